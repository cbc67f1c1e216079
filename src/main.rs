//! `gpu-ledger` binary: parse arguments, start logging, run, map errors to exit codes.
//!
//! Everything else lives in the library (`gpu_ledger::app`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use gpu_ledger::app;
use gpu_ledger::config::{Cli, Command};
use gpu_ledger::telemetry::{self, LogFormat};

/// mimalloc instead of glibc malloc: each refresh decodes megabytes of Prometheus answers and
/// frees them again; glibc's per-thread arenas kept most of that resident. The image sets
/// `MIMALLOC_PURGE_DELAY=0` so freed pages go back at once, and the crate is built without
/// transparent huge pages (`no_thp` in Cargo.toml; docs/benchmarks.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The log format asked for on a command line clap rejected (`--log-format json`,
/// `--log-format=json` or `GPU_LEDGER_LOG_FORMAT=json`), so even that error is JSON.
fn requested_log_format() -> LogFormat {
    let args: Vec<String> = std::env::args().collect();
    let from_args = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--log-format=")
            .map(str::to_string)
            .or_else(|| {
                (a == "--log-format")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
    });
    let value = from_args.or_else(|| std::env::var("GPU_LEDGER_LOG_FORMAT").ok());
    if value.as_deref() == Some("json") {
        LogFormat::Json
    } else {
        LogFormat::Plain
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() && requested_log_format() == LogFormat::Json => {
            let text = e.render().to_string();
            telemetry::fatal(LogFormat::Json, text.trim(), 2);
            return ExitCode::from(2);
        }
        // --help, --version and plain-format usage errors as clap prints them.
        Err(e) => e.exit(),
    };
    if let Command::Completions(args) = &cli.command {
        let mut script = Vec::new();
        clap_complete::generate(args.shell, &mut Cli::command(), "gpu-ledger", &mut script);
        return match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
            // `| head` is the reader's choice.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                telemetry::fatal(cli.log_format, &format!("writing output: {e}"), 1);
                ExitCode::FAILURE
            }
            _ => ExitCode::SUCCESS,
        };
    }
    // A one-shot command prints its one error itself; a service logs everything.
    let quiet = match cli.command {
        Command::Serve(_) => &[][..],
        _ => telemetry::CLI_QUIET_TARGETS,
    };
    telemetry::init_quiet(cli.log_format, &cli.log, quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            telemetry::fatal(
                cli.log_format,
                &format!("cannot start the async runtime: {e}"),
                1,
            );
            return ExitCode::FAILURE;
        }
    };
    let format = cli.log_format;
    // The command runs inside the library (app::run, which says why).
    match app::run(&runtime, cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            // The whole cause chain on one line ("a: b: c"), each cause once (kube's errors
            // repeat their sources in their own text: that printed the chain three times).
            let chain = telemetry::error_chain(&e);
            telemetry::fatal(format, &chain, code);
            ExitCode::from(code)
        }
    }
}
