//! `GET /api/v1/history?range=24h|7d`: GPUs claimed, busy and idle over the last day or week,
//! cluster-wide and per namespace, from gpu-ledger's own counters in Prometheus. The page draws
//! it as a small chart; the ledger itself never waits for it.
//!
//! The app provides the [`HistorySource`] (the Prometheus queries); answers are cached for
//! [`CACHE_FOR`] and bounded by [`FETCH_TIMEOUT`], and a failure is an answer too
//! (`available: false` with the reason), so the page says why instead of breaking.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How long an answer is reused: the page of every viewer asks on load.
pub const CACHE_FOR: Duration = Duration::from_secs(60);
/// Longest wait for the source; the request then answers "unavailable".
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// GPUs above this in one series are not believed.
const MAX_GPUS: f64 = 1_000_000.0;

/// Why a history request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HistoryError {
    #[error("range {0:?}: expected 24h or 7d")]
    Range(String),
}

/// The two spans the page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Span {
    Day,
    Week,
}

impl Span {
    pub fn parse(s: &str) -> Result<Self, HistoryError> {
        match s {
            "24h" => Ok(Span::Day),
            "7d" => Ok(Span::Week),
            other => Err(HistoryError::Range(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Span::Day => "24h",
            Span::Week => "7d",
        }
    }

    pub fn length(self) -> chrono::Duration {
        match self {
            Span::Day => chrono::Duration::hours(24),
            Span::Week => chrono::Duration::days(7),
        }
    }

    /// Step between points: 96 of them a day, 84 a week.
    pub fn step(self) -> chrono::Duration {
        match self {
            Span::Day => chrono::Duration::minutes(15),
            Span::Week => chrono::Duration::hours(2),
        }
    }
}

/// (namespace, Unix seconds, GPUs) as the source read them.
pub type Points = Vec<(String, i64, f64)>;

/// What a [`HistorySource`] answers: the mean GPUs of each namespace in each step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Raw {
    pub claimed: Points,
    pub busy: Points,
    pub idle: Points,
}

/// Boxed future of a [`HistorySource`] answer.
pub type Fetch<'a> = Pin<Box<dyn Future<Output = Result<Raw, String>> + Send + 'a>>;

/// Where history comes from (the app asks Prometheus).
pub trait HistorySource: Send + Sync {
    /// Steps of `span` ending at `now`, aligned to multiples of [`Span::step`]; `Err` is the
    /// reason, shown on the page.
    fn fetch(&self, span: Span, now: DateTime<Utc>) -> Fetch<'_>;
}

/// One line set of the chart: per step, GPUs claimed, busy and idle (`null`: no data).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    pub claimed: Vec<Option<f64>>,
    pub busy: Vec<Option<f64>>,
    pub idle: Vec<Option<f64>>,
}

/// The answer of `/api/v1/history`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    pub range: &'static str,
    pub step_seconds: i64,
    /// Unix seconds of every step.
    pub t: Vec<i64>,
    pub available: bool,
    /// Why there is no history (`available: false`).
    pub reason: Option<String>,
    pub cluster: Series,
    pub namespaces: BTreeMap<String, Series>,
}

impl History {
    fn unavailable(span: Span, reason: String) -> Self {
        History {
            range: span.name(),
            step_seconds: span.step().num_seconds(),
            t: Vec::new(),
            available: false,
            reason: Some(reason),
            cluster: Series::default(),
            namespaces: BTreeMap::new(),
        }
    }
}

/// Which line of a [`Series`] a set of points fills.
type Line = fn(&mut Series) -> &mut Vec<Option<f64>>;

/// The last answer per span, and when it was fetched.
type Cache = Arc<tokio::sync::Mutex<BTreeMap<Span, (Instant, Arc<History>)>>>;

/// Lays `raw` on the step grid of `span` ending at `now`. Values that cannot be GPUs
/// (negative, NaN, huge) are no data; the cluster line sums the namespaces that have data at a
/// step and has none where no namespace has.
pub fn assemble(span: Span, now: DateTime<Utc>, raw: &Raw) -> History {
    let step = span.step().num_seconds();
    let end = now.timestamp().div_euclid(step) * step;
    let count = span.length().num_seconds() / step;
    let t: Vec<i64> = (0..=count).map(|i| end - (count - i) * step).collect();
    let index = |ts: i64| -> Option<usize> {
        let off = ts.checked_sub(t[0])?;
        if off < 0 || off % step != 0 {
            return None;
        }
        usize::try_from(off / step).ok().filter(|i| *i < t.len())
    };
    let mut namespaces: BTreeMap<String, Series> = BTreeMap::new();
    let mut cluster = Series {
        claimed: vec![None; t.len()],
        busy: vec![None; t.len()],
        idle: vec![None; t.len()],
    };
    let lines: [(&Points, Line); 3] = [
        (&raw.claimed, |s| &mut s.claimed),
        (&raw.busy, |s| &mut s.busy),
        (&raw.idle, |s| &mut s.idle),
    ];
    for (points, line) in lines {
        for (ns, ts, v) in points {
            let (Some(i), true) = (index(*ts), v.is_finite() && (0.0..=MAX_GPUS).contains(v))
            else {
                continue;
            };
            let s = namespaces.entry(ns.clone()).or_insert_with(|| Series {
                claimed: vec![None; t.len()],
                busy: vec![None; t.len()],
                idle: vec![None; t.len()],
            });
            line(s)[i] = Some(*v);
            let c = &mut line(&mut cluster)[i];
            *c = Some(c.unwrap_or(0.0) + v);
        }
    }
    History {
        range: span.name(),
        step_seconds: step,
        t,
        available: true,
        reason: None,
        cluster,
        namespaces,
    }
}

/// State of the history route: the source and the cache.
#[derive(Clone)]
pub struct HistoryState {
    pub source: Option<Arc<dyn HistorySource>>,
    cache: Cache,
}

impl HistoryState {
    pub fn new(source: Option<Arc<dyn HistorySource>>) -> Self {
        HistoryState {
            source,
            cache: Arc::default(),
        }
    }

    /// The cached answer, or a fresh one. One fetch at a time: concurrent viewers wait for it
    /// rather than each asking Prometheus.
    async fn get(&self, span: Span) -> Arc<History> {
        let Some(source) = &self.source else {
            return Arc::new(History::unavailable(
                span,
                "no Prometheus configured (--prometheus-url)".into(),
            ));
        };
        let mut cache = self.cache.lock().await;
        if let Some((at, h)) = cache.get(&span)
            && at.elapsed() < CACHE_FOR
        {
            return h.clone();
        }
        let now = Utc::now();
        let answer = match tokio::time::timeout(FETCH_TIMEOUT, source.fetch(span, now)).await {
            Ok(Ok(raw)) => assemble(span, now, &raw),
            Ok(Err(why)) => History::unavailable(span, why),
            Err(_) => History::unavailable(
                span,
                format!(
                    "Prometheus did not answer within {}s",
                    FETCH_TIMEOUT.as_secs()
                ),
            ),
        };
        if !answer.available {
            tracing::warn!(range = span.name(), reason = ?answer.reason, "history unavailable");
        }
        let answer = Arc::new(answer);
        cache.insert(span, (Instant::now(), answer.clone()));
        answer
    }
}

/// `?range=24h|7d` (default 24h).
#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    #[serde(default)]
    range: Option<String>,
}

/// `GET /api/v1/history`.
pub async fn history(State(state): State<HistoryState>, Query(q): Query<HistoryQuery>) -> Response {
    let span = match Span::parse(q.range.as_deref().unwrap_or("24h")) {
        Ok(s) => s,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let answer = state.get(span).await;
    match serde_json::to_vec(&*answer) {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding history: {e}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_land_on_the_grid_and_the_cluster_sums_namespaces() {
        let now = DateTime::from_timestamp(1_800_000_123, 0).expect("time");
        let step = 900;
        let end = 1_800_000_123 / step * step;
        let raw = Raw {
            claimed: vec![
                ("a".into(), end, 2.0),
                ("b".into(), end, 0.25),
                ("a".into(), end - step, f64::NAN),
                ("a".into(), end + 7, 9.0),
                ("b".into(), end - 2 * step, -1.0),
            ],
            busy: vec![("a".into(), end, 1.0)],
            idle: vec![],
        };
        let h = assemble(Span::Day, now, &raw);
        assert_eq!(h.t.len(), 97);
        assert_eq!(h.t.last(), Some(&end));
        assert_eq!(h.cluster.claimed.last(), Some(&Some(2.25)));
        assert_eq!(h.cluster.busy.last(), Some(&Some(1.0)));
        assert_eq!(h.cluster.idle.last(), Some(&None), "no data is not zero");
        assert_eq!(
            h.cluster.claimed[95], None,
            "NaN is no data, not a point of 0"
        );
        assert_eq!(
            h.namespaces["b"].claimed[94], None,
            "negative GPUs: no data"
        );
        assert!(Span::parse("1y").is_err());
    }
}
