//! cargo-fuzz entry point for the `kubectl_list` target; the checks live in `gpu_ledger_fuzz::kubectl_list`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ledger_fuzz::kubectl_list(data));
