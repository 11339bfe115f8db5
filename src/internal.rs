//! What the command line does with its own bugs. A panic in a command is
//! equarx's fault, never the input's; it becomes an [`InternalError`]:
//! `equarx: internal error: MESSAGE at FILE:LINE`, a request to report it,
//! and exit status 70 (`EX_SOFTWARE`), instead of Rust's panic text. Every
//! output is written to a temporary file and renamed only when complete,
//! so a panic leaves no partial file behind. A directory rewrite reports
//! the module that hit it and goes on with the others.
//!
//! `RUST_BACKTRACE=1` prints Rust's own panic message and backtrace as
//! well.

use std::panic::{AssertUnwindSafe, PanicHookInfo, catch_unwind};
use std::sync::Mutex;

use anyhow::Result;

/// The exit status of an internal error (`EX_SOFTWARE` of sysexits.h).
pub const EXIT_STATUS: u8 = 70;

/// A panic caught in a command: what it said and where.
#[derive(Debug)]
pub struct InternalError(pub String);

impl std::fmt::Display for InternalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "internal error: {}; this is a bug in equarx, not in the input: please report \
             it with the command line and the input (RUST_BACKTRACE=1 shows the backtrace)",
            self.0
        )
    }
}

impl std::error::Error for InternalError {}

/// What the last panic said and where, as the hook saw it.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Replaces Rust's panic message with a note of it for [`contain`]; Rust's
/// own message and backtrace still print under `RUST_BACKTRACE`.
pub fn install_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
        let message = equarx::ffi::panic_message(info.payload());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("{message}{at}"));
        }
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            default(info);
        }
    }));
}

/// Runs `f`, turning a panic into an [`InternalError`].
pub fn contain<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        let what = LAST_PANIC
            .lock()
            .ok()
            .and_then(|mut last| last.take())
            .unwrap_or_else(|| "a panic".into());
        Err(InternalError(what).into())
    })
}

/// Panics when `EQUARX_TEST_INTERNAL_ERROR` is set: the tests' way to
/// reach the handling above, which no input can (only a bug panics).
pub fn test_trigger() {
    if std::env::var_os("EQUARX_TEST_INTERNAL_ERROR").is_some() {
        panic!("EQUARX_TEST_INTERNAL_ERROR is set");
    }
}
