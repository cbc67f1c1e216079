//! cargo-fuzz entry point for the `prom_response` target; the checks live in `gpu_ledger_fuzz::prom_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ledger_fuzz::prom_response(data));
