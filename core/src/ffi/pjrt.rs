//! **Experimental.** A native entry in the shape of the PJRT XLA-transform
//! extension (`xla/pjrt/c/pjrt_c_api_xla_transform_extension.h` in
//! openxla/xla, extension version 1), so a framework can register equarx
//! with a PJRT plugin (TPU, GPU) without a Python callback. A Python
//! callback needs the GIL on the compiler thread, which can deadlock
//! ahead-of-time compiles (jax-ml/jax#38829); this callback needs nothing.
//!
//! Two ways in:
//! - `equarx_pjrt_register(pjrt_api, name, stage, options_json, &error)`
//!   walks the plugin's extension chain for the XLA-transform extension and
//!   registers [`equarx_pjrt_transform_hlo_module`] with it.
//! - A framework that does its own registration sets the options with
//!   `equarx_pjrt_configure` and passes `equarx_pjrt_callbacks()`.
//!
//! The callbacks table carries no user data, and older XLA copied it by
//! value (openxla/xla#43630), so the options live in one process-wide slot
//! rather than next to the table: one equarx configuration per process.
//!
//! The layouts below are written from that header (the TensorFlow 2.21
//! headers predate it). `PJRT_Extension_Type_XlaTransform` is 24: the
//! jaxlib 0.10.2 binary compares extension types against 24 when it looks
//! this extension up, and the order of the enum in `pjrt_c_api.h` gives
//! the same.

use std::ffi::{c_char, c_int, c_void};
use std::sync::RwLock;

use super::c_abi::{c_string, opt_str, status_into};
use super::{DoorError, guarded, parse_options, rewrite_bytes};
use crate::RewriteOptions;
use crate::io::Format;

pub const PJRT_API_XLA_TRANSFORM_EXTENSION_VERSION: i64 = 1;
pub const PJRT_EXTENSION_TYPE_XLA_TRANSFORM: c_int = 24;
pub const PJRT_ERROR_CODE_INVALID_ARGUMENT: c_int = 3;
pub const PJRT_ERROR_CODE_INTERNAL: c_int = 13;
pub const PIPELINE_STAGE_PRE_SCHEDULER: c_int = 0;
pub const PIPELINE_STAGE_POST_SCHEDULER: c_int = 1;

/// `PJRT_XlaTransform_string`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransformString {
    pub data: *const c_char,
    pub size: usize,
}

/// `PJRT_XlaTransform_version_and_error`.
#[repr(C)]
#[derive(Debug)]
pub struct VersionAndError {
    pub api_version: i64,
    pub data: *mut c_void,
    pub cleanup_fn: Option<unsafe extern "C" fn(*mut c_void)>,
    pub has_error: bool,
    /// `PJRT_Error_Code`.
    pub code: c_int,
    pub error_msg: TransformString,
}

/// `PJRT_XlaTransform_Args`.
#[repr(C)]
#[derive(Debug)]
pub struct TransformArgs {
    pub struct_size: usize,
    pub header: VersionAndError,
    pub hlo_module: TransformString,
    pub transformed_hlo_module: TransformString,
    pub changed: bool,
}

/// `PJRT_XlaTransform_Args_STRUCT_SIZE`: PJRT sizes end at the last field
/// (no trailing padding).
pub const ARGS_STRUCT_SIZE: usize = std::mem::offset_of!(TransformArgs, changed) + 1;

/// `PJRT_XlaTransform_Callbacks`.
#[repr(C)]
#[derive(Debug)]
pub struct TransformCallbacks {
    pub version: i64,
    pub dtor: Option<unsafe extern "C" fn(*mut TransformCallbacks)>,
    pub transform_hlo_module:
        Option<unsafe extern "C" fn(*mut TransformCallbacks, *mut TransformArgs)>,
}

/// `PJRT_Extension_Base`.
#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: c_int,
    next: *const ExtensionBase,
}

/// The first fields of `PJRT_Api` (stable since the C API's first version):
/// the extension chain, the version struct, then the error functions.
#[repr(C)]
struct ApiHead {
    struct_size: usize,
    extension_start: *const ExtensionBase,
    version: [usize; 3],
    error_destroy: Option<unsafe extern "C" fn(*mut ErrorDestroyArgs)>,
    error_message: Option<unsafe extern "C" fn(*mut ErrorMessageArgs)>,
}

#[repr(C)]
struct ErrorDestroyArgs {
    struct_size: usize,
    extension_start: *const c_void,
    error: *mut c_void,
}

#[repr(C)]
struct ErrorMessageArgs {
    struct_size: usize,
    extension_start: *const c_void,
    error: *const c_void,
    message: *const c_char,
    message_size: usize,
}

/// `PJRT_Register_Xla_Transform_Args`.
#[repr(C)]
struct RegisterArgs {
    struct_size: usize,
    name: *const c_char,
    name_size: usize,
    stage: c_int,
    callbacks: *mut TransformCallbacks,
}

/// `PJRT_Xla_Transform_Extension`.
#[repr(C)]
struct TransformExtension {
    base: ExtensionBase,
    register: Option<unsafe extern "C" fn(*mut RegisterArgs) -> *mut c_void>,
}

/// The options the callback uses (set by configure / register).
static OPTIONS: RwLock<Option<RewriteOptions>> = RwLock::new(None);

/// The report of the callback's last call (a JSON array of
/// [`crate::OpReport`], or the error it answered XLA with), for
/// [`equarx_pjrt_last_report`]: the native door has no Python side to hand
/// it to.
static LAST_REPORT: RwLock<Option<String>> = RwLock::new(None);

struct Callbacks(std::cell::UnsafeCell<TransformCallbacks>);
// SAFETY: the table is never written after initialization; XLA only reads it.
unsafe impl Sync for Callbacks {}

static CALLBACKS: Callbacks = Callbacks(std::cell::UnsafeCell::new(TransformCallbacks {
    version: PJRT_API_XLA_TRANSFORM_EXTENSION_VERSION,
    dtor: None,
    transform_hlo_module: Some(equarx_pjrt_transform_hlo_module),
}));

/// What the callback allocates for one call; freed by the header's
/// `cleanup_fn` once XLA has read it.
struct CallOutput {
    module: Vec<u8>,
    error: Vec<u8>,
}

unsafe extern "C" fn free_call_output(data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: `data` is the `Box<CallOutput>` the callback leaked.
        drop(unsafe { Box::from_raw(data.cast::<CallOutput>()) });
    }
}

fn configured_options() -> Result<RewriteOptions, DoorError> {
    let slot = OPTIONS.read().unwrap_or_else(|p| p.into_inner());
    match &*slot {
        Some(o) => Ok(o.clone()),
        None => Err(DoorError::Options(
            "equarx's PJRT callback ran before equarx_pjrt_configure or equarx_pjrt_register set its options".into(),
        )),
    }
}

/// `void equarx_pjrt_transform_hlo_module(PJRT_XlaTransform_Callbacks*,
/// PJRT_XlaTransform_Args*)`: the extension's `transform_hlo_module`.
/// Reads `args->hlo_module` (a bare `HloModuleProto`), rewrites it with the
/// configured options, and sets `changed` + `transformed_hlo_module`, or
/// `header.has_error`, `code` and `error_msg`. Output buffers live until
/// XLA calls `header.cleanup_fn(header.data)`.
///
/// # Safety
/// `args` is null or a valid `PJRT_XlaTransform_Args` whose `hlo_module`
/// points to `size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_pjrt_transform_hlo_module(
    _callbacks: *mut TransformCallbacks,
    args: *mut TransformArgs,
) {
    if args.is_null() {
        return;
    }
    // SAFETY: non-null, valid by the caller's contract.
    let args = unsafe { &mut *args };
    if args.struct_size < ARGS_STRUCT_SIZE {
        // An args struct from an unknown, smaller layout: do not touch it
        // beyond what every version has (the header comes first).
        args.header.has_error = true;
        args.header.code = PJRT_ERROR_CODE_INVALID_ARGUMENT;
        args.header.error_msg = TransformString {
            data: c"equarx: PJRT_XlaTransform_Args is smaller than extension version 1's".as_ptr(),
            size: "equarx: PJRT_XlaTransform_Args is smaller than extension version 1's".len(),
        };
        return;
    }
    let input = args.hlo_module;
    let run = guarded(|| {
        // SAFETY: per the function's contract.
        let bytes = unsafe { super::c_abi::bytes(input.data.cast(), input.size, "hlo_module") }?;
        let options = RewriteOptions {
            at_hook: true,
            ..configured_options()?
        };
        rewrite_bytes(bytes, Some(Format::Module), &options)
    });
    let mut out = Box::new(CallOutput {
        module: Vec::new(),
        error: Vec::new(),
    });
    let report = match &run {
        Ok(outcome) => outcome.report_json.clone(),
        Err(e) => serde_json::json!({ "error": format!("equarx: {e}") }).to_string(),
    };
    *LAST_REPORT.write().unwrap_or_else(|p| p.into_inner()) = Some(report);
    match run {
        Ok(outcome) => {
            out.module = outcome.module.unwrap_or_default();
            args.changed = outcome.changed;
            args.transformed_hlo_module = TransformString {
                data: out.module.as_ptr().cast(),
                size: out.module.len(),
            };
        }
        Err(e) => {
            out.error = format!("equarx: {e}").into_bytes();
            args.changed = false;
            args.header.has_error = true;
            args.header.code = match e {
                DoorError::Argument(_) | DoorError::Options(_) | DoorError::Module(_) => {
                    PJRT_ERROR_CODE_INVALID_ARGUMENT
                }
                _ => PJRT_ERROR_CODE_INTERNAL,
            };
            args.header.error_msg = TransformString {
                data: out.error.as_ptr().cast(),
                size: out.error.len(),
            };
        }
    }
    args.header.data = Box::into_raw(out).cast();
    args.header.cleanup_fn = Some(free_call_output);
}

/// `equarx_status equarx_pjrt_configure(const char* options_json, char**
/// error)`: sets the options the PJRT callback uses (JSON as for
/// `equarx_rewrite`).
///
/// # Safety
/// `options_json` is null or NUL-terminated; `error` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_pjrt_configure(
    options_json: *const c_char,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: per the function's contract.
    let run = guarded(|| parse_options(unsafe { opt_str(options_json, "options_json") }?));
    // SAFETY: per the function's contract.
    unsafe { status_into(run.map(set_options), error) }
}

fn set_options(o: RewriteOptions) {
    *OPTIONS.write().unwrap_or_else(|p| p.into_inner()) = Some(o);
}

/// `equarx_status equarx_pjrt_last_report(char** report_json, char**
/// error)`: the report of the PJRT callback's last call in this process,
/// as `equarx_rewrite` gives it (a JSON array, one entry per collective),
/// or `{"error": MESSAGE}` when that call failed; null before any call.
/// Free it with `equarx_free_string`.
///
/// # Safety
/// `report_json` and `error` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_pjrt_last_report(
    report_json: *mut *mut c_char,
    error: *mut *mut c_char,
) -> c_int {
    let run = guarded(|| {
        if report_json.is_null() {
            return Err(DoorError::Argument("report_json is null".into()));
        }
        let last = LAST_REPORT.read().unwrap_or_else(|p| p.into_inner());
        let out = match &*last {
            Some(json) => c_string(json),
            None => std::ptr::null_mut(),
        };
        // SAFETY: checked non-null above, writable by the contract.
        unsafe { report_json.write(out) };
        Ok(())
    });
    // SAFETY: per the function's contract.
    unsafe { status_into(run, error) }
}

/// `PJRT_XlaTransform_Callbacks* equarx_pjrt_callbacks(void)`: a static
/// table (version 1, no destructor, [`equarx_pjrt_transform_hlo_module`]).
#[unsafe(no_mangle)]
pub extern "C" fn equarx_pjrt_callbacks() -> *mut TransformCallbacks {
    CALLBACKS.0.get()
}

/// `equarx_status equarx_pjrt_register(const void* pjrt_api, const char*
/// name, int stage, const char* options_json, char** error)`: sets the
/// options, finds the XLA-transform extension in the plugin's `PJRT_Api`
/// and registers equarx's callback under `name` (null: the pass's name) at
/// `stage` (0 pre-scheduler, 1 post-scheduler).
///
/// # Safety
/// `pjrt_api` is null or the `const PJRT_Api*` of a loaded plugin; strings
/// are null or NUL-terminated; `error` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_pjrt_register(
    pjrt_api: *const c_void,
    name: *const c_char,
    stage: c_int,
    options_json: *const c_char,
    error: *mut *mut c_char,
) -> c_int {
    let run = guarded(|| {
        if pjrt_api.is_null() {
            return Err(DoorError::Argument("pjrt_api is null".into()));
        }
        if !(PIPELINE_STAGE_PRE_SCHEDULER..=PIPELINE_STAGE_POST_SCHEDULER).contains(&stage) {
            return Err(DoorError::Argument(format!(
                "stage {stage} is neither 0 (pre-scheduler) nor 1 (post-scheduler)"
            )));
        }
        // SAFETY: per the function's contract.
        let options = parse_options(unsafe { opt_str(options_json, "options_json") }?)?;
        // SAFETY: per the function's contract.
        let name = match unsafe { opt_str(name, "name") }? {
            "" => "equarx-quantize-collectives",
            n => n,
        };
        // SAFETY: `pjrt_api` is a PJRT_Api by the contract.
        let api = unsafe { &*pjrt_api.cast::<ApiHead>() };
        // SAFETY: the extension chain of a valid PJRT_Api.
        let ext = unsafe { find_transform_extension(api) }?;
        let register = ext.register.ok_or_else(|| {
            DoorError::Argument("the XLA-transform extension has no register_xla_transform".into())
        })?;
        set_options(options);
        let mut args = RegisterArgs {
            struct_size: std::mem::size_of::<RegisterArgs>(),
            name: name.as_ptr().cast(),
            name_size: name.len(),
            stage,
            callbacks: equarx_pjrt_callbacks(),
        };
        // SAFETY: a valid function of the plugin with valid arguments.
        let err = unsafe { register(&mut args) };
        if err.is_null() {
            Ok(())
        } else {
            // SAFETY: `err` is a PJRT_Error* of this api.
            let msg = unsafe { take_error(api, err) };
            Err(DoorError::Argument(format!(
                "register_xla_transform failed: {msg}"
            )))
        }
    });
    // SAFETY: per the function's contract.
    unsafe { status_into(run, error) }
}

/// # Safety
/// `api` is a valid `PJRT_Api`.
unsafe fn find_transform_extension(api: &ApiHead) -> Result<&TransformExtension, DoorError> {
    let mut ext = api.extension_start;
    let mut seen = Vec::new();
    for _ in 0..1024 {
        if ext.is_null() {
            break;
        }
        // SAFETY: a node of the plugin's extension chain.
        let base = unsafe { &*ext };
        if base.kind == PJRT_EXTENSION_TYPE_XLA_TRANSFORM {
            if base.struct_size < std::mem::size_of::<TransformExtension>() {
                return Err(DoorError::Argument(format!(
                    "the plugin's XLA-transform extension is {} bytes, older than version 1 ({} bytes)",
                    base.struct_size,
                    std::mem::size_of::<TransformExtension>()
                )));
            }
            // SAFETY: the type tag says this node is the extension struct.
            return Ok(unsafe { &*ext.cast::<TransformExtension>() });
        }
        seen.push(base.kind.to_string());
        ext = base.next;
    }
    Err(DoorError::Argument(format!(
        "this PJRT plugin has no XLA-transform extension (type {PJRT_EXTENSION_TYPE_XLA_TRANSFORM}); \
         its extensions are [{}]; use the Python callback (jax.extend.xla.register_hlo_module_transformation) instead",
        seen.join(", ")
    )))
}

/// Reads and destroys a `PJRT_Error`.
///
/// # Safety
/// `err` is a live `PJRT_Error*` of `api`.
unsafe fn take_error(api: &ApiHead, err: *mut c_void) -> String {
    let mut msg = String::from("(no message)");
    if let Some(f) = api.error_message {
        let mut a = ErrorMessageArgs {
            struct_size: std::mem::size_of::<ErrorMessageArgs>(),
            extension_start: std::ptr::null(),
            error: err,
            message: std::ptr::null(),
            message_size: 0,
        };
        // SAFETY: the plugin's own function with valid arguments.
        unsafe { f(&mut a) };
        if !a.message.is_null() {
            // SAFETY: the plugin returns `message_size` bytes at `message`.
            let bytes =
                unsafe { std::slice::from_raw_parts(a.message.cast::<u8>(), a.message_size) };
            msg = String::from_utf8_lossy(bytes).into_owned();
        }
    }
    if let Some(f) = api.error_destroy {
        let mut a = ErrorDestroyArgs {
            struct_size: std::mem::size_of::<ErrorDestroyArgs>(),
            extension_start: std::ptr::null(),
            error: err,
        };
        // SAFETY: as above.
        unsafe { f(&mut a) };
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::c_abi::EQUARX_INVALID_ARGUMENT;

    /// The sizes the C header's structs have on LP64 (checked by the C test
    /// as well, against its own declarations).
    #[test]
    fn layouts_match_the_extension_header() {
        assert_eq!(std::mem::size_of::<TransformString>(), 16);
        assert_eq!(std::mem::size_of::<VersionAndError>(), 48);
        assert_eq!(std::mem::size_of::<TransformArgs>(), 96);
        assert_eq!(ARGS_STRUCT_SIZE, 89);
        assert_eq!(std::mem::size_of::<TransformCallbacks>(), 24);
        assert_eq!(std::mem::size_of::<RegisterArgs>(), 40);
        assert_eq!(std::mem::size_of::<TransformExtension>(), 32);
    }

    #[test]
    fn null_args_and_null_api_are_handled() {
        // SAFETY: null args are checked.
        unsafe { equarx_pjrt_transform_hlo_module(std::ptr::null_mut(), std::ptr::null_mut()) };
        let mut err = std::ptr::null_mut();
        // SAFETY: null api is checked; err is writable.
        let s = unsafe {
            equarx_pjrt_register(
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                &mut err,
            )
        };
        assert_eq!(s, EQUARX_INVALID_ARGUMENT);
        // SAFETY: set by equarx_pjrt_register.
        let msg = unsafe { std::ffi::CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains("pjrt_api is null"), "{msg}");
        // SAFETY: from equarx.
        unsafe { super::super::c_abi::free_c_string(err) };
    }
}
