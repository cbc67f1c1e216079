//! Logging: plain or JSON lines on stderr, filtered by an EnvFilter expression. Colour only on a
//! terminal, never with `NO_COLOR` (<https://no-color.org>).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Whether stderr may carry ANSI colour: a terminal, and `NO_COLOR` unset or empty.
pub fn colour_allowed() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Installs the global subscriber. An invalid filter falls back to `info` with a warning.
pub fn init(format: LogFormat, filter: &str) {
    let (env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
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
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
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
