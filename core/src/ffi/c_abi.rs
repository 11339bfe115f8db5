//! The C ABI (`cpp_shim/include/equarx.h`): rewrite serialized module bytes
//! with JSON options, get bytes + a changed flag + a JSON report, or a
//! status code and a message.
//!
//! Rules every function here keeps:
//! - every pointer and length is checked before use; a null where a value is
//!   required is `EQUARX_INVALID_ARGUMENT`, never a crash;
//! - no panic crosses the boundary ([`super::guarded`]);
//! - no global state: calls from many threads at once are independent;
//! - memory handed out is freed only by the matching `equarx_free_*`
//!   function, which accepts what it handed out, nulls, and structs it has
//!   already freed.

use std::ffi::{CStr, CString, c_char, c_int};

use super::{DoorError, Outcome, guarded, parse_options, rewrite_bytes};

/// Status codes (`equarx_status` in the header).
pub const EQUARX_OK: c_int = 0;
pub const EQUARX_INVALID_ARGUMENT: c_int = 1;
pub const EQUARX_INVALID_OPTIONS: c_int = 2;
pub const EQUARX_INVALID_MODULE: c_int = 3;
pub const EQUARX_REWRITE_FAILED: c_int = 4;
pub const EQUARX_INTERNAL: c_int = 5;

/// `equarx_result`: filled by [`equarx_rewrite`]. The caller sets
/// `struct_size` to `sizeof(equarx_result)`; a later equarx that grows the
/// struct still accepts callers compiled against this layout.
#[repr(C)]
#[derive(Debug)]
pub struct EquarxResult {
    pub struct_size: usize,
    /// The rewritten module (same container as the input); null when
    /// unchanged or on error.
    pub module: *mut u8,
    pub module_len: usize,
    pub changed: c_int,
    /// NUL-terminated JSON array, one object per all-reduce; null on error.
    pub report_json: *mut c_char,
    /// NUL-terminated message; null on success.
    pub error: *mut c_char,
}

impl Default for EquarxResult {
    /// An empty result for this layout, `struct_size` set: what a Rust
    /// caller passes to [`equarx_rewrite`].
    fn default() -> Self {
        EquarxResult {
            struct_size: std::mem::size_of::<EquarxResult>(),
            module: std::ptr::null_mut(),
            module_len: 0,
            changed: 0,
            report_json: std::ptr::null_mut(),
            error: std::ptr::null_mut(),
        }
    }
}

pub(crate) fn status_of(e: &DoorError) -> c_int {
    match e {
        DoorError::Argument(_) => EQUARX_INVALID_ARGUMENT,
        DoorError::Options(_) => EQUARX_INVALID_OPTIONS,
        DoorError::Module(_) => EQUARX_INVALID_MODULE,
        DoorError::Rewrite(crate::Error::Options(_)) => EQUARX_INVALID_OPTIONS,
        DoorError::Rewrite(_) => EQUARX_REWRITE_FAILED,
        DoorError::Internal(_) => EQUARX_INTERNAL,
    }
}

/// A C string for `s` (interior NULs, which C cannot hold, become spaces).
pub(crate) fn c_string(s: &str) -> *mut c_char {
    let cleaned: Vec<u8> = s.bytes().map(|b| if b == 0 { b' ' } else { b }).collect();
    CString::new(cleaned)
        .expect("NULs were replaced")
        .into_raw()
}

/// Reads an optional NUL-terminated UTF-8 string; null reads as "".
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
pub(crate) unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, DoorError> {
    if p.is_null() {
        return Ok("");
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| DoorError::Options(format!("{what} is not UTF-8: {e}")))
}

/// Borrows `len` bytes at `p`, checking what can be checked.
///
/// # Safety
/// When non-null, `p` points to `len` readable bytes.
pub(crate) unsafe fn bytes<'a>(
    p: *const u8,
    len: usize,
    what: &str,
) -> Result<&'a [u8], DoorError> {
    if p.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(DoorError::Argument(format!(
                "{what} is null but its length is {len}"
            )))
        };
    }
    if len > isize::MAX as usize {
        return Err(DoorError::Argument(format!(
            "{what} length {len} is too large"
        )));
    }
    // SAFETY: non-null, `len` readable bytes by the caller's contract, len
    // within isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

fn boxed_bytes(v: Vec<u8>) -> (*mut u8, usize) {
    let b = v.into_boxed_slice();
    let len = b.len();
    (Box::into_raw(b).cast::<u8>(), len)
}

/// # Safety
/// `p`/`len` came from [`boxed_bytes`] (or `p` is null).
unsafe fn free_bytes(p: *mut u8, len: usize) {
    if !p.is_null() {
        // SAFETY: allocated by `boxed_bytes` as a boxed slice of `len` bytes.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
    }
}

/// # Safety
/// `p` came from [`c_string`] (or is null).
pub(crate) unsafe fn free_c_string(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: allocated by `CString::into_raw` in `c_string`.
        drop(unsafe { CString::from_raw(p) });
    }
}

/// `const char* equarx_version(void)`: the library version, static storage.
#[unsafe(no_mangle)]
pub extern "C" fn equarx_version() -> *const c_char {
    super::VERSION.as_ptr().cast()
}

/// `equarx_status equarx_rewrite(const uint8_t* module, size_t module_len,
/// const char* options_json, equarx_result* result)`.
///
/// `module`: any container equarx reads (a bare `HloModuleProto` as XLA and
/// JAX hand it over, an `HloProto`, an `HloModuleProtoWithConfig`, gzip or
/// not); the rewritten module comes back in the same one. `options_json`:
/// null or "" for the defaults, else a JSON object (see [`crate::options`],
/// the one list of options). On any status other than `EQUARX_OK`,
/// `result->error` says why (except when `result` itself is unusable).
///
/// # Safety
/// `module` is null or points to `module_len` readable bytes; `options_json`
/// is null or NUL-terminated; `result` is null or points to a writable
/// `equarx_result` whose `struct_size` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_rewrite(
    module: *const u8,
    module_len: usize,
    options_json: *const c_char,
    result: *mut EquarxResult,
) -> c_int {
    if result.is_null() {
        return EQUARX_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and writable by the caller's contract; read the size
    // first, write nothing if the caller's struct is smaller than ours.
    let size = unsafe { std::ptr::addr_of!((*result).struct_size).read() };
    if size < std::mem::size_of::<EquarxResult>() {
        return EQUARX_INVALID_ARGUMENT;
    }
    // SAFETY: as above, the whole struct is ours to write.
    let out = unsafe { &mut *result };
    out.module = std::ptr::null_mut();
    out.module_len = 0;
    out.changed = 0;
    out.report_json = std::ptr::null_mut();
    out.error = std::ptr::null_mut();

    let run = guarded(|| {
        // SAFETY: per the function's contract.
        let input = unsafe { bytes(module, module_len, "module") }?;
        // SAFETY: per the function's contract.
        let json = unsafe { opt_str(options_json, "options_json") }?;
        let options = parse_options(json)?;
        rewrite_bytes(input, None, &options)
    });
    match run {
        Ok(Outcome {
            changed,
            module,
            report_json,
        }) => {
            if let Some(m) = module {
                (out.module, out.module_len) = boxed_bytes(m);
            }
            out.changed = c_int::from(changed);
            out.report_json = c_string(&report_json);
            EQUARX_OK
        }
        Err(e) => {
            out.error = c_string(&e.to_string());
            status_of(&e)
        }
    }
}

/// `void equarx_free_result(equarx_result* result)`: frees what
/// [`equarx_rewrite`] put in `result` and nulls the fields; a null `result`,
/// a zeroed one and one already freed are fine.
///
/// # Safety
/// `result` is null or points to an `equarx_result` that is zeroed or was
/// filled by `equarx_rewrite` (with its buffers not freed elsewhere).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_free_result(result: *mut EquarxResult) {
    if result.is_null() {
        return;
    }
    let _ = guarded(|| {
        // SAFETY: non-null by the check, valid by the caller's contract.
        let r = unsafe { &mut *result };
        if r.struct_size < std::mem::size_of::<EquarxResult>() {
            return Ok(());
        }
        // SAFETY: the buffers came from `equarx_rewrite`.
        unsafe {
            free_bytes(r.module, r.module_len);
            free_c_string(r.report_json);
            free_c_string(r.error);
        }
        r.module = std::ptr::null_mut();
        r.module_len = 0;
        r.report_json = std::ptr::null_mut();
        r.error = std::ptr::null_mut();
        Ok(())
    });
}

/// `equarx_status equarx_check_options(const char* options_json, char**
/// error)`: validates options without a module (e.g. when a framework
/// registers the pass). On failure `*error` (if `error` is non-null) gets a
/// message to free with `equarx_free_string`.
///
/// # Safety
/// `options_json` is null or NUL-terminated; `error` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_check_options(
    options_json: *const c_char,
    error: *mut *mut c_char,
) -> c_int {
    let run = guarded(|| {
        // SAFETY: per the function's contract.
        let json = unsafe { opt_str(options_json, "options_json") }?;
        parse_options(json).map(|_| ())
    });
    // SAFETY: `error` is null or writable, per the function's contract.
    unsafe { status_into(run, error) }
}

/// `equarx_status equarx_op_stats(const float* inputs, size_t devices,
/// size_t elements, int moved, const char* source, char** stats_json,
/// char** error)`: the error model's statistics of one collective's inputs
/// (`numerics::profile::op_stats`): `inputs` holds `devices` rows of
/// `elements` values, device d's payload in row d (rank order); `moved` is
/// nonzero for a collective that moves its inputs (all-gather, all-to-all)
/// rather than summing them. `*stats_json` gets the statistics as JSON
/// (free with `equarx_free_string`). Calibration (`equarx.jax.calibrate`)
/// calls it per op, so the statistics have one definition.
///
/// # Safety
/// `inputs` points to `devices · elements` floats; `source` is null or
/// NUL-terminated; `stats_json` and `error` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_op_stats(
    inputs: *const f32,
    devices: usize,
    elements: usize,
    moved: c_int,
    source: *const c_char,
    stats_json: *mut *mut c_char,
    error: *mut *mut c_char,
) -> c_int {
    if !stats_json.is_null() {
        // SAFETY: per the contract.
        unsafe { stats_json.write(std::ptr::null_mut()) };
    }
    let run = guarded(|| {
        if inputs.is_null() || stats_json.is_null() {
            return Err(DoorError::Argument("inputs or stats_json is null".into()));
        }
        let total = devices
            .checked_mul(elements)
            .filter(|&n| n > 0 && n <= isize::MAX as usize / 4)
            .ok_or_else(|| {
                DoorError::Argument(format!("{devices} devices of {elements} values"))
            })?;
        // SAFETY: `inputs` holds `total` floats by the contract.
        let all = unsafe { std::slice::from_raw_parts(inputs, total) };
        let rows: Vec<Vec<f32>> = all.chunks_exact(elements).map(<[f32]>::to_vec).collect();
        // SAFETY: per the contract.
        let source = unsafe { opt_str(source, "source") }?;
        let kind = if moved != 0 {
            crate::numerics::profile::Inputs::Moved
        } else {
            crate::numerics::profile::Inputs::Summed
        };
        let stats =
            crate::numerics::profile::op_stats(&rows, kind, source).map_err(DoorError::Argument)?;
        let json = serde_json::to_string(&stats).map_err(|e| DoorError::Internal(e.to_string()))?;
        // SAFETY: checked non-null above, writable by the contract.
        unsafe { stats_json.write(c_string(&json)) };
        Ok(())
    });
    // SAFETY: `error` is null or writable, per the function's contract.
    unsafe { status_into(run, error) }
}

/// `equarx_status equarx_sites(const uint8_t* module, size_t len, const
/// char* options_json, char** sites_json, char** error)`: the module's
/// collectives as calibration sees them (`calibrate::sites`: each one's
/// key, name, groups and payload size), a JSON array in `*sites_json` (free
/// with `equarx_free_string`). Counts in the options override the
/// module's.
///
/// # Safety
/// `module` points to `len` bytes; `options_json` is null or
/// NUL-terminated; `sites_json` and `error` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_sites(
    module: *const u8,
    len: usize,
    options_json: *const c_char,
    sites_json: *mut *mut c_char,
    error: *mut *mut c_char,
) -> c_int {
    if !sites_json.is_null() {
        // SAFETY: per the contract.
        unsafe { sites_json.write(std::ptr::null_mut()) };
    }
    let run = guarded(|| {
        if module.is_null() || sites_json.is_null() {
            return Err(DoorError::Argument("module or sites_json is null".into()));
        }
        // SAFETY: `module` holds `len` bytes by the contract.
        let bytes = unsafe { std::slice::from_raw_parts(module, len) };
        // SAFETY: per the contract.
        let options = parse_options(unsafe { opt_str(options_json, "options_json") }?)?;
        let json = super::sites_json(bytes, &options)?;
        // SAFETY: checked non-null above, writable by the contract.
        unsafe { sites_json.write(c_string(&json)) };
        Ok(())
    });
    // SAFETY: `error` is null or writable, per the function's contract.
    unsafe { status_into(run, error) }
}

/// `equarx_status equarx_profile(const char* measurements_json, char**
/// profile_json, char** error)`: the calibration profile of what a run
/// measured (`calibrate::Measurements`: per op its key and the statistics
/// of each group and run, from `equarx_op_stats`), averaged per op, as the
/// JSON a `profile` option reads.
///
/// # Safety
/// `measurements_json` is NUL-terminated; `profile_json` and `error` are
/// null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_profile(
    measurements_json: *const c_char,
    profile_json: *mut *mut c_char,
    error: *mut *mut c_char,
) -> c_int {
    if !profile_json.is_null() {
        // SAFETY: per the contract.
        unsafe { profile_json.write(std::ptr::null_mut()) };
    }
    let run = guarded(|| {
        if measurements_json.is_null() || profile_json.is_null() {
            return Err(DoorError::Argument(
                "measurements_json or profile_json is null".into(),
            ));
        }
        // SAFETY: per the contract.
        let m = unsafe { opt_str(measurements_json, "measurements_json") }?;
        let json = super::profile_json(m)?;
        // SAFETY: checked non-null above, writable by the contract.
        unsafe { profile_json.write(c_string(&json)) };
        Ok(())
    });
    // SAFETY: `error` is null or writable, per the function's contract.
    unsafe { status_into(run, error) }
}

/// Writes the status of `run` and, on failure, its message to `*error`.
///
/// # Safety
/// `error` is null or writable.
pub(crate) unsafe fn status_into(run: Result<(), DoorError>, error: *mut *mut c_char) -> c_int {
    if !error.is_null() {
        // SAFETY: per the contract.
        unsafe { error.write(std::ptr::null_mut()) };
    }
    match run {
        Ok(()) => EQUARX_OK,
        Err(e) => {
            if !error.is_null() {
                // SAFETY: per the contract.
                unsafe { error.write(c_string(&e.to_string())) };
            }
            status_of(&e)
        }
    }
}

/// `void equarx_free_string(char* s)`: frees a string equarx handed out
/// outside an `equarx_result`; null is fine.
///
/// # Safety
/// `s` is null or a string from `equarx_check_options` / the PJRT
/// registration, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn equarx_free_string(s: *mut c_char) {
    // SAFETY: per the function's contract.
    unsafe { free_c_string(s) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(r: &EquarxResult) -> String {
        assert!(!r.error.is_null());
        // SAFETY: set by equarx_rewrite.
        unsafe { CStr::from_ptr(r.error) }
            .to_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn null_and_short_results_are_refused_without_writing() {
        // SAFETY: null result is checked.
        let s =
            unsafe { equarx_rewrite(std::ptr::null(), 0, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(s, EQUARX_INVALID_ARGUMENT);
        let mut r = EquarxResult {
            struct_size: 8,
            changed: 77,
            ..Default::default()
        };
        // SAFETY: valid pointers.
        let s = unsafe { equarx_rewrite(std::ptr::null(), 0, std::ptr::null(), &mut r) };
        assert_eq!(s, EQUARX_INVALID_ARGUMENT);
        assert_eq!(
            r.changed, 77,
            "nothing written into a struct of unknown size"
        );
    }

    #[test]
    fn null_module_with_a_length_is_an_argument_error() {
        let mut r = EquarxResult::default();
        // SAFETY: the null module is checked before use.
        let s = unsafe { equarx_rewrite(std::ptr::null(), 5, std::ptr::null(), &mut r) };
        assert_eq!(s, EQUARX_INVALID_ARGUMENT);
        assert!(error_of(&r).contains("module is null but its length is 5"));
        // SAFETY: r was filled by equarx_rewrite; freeing twice is allowed.
        unsafe {
            equarx_free_result(&mut r);
            equarx_free_result(&mut r);
        }
        assert!(r.error.is_null());
    }

    #[test]
    fn empty_and_garbage_modules_are_module_errors() {
        for input in [&b""[..], &b"\xff\xfe garbage \x00\x01"[..]] {
            let mut r = EquarxResult::default();
            // SAFETY: valid slice.
            let s =
                unsafe { equarx_rewrite(input.as_ptr(), input.len(), std::ptr::null(), &mut r) };
            assert_eq!(s, EQUARX_INVALID_MODULE, "{}", error_of(&r));
            assert!(r.report_json.is_null() && r.module.is_null());
            // SAFETY: filled by equarx_rewrite.
            unsafe { equarx_free_result(&mut r) };
        }
    }

    #[test]
    fn options_errors_come_back_as_strings() {
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid C string and out pointer.
        let s = unsafe { equarx_check_options(c"{\"pipeline_depth\": 0}".as_ptr(), &mut err) };
        assert_eq!(s, EQUARX_INVALID_OPTIONS);
        // SAFETY: set by equarx_check_options.
        let msg = unsafe { CStr::from_ptr(err) }.to_str().unwrap().to_string();
        assert!(msg.contains("pipeline depth must be in 1..="), "{msg}");
        // SAFETY: from equarx_check_options.
        unsafe { equarx_free_string(err) };
        // SAFETY: null options are the defaults; null error pointer is allowed.
        assert_eq!(
            unsafe { equarx_check_options(std::ptr::null(), std::ptr::null_mut()) },
            EQUARX_OK
        );
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(equarx_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
