//! cargo-fuzz entry point for the `quantity` target; the checks live in `gpu_ledger_fuzz::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ledger_fuzz::quantity(data));
