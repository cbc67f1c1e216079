//! Live Prometheus client.
//!
//! A refresh asks one question whatever the number of pods or devices: the raw samples of the
//! DCGM fields gpu-ledger reads since the previous refresh ([`PromClient::window_series`], a
//! range-vector selector: Prometheus only reads chunks, it evaluates nothing per step). The
//! samples are reduced by the same [`super::series::reduce`] as an offline dump, so live and
//! offline conclusions cannot differ. The one-off start-up history query
//! ([`queries::bootstrap_query`]) is the only aggregating query.
//!
//! Answers are untrusted: their size is bounded ([`MAX_ANSWER_BYTES`]), and so is what decoding
//! may build from them (label names and values [`MAX_LABEL_BYTES`], labels per series
//! [`MAX_LABELS_PER_SERIES`], series per answer [`MAX_SERIES`]), checked before anything is
//! copied out of the body: an answer over a bound is refused whole ([`PromError::TooLarge`]).
//! Values are parsed strictly, and an unexpected answer type is an error, never an empty result.
//! `warnings` (a partial answer: Thanos or Mimir missed a store) are counted, logged
//! (truncated) and reported ([`Answered`]); a partial answer never proves a device idle.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use std::sync::Arc;

use super::scheme::READ_LABELS;
use super::series::{Labels, Series};

pub mod queries;

use queries::range_selector;
pub use queries::{FIELD_LABEL, STAT_LABEL};

/// Largest answer accepted (bytes). 4,000 GPUs × 3 fields × 10 minutes of samples with full label
/// sets is about 15 MB; an answer 20 times that size is a misconfiguration (or a hostile
/// endpoint), not telemetry.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Longest label name or value accepted (bytes). Kubernetes names are at most 253 bytes, label
/// values 63, GPU UUIDs 40, driver versions and model names a few dozen: a longer one is not
/// telemetry, and one 200 MiB value took `serve` to a 1.84 GB peak (issue 22). A value over it
/// refuses the whole answer (not the series): answers are already all or nothing for a bad
/// sample value, and a dropped series would silently hide a device.
pub const MAX_LABEL_BYTES: usize = 4096;

/// Most labels on one series. dcgm-exporter writes about 15, service discovery adds a handful;
/// Mimir refuses to ingest more than 30 by default.
pub const MAX_LABELS_PER_SERIES: usize = 256;

/// Most series (or vector samples) in one answer. The largest cluster Kubernetes supports (5,000
/// nodes) of 8-GPU nodes split into 7 MIG instances each has 280,000 devices: 840,000 series
/// for the three fields read. Every series is held for the window, so more would not fit
/// anyway; a shared Thanos answering for many clusters wants `--prometheus-selector`.
pub const MAX_SERIES: usize = 1_000_000;

/// Warnings kept per answer for the log (all are counted), and the bytes kept of each one and
/// of an error message.
const KEPT_WARNINGS: usize = 4;
const MAX_MESSAGE_BYTES: usize = 512;

/// Marks a decoding error as a bound being exceeded ([`PromError::TooLarge`]).
const OVER_BOUND: &str = "answer over gpu-ledger's bounds";

/// Connection settings for the Prometheus HTTP API.
#[derive(Debug, Clone)]
pub struct PromConfig {
    /// Base URL, e.g. `http://prometheus:9090/` (a path prefix is kept).
    pub url: reqwest::Url,
    /// File holding a bearer token, re-read for every batch of requests (tokens rotate).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM bundle of extra CAs to trust.
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Extra label matchers on every DCGM selector (`--prometheus-selector`), e.g. one
    /// cluster's or one job's series in a shared Prometheus or Thanos.
    pub selector: Option<Selector>,
    /// Extra headers on every request (`--prometheus-header`), e.g. Mimir's or Cortex'
    /// tenant `X-Scope-OrgID`.
    pub headers: Vec<Header>,
}

/// One `--prometheus-header` (`Name: value`), validated as an HTTP header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: String,
}

impl std::str::FromStr for Header {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, value) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected `Name: value`"))?;
        let (name, value) = (name.trim(), value.trim());
        reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a valid header name"))?;
        reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of {name} is not a valid header value"))?;
        if name.eq_ignore_ascii_case("authorization") {
            return Err(
                "set the Authorization header with --prometheus-bearer-token-file (re-read, never logged)".into(),
            );
        }
        Ok(Header {
            name: name.to_string(),
            value: value.to_string(),
        })
    }
}

/// A validated list of label matchers (`cluster="prod",job=~"dcgm.*"`), safe to splice into a
/// selector: each is `name op "value"` with a Prometheus label name, one of `=`, `!=`, `=~`,
/// `!~`, and a double-quoted value with `\`-escapes only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(String);

impl Selector {
    /// The matchers, comma-separated, as given (whitespace around them trimmed).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Selector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut rest = s.trim();
        let mut out = Vec::new();
        while !rest.is_empty() {
            let name_len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..name_len];
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(format!("{s:?}: expected a label name at {rest:?}"));
            }
            let after = rest[name_len..].trim_start();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| after.starts_with(op))
                .ok_or_else(|| format!("{s:?}: expected =, !=, =~ or !~ after {name}"))?;
            let value = after[op.len()..].trim_start();
            let body = value
                .strip_prefix('"')
                .ok_or_else(|| format!("{s:?}: the value of {name} must be double-quoted"))?;
            let mut end = None;
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, '\n') => break,
                    _ => {}
                }
            }
            let end = end.ok_or_else(|| format!("{s:?}: unterminated value of {name}"))?;
            out.push(format!("{name}{op}\"{}\"", &body[..end]));
            rest = body[end + 1..].trim_start();
            if let Some(r) = rest.strip_prefix(',') {
                rest = r.trim_start();
                if rest.is_empty() {
                    return Err(format!("{s:?}: trailing comma"));
                }
            } else if !rest.is_empty() {
                return Err(format!("{s:?}: expected a comma before {rest:?}"));
            }
        }
        if out.is_empty() {
            return Err("empty selector".into());
        }
        Ok(Selector(out.join(",")))
    }
}

impl Selector {
    /// The matchers, parsed for evaluation against a series' labels: the offline report applies
    /// `--prometheus-selector` to a dump as Prometheus applies it to a query.
    pub fn matchers(&self) -> Result<Vec<Matcher>, String> {
        let mut out = Vec::new();
        let mut rest = self.0.as_str();
        // `as_str` is canonical (`name op "value"`, comma-separated; validated by `from_str`).
        while !rest.is_empty() {
            let op_at = rest
                .find(['=', '!'])
                .ok_or_else(|| format!("{}: no operator", self.0))?;
            let name = &rest[..op_at];
            let (op, len) = if rest[op_at..].starts_with("=~") {
                (MatchOp::Re, 2)
            } else if rest[op_at..].starts_with("!~") {
                (MatchOp::NotRe, 2)
            } else if rest[op_at..].starts_with("!=") {
                (MatchOp::Ne, 2)
            } else {
                (MatchOp::Eq, 1)
            };
            let body = &rest[op_at + len + 1..];
            let mut value = String::new();
            let mut end = None;
            let mut chars = body.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, 't')) => value.push('\t'),
                        Some((_, e)) => value.push(e),
                        None => {}
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let end = end.ok_or_else(|| format!("{}: unterminated value", self.0))?;
            let regex = match op {
                MatchOp::Re | MatchOp::NotRe => Some(
                    // Prometheus anchors label regexes at both ends.
                    regex::Regex::new(&format!("^(?:{value})$"))
                        .map_err(|e| format!("{}: regex of {name}: {e}", self.0))?,
                ),
                MatchOp::Eq | MatchOp::Ne => None,
            };
            out.push(Matcher {
                name: name.to_string(),
                op,
                value,
                regex,
            });
            rest = body[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&body[end + 1..]);
        }
        Ok(out)
    }
}

/// How a [`Matcher`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Eq,
    Ne,
    Re,
    NotRe,
}

/// One label matcher of a [`Selector`], evaluated as Prometheus does: an absent label has the
/// empty value.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<regex::Regex>,
}

impl Matcher {
    /// Whether a series with `value` (None: the label is absent) passes.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let v = value.unwrap_or("");
        match (self.op, &self.regex) {
            (MatchOp::Eq, _) => v == self.value,
            (MatchOp::Ne, _) => v != self.value,
            (MatchOp::Re, Some(r)) => r.is_match(v),
            (MatchOp::NotRe, Some(r)) => !r.is_match(v),
            (MatchOp::Re | MatchOp::NotRe, None) => false,
        }
    }
}

/// Labels that name the cluster a series came from in a metrics store shared by several
/// clusters: `cluster` (kubernetes-mixin, kube-prometheus-stack's external labels, Thanos and
/// Mimir docs) and `cluster_id` (OpenCost).
pub const CLUSTER_LABELS: &[&str] = &["cluster", "cluster_id"];

/// The distinct cluster names among `labels` (per [`CLUSTER_LABELS`], `name=value`), sorted;
/// a series without any cluster label counts as `(none)`. More than one entry means the
/// series come from several clusters and must not be joined to this cluster's pods.
pub fn clusters_of<'a>(
    labels: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, String>>,
) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut unlabelled = false;
    for l in labels {
        let mut named = false;
        for name in CLUSTER_LABELS {
            if let Some(v) = l.get(*name) {
                seen.insert(format!("{name}={v:?}"));
                named = true;
            }
        }
        unlabelled |= !named;
    }
    if unlabelled && !seen.is_empty() {
        seen.insert("(none)".to_string());
    }
    seen.into_iter().collect()
}

/// A failed query.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("prometheus transport error: {0}")]
    Transport(String),
    #[error("prometheus answered HTTP {code} ({error_type}): {message}")]
    Status {
        code: u16,
        error_type: String,
        message: String,
    },
    #[error("cannot decode prometheus answer: {0}")]
    Decode(String),
    #[error("prometheus query failed ({error_type}): {error}")]
    Api { error_type: String, error: String },
    #[error("prometheus query timed out")]
    Timeout,
    #[error("prometheus client setup: {0}")]
    Config(String),
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
    /// The answer, or something in it, exceeds a bound ([`MAX_ANSWER_BYTES`],
    /// [`MAX_LABEL_BYTES`], [`MAX_LABELS_PER_SERIES`], [`MAX_SERIES`]).
    #[error("prometheus answer refused: {0}")]
    TooLarge(String),
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
            Self::Decode(_) => "decode",
            Self::Api { .. } => "api",
            Self::Timeout => "timeout",
            Self::Config(_) => "config",
            Self::SeveralClusters { .. } => "several_clusters",
            Self::TooLarge(_) => "too_large",
            Self::Partial(_) => "partial",
        }
    }

    fn from_reqwest(e: &reqwest::Error) -> Self {
        if e.is_timeout() {
            Self::Timeout
        } else {
            Self::Transport(without_url(e))
        }
    }
}

/// Error text without the URL (which may carry credentials in userinfo).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = String::new();
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    let url = e.url().map(ToString::to_string);
    while let Some(err) = cur {
        let mut t = err.to_string();
        if let Some(u) = &url {
            t = t.replace(u.as_str(), "<prometheus>");
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&t);
        cur = err.source();
    }
    s
}

/// `/api/v1/query` envelope; `data` decodes as `D` ([`QueryData`], or [`WindowData`] for the
/// window's range-vector answers).
/// Strings of the envelope (`status`, `errorType`, `error`, each warning) are cut to
/// [`MAX_MESSAGE_BYTES`].
#[derive(Debug, Clone, Deserialize)]
pub struct ApiResponse<D = QueryData> {
    #[serde(deserialize_with = "truncated")]
    pub status: String,
    #[serde(default = "none")]
    pub data: Option<D>,
    #[serde(default, rename = "errorType", deserialize_with = "truncated_opt")]
    pub error_type: Option<String>,
    #[serde(default, deserialize_with = "truncated_opt")]
    pub error: Option<String>,
    #[serde(default)]
    pub warnings: Warnings,
}

/// The `warnings` of an answer: how many, and the first few, truncated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Warnings {
    pub count: usize,
    /// At most [`KEPT_WARNINGS`], each at most [`MAX_MESSAGE_BYTES`].
    pub kept: Vec<String>,
}

impl Warnings {
    /// The first warning (truncated), or "" when there is none.
    pub fn first(&self) -> &str {
        self.kept.first().map_or("", String::as_str)
    }
}

impl<'de> Deserialize<'de> for Warnings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Warnings;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of warning strings")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Warnings, E> {
                Ok(Warnings::default())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Warnings, A::Error> {
                let mut w = Warnings::default();
                while let Some(Truncated(text)) = seq.next_element()? {
                    w.count = w.count.saturating_add(1);
                    if w.kept.len() < KEPT_WARNINGS {
                        w.kept.push(text);
                    }
                }
                Ok(w)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// A string cut to [`MAX_MESSAGE_BYTES`] (at a character boundary) before it is copied.
struct Truncated(String);

impl<'de> Deserialize<'de> for Truncated {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Truncated;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Truncated, E> {
                Ok(Truncated(truncate(v, MAX_MESSAGE_BYTES).to_string()))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn truncated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Truncated::deserialize(d).map(|t| t.0)
}

fn truncated_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<Truncated>::deserialize(d).map(|t| t.map(|t| t.0))
}

fn over_bound<E: serde::de::Error>(what: std::fmt::Arguments<'_>) -> E {
    E::custom(format_args!("{OVER_BOUND}: {what}"))
}

/// A label name or value (or a sample value string) of at most [`MAX_LABEL_BYTES`], refused
/// before it is copied out of the body.
struct Bounded(String);

impl<'de> Deserialize<'de> for Bounded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |v| Bounded(v.to_string()))
    }
}

/// A label value that is checked against [`MAX_LABEL_BYTES`] and dropped (no allocation).
struct BoundedIgnored;

impl<'de> Deserialize<'de> for BoundedIgnored {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |_| BoundedIgnored)
    }
}

/// Deserialises a string, refused over [`MAX_LABEL_BYTES`], into `keep(it)`.
fn checked_str<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    keep: fn(&str) -> T,
) -> Result<T, D::Error> {
    struct Visit<T>(fn(&str) -> T);
    impl<T> serde::de::Visitor<'_> for Visit<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            if v.len() > MAX_LABEL_BYTES {
                return Err(over_bound(format_args!(
                    "a string of {} bytes (at most {MAX_LABEL_BYTES})",
                    v.len()
                )));
            }
            Ok((self.0)(v))
        }
    }
    d.deserialize_str(Visit(keep))
}

/// The labels of a series, each name and value bounded, at most [`MAX_LABELS_PER_SERIES`].
fn bounded_labels<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Labels;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a label map")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
            let mut labels = Labels::new();
            let mut seen = 0_usize;
            while let Some(Bounded(name)) = map.next_key()? {
                seen = count_label(seen)?;
                let Bounded(value) = map.next_value()?;
                labels.insert(name, value);
            }
            Ok(labels)
        }
    }
    d.deserialize_map(Visit)
}

/// One more label on a series: refused past [`MAX_LABELS_PER_SERIES`].
fn count_label<E: serde::de::Error>(seen: usize) -> Result<usize, E> {
    if seen >= MAX_LABELS_PER_SERIES {
        return Err(over_bound(format_args!(
            "a series with more than {MAX_LABELS_PER_SERIES} labels"
        )));
    }
    Ok(seen + 1)
}

/// A sample `[time, "value"]`, the value string bounded.
fn bounded_point<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(f64, String), D::Error> {
    let (t, Bounded(v)) = Deserialize::deserialize(d)?;
    Ok((t, v))
}

fn bounded_points<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(f64, String)>, D::Error> {
    let points: Vec<(f64, Bounded)> = Deserialize::deserialize(d)?;
    Ok(points.into_iter().map(|(t, v)| (t, v.0)).collect())
}

/// The `result` list of an answer: at most `MAX` elements (series or vector samples), refused
/// at the first one over.
struct SeriesList<T, const MAX: usize = MAX_SERIES>(Vec<T>);

impl<'de, T: Deserialize<'de>, const MAX: usize> Deserialize<'de> for SeriesList<T, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T, const MAX: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const MAX: usize> serde::de::Visitor<'de> for Visit<T, MAX> {
            type Value = SeriesList<T, MAX>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of series")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SeriesList<T, MAX>, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element()? {
                    if out.len() >= MAX {
                        return Err(over_bound(format_args!("more than {MAX} series")));
                    }
                    out.push(x);
                }
                Ok(SeriesList(out))
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// `resultType` of an answer's `data`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ResultType {
    Vector,
    Scalar,
    String,
    Matrix,
}

/// A key of an answer's `data`.
#[derive(Deserialize)]
#[serde(field_identifier)]
enum DataKey {
    #[serde(rename = "resultType")]
    ResultType,
    #[serde(rename = "result")]
    Result,
    #[serde(other)]
    Other,
}

/// Decodes `result` once its `resultType` is known.
trait FromResult: Sized {
    fn result<'de, D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error>;
}

/// [`FromResult`] as a seed, for `MapAccess::next_value_seed`.
struct ResultSeed<T>(ResultType, std::marker::PhantomData<T>);

impl<'de, T: FromResult> serde::de::DeserializeSeed<'de> for ResultSeed<T> {
    type Value = T;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::result(self.0, d)
    }
}

/// An answer's `data`, decoded by its `resultType` straight into the bounded decoders. Prometheus,
/// Thanos, Mimir and VictoriaMetrics write `resultType` first; a proxy that re-encodes with
/// sorted keys puts `result` first, and serde's derived adjacently tagged enum would then buffer
/// it into a generic tree many times the size of its text before any bound applies. Here it is
/// kept as its raw text instead (one copy, at most the body) and decoded once the type is known.
fn data_in_order<'de, D: serde::Deserializer<'de>, T: FromResult>(d: D) -> Result<T, D::Error> {
    struct Visit<T>(std::marker::PhantomData<T>);
    impl<'de, T: FromResult> serde::de::Visitor<'de> for Visit<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an answer's data: resultType and result")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            use serde::de::Error;
            let mut kind: Option<ResultType> = None;
            let mut out = None;
            let mut early: Option<Box<serde_json::value::RawValue>> = None;
            while let Some(key) = map.next_key()? {
                match key {
                    DataKey::ResultType if kind.is_none() => kind = Some(map.next_value()?),
                    DataKey::Result if out.is_none() && early.is_none() => match kind {
                        Some(kind) => {
                            out = Some(
                                map.next_value_seed(ResultSeed(kind, std::marker::PhantomData))?,
                            );
                        }
                        None => early = Some(map.next_value()?),
                    },
                    DataKey::ResultType => return Err(A::Error::duplicate_field("resultType")),
                    DataKey::Result => return Err(A::Error::duplicate_field("result")),
                    DataKey::Other => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            if let Some(out) = out {
                return Ok(out);
            }
            let raw = early.ok_or_else(|| A::Error::missing_field("result"))?;
            let kind = kind.ok_or_else(|| A::Error::missing_field("resultType"))?;
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let out = T::result(kind, &mut de).map_err(A::Error::custom)?;
            de.end().map_err(A::Error::custom)?;
            Ok(out)
        }
    }
    d.deserialize_map(Visit(std::marker::PhantomData))
}

/// `data` of a query answer. Values are strings (`"0.5"`, `"NaN"`, `"+Inf"`); times float seconds.
#[derive(Debug, Clone)]
pub enum QueryData {
    Vector(Vec<RawVectorSample>),
    Scalar((f64, String)),
    String((f64, String)),
    Matrix(Vec<RawMatrixSeries>),
}

impl FromResult for QueryData {
    fn result<'de, D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error> {
        let point = |(t, Bounded(v)): (f64, Bounded)| (t, v);
        Ok(match kind {
            ResultType::Vector => Self::Vector(SeriesList::<_>::deserialize(d)?.0),
            ResultType::Scalar => Self::Scalar(point(Deserialize::deserialize(d)?)),
            ResultType::String => Self::String(point(Deserialize::deserialize(d)?)),
            ResultType::Matrix => Self::Matrix(SeriesList::<_>::deserialize(d)?.0),
        })
    }
}

impl<'de> Deserialize<'de> for QueryData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        data_in_order(d)
    }
}

/// One element of a vector answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RawVectorSample {
    #[serde(default, deserialize_with = "bounded_labels")]
    pub metric: Labels,
    #[serde(deserialize_with = "bounded_point")]
    pub value: (f64, String),
}

/// One element of a matrix answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RawMatrixSeries {
    #[serde(default, deserialize_with = "bounded_labels")]
    pub metric: Labels,
    #[serde(deserialize_with = "bounded_points")]
    pub values: Vec<(f64, String)>,
}

fn none<D>() -> Option<D> {
    None
}

/// `data` of a range-vector answer as the sample window reads it. Each row keeps only `__name__`
/// and the labels the reduction reads ([`READ_LABELS`]); every other label, and each sample's
/// value string, is decoded without an allocation. A profile of the live refresh put a quarter
/// of its CPU in building full label maps that the window then cut down (docs/benchmarks.md).
/// The bounds are the full decoder's: both refuse the same answers.
#[derive(Debug)]
pub enum WindowData {
    Matrix(Vec<WindowRow>),
    /// Any other result type (an error once read as series).
    Other,
}

impl FromResult for WindowData {
    fn result<'de, D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error> {
        Ok(match kind {
            ResultType::Matrix => Self::Matrix(SeriesList::<_>::deserialize(d)?.0),
            ResultType::Vector | ResultType::Scalar | ResultType::String => {
                serde::de::IgnoredAny::deserialize(d)?;
                Self::Other
            }
        })
    }
}

impl<'de> Deserialize<'de> for WindowData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        data_in_order(d)
    }
}

/// One series of a [`WindowData`] answer.
#[derive(Debug, Deserialize)]
pub struct WindowRow {
    #[serde(default)]
    metric: ReadLabels,
    values: Vec<(f64, PromValue)>,
}

/// The labels of a series that the window keeps: `__name__` and [`READ_LABELS`], non-empty.
#[derive(Debug, Default)]
struct ReadLabels(Labels);

impl<'de> Deserialize<'de> for ReadLabels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ReadLabels;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ReadLabels, A::Error> {
                let mut labels = Labels::new();
                let mut seen = 0_usize;
                while let Some(LabelName(kept)) = map.next_key()? {
                    seen = count_label(seen)?;
                    match kept {
                        Some(name) => {
                            let Bounded(value) = map.next_value()?;
                            if !value.is_empty() {
                                labels.insert(name.to_string(), value);
                            }
                        }
                        None => {
                            map.next_value::<BoundedIgnored>()?;
                        }
                    }
                }
                Ok(ReadLabels(labels))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A label name, resolved to its static spelling when the window keeps it (no allocation).
struct LabelName(Option<&'static str>);

impl<'de> Deserialize<'de> for LabelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = LabelName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LabelName, E> {
                if v.len() > MAX_LABEL_BYTES {
                    return Err(over_bound(format_args!(
                        "a label name of {} bytes (at most {MAX_LABEL_BYTES})",
                        v.len()
                    )));
                }
                Ok(LabelName(
                    std::iter::once(&NAME_LABEL)
                        .chain(READ_LABELS)
                        .find(|k| **k == v)
                        .copied(),
                ))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A sample value parsed straight from its string ([`parse_value`]); a bad one fails the answer.
#[derive(Debug, Clone, Copy)]
struct PromValue(f64);

impl<'de> Deserialize<'de> for PromValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = PromValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sample value string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PromValue, E> {
                if v.len() > MAX_LABEL_BYTES {
                    return Err(over_bound(format_args!(
                        "a sample value of {} bytes (at most {MAX_LABEL_BYTES})",
                        v.len()
                    )));
                }
                parse_value(v)
                    .map(PromValue)
                    .ok_or_else(|| E::custom(format!("bad sample value {v:?}")))
            }
        }
        d.deserialize_str(Visit)
    }
}

const NAME_LABEL: &str = "__name__";

impl WindowData {
    /// The rows as [`Series`]: named by `__name__`, times in milliseconds.
    pub fn into_series(self) -> Result<Vec<Series>, PromError> {
        let Self::Matrix(rows) = self else {
            return Err(not_a_matrix());
        };
        rows.into_iter()
            .map(|row| {
                let mut labels = row.metric.0;
                let name = take_name(&mut labels)?;
                Ok(Series {
                    name,
                    labels: Arc::new(labels),
                    samples: row
                        .values
                        .into_iter()
                        .map(|(t, v)| (secs_to_ms(t), v.0))
                        .collect(),
                })
            })
            .collect()
    }
}

/// A decoded instant-query sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    /// Evaluation (or sample) time in Unix seconds.
    pub time: f64,
    pub value: f64,
}

/// Parses a Prometheus sample value string (`"0.5"`, `"NaN"`, `"+Inf"`, `"-Inf"`, `"-0"`).
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

/// One matrix answer row as a [`Series`]: the metric name out of the labels, values parsed,
/// The metric name of an answer series, taken out of its labels.
fn take_name(labels: &mut Labels) -> Result<String, PromError> {
    labels
        .remove(NAME_LABEL)
        .ok_or_else(|| PromError::Decode("matrix series without __name__".into()))
}

fn not_a_matrix() -> PromError {
    PromError::Decode("expected a matrix answer to a range-vector selector".into())
}

/// times in milliseconds.
fn series_of_matrix_row(row: RawMatrixSeries) -> Result<Series, PromError> {
    let mut labels = row.metric;
    let name = take_name(&mut labels)?;
    labels.retain(|_, v| !v.is_empty());
    let labels = Arc::new(labels);
    let samples = row
        .values
        .into_iter()
        .map(|(t, v)| {
            let value = parse_value(&v)
                .ok_or_else(|| PromError::Decode(format!("bad sample value {v:?}")))?;
            Ok((secs_to_ms(t), value))
        })
        .collect::<Result<Vec<_>, PromError>>()?;
    Ok(Series {
        name,
        labels,
        samples,
    })
}

impl QueryData {
    /// A matrix answer as [`Series`], every label kept (empty values dropped).
    pub fn into_series(self) -> Result<Vec<Series>, PromError> {
        let Self::Matrix(rows) = self else {
            return Err(not_a_matrix());
        };
        rows.into_iter().map(series_of_matrix_row).collect()
    }

    /// Vector and scalar answers as samples (a scalar becomes one label-less sample).
    pub fn into_samples(self) -> Result<Vec<Sample>, PromError> {
        let point = |labels: Labels, (t, v): (f64, String)| {
            let value = parse_value(&v)
                .ok_or_else(|| PromError::Decode(format!("bad sample value {v:?}")))?;
            Ok(Sample {
                labels,
                time: t,
                value,
            })
        };
        match self {
            Self::Vector(v) => v.into_iter().map(|s| point(s.metric, s.value)).collect(),
            Self::Scalar(p) => Ok(vec![point(Labels::new(), p)?]),
            Self::String(_) => Err(PromError::Decode(
                "string result where a vector was expected".into(),
            )),
            Self::Matrix(_) => Err(PromError::Decode(
                "matrix result where a vector was expected".into(),
            )),
        }
    }
}

/// Counters of one refresh.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueryStats {
    /// HTTP queries sent.
    pub queries: u32,
    pub duration: Duration,
    /// Warnings in answers since the previous refresh (any query of the client).
    pub warnings: u64,
}

/// A decoded answer and the warnings Prometheus attached to it.
#[derive(Debug)]
pub struct Answered<T> {
    pub value: T,
    /// Non-empty for a partial answer (Thanos or Mimir missed a store, a remote read failed):
    /// what it holds is true, but something may be missing, so it proves no device idle.
    pub warnings: Warnings,
}

impl<T> Answered<T> {
    pub fn is_partial(&self) -> bool {
        self.warnings.count > 0
    }

    /// The value of a complete answer; a partial one is [`PromError::Partial`].
    pub fn complete(self) -> Result<T, PromError> {
        if self.is_partial() {
            return Err(PromError::Partial(self.warnings));
        }
        Ok(self.value)
    }

    fn map<U>(self, f: impl FnOnce(T) -> Result<U, PromError>) -> Result<Answered<U>, PromError> {
        Ok(Answered {
            value: f(self.value)?,
            warnings: self.warnings,
        })
    }
}

/// Prometheus HTTP API client.
#[derive(Debug)]
pub struct PromClient {
    http: reqwest::Client,
    query_url: reqwest::Url,
    token_file: Option<PathBuf>,
    /// `,matchers` appended inside every DCGM selector (empty without `--prometheus-selector`).
    matchers: String,
    /// Warnings in answers since [`Self::take_warnings`] last read them.
    warnings: AtomicU64,
}

impl PromClient {
    pub fn new(cfg: PromConfig) -> Result<Self, PromError> {
        let mut b = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .use_rustls_tls();
        if let Some(ca) = &cfg.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| PromError::Config(format!("reading CA file {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| PromError::Config(format!("parsing CA file {}: {e}", ca.display())))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if cfg.insecure_skip_verify {
            b = b.danger_accept_invalid_certs(true);
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for h in &cfg.headers {
            let name = reqwest::header::HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|e| PromError::Config(format!("header {:?}: {e}", h.name)))?;
            let mut value = reqwest::header::HeaderValue::from_str(&h.value)
                .map_err(|e| PromError::Config(format!("value of header {}: {e}", h.name)))?;
            // Tenant ids are not secrets, but keep header values out of debug output anyway.
            value.set_sensitive(true);
            headers.append(name, value);
        }
        b = b.default_headers(headers);
        let http = b.build().map_err(|e| PromError::Config(without_url(&e)))?;
        let mut base = cfg.url;
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let query_url = base
            .join("api/v1/query")
            .map_err(|e| PromError::Config(format!("bad prometheus URL: {e}")))?;
        Ok(Self {
            http,
            query_url,
            token_file: cfg.bearer_token_file,
            matchers: cfg
                .selector
                .map(|s| format!(",{}", s.as_str()))
                .unwrap_or_default(),
            warnings: AtomicU64::new(0),
        })
    }

    /// Warnings in answers to every query of this client since the previous call (for
    /// `gpu_ledger_prometheus_warnings_total`).
    pub fn take_warnings(&self) -> u64 {
        self.warnings.swap(0, Ordering::Relaxed)
    }

    /// The extra matchers of every DCGM selector, `,`-prefixed (empty when none).
    pub fn matchers(&self) -> &str {
        &self.matchers
    }

    /// Reads the bearer token (once per batch of requests). Never logged.
    fn token(&self) -> Result<Option<String>, PromError> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let t = std::fs::read_to_string(path).map_err(|e| {
            PromError::Config(format!("reading bearer token file {}: {e}", path.display()))
        })?;
        Ok(Some(t.trim().to_string()))
    }

    /// Instant query at `at` (POST form `query`, `time`).
    pub async fn instant(&self, query: &str, at: DateTime<Utc>) -> Result<Vec<Sample>, PromError> {
        let token = self.token()?;
        self.instant_with(token.as_deref(), query, at, None).await
    }

    /// Instant query with its own timeout instead of the client's (the one-off start-up history
    /// query scans hours of data and may take far longer than a refresh query).
    pub async fn instant_with_timeout(
        &self,
        query: &str,
        at: DateTime<Utc>,
        timeout: Duration,
    ) -> Result<Vec<Sample>, PromError> {
        let token = self.token()?;
        self.instant_with(token.as_deref(), query, at, Some(timeout))
            .await
    }

    /// One instant query answered with a vector or scalar; `timeout` replaces the client's. A
    /// partial answer is an error: the only such query is the start-up history, and activity
    /// missing from it would be read as idle time.
    async fn instant_with(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<Vec<Sample>, PromError> {
        self.query_data::<QueryData>(token, query, at, timeout)
            .await?
            .complete()?
            .into_samples()
    }

    /// One instant query (POST form `query`, `time`), its answer's `data` and warnings (counted
    /// and logged here). The body is read up to [`MAX_ANSWER_BYTES`] and decoded in one pass
    /// that refuses an answer over a bound before copying the offending part out of the body.
    async fn query_data<D: serde::de::DeserializeOwned>(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<Answered<D>, PromError> {
        let time = format!("{:.3}", at.timestamp_millis() as f64 / 1000.0);
        let started = Instant::now();
        let mut req = self
            .http
            .post(self.query_url.clone())
            .form(&[("query", query), ("time", time.as_str())]);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await.map_err(|e| PromError::from_reqwest(&e))?;
        let status = resp.status();
        let too_large =
            || PromError::TooLarge(format!("answer larger than {MAX_ANSWER_BYTES} bytes"));
        let announced = resp.content_length();
        if announced.is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
            return Err(too_large());
        }
        // Sized once when announced: growing by doubling would hold two copies on the way.
        let mut body: Vec<u8> =
            Vec::with_capacity(announced.and_then(|n| usize::try_from(n).ok()).unwrap_or(0));
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| PromError::from_reqwest(&e))?
        {
            if body.len().saturating_add(chunk.len()) > MAX_ANSWER_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        tracing::debug!(
            query,
            bytes = body.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "prometheus answered"
        );
        let parsed: Result<ApiResponse<D>, _> = serde_json::from_slice(&body);
        if !status.is_success() {
            let (error_type, message) = match parsed {
                Ok(r) => (
                    r.error_type.unwrap_or_default(),
                    r.error.unwrap_or_default(),
                ),
                Err(_) => (
                    String::new(),
                    String::from_utf8_lossy(&body).chars().take(300).collect(),
                ),
            };
            return Err(PromError::Status {
                code: status.as_u16(),
                error_type,
                message,
            });
        }
        drop(body);
        let r = parsed.map_err(|e| {
            let text = e.to_string();
            if text.contains(OVER_BOUND) {
                PromError::TooLarge(text)
            } else {
                PromError::Decode(text)
            }
        })?;
        if r.status != "success" {
            return Err(PromError::Api {
                error_type: r.error_type.unwrap_or_default(),
                error: r.error.unwrap_or_default(),
            });
        }
        if r.warnings.count > 0 {
            self.warnings.fetch_add(
                u64::try_from(r.warnings.count).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            tracing::warn!(
                warnings = r.warnings.count,
                first = r.warnings.first(),
                "prometheus answered partially; nothing in this answer is proof of idleness"
            );
        }
        let value = r
            .data
            .ok_or_else(|| PromError::Decode("success without data".into()))?;
        Ok(Answered {
            value,
            warnings: r.warnings,
        })
    }

    /// An instant query answered with a matrix (a subquery `expr[range:step]`): every point of
    /// every series as one [`Sample`] (labels, Unix seconds, value). Series need no metric name
    /// (an aggregation's subquery has none). A partial answer is an error: a missing point would
    /// read as a gap.
    pub async fn instant_matrix(
        &self,
        query: &str,
        at: DateTime<Utc>,
    ) -> Result<Vec<Sample>, PromError> {
        let token = self.token()?;
        let data = self
            .query_data::<QueryData>(token.as_deref(), query, at, None)
            .await?
            .complete()?;
        let QueryData::Matrix(rows) = data else {
            return Err(not_a_matrix());
        };
        let mut out = Vec::new();
        for row in rows {
            for (t, v) in row.values {
                let value = parse_value(&v)
                    .ok_or_else(|| PromError::Decode(format!("bad sample value {v:?}")))?;
                out.push(Sample {
                    labels: row.metric.clone(),
                    time: t,
                    value,
                });
            }
        }
        Ok(out)
    }

    /// Raw samples of `fields` over `(at - range, at]`, with their own timestamps: one instant
    /// query of a range-vector selector (`{__name__=~"A|B"}[range]`), the cheapest question
    /// Prometheus answers (no evaluation per step). Each answer series becomes one [`Series`]
    /// named by its `__name__`; empty label values are dropped (as Prometheus itself treats them).
    /// A partial answer is an error ([`PromError::Partial`]): `capture` writes what it reads as
    /// a complete record.
    pub async fn range_series(
        &self,
        fields: &[&str],
        range: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<Vec<Series>, PromError> {
        self.raw_samples::<QueryData>(fields, range, at)
            .await?
            .complete()?
            .into_series()
    }

    /// As [`Self::range_series`], keeping only the labels the reduction reads ([`WindowData`]):
    /// for everything that reduces (the sample window, scheme detection, the pre-stop re-check).
    /// `capture` uses [`Self::range_series`], which keeps them all. A partial answer is
    /// returned with its warnings: busy samples in it are still evidence.
    pub async fn window_series(
        &self,
        fields: &[&str],
        range: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<Answered<Vec<Series>>, PromError> {
        self.raw_samples::<WindowData>(fields, range, at)
            .await?
            .map(WindowData::into_series)
    }

    /// The answer to `{__name__=~"<fields>",<matchers>}[range]` at `at`, decoded as `D`.
    async fn raw_samples<D: serde::de::DeserializeOwned>(
        &self,
        fields: &[&str],
        range: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<Answered<D>, PromError> {
        let token = self.token()?;
        let query = range_selector(fields, &self.matchers, range);
        self.query_data(token.as_deref(), &query, at, None).await
    }
}

fn secs_to_ms(s: f64) -> i64 {
    (s * 1000.0).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::usage::Window;
    use crate::usage::LabelScheme;

    fn window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    #[test]
    fn bootstrap_text() {
        let q = queries::bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(24),
            0.9,
            "",
        );
        // 24 h in 5-minute buckets; 10 scrapes of 30 s per bucket, 9 needed.
        assert!(q.contains("max_over_time(timestamp(max_over_time(DCGM_FI_DEV_GPU_UTIL[299999ms]) >= 5)[86400000ms:300000ms])"), "{q}");
        assert!(q.contains("\"field\", \"gr\""), "{q}");
        assert!(
            q.contains("timestamp(count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[299999ms]) < 9)"),
            "{q}"
        );
        assert!(q.contains("count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[299999ms]) unless count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[299999ms] offset 300000ms)"), "{q}");
        assert_eq!(
            queries::bootstrap_bucket(&window(), chrono::Duration::minutes(30)),
            chrono::Duration::seconds(30),
            "never finer than a scrape"
        );
        assert_eq!(
            queries::bootstrap_bucket(&window(), chrono::Duration::days(30)),
            chrono::Duration::minutes(10),
            "never wider than the window"
        );
    }

    #[test]
    fn decodes_answers() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"UUID":"GPU-a","stat":"last"},"value":[1700000000.123,"NaN"]},
            {"metric":{},"value":[1700000000,"+Inf"]},
            {"metric":{"a":"b"},"value":[1700000000,"-0"]}]}}"#;
        let r: ApiResponse = serde_json::from_str(body).expect("decodes");
        let s = r.data.expect("data").into_samples().expect("samples");
        assert!(s[0].value.is_nan());
        assert!((s[0].time - 1_700_000_000.123).abs() < 1e-6);
        assert!(s[1].value.is_infinite() && s[1].value > 0.0);
        assert!(s[2].value.abs() < f64::EPSILON);
        let r: ApiResponse = serde_json::from_str(
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#,
        )
        .expect("scalar");
        let v = r.data.expect("data").into_samples().expect("samples")[0].value;
        assert!((v - 2.0).abs() < f64::EPSILON);
        let r: ApiResponse = serde_json::from_str(
            r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        )
        .expect("error");
        assert_eq!(r.error_type.as_deref(), Some("bad_data"));
        assert_eq!(PromError::Timeout.kind(), "timeout");
    }

    /// A dcgm-exporter series as Prometheus answers a range-vector selector (labels as in
    /// dcgm-exporter's README sample, plus the scrape's `instance`/`job`).
    const WINDOW_ANSWER: &str = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0","UUID":"GPU-604ac76c",
          "pci_bus_id":"00000000:00:1E.0","device":"nvidia0","modelName":"Tesla T4",
          "Hostname":"ip-10-0-1-2","DCGM_FI_DRIVER_VERSION":"535.104.05","container":"",
          "instance":"10.0.1.7:9400","job":"dcgm-exporter","pod":"train-0","namespace":"ml"},
         "values":[[1700000000,"42"],[1700000015.5,"NaN"]]}]}}"#;

    #[test]
    fn the_window_decoder_keeps_only_read_labels_and_agrees_with_the_full_one() {
        let r: ApiResponse<WindowData> = serde_json::from_str(WINDOW_ANSWER).expect("decodes");
        let window = r.data.expect("data").into_series().expect("series");
        let r: ApiResponse = serde_json::from_str(WINDOW_ANSWER).expect("decodes");
        let mut full = r.data.expect("data").into_series().expect("series");
        assert!(
            full[0].labels.contains_key("pci_bus_id"),
            "the full decoder keeps all"
        );
        Arc::make_mut(&mut full[0].labels).retain(|k, _| READ_LABELS.contains(&k.as_str()));
        assert_eq!(window[0].name, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(window[0].labels, full[0].labels);
        let kept: Vec<&str> = window[0].labels.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "Hostname",
                "UUID",
                "instance",
                "modelName",
                "namespace",
                "pod"
            ],
            "empty `container` dropped, device/gpu/pci_bus_id/job/driver not held"
        );
        assert_eq!(window[0].samples[0], (1_700_000_000_000, 42.0));
        assert_eq!(window[0].samples[1].0, 1_700_000_015_500);
        assert!(window[0].samples[1].1.is_nan());
    }

    #[test]
    fn the_window_decoder_rejects_what_the_full_one_rejects() {
        let bad_value = WINDOW_ANSWER.replace(r#""42""#, r#""4x2""#);
        let err = serde_json::from_str::<ApiResponse<WindowData>>(&bad_value)
            .expect_err("bad value")
            .to_string();
        assert!(err.contains(r#"bad sample value "4x2""#), "{err}");
        let nameless = WINDOW_ANSWER.replace(r#""__name__":"DCGM_FI_DEV_GPU_UTIL","#, "");
        let r: ApiResponse<WindowData> = serde_json::from_str(&nameless).expect("decodes");
        let err = r.data.expect("data").into_series().expect_err("no name");
        assert!(err.to_string().contains("without __name__"), "{err}");
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let r: ApiResponse<WindowData> = serde_json::from_str(vector).expect("decodes");
        let err = r
            .data
            .expect("data")
            .into_series()
            .expect_err("not a matrix");
        assert!(err.to_string().contains("expected a matrix"), "{err}");
    }

    /// Decodes `body` with both decoders as `query_data` does (the same error classification).
    fn both(
        body: &str,
    ) -> (
        Result<Vec<Series>, PromError>,
        Result<Vec<Series>, PromError>,
    ) {
        fn classify(e: &serde_json::Error) -> PromError {
            let text = e.to_string();
            if text.contains(OVER_BOUND) {
                PromError::TooLarge(text)
            } else {
                PromError::Decode(text)
            }
        }
        let full = serde_json::from_str::<ApiResponse>(body)
            .map_err(|e| classify(&e))
            .and_then(|r| r.data.expect("data").into_series());
        let window = serde_json::from_str::<ApiResponse<WindowData>>(body)
            .map_err(|e| classify(&e))
            .and_then(|r| r.data.expect("data").into_series());
        (full, window)
    }

    fn assert_too_large(body: &str, what: &str) {
        let (full, window) = both(body);
        for (decoder, r) in [("full", full), ("window", window)] {
            match r {
                Err(e @ PromError::TooLarge(_)) => {
                    assert_eq!(e.kind(), "too_large");
                    let text = e.to_string();
                    assert!(text.contains(what), "{decoder}: {text}");
                    assert!(
                        text.len() < 1000,
                        "{decoder}: the error does not echo the input"
                    );
                }
                other => panic!("{decoder}: expected too_large ({what}), got {other:?}"),
            }
        }
    }

    #[test]
    fn label_values_names_and_sample_strings_are_bounded() {
        let at_bound = "v".repeat(MAX_LABEL_BYTES);
        let over = "v".repeat(MAX_LABEL_BYTES + 1);
        // A read label (`pod`), an ignored one (`pci_bus_id`): the bound is on every label.
        for label in ["pod", "pci_bus_id"] {
            let ok = WINDOW_ANSWER.replace(r#""train-0""#, &format!("{at_bound:?}"));
            let ok = ok.replace(r#""00000000:00:1E.0""#, &format!("{at_bound:?}"));
            let (full, window) = both(&ok);
            assert!(
                full.is_ok() && window.is_ok(),
                "{MAX_LABEL_BYTES} bytes pass"
            );
            let bad = if label == "pod" {
                WINDOW_ANSWER.replace(r#""train-0""#, &format!("{over:?}"))
            } else {
                WINDOW_ANSWER.replace(r#""00000000:00:1E.0""#, &format!("{over:?}"))
            };
            assert_too_large(&bad, &format!("a string of {} bytes", MAX_LABEL_BYTES + 1));
        }
        // Escaped text is measured decoded, as held.
        let escaped = WINDOW_ANSWER.replace(
            r#""train-0""#,
            &format!("\"{}\"", "\\u0041".repeat(MAX_LABEL_BYTES + 1)),
        );
        assert_too_large(&escaped, "bytes (at most 4096)");
        let long_name = WINDOW_ANSWER.replace(r#""job":"#, &format!("{over:?}:"));
        assert_too_large(&long_name, "bytes (at most 4096)");
        let long_value = WINDOW_ANSWER.replace(
            r#""42""#,
            &format!("\"{}\"", "4".repeat(MAX_LABEL_BYTES + 1)),
        );
        assert_too_large(&long_value, "bytes (at most 4096)");
    }

    #[test]
    fn labels_per_series_are_bounded() {
        let labels = |n: usize| {
            (0..n)
                .map(|i| format!(r#""l{i}":"x""#))
                .collect::<Vec<_>>()
                .join(",")
        };
        let answer = |n: usize| {
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL",{}}},"values":[[1,"1"]]}}]}}}}"#,
                labels(n)
            )
        };
        let (full, window) = both(&answer(MAX_LABELS_PER_SERIES - 1));
        assert!(
            full.is_ok() && window.is_ok(),
            "__name__ plus 255 labels pass"
        );
        assert_too_large(&answer(MAX_LABELS_PER_SERIES), "more than 256 labels");
    }

    #[test]
    fn series_per_answer_are_bounded() {
        let list = |n: usize| format!("[{}]", vec!["1"; n].join(","));
        let three = serde_json::from_str::<SeriesList<u8, 3>>(&list(3)).expect("3 of 3");
        assert_eq!(three.0.len(), 3);
        let err = serde_json::from_str::<SeriesList<u8, 3>>(&list(4))
            .err()
            .expect("4 of 3 refused");
        assert!(err.to_string().contains("more than 3 series"), "{err}");
        assert!(err.to_string().contains(OVER_BOUND), "{err}");
        assert_eq!(MAX_SERIES, 1_000_000);
    }

    #[test]
    fn result_before_result_type_decodes_alike_and_is_bounded() {
        // serde_json::Value re-encodes with sorted keys: `result` before `resultType`.
        let sorted = serde_json::from_str::<serde_json::Value>(WINDOW_ANSWER)
            .expect("json")
            .to_string();
        assert!(sorted.contains(r#""data":{"result":"#), "{sorted}");
        let (full, window) = both(&sorted);
        let (full_in_order, window_in_order) = both(WINDOW_ANSWER);
        assert_eq!(format!("{full:?}"), format!("{full_in_order:?}"));
        assert_eq!(format!("{window:?}"), format!("{window_in_order:?}"));
        let r: ApiResponse = serde_json::from_str(
            r#"{"status":"success","data":{"result":[1,"2"],"resultType":"scalar"}}"#,
        )
        .expect("scalar");
        assert_eq!(
            r.data.expect("data").into_samples().expect("samples").len(),
            1
        );
        let huge = WINDOW_ANSWER.replace(
            r#""train-0""#,
            &format!("{:?}", "v".repeat(MAX_LABEL_BYTES + 1)),
        );
        let huge = serde_json::from_str::<serde_json::Value>(&huge)
            .expect("json")
            .to_string();
        assert_too_large(&huge, "bytes (at most 4096)");
        let extra =
            r#"{"status":"success","data":{"resultType":"matrix","stats":{"x":[1]},"result":[]}}"#;
        let (full, window) = both(extra);
        assert!(full.expect("unknown keys ignored").is_empty());
        assert!(window.expect("unknown keys ignored").is_empty());
        for bad in [
            r#"{"status":"success","data":{"resultType":"matrix"}}"#,
            r#"{"status":"success","data":{"result":[]}}"#,
            r#"{"status":"success","data":{"resultType":"matrix","result":[],"result":[]}}"#,
        ] {
            let (full, window) = both(bad);
            assert!(full.is_err() && window.is_err(), "{bad}");
        }
    }

    #[test]
    fn warnings_are_counted_kept_truncated_and_make_an_answer_partial() {
        let long = "w".repeat(10_000);
        let warnings: Vec<String> = (0..10).map(|i| format!("{i}: {long}")).collect();
        let body = format!(
            r#"{{"status":"success","warnings":{},"data":{{"resultType":"vector","result":[]}}}}"#,
            serde_json::to_string(&warnings).expect("json")
        );
        let r: ApiResponse = serde_json::from_str(&body).expect("decodes");
        assert_eq!(r.warnings.count, 10);
        assert_eq!(r.warnings.kept.len(), KEPT_WARNINGS);
        assert!(r.warnings.kept.iter().all(|w| w.len() == MAX_MESSAGE_BYTES));
        assert!(r.warnings.first().starts_with("0: www"));
        let answered = Answered {
            value: (),
            warnings: r.warnings,
        };
        assert!(answered.is_partial());
        let err = answered.complete().expect_err("partial");
        assert_eq!(err.kind(), "partial");
        assert!(err.to_string().contains("10 warnings"), "{err}");
        // Absent, null or empty: complete.
        for w in ["", r#""warnings":null,"#, r#""warnings":[],"#] {
            let body = format!(
                r#"{{"status":"success",{w}"data":{{"resultType":"vector","result":[]}}}}"#
            );
            let r: ApiResponse = serde_json::from_str(&body).expect("decodes");
            assert_eq!(r.warnings.count, 0, "{body}");
        }
        // A multi-byte character is never cut in half; error texts are cut the same way.
        assert_eq!(truncate("aé", 2), "a");
        let body = format!(
            r#"{{"status":"error","errorType":"bad_data","error":"{}"}}"#,
            "é".repeat(1000)
        );
        let r: ApiResponse = serde_json::from_str(&body).expect("decodes");
        assert_eq!(r.error.expect("error").len(), MAX_MESSAGE_BYTES);
    }

    #[test]
    fn selectors_are_validated_and_spliced_into_every_query() {
        let sel: Selector = r#" cluster="prod" , job=~"dcgm.*",env!="a\"b" "#
            .parse()
            .expect("valid");
        assert_eq!(sel.as_str(), r#"cluster="prod",job=~"dcgm.*",env!="a\"b""#);
        for bad in [
            "",
            "cluster",
            "cluster=prod",
            r#"cluster="prod"}"#,
            r#"cluster="prod""#.trim_end_matches('"'),
            r#"cluster="a",,job="b""#,
            r#"1x="a""#,
            r#"cluster="a" job="b""#,
            r#"cluster="a"} or vector(1) or {x="b""#,
        ] {
            assert!(bad.parse::<Selector>().is_err(), "{bad:?}");
        }
        let q = queries::bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(1),
            0.9,
            r#",cluster="prod""#,
        );
        assert!(
            q.contains(r#"timestamp(DCGM_FI_DEV_GPU_UTIL{cluster="prod"}) and DCGM_FI_DEV_GPU_UTIL{cluster="prod"} >= 5"#),
            "{q}"
        );
        assert!(
            q.contains(r#"dcgm_gpu_utilization{cluster="prod"}"#),
            "every spelling: {q}"
        );
    }

    #[test]
    fn selectors_evaluate_like_prometheus_matchers() {
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let passes = |sel: &str, l: &Labels| {
            let s: Selector = sel.parse().expect("selector");
            s.matchers()
                .expect("matchers")
                .iter()
                .all(|m| m.matches(l.get(&m.name).map(String::as_str)))
        };
        let east = labels(&[("cluster", "east"), ("job", "dcgm")]);
        let bare = labels(&[("job", "dcgm")]);
        assert!(passes(r#"cluster="east""#, &east));
        assert!(!passes(r#"cluster="west""#, &east));
        assert!(passes(r#"cluster!="west",job="dcgm""#, &east));
        // Regexes are anchored at both ends, as in PromQL.
        assert!(passes(r#"cluster=~"ea.*""#, &east));
        assert!(!passes(r#"cluster=~"as""#, &east));
        assert!(passes(r#"cluster!~"w.*""#, &east));
        // An absent label is the empty value.
        assert!(passes(r#"cluster="""#, &bare));
        assert!(!passes(r#"cluster=~".+""#, &bare));
        // Escapes inside values.
        let quoted = labels(&[("team", "a\"b")]);
        assert!(passes(r#"team="a\"b""#, &quoted));
    }

    #[test]
    fn clusters_are_named_and_a_missing_label_counts() {
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let (east, west, bare) = (
            l(&[("cluster", "east")]),
            l(&[("cluster", "west")]),
            l(&[("job", "dcgm")]),
        );
        assert!(
            clusters_of([&bare, &bare]).is_empty(),
            "one Prometheus, no label"
        );
        assert_eq!(clusters_of([&east, &east]), ["cluster=\"east\""]);
        assert_eq!(
            clusters_of([&east, &west]),
            ["cluster=\"east\"", "cluster=\"west\""]
        );
        assert_eq!(
            clusters_of([&east, &bare]),
            ["(none)", "cluster=\"east\""],
            "a store mixing labelled and unlabelled series is ambiguous too"
        );
        let opencost = l(&[("cluster_id", "c1")]);
        assert_eq!(clusters_of([&opencost]), ["cluster_id=\"c1\""]);
    }

    #[test]
    fn headers_are_validated_and_authorization_is_refused() {
        let h: Header = "X-Scope-OrgID: team-a".parse().expect("header");
        assert_eq!(
            (h.name.as_str(), h.value.as_str()),
            ("X-Scope-OrgID", "team-a")
        );
        assert!("X-Scope-OrgID:team-a".parse::<Header>().is_ok());
        for bad in [
            "no colon",
            "bad name: x",
            "X-Tenant: a\nb",
            "Authorization: Bearer x",
        ] {
            assert!(bad.parse::<Header>().is_err(), "{bad:?}");
        }
    }

    /// A one-shot HTTP server answering an empty vector and handing back the request head it
    /// read: a test double of Prometheus' query endpoint, to see what the client sends.
    async fn capture_request() -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!(
            "http://{}/select/0/prometheus",
            listener.local_addr().expect("addr")
        );
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 65536];
            let mut n = 0;
            while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                n += sock.read(&mut buf[n..]).await.expect("read");
            }
            let body = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await.expect("write");
            sock.write_all(body.as_bytes()).await.expect("write");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (url, task)
    }

    #[tokio::test]
    async fn path_prefix_and_tenant_headers_reach_the_store() {
        let (url, request) = capture_request().await;
        let client = PromClient::new(PromConfig {
            url: url.parse().expect("url"),
            bearer_token_file: None,
            ca_file: None,
            insecure_skip_verify: false,
            timeout: Duration::from_secs(30),
            selector: None,
            headers: vec![
                "X-Scope-OrgID: team-a".parse().expect("header"),
                "X-Extra: 1".parse().expect("header"),
            ],
        })
        .expect("client");
        client
            .instant("vector(1)", chrono::Utc::now())
            .await
            .expect("query");
        let head = request.await.expect("request").to_ascii_lowercase();
        assert!(
            head.starts_with("post /select/0/prometheus/api/v1/query "),
            "the path prefix is kept: {head}"
        );
        assert!(head.contains("x-scope-orgid: team-a\r\n"), "{head}");
        assert!(head.contains("x-extra: 1\r\n"), "{head}");
    }
}
