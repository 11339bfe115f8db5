//! Fuzz target `decode_verify`: see `fuzz/harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::decode_verify(data));
