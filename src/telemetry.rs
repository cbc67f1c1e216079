//! Logging: plain or JSON lines on stderr, filtered by an EnvFilter expression. Colour only on a
//! terminal, never with `NO_COLOR` (<https://no-color.org>).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written on stderr (`--log-format`: plain lines, coloured on a terminal, or
/// one JSON object per line). No doc comment on the variants: clap would print them in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

/// Whether stderr may carry ANSI colour: a terminal, and `NO_COLOR` unset or empty.
pub fn colour_allowed() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Targets whose own log lines a one-shot command (`report`, `capture`, `showback`) turns off:
/// kube's client (and the TLS certificate verifier under it) log a failed request at ERROR
/// before returning the error, which the command then prints once as its one-line error with
/// the cause chain.
pub const CLI_QUIET_TARGETS: &[&str] = &["kube_client", "kube_runtime", "rustls_platform_verifier"];

/// Installs the global subscriber. An invalid filter falls back to `info` with a warning.
pub fn init(format: LogFormat, filter: &str) {
    init_quiet(format, filter, &[]);
}

/// [`init`], with the log lines of `quiet` targets off unless `filter` names the target (a
/// user who asks for `kube_client=debug` gets it).
pub fn init_quiet(format: LogFormat, filter: &str, quiet: &[&str]) {
    let (mut env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    for target in quiet.iter().filter(|t| !filter.contains(**t)) {
        if let Ok(directive) = format!("{target}=off").parse() {
            env_filter = env_filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.with_ansi(colour_allowed()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    if let Some(e) = bad {
        tracing::warn!(
            filter,
            error = &e as &dyn std::error::Error,
            "invalid log filter; using info"
        );
    }
}

/// "a: b: c" for an error and its sources, each cause once: kube's and other errors often
/// repeat their source inside their own message, so a source whose text is already in the line
/// is left out.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = cause_text(e);
    let mut cur = next_cause(e);
    while let Some(c) = cur {
        let part = cause_text(c);
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = next_cause(c);
    }
    s
}

/// The source of `e`, except under kube's API error: its source is the `Status` that
/// [`cause_text`] has already said.
fn next_cause<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    match e.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(_)) => None,
        _ => e.source(),
    }
}

/// One cause's text. kube's API error prints its whole `Status` with `{:?}` ("ApiError:
/// forbidden: … (Status { status: Some(Failure), code: 403, … })"): said instead as the HTTP
/// code, reason and the API server's message, which is what a user acts on.
fn cause_text(e: &(dyn std::error::Error + 'static)) -> String {
    match e.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) => {
            let reason = if status.reason.is_empty() {
                String::new()
            } else {
                format!(" {}", status.reason)
            };
            format!(
                "the Kubernetes API answered {}{reason}: {}",
                status.code, status.message
            )
        }
        _ => e.to_string(),
    }
}

/// Reports the error that ends the process: `error: a: b: c` on stderr in the plain format, one
/// JSON log line (`level` `ERROR`, `message`, `error`, `exit_code`) in the JSON format, so a log
/// pipeline that parses every line as JSON also parses the last one.
pub fn fatal(format: LogFormat, chain: &str, exit_code: u8) {
    match format {
        LogFormat::Plain => eprintln!("error: {chain}"),
        LogFormat::Json => {
            let line = serde_json::json!({
                "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "level": "ERROR",
                "message": "gpu-ledger stopped",
                "error": chain,
                "exit_code": exit_code,
                "target": "gpu_ledger",
            });
            eprintln!("{line}");
        }
    }
}
