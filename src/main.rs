//! `gpu-ledger` binary: parse arguments, start logging, run, map errors to exit codes.
//!
//! Everything else lives in the library (`gpu_ledger::app`).

use std::process::ExitCode;

use clap::Parser;
use gpu_ledger::app::{self, AppError};
use gpu_ledger::config::{Cli, Command};

/// mimalloc instead of glibc malloc: each refresh decodes megabytes of Prometheus answers and
/// frees them again; glibc's per-thread arenas kept most of that resident. The image sets
/// `MIMALLOC_PURGE_DELAY=0` so freed pages go back at once (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    gpu_ledger::telemetry::init(cli.log_format, &cli.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => app::serve(*args).await,
            Command::Report(args) => app::report(*args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            // The whole cause chain on one line ("a: b: c"), each cause once.
            eprintln!("error: {:#}", anyhow::Error::new::<AppError>(e));
            ExitCode::from(code)
        }
    }
}
