//! The one error of the Prometheus source ([`PromError`]), raised by the client (transport,
//! status, settings, the body's size), the decoders (a malformed answer or one over a bound) and
//! the live source (several clusters, a partial answer where a complete one is needed).

use std::fmt::Write as _;

use super::bounds::{MAX_ANSWER_BYTES, OVER_BOUND};
use super::envelope::Warnings;

/// A failed query. Causes are kept as sources (printed once, by whoever reports the chain); a
/// transport error's URL is removed before it is kept, since the configured URL may carry
/// `user:password` and must reach no log and no readiness reason.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    /// The request or the answer's body failed in transit (the URL removed from the cause).
    #[error("prometheus transport error")]
    Transport(#[source] reqwest::Error),
    #[error("prometheus answered HTTP {code} ({error_type}): {message}")]
    Status {
        code: u16,
        error_type: String,
        message: String,
    },
    /// The answer is not the JSON of a query answer.
    #[error("cannot decode prometheus answer")]
    Decode(#[source] DecodeMessage),
    /// The answer is not JSON at all (a web page, a login form): the URL is probably not a
    /// Prometheus API. `answer` says its content type and how its body starts, sanitized and
    /// short (never the whole page).
    #[error("not a Prometheus API answer (HTTP {code}, {answer}): check --prometheus-url")]
    NotPrometheus { code: u16, answer: String },
    /// The answer decoded but is not what the query asks for (its type, a series without a
    /// name, a bad sample value).
    #[error("cannot decode prometheus answer: {0}")]
    Unexpected(String),
    #[error("prometheus query failed ({error_type}): {error}")]
    Api { error_type: String, error: String },
    #[error("prometheus query timed out")]
    Timeout,
    /// A client setting cannot be used: `what` names the setting (and its file), the source why.
    #[error("prometheus client setup: {what}")]
    Config {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// DCGM series of several clusters answer the queries (a shared Thanos, Mimir or
    /// VictoriaMetrics) and no `--prometheus-selector` narrows them to this cluster's: joining
    /// them would give this cluster's pods another cluster's GPUs.
    #[error(
        "DCGM series of {} clusters are visible ({}): set --prometheus-selector to this cluster's, e.g. {}",
        clusters.len(),
        clusters.join(", "),
        clusters.first().map_or("cluster=\"…\"", String::as_str)
    )]
    SeveralClusters { clusters: Vec<String> },
    /// The answer's body exceeds [`MAX_ANSWER_BYTES`].
    #[error("prometheus answer refused: larger than {MAX_ANSWER_BYTES} bytes")]
    BodyTooLarge,
    /// Something in the answer exceeds a bound ([`super::bounds`]); the source says which.
    #[error("prometheus answer refused")]
    TooLarge(#[source] DecodeMessage),
    /// The answer carried warnings (a partial response), where a complete one is needed.
    #[error("prometheus answered partially ({} warnings, first: {})", .0.count, .0.first())]
    Partial(Warnings),
}

impl PromError {
    /// Short, fixed label value for error counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transport(_) => "transport",
            Self::Status { .. } => "status",
            Self::Decode(_) | Self::Unexpected(_) | Self::NotPrometheus { .. } => "decode",
            Self::Api { .. } => "api",
            Self::Timeout => "timeout",
            Self::Config { .. } => "config",
            Self::SeveralClusters { .. } => "several_clusters",
            Self::BodyTooLarge | Self::TooLarge(_) => "too_large",
            Self::Partial(_) => "partial",
        }
    }

    /// A failed request: a timeout, or a transport error without its URL.
    pub(super) fn from_reqwest(e: reqwest::Error) -> Self {
        if e.is_timeout() {
            Self::Timeout
        } else {
            Self::Transport(e.without_url())
        }
    }

    /// A setting that cannot be used, and why.
    pub(super) fn config(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Config {
            what: what.into(),
            source: source.into(),
        }
    }

    /// An answer that JSON decoding refused: over a bound ([`OVER_BOUND`] in the
    /// message) or malformed.
    pub(super) fn decoding(e: &serde_json::Error) -> Self {
        let message = e.to_string();
        if message.contains(OVER_BOUND) {
            Self::TooLarge(DecodeMessage::cut(message))
        } else {
            Self::Decode(DecodeMessage::cut(message))
        }
    }
}

/// Bytes kept of a decoding error's message.
const MAX_DECODE_MESSAGE_BYTES: usize = 512;

/// Why JSON decoding refused an answer, cut to [`MAX_DECODE_MESSAGE_BYTES`]: serde repeats an
/// offending string whole ("invalid type: string \"…\""), and an answer may be 256 MiB, so
/// one hostile value would otherwise reach every log line and readiness reason whole.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeMessage(String);

impl DecodeMessage {
    fn cut(mut message: String) -> Self {
        if message.len() > MAX_DECODE_MESSAGE_BYTES {
            let mut end = MAX_DECODE_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            let omitted = message.len() - end;
            message.truncate(end);
            let _ = write!(message, "… ({omitted} bytes omitted)");
        }
        Self(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// serde names a refused string whole; a megabyte of it must not reach the logs.
    #[test]
    fn a_decoding_error_names_a_huge_value_in_a_bounded_message() {
        let huge = format!(
            r#"{{"status":"success","warnings":"{}"}}"#,
            "é".repeat(500_000)
        );
        let e = serde_json::from_str::<super::super::envelope::ApiResponse<serde::de::IgnoredAny>>(
            &huge,
        )
        .expect_err("warnings must be a list");
        assert!(
            e.to_string().len() > 1_000_000,
            "serde repeats the value whole"
        );
        let refused = PromError::decoding(&e);
        let cause = std::error::Error::source(&refused)
            .expect("a cause")
            .to_string();
        assert!(cause.len() < 600, "{} bytes", cause.len());
        assert!(cause.starts_with("invalid type: string"), "{cause}");
        assert!(cause.ends_with("bytes omitted)"), "{cause}");
        assert_eq!(refused.kind(), "decode");
    }

    #[test]
    fn kinds_are_fixed_labels() {
        assert_eq!(PromError::Timeout.kind(), "timeout");
        assert_eq!(PromError::BodyTooLarge.kind(), "too_large");
        assert_eq!(PromError::Unexpected("x".into()).kind(), "decode");
    }
}
