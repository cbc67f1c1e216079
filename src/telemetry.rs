//! Logging: plain or JSON lines on stderr, filtered by an EnvFilter expression.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

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
        LogFormat::Plain => builder.init(),
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
