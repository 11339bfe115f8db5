//! Fuzz target `c_abi`: see `fuzz/harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::c_abi(data));
