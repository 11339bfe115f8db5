//! Fuzz target `structured`: generated valid modules and options through
//! the pass; see `fuzz/structured.rs`. The coverage counts go to
//! `$EQUARX_FUZZ_COVERAGE` and stderr when libFuzzer exits.
#![no_main]

#[path = "../structured.rs"]
mod structured;

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

extern "C" fn at_exit() {
    structured::write_coverage();
    if let Ok(g) = structured::COVERAGE.lock() {
        if let Some(c) = g.as_ref() {
            eprintln!("== structured coverage\n{}", c.summary());
        }
    }
}

libfuzzer_sys::fuzz_target!(
    init: {
        // SAFETY: registers a plain function; libFuzzer exits through exit().
        unsafe { atexit(at_exit) };
    },
    |data: &[u8]| structured::structured(data)
);
