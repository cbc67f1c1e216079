//! cargo-fuzz entry point for the `exposition` target; the checks live in `gpu_ledger_fuzz::exposition`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ledger_fuzz::exposition(data));
