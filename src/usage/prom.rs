//! Live Prometheus client: the fixed set of `PromQL` queries per refresh.
//!
//! A refresh asks Prometheus three questions whatever the number of pods or devices (plus one
//! label-scheme detection query, cached after its first useful answer):
//!
//! 1. window statistics of `DCGM_FI_PROF_GR_ENGINE_ACTIVE`,
//! 2. the same for `DCGM_FI_DEV_GPU_UTIL`,
//! 3. the latest `DCGM_FI_DEV_FB_USED`.
//!
//! Each answer is aggregated `max by` (device labels + workload labels), so time-slice copies of
//! one pod collapse into one row while per-process series and label changes stay apart; the rows
//! are then reduced per device exactly as [`super::series::reduce`] reduces raw samples, so the
//! live and offline paths produce [`DeviceUsage`] with the same meaning.
//!
//! Known, documented differences from the offline reduction (all on the conservative side):
//! devices with no sample in the window are not listed; when the newest sample is NaN the current
//! utilisation is unknown (offline uses the previous usable sample); NaN samples are
//! counted per scrape interval and give no coverage (a NaN never proves idleness); coverage of a
//! device whose series changed identity inside the window is that of its best-covered series.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::LabelScheme;
use super::scheme::SchemeChoice;
use super::series::{
    GPU_INSTANCE_LABEL, GPU_PROFILE_LABEL, Labels, MIB, POD_UID_LABEL, Series, usable,
};
use crate::ledger::usage::{DeviceKey, DeviceUsage, Signal, Window, Workload, fields};

/// Label added by `label_replace` to tell statistics apart in one answer.
pub const STAT_LABEL: &str = "stat";
/// Label naming the DCGM field in combined answers (bootstrap).
pub const FIELD_LABEL: &str = "field";
/// Label naming a label key found by the detection query.
pub const HAS_LABEL: &str = "has";

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

/// `/api/v1/query` envelope.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiResponse {
    pub status: String,
    #[serde(default)]
    pub data: Option<QueryData>,
    #[serde(default, rename = "errorType")]
    pub error_type: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// `data` of a query answer. Values are strings (`"0.5"`, `"NaN"`, `"+Inf"`); times float seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
pub enum QueryData {
    Vector(Vec<RawVectorSample>),
    Scalar((f64, String)),
    String((f64, String)),
    Matrix(Vec<RawMatrixSeries>),
}

/// One element of a vector answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RawVectorSample {
    #[serde(default)]
    pub metric: Labels,
    pub value: (f64, String),
}

/// One element of a matrix answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RawMatrixSeries {
    #[serde(default)]
    pub metric: Labels,
    pub values: Vec<(f64, String)>,
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
/// times in milliseconds.
fn series_of_matrix_row(row: RawMatrixSeries) -> Result<Series, PromError> {
    let mut labels = row.metric;
    let name = labels
        .remove("__name__")
        .ok_or_else(|| PromError::Decode("matrix series without __name__".into()))?;
    labels.retain(|_, v| !v.is_empty());
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
}

/// Prometheus HTTP API client with the cached label-scheme detection.
#[derive(Debug)]
pub struct PromClient {
    http: reqwest::Client,
    query_url: reqwest::Url,
    token_file: Option<PathBuf>,
    /// Label keys found on DCGM series by the first detection that found any.
    detected: RwLock<Option<Vec<String>>>,
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
            detected: RwLock::new(None),
        })
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

    /// One instant query answered with a vector or scalar; `timeout` replaces the client's.
    async fn instant_with(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<Vec<Sample>, PromError> {
        self.query_data(token, query, at, timeout)
            .await?
            .into_samples()
    }

    /// One instant query (POST form `query`, `time`), its answer's `data`.
    async fn query_data(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<QueryData, PromError> {
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
        let resp = req.send().await.map_err(|e| PromError::from_reqwest(&e))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| PromError::from_reqwest(&e))?;
        tracing::debug!(
            query,
            bytes = body.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "prometheus answered"
        );
        let parsed: Result<ApiResponse, _> = serde_json::from_slice(&body);
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
        let r = parsed.map_err(|e| PromError::Decode(e.to_string()))?;
        if r.status != "success" {
            return Err(PromError::Api {
                error_type: r.error_type.unwrap_or_default(),
                error: r.error.unwrap_or_default(),
            });
        }
        for w in &r.warnings {
            tracing::debug!(warning = %w, "prometheus query warning");
        }
        r.data
            .ok_or_else(|| PromError::Decode("success without data".into()))
    }

    /// Raw samples of `fields` over `(at - range, at]`, with their own timestamps: one instant
    /// query of a range-vector selector (`{__name__=~"A|B"}[range]`), the cheapest question
    /// Prometheus answers (no evaluation per step). Each answer series becomes one [`Series`]
    /// named by its `__name__`; empty label values are dropped (as Prometheus itself treats them).
    pub async fn range_series(
        &self,
        fields: &[&str],
        range: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<Vec<Series>, PromError> {
        let token = self.token()?;
        let names = fields.join("|");
        let query = format!("{{__name__=~\"{names}\"}}[{}]", queries::duration(range));
        let data = self.query_data(token.as_deref(), &query, at, None).await?;
        let QueryData::Matrix(rows) = data else {
            return Err(PromError::Decode(
                "expected a matrix answer to a range-vector selector".into(),
            ));
        };
        rows.into_iter().map(series_of_matrix_row).collect()
    }

    /// The label scheme (detection query only until it finds DCGM series; then cached).
    async fn scheme(
        &self,
        token: Option<&str>,
        choice: SchemeChoice,
        window: &Window,
        now: DateTime<Utc>,
        stats: &mut QueryStats,
    ) -> Result<LabelScheme, PromError> {
        let cached = self
            .detected
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let names = if let Some(n) = cached {
            n
        } else {
            stats.queries += 1;
            let rows = self
                .instant_with(token, &queries::detection_query(window), now, None)
                .await?;
            let names: Vec<String> = rows
                .iter()
                .filter_map(|s| s.labels.get(HAS_LABEL).cloned())
                .collect();
            if !names.is_empty() {
                *self
                    .detected
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(names.clone());
            }
            names
        };
        Ok(LabelScheme::detect(
            choice,
            names.iter().map(String::as_str),
        ))
    }

    /// The label scheme as detected (or overridden), running detection if not cached yet.
    pub async fn detect_scheme(
        &self,
        choice: SchemeChoice,
        window: &Window,
        now: DateTime<Utc>,
    ) -> Result<LabelScheme, PromError> {
        let token = self.token()?;
        self.scheme(
            token.as_deref(),
            choice,
            window,
            now,
            &mut QueryStats::default(),
        )
        .await
    }

    /// One live refresh: per-device usage over `window` ending at `now`, sorted by device key.
    ///
    /// Sends 3 queries (4 until the label scheme has been detected), whatever the device count.
    /// `covered_since` is left `None`: [`super::history::History::merge`] fills it.
    pub async fn fetch_usage(
        &self,
        scheme_choice: SchemeChoice,
        window: &Window,
        now: DateTime<Utc>,
    ) -> Result<(Vec<DeviceUsage>, QueryStats), PromError> {
        self.fetch_usage_since(scheme_choice, window, now, None)
            .await
    }

    /// [`Self::fetch_usage`] for a caller that keeps an idle history: activity up to
    /// `known_until` (the previous refresh merged into it) is already known, so the newest-activity
    /// subquery only scans since then instead of the whole window, which is the costliest part of
    /// a refresh on the Prometheus side. `None` scans the whole window.
    pub async fn fetch_usage_since(
        &self,
        scheme_choice: SchemeChoice,
        window: &Window,
        now: DateTime<Utc>,
        known_until: Option<DateTime<Utc>>,
    ) -> Result<(Vec<DeviceUsage>, QueryStats), PromError> {
        let started = Instant::now();
        let mut stats = QueryStats::default();
        let token = self.token()?;
        let token = token.as_deref();
        let scheme = self
            .scheme(token, scheme_choice, window, now, &mut stats)
            .await?;
        // Steps are aligned to multiples of the interval: two intervals of margin reach back to the
        // last step the previous refresh evaluated.
        let activity_range = known_until.map_or(window.length, |t| {
            (now - t + window.interval * 2).clamp(window.interval, window.length)
        });
        let q_gr = queries::window_query(fields::GR_ENGINE_ACTIVE, &scheme, window, activity_range);
        let q_util = queries::window_query(fields::GPU_UTIL, &scheme, window, activity_range);
        let q_fb = queries::memory_query(&scheme, window);
        // Each answer is grouped as soon as it is decoded, so only one answer's rows (a row per
        // statistic, each with its full label set) are alive at a time.
        let grouped = |q: String| {
            let scheme = &scheme;
            async move {
                let rows = self.instant_with(token, &q, now, None).await?;
                Ok::<_, PromError>(group_rows(rows, scheme))
            }
        };
        let (gr, util, fb) = tokio::try_join!(grouped(q_gr), grouped(q_util), grouped(q_fb))?;
        stats.queries += 3;
        let devices = reduce_groups(gr, util, fb, &scheme, window, now);
        stats.duration = started.elapsed();
        Ok((devices, stats))
    }
}

/// `PromQL` builders (pure; their text is unit-tested).
pub mod queries {
    use super::{FIELD_LABEL, HAS_LABEL, LabelScheme, STAT_LABEL, Window, fields};
    use crate::usage::series::{GPU_INSTANCE_LABEL, GPU_PROFILE_LABEL, POD_UID_LABEL};

    /// A `PromQL` duration in milliseconds (at least 1 ms).
    pub fn duration(d: chrono::Duration) -> String {
        format!("{}ms", d.num_milliseconds().max(1))
    }

    /// A range `(now - d, now]`: Prometheus ranges include their start, the offline reduction does not.
    fn open_range(d: chrono::Duration) -> String {
        format!("{}ms", (d.num_milliseconds() - 1).max(1))
    }

    /// Labels identifying a device and describing it.
    pub fn device_labels(scheme: &LabelScheme) -> String {
        format!(
            "{}, {GPU_INSTANCE_LABEL}, {GPU_PROFILE_LABEL}, {}, modelName",
            scheme.uuid, scheme.hostname
        )
    }

    /// Device labels plus the workload labels: one row per device and holder.
    pub fn series_labels(scheme: &LabelScheme) -> String {
        format!(
            "{}, {}, {}, {POD_UID_LABEL}",
            device_labels(scheme),
            scheme.pod,
            scheme.namespace
        )
    }

    fn stat(name: &str, by: &str, expr: &str) -> String {
        format!("label_replace(max by ({by}) ({expr}), \"{STAT_LABEL}\", \"{name}\", \"\", \"\")")
    }

    /// Threshold in the field's own unit (`GPU_UTIL` is a percentage).
    fn threshold(field: &str, window: &Window) -> f64 {
        if field == fields::GPU_UTIL {
            window.idle_threshold * 100.0
        } else {
            window.idle_threshold
        }
    }

    /// Label keys present on DCGM utilisation series in the window (one row per key found).
    pub fn detection_query(window: &Window) -> String {
        let sel = format!(
            "{{__name__=~\"{}|{}|{}\"",
            fields::GR_ENGINE_ACTIVE,
            fields::GPU_UTIL,
            fields::FB_USED
        );
        let w = duration(window.length);
        ["exported_pod", "exported_namespace", "pod", "namespace", "Hostname", "hostname", "UUID", "uuid"]
            .iter()
            .map(|l| format!("label_replace(count(last_over_time({sel},{l}!=\"\"}}[{w}])), \"{HAS_LABEL}\", \"{l}\", \"\", \"\")"))
            .collect::<Vec<_>>()
            .join(" or ")
    }

    /// Window statistics of one utilisation field, one row per (device, holder, statistic):
    /// `peak`, `count`, `nan` (NaN samples, no coverage), `last`, `ts`/`ts_sub` (newest sample time, at
    /// `now` and by subquery), `active`/`active_sub` (newest sample at or above the threshold).
    ///
    /// The subqueries cost one evaluation per step and GPU. `ts_sub` scans the whole window: the
    /// newest sample also decides a device's current holders, as in the offline reduction, even
    /// when it is stale. `active_sub` scans only `activity_range` (the whole window, or since the
    /// previous refresh when the caller keeps an idle history that already holds older
    /// activity).
    pub fn window_query(
        field: &str,
        scheme: &LabelScheme,
        window: &Window,
        activity_range: chrono::Duration,
    ) -> String {
        let by = series_labels(scheme);
        let w = open_range(window.length);
        let step = duration(window.interval);
        let sub = format!("{}:{step}", duration(window.length));
        let active_sub = format!("{}:{step}", duration(activity_range.min(window.length)));
        let thr = threshold(field, window);
        let f = field;
        // NaN samples, counted per step: each step sees only the samples of its own interval.
        let fresh = format!("last_over_time({f}[{}])", open_range(window.interval));
        let nan_sub = format!("{w}:{step}");
        [
            stat("peak", &by, &format!("max_over_time({f}[{w}])")),
            stat("count", &by, &format!("count_over_time({f}[{w}])")),
            stat(
                "nan",
                &by,
                &format!("count_over_time(({fresh} != {fresh})[{nan_sub}])"),
            ),
            stat("last", &by, &format!("last_over_time({f}[{w}])")),
            stat("ts", &by, &format!("timestamp({f})")),
            stat(
                "ts_sub",
                &by,
                &format!("max_over_time(timestamp({f})[{sub}])"),
            ),
            stat("active", &by, &format!("timestamp({f}) and {f} >= {thr}")),
            stat(
                "active_sub",
                &by,
                &format!("max_over_time((timestamp({f}) and {f} >= {thr})[{active_sub}])"),
            ),
        ]
        .join(" or ")
    }

    /// Latest framebuffer use (MiB) per (device, holder) within the staleness bound, and its time.
    pub fn memory_query(scheme: &LabelScheme, window: &Window) -> String {
        let by = series_labels(scheme);
        let f = fields::FB_USED;
        let s = duration(window.max_staleness);
        [
            stat("last", &by, &format!("last_over_time({f}[{s}])")),
            stat("ts", &by, &format!("timestamp({f})")),
        ]
        .join(" or ")
    }

    /// Width of the start-up query's buckets: about 288 over the lookback (5 min for 24 h), at
    /// least one scrape interval, at most the window (the first refresh sees the newest part at
    /// full resolution).
    pub fn bootstrap_bucket(window: &Window, lookback: chrono::Duration) -> chrono::Duration {
        (lookback / 288).max(window.interval).min(window.length)
    }

    /// Start-up history over `lookback`, per device and field, in buckets of
    /// [`bootstrap_bucket`] width (each sample is read about once per statistic; a subquery at
    /// scrape resolution costs lookback ÷ interval evaluations per GPU and timed out at 4,000
    /// GPUs): `active` (end of the newest bucket with a sample at or above the threshold),
    /// `active_now` (the newest sample, if active), `first` (earliest sample seen by a bucket
    /// step), `count`, and `gap_end` (end of the newest bucket below `min_coverage` of its
    /// expected samples, or of the first bucket with data after an empty one). Bucket ends err
    /// late: activity and gaps are placed up to one bucket later than they happened, so idle time
    /// is under- never over-estimated.
    pub fn bootstrap_query(
        scheme: &LabelScheme,
        window: &Window,
        lookback: chrono::Duration,
        min_coverage: f64,
    ) -> String {
        let by = format!("{}, {GPU_INSTANCE_LABEL}, {}", scheme.uuid, scheme.hostname);
        let l = duration(lookback);
        let bucket = bootstrap_bucket(window, lookback);
        let b = open_range(bucket);
        let sub = format!("{l}:{}", duration(bucket));
        let expected = bucket.num_milliseconds() as f64
            / window.interval.num_milliseconds().max(1) as f64
            * min_coverage;
        let mut parts = Vec::new();
        for (f, name) in [(fields::GR_ENGINE_ACTIVE, "gr"), (fields::GPU_UTIL, "util")] {
            let thr = threshold(f, window);
            let field = |stat_expr: String| {
                format!("label_replace({stat_expr}, \"{FIELD_LABEL}\", \"{name}\", \"\", \"\")")
            };
            parts.push(field(stat(
                "active",
                &by,
                &format!("max_over_time(timestamp(max_over_time({f}[{b}]) >= {thr})[{sub}])"),
            )));
            parts.push(field(stat(
                "active_now",
                &by,
                &format!("timestamp({f}) and {f} >= {thr}"),
            )));
            parts.push(field(stat(
                "first",
                &by,
                &format!("min_over_time(timestamp({f})[{sub}])"),
            )));
            parts.push(field(stat(
                "count",
                &by,
                &format!("count_over_time({f}[{}])", open_range(lookback)),
            )));
            parts.push(field(stat(
                "gap_end",
                &by,
                &format!("max_over_time((timestamp(count_over_time({f}[{b}]) < {expected}) or timestamp(count_over_time({f}[{b}]) unless count_over_time({f}[{b}] offset {})))[{sub}])", duration(bucket)),
            )));
        }
        parts.join(" or ")
    }
}

/// Statistics of one (device, holder) row group.
#[derive(Debug, Default, Clone)]
struct Group {
    labels: Labels,
    stats: BTreeMap<String, f64>,
}

impl Group {
    fn get(&self, stat: &str) -> Option<f64> {
        self.stats.get(stat).copied()
    }
    /// Newest sample time in ms (instant and subquery views).
    fn newest_ms(&self) -> Option<i64> {
        let a = self.get("ts");
        let b = self.get("ts_sub");
        let t = match (a, b) {
            (Some(a), Some(b)) => a.max(b),
            (x, y) => x.or(y)?,
        };
        Some(secs_to_ms(t))
    }
}

fn secs_to_ms(s: f64) -> i64 {
    (s * 1000.0).round() as i64
}

fn workload(labels: &Labels, scheme: &LabelScheme) -> Option<Workload> {
    super::series::workload_of(labels, scheme)
}

/// Groups answer rows by their labels without `stat`, then by device.
fn group_rows(rows: Vec<Sample>, scheme: &LabelScheme) -> BTreeMap<DeviceKey, Vec<Group>> {
    // Rows are consumed: each label set is kept once per group, not once per statistic.
    let mut groups: BTreeMap<Labels, BTreeMap<String, f64>> = BTreeMap::new();
    for s in rows {
        let mut labels = s.labels;
        let Some(stat) = labels.remove(STAT_LABEL) else {
            continue;
        };
        groups.entry(labels).or_default().insert(stat, s.value);
    }
    let mut by_device: BTreeMap<DeviceKey, Vec<Group>> = BTreeMap::new();
    for (labels, stats) in groups {
        let g = Group { labels, stats };
        let Some(uuid) = g.labels.get(scheme.uuid) else {
            continue;
        };
        let key = DeviceKey {
            uuid: uuid.clone(),
            gpu_instance: g.labels.get(GPU_INSTANCE_LABEL).cloned(),
        };
        by_device.entry(key).or_default().push(g);
    }
    by_device
}

/// Splits per-process groups (pod-labelled with `pod_uid` beside a pod-less device group).
fn split_per_process(list: &[Group], scheme: &LabelScheme) -> (Vec<Group>, Vec<Group>) {
    let has_device_level = list.iter().any(|g| workload(&g.labels, scheme).is_none());
    list.iter().cloned().partition(|g| {
        !(has_device_level
            && g.labels.contains_key(POD_UID_LABEL)
            && workload(&g.labels, scheme).is_some())
    })
}

fn to_time(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

/// Reduces the three answers to per-device usage (same meaning as the offline reduction).
fn reduce_groups(
    mut gr: BTreeMap<DeviceKey, Vec<Group>>,
    mut util: BTreeMap<DeviceKey, Vec<Group>>,
    mut fb: BTreeMap<DeviceKey, Vec<Group>>,
    scheme: &LabelScheme,
    window: &Window,
    now: DateTime<Utc>,
) -> Vec<DeviceUsage> {
    let keys: BTreeSet<DeviceKey> = gr
        .keys()
        .chain(util.keys())
        .chain(fb.keys())
        .cloned()
        .collect();
    keys.into_iter()
        .map(|key| {
            let g = gr.remove(&key).unwrap_or_default();
            let u = util.remove(&key).unwrap_or_default();
            let f = fb.remove(&key).unwrap_or_default();
            reduce_device(key, &g, &u, &f, scheme, window, now)
        })
        .collect()
}

fn reduce_device(
    key: DeviceKey,
    gr: &[Group],
    util: &[Group],
    fb: &[Group],
    scheme: &LabelScheme,
    window: &Window,
    now: DateTime<Utc>,
) -> DeviceUsage {
    let now_ms = now.timestamp_millis();
    let (util_device, util_per_pod) = split_per_process(util, scheme);
    let (fb_device, _) = split_per_process(fb, scheme);
    let (signal, chosen, scale) = if gr.is_empty() {
        (Signal::GpuUtil, util_device, 0.01)
    } else {
        (Signal::GrEngineActive, gr.to_vec(), 1.0)
    };
    let fresh = |t: i64| now_ms - t <= window.max_staleness.num_milliseconds();
    let newest = chosen
        .iter()
        .filter_map(Group::newest_ms)
        .filter(|t| *t <= now_ms)
        .max();
    let utilization = newest.filter(|t| fresh(*t)).and_then(|t| {
        let vals: Vec<f64> = chosen
            .iter()
            .filter(|g| g.newest_ms() == Some(t))
            .filter_map(|g| g.get("last"))
            .collect();
        if vals.iter().any(|v| !usable(*v)) {
            return None;
        }
        vals.into_iter().reduce(f64::max).map(|v| v * scale)
    });
    let peak = chosen
        .iter()
        .filter_map(|g| g.get("peak"))
        .filter(|v| usable(*v))
        .reduce(f64::max)
        .map(|v| v * scale);
    let count = chosen
        .iter()
        .filter_map(|g| {
            let c = g.get("count")?;
            Some((c - g.get("nan").unwrap_or(0.0)).max(0.0))
        })
        .fold(0.0, f64::max);
    // A window of nothing but NaN proves nothing.
    let coverage = if peak.is_some() {
        (count / window.expected_samples()).min(1.0)
    } else {
        0.0
    };
    let last_active_at = chosen
        .iter()
        .flat_map(|g| [g.get("active"), g.get("active_sub")])
        .flatten()
        .map(secs_to_ms)
        .filter(|t| *t <= now_ms)
        .max()
        .and_then(to_time);
    let mut workloads = BTreeSet::new();
    for g in chosen.iter().chain(fb_device.iter()) {
        if newest.is_some()
            && g.newest_ms() == newest
            && let Some(w) = workload(&g.labels, scheme)
        {
            workloads.insert(w);
        }
    }
    let mut per_pod_utilization: Vec<(Workload, f64)> = util_per_pod
        .iter()
        .filter_map(|g| {
            let t = g.newest_ms()?;
            let v = g.get("last").filter(|v| usable(*v))?;
            (fresh(t) && t <= now_ms).then(|| workload(&g.labels, scheme).map(|w| (w, v * 0.01)))?
        })
        .collect();
    per_pod_utilization.sort_by(|a, b| a.0.cmp(&b.0));
    let memory_used_bytes = fb_device
        .iter()
        .filter_map(|g| {
            Some((
                g.get("ts").map_or(now_ms, secs_to_ms),
                g.get("last").filter(|v| usable(*v))?,
            ))
        })
        .filter(|(t, _)| *t <= now_ms && fresh(*t))
        .max_by_key(|(t, _)| *t)
        .map(|(_, mib)| mib * MIB);
    let any = chosen.first().or(fb.first()).or(util.first());
    let label = |name: &str| any.and_then(|g| g.labels.get(name).cloned());
    DeviceUsage {
        key,
        hostname: label(scheme.hostname),
        model: label("modelName"),
        mig_profile: label(GPU_PROFILE_LABEL),
        workloads: workloads.into_iter().collect(),
        per_pod_utilization,
        signal: (!chosen.is_empty()).then_some(signal),
        utilization,
        peak,
        coverage,
        last_sample_at: newest.and_then(to_time),
        memory_used_bytes,
        last_active_at,
        covered_since: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    #[test]
    fn window_query_text() {
        let q = queries::window_query(
            fields::GPU_UTIL,
            &LabelScheme::new(true, true, false),
            &window(),
            window().length,
        );
        assert!(q.starts_with(
            "label_replace(max by (UUID, GPU_I_ID, GPU_I_PROFILE, hostname, modelName, exported_pod, exported_namespace, pod_uid) (max_over_time(DCGM_FI_DEV_GPU_UTIL[599999ms])), \"stat\", \"peak\", \"\", \"\") or "
        ), "{q}");
        assert!(
            q.contains("count_over_time(DCGM_FI_DEV_GPU_UTIL[599999ms])"),
            "{q}"
        );
        assert!(
            q.contains(
                "(timestamp(DCGM_FI_DEV_GPU_UTIL) and DCGM_FI_DEV_GPU_UTIL >= 5)[600000ms:30000ms]"
            ),
            "{q}"
        );
        assert!(
            q.contains("max_over_time(timestamp(DCGM_FI_DEV_GPU_UTIL)[600000ms:30000ms])"),
            "newest sample over the whole window (it names the holders); {q}"
        );
        assert_eq!(q.matches(" or ").count(), 7);
        let q = queries::window_query(
            fields::GR_ENGINE_ACTIVE,
            &LabelScheme::default(),
            &window(),
            chrono::Duration::seconds(90),
        );
        assert!(
            q.contains("(timestamp(DCGM_FI_PROF_GR_ENGINE_ACTIVE) and DCGM_FI_PROF_GR_ENGINE_ACTIVE >= 0.05)[90000ms:30000ms]"),
            "activity since the previous refresh; {q}"
        );
        assert!(q.contains("DCGM_FI_PROF_GR_ENGINE_ACTIVE >= 0.05"), "{q}");
        assert!(q.contains("max by (UUID, GPU_I_ID, GPU_I_PROFILE, Hostname, modelName, pod, namespace, pod_uid)"), "{q}");
    }

    #[test]
    fn detection_and_memory_and_bootstrap_text() {
        let q = queries::detection_query(&window());
        assert!(q.starts_with("label_replace(count(last_over_time({__name__=~\"DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED\",exported_pod!=\"\"}[600000ms])), \"has\", \"exported_pod\", \"\", \"\")"), "{q}");
        assert_eq!(q.matches(" or ").count(), 7);
        let q = queries::memory_query(&LabelScheme::default(), &window());
        assert!(
            q.contains("last_over_time(DCGM_FI_DEV_FB_USED[120000ms])"),
            "{q}"
        );
        let q = queries::bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(24),
            0.9,
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

    fn row(labels: &[(&str, &str)], stat: &str, v: f64) -> Sample {
        let mut l: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        l.insert(STAT_LABEL.into(), stat.into());
        Sample {
            labels: l,
            time: 1_700_000_000.0,
            value: v,
        }
    }

    #[test]
    fn reduces_rows_like_series() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let t = 1_700_000_000.0;
        let dev = [("UUID", "GPU-t"), ("Hostname", "h")];
        let pa = [
            ("UUID", "GPU-t"),
            ("Hostname", "h"),
            ("pod", "a"),
            ("namespace", "x"),
            ("pod_uid", "u1"),
        ];
        let util = vec![
            row(&dev, "last", 63.0),
            row(&dev, "ts", t),
            row(&dev, "peak", 80.0),
            row(&dev, "count", 20.0),
            row(&dev, "active", t),
            row(&pa, "last", 58.0),
            row(&pa, "ts", t),
            row(&pa, "count", 20.0),
        ];
        let gr = vec![
            row(&[("UUID", "GPU-g"), ("GPU_I_ID", "1")], "last", f64::NAN),
            row(&[("UUID", "GPU-g"), ("GPU_I_ID", "1")], "ts", t),
        ];
        let scheme = LabelScheme::default();
        let d = reduce_groups(
            group_rows(gr, &scheme),
            group_rows(util, &scheme),
            BTreeMap::new(),
            &scheme,
            &window(),
            now,
        );
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].key.gpu_instance.as_deref(), Some("1"));
        assert_eq!(d[0].utilization, None);
        assert_eq!(d[0].signal, Some(Signal::GrEngineActive));
        assert_eq!(d[1].signal, Some(Signal::GpuUtil));
        assert_eq!(d[1].utilization, Some(0.63));
        assert_eq!(d[1].peak, Some(0.8));
        assert!((d[1].coverage - 1.0).abs() < 1e-9);
        assert!(d[1].workloads.is_empty());
        assert_eq!(d[1].per_pod_utilization.len(), 1);
        assert!((d[1].per_pod_utilization[0].1 - 0.58).abs() < 1e-9);
        assert_eq!(d[1].last_active_at, Some(now));
    }
}
