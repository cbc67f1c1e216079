//! The Prometheus HTTP client: connection settings, the one POST of `/api/v1/query` every
//! question goes through (body bounded, envelope checked, warnings counted and returned with its
//! `data`), and the questions gpu-ledger asks. It decodes no answer's `data` itself: that is
//! [`super::decode`]'s, whose functions the typed questions here call, and which reads the
//! window's answer, envelope and `data` in one scan, for [`PromClient::window_series`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::de::IgnoredAny;

use super::bounds::MAX_ANSWER_BYTES;
use super::decode::{self, MatrixRow, Sample, WindowSeries};
use super::envelope::{ApiResponse, Warnings};
use super::error::PromError;
use super::queries::{HEALTH_PART_LABEL, Selector, range_selector};
use crate::ledger::usage::DcgmHealth;
use crate::usage::fields::{HEALTH_WATCH_LABEL, XID_LABEL};
use crate::usage::series::Series;

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

impl PromConfig {
    /// `url` with `timeout` per request and nothing else: no token, the system's CAs (verified),
    /// no selector, no extra headers. Callers set the rest with struct update syntax.
    pub fn new(url: reqwest::Url, timeout: Duration) -> Self {
        PromConfig {
            url,
            bearer_token_file: None,
            ca_file: None,
            insecure_skip_verify: false,
            timeout,
            selector: None,
            headers: Vec::new(),
        }
    }
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

/// Counters of one refresh.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueryStats {
    /// HTTP queries sent.
    pub queries: u32,
    pub duration: Duration,
    /// Warnings in answers since the previous refresh (any query of the client).
    pub warnings: u64,
}

/// An answer (its body, or what was decoded from it) and the warnings Prometheus attached to it.
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
}

/// An answer's body as read: [`PromClient::window`]'s, nothing in it judged yet (its
/// status, envelope and `data` are read by [`PromClient::window_series`], borrowing from it),
/// or another question's, its envelope checked (the decoders of [`super::decode`] read its
/// `data`).
#[derive(Debug)]
pub struct AnswerBody {
    status: u16,
    /// The `Content-Type` header, at most [`MAX_CONTENT_TYPE_CHARS`] characters.
    content_type: Option<String>,
    bytes: Vec<u8>,
}

/// Longest content type kept from an answer (for the error about a non-Prometheus answer).
const MAX_CONTENT_TYPE_CHARS: usize = 80;
/// Characters of a non-JSON body shown in an error: enough to recognise a page, too few to
/// carry one into a log.
const MAX_BODY_EXCERPT_CHARS: usize = 60;

impl AnswerBody {
    /// The body of an HTTP 200 answer read elsewhere (a benchmark's, a test's), for
    /// [`PromClient::window_series`].
    pub fn ok(bytes: Vec<u8>) -> Self {
        Self {
            status: 200,
            content_type: Some("application/json".into()),
            bytes,
        }
    }

    /// The body's bytes, for [`super::decode`].
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// "content type text/html, body starts \"<!DOCTYPE html> <html>…\"": control characters
    /// and runs of whitespace become one space, the text is cut and quoted with escapes.
    fn describe(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        let mut excerpt = String::new();
        let mut chars = 0;
        let mut last_space = false;
        for c in text.chars() {
            if chars >= MAX_BODY_EXCERPT_CHARS {
                excerpt.push('…');
                break;
            }
            let space = c.is_whitespace() || c.is_control();
            if space && last_space {
                continue;
            }
            excerpt.push(if space { ' ' } else { c });
            last_space = space;
            chars += 1;
        }
        let content_type = self.content_type.as_deref().unwrap_or("none");
        format!(
            "content type {content_type:?}, body starts {:?}",
            excerpt.trim()
        )
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
                .map_err(|e| PromError::config(format!("reading CA file {}", ca.display()), e))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| PromError::config(format!("parsing CA file {}", ca.display()), e))?;
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
                .map_err(|e| PromError::config(format!("header {:?}", h.name), e))?;
            let mut value = reqwest::header::HeaderValue::from_str(&h.value)
                .map_err(|e| PromError::config(format!("value of header {}", h.name), e))?;
            // Tenant ids are not secrets, but keep header values out of debug output anyway.
            value.set_sensitive(true);
            headers.append(name, value);
        }
        b = b.default_headers(headers);
        let http = b
            .build()
            .map_err(|e| PromError::config("building the HTTP client", e.without_url()))?;
        let mut base = cfg.url;
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let query_url = base
            .join("api/v1/query")
            .map_err(|e| PromError::config("the prometheus URL", e))?;
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
            PromError::config(format!("reading bearer token file {}", path.display()), e)
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
        let body = self.ask(token, query, at, timeout).await?.complete()?;
        decode::query_data(&body.bytes)?.into_samples()
    }

    /// One instant query (POST form `query`, `time`): its body, read up to [`MAX_ANSWER_BYTES`],
    /// with its envelope checked and its warnings (counted and logged here, [`Self::envelope`]).
    async fn ask(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<Answered<AnswerBody>, PromError> {
        let body = self.answer_body(token, query, at, timeout).await?;
        let warnings = self.envelope(&body)?;
        Ok(Answered {
            value: body,
            warnings,
        })
    }

    /// The body of an answer to one instant query (POST form `query`, `time`), read up to
    /// [`MAX_ANSWER_BYTES`]; [`Self::envelope`] reads it.
    async fn answer_body(
        &self,
        token: Option<&str>,
        query: &str,
        at: DateTime<Utc>,
        timeout: Option<Duration>,
    ) -> Result<AnswerBody, PromError> {
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
        let mut resp = req.send().await.map_err(PromError::from_reqwest)?;
        let status = resp.status();
        let content_type = resp.headers().get(reqwest::header::CONTENT_TYPE).map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(MAX_CONTENT_TYPE_CHARS)
                .collect()
        });
        let announced = resp.content_length();
        if announced.is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
            return Err(PromError::BodyTooLarge);
        }
        // Sized once when announced: growing by doubling would hold two copies on the way.
        let mut body: Vec<u8> =
            Vec::with_capacity(announced.and_then(|n| usize::try_from(n).ok()).unwrap_or(0));
        while let Some(chunk) = resp.chunk().await.map_err(PromError::from_reqwest)? {
            if body.len().saturating_add(chunk.len()) > MAX_ANSWER_BYTES {
                return Err(PromError::BodyTooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        tracing::debug!(
            query,
            bytes = body.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "prometheus answered"
        );
        Ok(AnswerBody {
            status: status.as_u16(),
            content_type,
            bytes: body,
        })
    }

    /// An answer's envelope ([`Self::judge`]), `data` skipped unread (no copy, no allocation):
    /// the caller decodes it with [`super::decode`], in a second scan of the body. Its warnings.
    fn envelope(&self, body: &AnswerBody) -> Result<Warnings, PromError> {
        let parsed = serde_json::from_slice::<ApiResponse<IgnoredAny>>(&body.bytes);
        Ok(self.judge(body, parsed)?.warnings)
    }

    /// Judges an answer (`parsed` from `body`): an error status, an unsuccessful answer or one
    /// without `data` is an error; its warnings are counted and logged here, and returned with
    /// its `data`.
    fn judge<D>(
        &self,
        body: &AnswerBody,
        parsed: Result<ApiResponse<D>, serde_json::Error>,
    ) -> Result<Answered<D>, PromError> {
        if !(200..300).contains(&body.status) {
            return Err(match parsed {
                Ok(r) => PromError::Status {
                    code: body.status,
                    error_type: r.error_type.unwrap_or_default(),
                    message: r.error.unwrap_or_default(),
                },
                Err(_) => PromError::NotPrometheus {
                    code: body.status,
                    answer: body.describe(),
                },
            });
        }
        let r = match parsed {
            Ok(r) => r,
            // Not JSON at all: a web page, not a Prometheus answer that failed to decode.
            Err(e) if e.is_syntax() && !body.bytes.trim_ascii_start().starts_with(b"{") => {
                return Err(PromError::NotPrometheus {
                    code: body.status,
                    answer: body.describe(),
                });
            }
            Err(e) => return Err(PromError::decoding(&e)),
        };
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
        let Some(data) = r.data else {
            return Err(PromError::Unexpected("success without data".into()));
        };
        Ok(Answered {
            value: data,
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
        let rows = self.instant_series(query, at).await?;
        Ok(rows.into_iter().flat_map(MatrixRow::into_samples).collect())
    }

    /// As [`Self::instant_matrix`], each series once: its labels and its points
    /// ([`MatrixRow::labels`], [`MatrixRow::points`]), for callers that fold many points per
    /// series (showback reads millions) and must not hold a label map per point.
    pub async fn instant_series(
        &self,
        query: &str,
        at: DateTime<Utc>,
    ) -> Result<Vec<MatrixRow>, PromError> {
        let token = self.token()?;
        let body = self
            .ask(token.as_deref(), query, at, None)
            .await?
            .complete()?;
        decode::query_data(&body.bytes)?.into_rows()
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
        let token = self.token()?;
        let query = self.window_selector("", fields, range);
        let body = self
            .ask(token.as_deref(), &query, at, None)
            .await?
            .complete()?;
        decode::query_data(&body.bytes)?.into_series()
    }

    /// The devices with DCGM series but none under a name gpu-ledger reads, among those of
    /// `scope` (`,`-prefixed matchers; empty: every device), at `at`
    /// ([`super::queries::fields_missing_query`]). A value that is no count is an error.
    pub async fn devices_fields_missing(
        &self,
        scope: &str,
        at: DateTime<Utc>,
    ) -> Result<u64, PromError> {
        let query = super::queries::fields_missing_query(&format!("{}{scope}", self.matchers));
        let samples = self.instant(&query, at).await?;
        let value = match samples.as_slice() {
            [one] => one.value,
            _ => {
                return Err(PromError::Unexpected(format!(
                    "{} samples answering the fields-missing count (expected 1)",
                    samples.len()
                )));
            }
        };
        if !(value.is_finite() && value >= 0.0 && value <= f64::from(u32::MAX)) {
            return Err(PromError::Unexpected(format!(
                "fields-missing count {value} is no device count"
            )));
        }
        // Checked above: finite, not negative, within u32.
        Ok(value.round() as u64)
    }

    /// DCGM's health verdicts over `window` for the GPUs of `scope` (`,`-prefixed matchers;
    /// empty: every GPU), at `at` ([`super::queries::gpu_health_query`]): only GPUs with a
    /// non-passing watch or an XID. Health layer.
    pub async fn gpu_health(
        &self,
        scope: &str,
        window: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<Vec<DcgmHealth>, PromError> {
        let query = super::queries::gpu_health_query(window, &format!("{}{scope}", self.matchers));
        Ok(health_of(&self.instant(&query, at).await?))
    }

    /// The answer to the window's selector narrowed by `scope` (`,`-prefixed matchers, e.g. a
    /// shard's [`super::queries::scope_matcher`]; empty: every device): raw samples of `fields`
    /// over `(at - range, at]`, with their own timestamps, one instant query of a range-vector
    /// selector (`{__name__=~"A|B"}[range]`), the cheapest question Prometheus answers (no
    /// evaluation per step). Every window read asks it (the refresh, the pre-stop re-check,
    /// scheme detection). The body is returned as read, nothing in it judged yet: the caller
    /// reads it with [`Self::window_series`], envelope and `data` in one scan.
    pub async fn window(
        &self,
        scope: &str,
        fields: &[&str],
        range: chrono::Duration,
        at: DateTime<Utc>,
    ) -> Result<AnswerBody, PromError> {
        let token = self.token()?;
        let query = self.window_selector(scope, fields, range);
        self.answer_body(token.as_deref(), &query, at, None).await
    }

    /// The series of an answer to [`Self::window`], envelope and `data` read in one scan of
    /// `body` ([`decode::window_answer`]; label values borrowed from it) and judged as every
    /// answer is ([`Self::judge`]: warnings counted and logged). A partial answer is returned with
    /// its warnings: busy samples in it are still evidence.
    ///
    /// The errors are those of reading the envelope first and `data` after (as before issue 41):
    /// when the one scan fails, the body is scanned again for the envelope alone, so an error
    /// status, an unsuccessful answer or a malformed envelope wins over a malformed `data`, and
    /// the warnings of a successful answer are counted even when its `data` is refused. Only a
    /// refused answer pays the second scan.
    pub fn window_series<'b>(
        &self,
        body: &'b AnswerBody,
    ) -> Result<Answered<WindowSeries<'b>>, PromError> {
        match decode::window_answer(&body.bytes) {
            Ok(answer) => {
                let Answered { value, warnings } = self.judge(body, Ok(answer))?;
                Ok(Answered {
                    value: value.into_matrix()?,
                    warnings,
                })
            }
            // The envelope's own error first, as the two-scan read met it. If the envelope
            // reads, the one scan failed in `data`, at the place the second scan of the two-scan
            // read met its error: the same error.
            Err(e) => {
                self.envelope(body)?;
                Err(PromError::decoding(&e))
            }
        }
    }

    /// `{__name__=~"<fields>",<matchers><scope>}[range]`: the one selector every window read sends.
    fn window_selector(&self, scope: &str, fields: &[&str], range: chrono::Duration) -> String {
        range_selector(fields, &format!("{}{scope}", self.matchers), range)
    }
}

/// Most GPUs, and most watches or XID codes per GPU, kept of a health answer (an answer is
/// untrusted: a real GPU has a dozen watches and a handful of codes).
const MAX_HEALTH_GPUS: usize = 65_536;
const MAX_HEALTH_ENTRIES: usize = 64;
/// Longest health watch name kept (DCGM's are short: `THERMAL`, `UNKNOWN(12)`).
const MAX_WATCH_BYTES: usize = 64;

/// Folds the samples of [`super::queries::gpu_health_query`] into one entry per GPU UUID (either
/// spelling of the label). A sample without a UUID, an XID that is no code, a watch name too long
/// or a value that is not a finite positive number is left out: health unknown is not sickness.
fn health_of(samples: &[Sample]) -> Vec<DcgmHealth> {
    let mut out: Vec<DcgmHealth> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in samples {
        if !(s.value.is_finite() && s.value > 0.0) {
            continue;
        }
        let label = |k: &str| {
            s.labels
                .get(k)
                .map(String::as_str)
                .filter(|v| !v.is_empty())
        };
        let Some(uuid) = label("UUID").or_else(|| label("uuid")) else {
            continue;
        };
        let i = match index.get(uuid) {
            Some(i) => *i,
            None if out.len() < MAX_HEALTH_GPUS => {
                index.insert(uuid.to_string(), out.len());
                out.push(DcgmHealth {
                    uuid: uuid.to_string(),
                    ..DcgmHealth::default()
                });
                out.len() - 1
            }
            None => continue,
        };
        let h = &mut out[i];
        match label(HEALTH_PART_LABEL) {
            Some("watch") => {
                if let Some(w) = label(HEALTH_WATCH_LABEL).filter(|w| w.len() <= MAX_WATCH_BYTES)
                    && h.watches.len() < MAX_HEALTH_ENTRIES
                {
                    h.watches.push((w.to_string(), s.value));
                }
            }
            Some("xid") => {
                if let Some(code) = label(XID_LABEL).and_then(|x| x.trim().parse::<u32>().ok())
                    && h.xids.len() < MAX_HEALTH_ENTRIES
                    && !h.xids.contains(&code)
                {
                    h.xids.push(code);
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::usage::prom::bounds::MAX_LABEL_BYTES;

    #[test]
    fn warnings_make_an_answer_partial() {
        let answered = Answered {
            value: (),
            warnings: Warnings {
                count: 10,
                kept: vec!["0: www".into()],
            },
        };
        assert!(answered.is_partial());
        let err = answered.complete().expect_err("partial");
        assert_eq!(err.kind(), "partial");
        assert!(err.to_string().contains("10 warnings"), "{err}");
        let complete = Answered {
            value: (),
            warnings: Warnings::default(),
        };
        assert!(!complete.is_partial());
        assert!(complete.complete().is_ok());
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

    /// Settings for `url` and nothing else.
    fn config(url: &str) -> PromConfig {
        PromConfig::new(url.parse().expect("url"), Duration::from_secs(30))
    }

    #[tokio::test]
    async fn path_prefix_and_tenant_headers_reach_the_store() {
        let (url, request) = capture_request().await;
        let client = PromClient::new(PromConfig {
            headers: vec![
                "X-Scope-OrgID: team-a".parse().expect("header"),
                "X-Extra: 1".parse().expect("header"),
            ],
            ..config(&url)
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

    /// The configured URL may carry `user:password`; a transport error keeps its causes
    /// (printed once as a chain) but not the URL, so neither reaches a log or a reason.
    #[tokio::test]
    async fn a_transport_error_keeps_its_causes_but_not_the_url() {
        // A port nothing listens on: bound, then closed, so the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let client = PromClient::new(config(&format!(
            "http://gl-user:s3cret-pw@127.0.0.1:{port}/prefix"
        )))
        .expect("client");
        let err = client
            .instant("vector(1)", chrono::Utc::now())
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), "transport", "{err:?}");
        let chain = crate::telemetry::error_chain(&err);
        let debug = format!("{err:?}");
        assert!(
            std::error::Error::source(&err).is_some(),
            "the cause is kept: {debug}"
        );
        for shown in [&chain, &debug] {
            for secret in ["s3cret-pw", "gl-user", "/prefix/api/v1/query"] {
                assert!(!shown.contains(secret), "{secret:?} in {shown}");
            }
        }
        assert!(chain.starts_with("prometheus transport error: "), "{chain}");
    }

    /// The read of a window answer before issue 41, kept as the reference the one-scan read
    /// ([`PromClient::window_series`]) must equal: the envelope scanned with `data` skipped,
    /// then `data` scanned again ([`decode::window_data`]).
    fn two_scans(
        client: &PromClient,
        body: &AnswerBody,
    ) -> Result<Answered<Vec<Series>>, PromError> {
        let warnings = client.envelope(body)?;
        let series = decode::window_data(&body.bytes)?.into_series();
        Ok(Answered {
            value: series,
            warnings,
        })
    }

    fn one_scan(
        client: &PromClient,
        body: &AnswerBody,
    ) -> Result<Answered<Vec<Series>>, PromError> {
        let answered = client.window_series(body)?;
        Ok(Answered {
            value: answered.value.into_series(),
            warnings: answered.warnings,
        })
    }

    /// A read's outcome as text: the series (`Debug`, so NaN equals NaN) and warnings, or the
    /// error's kind and whole chain; then the warnings the client counted for its metric.
    fn outcome(client: &PromClient, read: Result<Answered<Vec<Series>>, PromError>) -> String {
        let counted = client.take_warnings();
        match read {
            Ok(a) => format!("ok {:?} {:?}, counted {counted}", a.value, a.warnings),
            Err(e) => format!(
                "{} error: {}, counted {counted}",
                e.kind(),
                crate::telemetry::error_chain(&e)
            ),
        }
    }

    /// Both reads of `text` answered with HTTP `code`: (one scan, two scans).
    fn both_reads(code: u16, text: &str) -> (String, String) {
        let client = PromClient::new(config("http://127.0.0.1:9/")).expect("client");
        let body = AnswerBody {
            status: code,
            content_type: Some("application/json".into()),
            bytes: text.as_bytes().to_vec(),
        };
        let new = outcome(&client, one_scan(&client, &body));
        let old = outcome(&client, two_scans(&client, &body));
        (new, old)
    }

    const SERIES: &str = r#"{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-a","pod":"p","job":"j"},"values":[[1700000000,"42"],[1700000015,"NaN"]]}"#;

    #[test]
    fn one_scan_reads_recorded_answers_as_the_two_scans_did() {
        let matrix = format!(r#"{{"resultType":"matrix","result":[{SERIES}]}}"#);
        let long = "x".repeat(2000);
        for (code, text, expected) in [
            (
                200,
                format!(r#"{{"status":"success","data":{matrix}}}"#),
                r#"ok [Series { name: "DCGM_FI_DEV_GPU_UTIL", labels: {"UUID": "GPU-a", "pod": "p"}"#,
            ),
            // Keys in any order: `status` and `warnings` after `data`.
            (
                200,
                format!(r#"{{"data":{matrix},"warnings":["w1 {long}","w2"],"status":"success"}}"#),
                "Warnings { count: 2, kept: [\"w1 xxx",
            ),
            // An error answer without `data`; one whose `data` is malformed: the error wins.
            (
                422,
                r#"{"status":"error","errorType":"execution","error":"too many samples"}"#.into(),
                "status error: prometheus answered HTTP 422 (execution): too many samples",
            ),
            (
                503,
                r#"{"data":{"resultType":"matrix","result":[{"values":[[1,"4x2"]]}]},"status":"error","errorType":"unavailable","error":"down"}"#.into(),
                "status error: prometheus answered HTTP 503 (unavailable): down",
            ),
            (
                200,
                r#"{"data":{"resultType":"matrix"},"status":"error","errorType":"bad_data","error":"x"}"#.into(),
                "api error: prometheus query failed (bad_data): x",
            ),
            // A bad sample value, with warnings: counted, then refused.
            (
                200,
                format!(r#"{{"status":"success","warnings":["w"],"data":{}}}"#, matrix.replace(r#""42""#, r#""4x2""#)),
                r#"decode error: cannot decode prometheus answer: bad sample value "4x2" at line 1 column"#,
            ),
            (
                200,
                r#"{"status":"success","warnings":["w"]}"#.into(),
                "decode error: cannot decode prometheus answer: success without data, counted 1",
            ),
            (
                200,
                format!(r#"{{"status":"success","data":{matrix},"data":{matrix}}}"#),
                "duplicate field `data`",
            ),
            (
                200,
                format!(r#"{{"status":"success","data":{matrix},"status":"success"}}"#),
                "duplicate field `status`",
            ),
            (
                200,
                r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#.into(),
                "decode error: cannot decode prometheus answer: expected a matrix answer",
            ),
            (
                200,
                format!(r#"{{"status":"success","data":{}}}"#, matrix.replace(r#""p""#, &format!("{:?}", "v".repeat(MAX_LABEL_BYTES + 1)))),
                "too_large error: prometheus answer refused: answer over gpu-ledger's bounds",
            ),
            (
                502,
                "<html><body>bad gateway</body></html>".into(),
                "decode error: not a Prometheus API answer (HTTP 502",
            ),
        ] {
            let (new, old) = both_reads(code, &text);
            assert_eq!(new, old, "{text}");
            assert!(new.contains(expected), "{text}\n{new}\nexpected {expected}");
        }
    }

    /// One of `choices`, each as often as its weight.
    fn weighted(choices: &[(u32, &'static str)]) -> impl Strategy<Value = &'static str> {
        proptest::strategy::Union::new_weighted(
            choices.iter().map(|(w, c)| (*w, Just(*c))).collect(),
        )
    }

    /// Answers as a Prometheus, a Thanos, a proxy re-encoding with sorted keys or a hostile
    /// endpoint may write them: HTTP status, the envelope's keys in any order, some missing,
    /// mistyped or repeated, warnings, and `data` valid, malformed, over a bound or another
    /// answer type.
    fn any_answer() -> impl Strategy<Value = (u16, String)> {
        use proptest::collection::vec;
        use proptest::sample::select;
        let series = (
            weighted(&[
                (6, "DCGM_FI_DEV_GPU_UTIL"),
                (6, "DCGM_FI_DEV_FB_USED"),
                (6, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                (1, ""),
            ]),
            select(&["GPU-a", "GPU-b", r"caf\u00e9", ""][..]),
            vec(
                weighted(&[
                    (10, r#""1""#),
                    (10, r#""0.5""#),
                    (3, r#""NaN""#),
                    (3, r#""+Inf""#),
                    (1, r#""4x2""#),
                    (1, "1"),
                ]),
                0..4,
            ),
            any::<bool>(),
        )
            .prop_map(|(name, uuid, values, values_first)| {
                let name = if name.is_empty() {
                    String::new()
                } else {
                    format!(r#""__name__":"{name}","#)
                };
                let metric = format!(r#""metric":{{{name}"UUID":"{uuid}","pod":"p","job":"j"}}"#);
                let values = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("[{},{v}]", 1_700_000_000 + 15 * i))
                    .collect::<Vec<_>>()
                    .join(",");
                if values_first {
                    format!(r#"{{"values":[{values}],{metric}}}"#)
                } else {
                    format!(r#"{{{metric},"values":[{values}]}}"#)
                }
            });
        let matrix = (vec(series, 0..4), any::<bool>()).prop_map(|(rows, result_first)| {
            let result = rows.join(",");
            if result_first {
                format!(r#"{{"result":[{result}],"resultType":"matrix"}}"#)
            } else {
                format!(r#"{{"resultType":"matrix","result":[{result}]}}"#)
            }
        });
        let over_bound = format!(
            r#"{{"resultType":"matrix","result":[{{"metric":{{"__name__":"x","pod":"{}"}},"values":[]}}]}}"#,
            "v".repeat(MAX_LABEL_BYTES + 1)
        );
        let data = prop_oneof![
            6 => matrix,
            1 => Just(r#"{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]}]}"#.to_string()),
            1 => Just(r#"{"resultType":"matrix"}"#.to_string()),
            1 => Just(r#"{"resultType":"matrix","result":[],"result":[]}"#.to_string()),
            1 => Just(over_bound),
            1 => Just("null".to_string()),
            1 => Just(r#""text""#.to_string()),
        ];
        let status = weighted(&[(8, r#""success""#), (2, r#""error""#), (1, "5")]);
        let error_type = weighted(&[(3, r#""bad_data""#), (3, r#""timeout""#), (1, "7")]);
        let error = prop_oneof![
            Just(r#""query failed""#.to_string()),
            Just(format!("\"{}\"", "é".repeat(600))),
        ];
        let warnings = prop_oneof![
            2 => Just("null".to_string()),
            2 => Just("[]".to_string()),
            1 => Just(r#""one""#.to_string()),
            6 => (1..8_usize).prop_map(|n| {
                let w: Vec<String> = (0..n)
                    .map(|i| format!(r#""w{i} {}""#, "x".repeat(i * 200)))
                    .collect();
                format!("[{}]", w.join(","))
            }),
        ];
        let entries = (
            proptest::option::weighted(0.9, status),
            proptest::option::weighted(0.85, data),
            proptest::option::of(error_type),
            proptest::option::of(error),
            proptest::option::of(warnings),
            proptest::option::of(Just(r#"{"stats":[1,{"a":2}]}"#)),
        )
            .prop_map(|(status, data, error_type, error, warnings, infos)| {
                [
                    ("status", status.map(String::from)),
                    ("data", data),
                    ("errorType", error_type.map(String::from)),
                    ("error", error),
                    ("warnings", warnings),
                    ("infos", infos.map(String::from)),
                ]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!(r#""{k}":{v}"#)))
                .collect::<Vec<_>>()
            });
        let shape = weighted(&[(12, "plain"), (1, "repeated"), (1, "html"), (1, "trailing")]);
        let code = proptest::strategy::Union::new_weighted(vec![
            (6, Just(200_u16)),
            (1, Just(400)),
            (1, Just(422)),
            (1, Just(503)),
        ]);
        (code, entries, shape)
            .prop_flat_map(|(code, entries, shape)| {
                (Just(code), Just(entries).prop_shuffle(), Just(shape))
            })
            .prop_map(|(code, mut entries, shape)| {
                if shape == "repeated"
                    && let Some(first) = entries.first().cloned()
                {
                    entries.push(first);
                }
                let text = format!("{{{}}}", entries.join(","));
                let text = match shape {
                    "html" => "<!DOCTYPE html><html>sign in</html>".to_string(),
                    "trailing" => format!("{text} x"),
                    _ => text,
                };
                (code, text)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn one_scan_reads_any_answer_as_the_two_scans_did((code, text) in any_answer()) {
            let (new, old) = both_reads(code, &text);
            prop_assert_eq!(new, old, "{}", text);
        }
    }

    #[test]
    fn health_answers_fold_per_gpu_and_drop_what_is_no_reading() {
        let sample = |labels: &[(&str, &str)], value: f64| Sample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            time: 0.0,
            value,
        };
        let h = health_of(&[
            sample(
                &[
                    ("UUID", "GPU-a"),
                    ("health_part", "watch"),
                    ("health_watch", "THERMAL"),
                ],
                20.0,
            ),
            sample(
                &[("uuid", "GPU-a"), ("health_part", "xid"), ("xid", "79")],
                2.0,
            ),
            sample(
                &[("UUID", "GPU-a"), ("health_part", "xid"), ("xid", "79")],
                1.0,
            ),
            sample(
                &[
                    ("UUID", "GPU-b"),
                    ("health_part", "xid"),
                    ("xid", "not-a-code"),
                ],
                1.0,
            ),
            sample(
                &[
                    ("UUID", "GPU-c"),
                    ("health_part", "watch"),
                    ("health_watch", "POWER"),
                ],
                f64::NAN,
            ),
            sample(&[("health_part", "xid"), ("xid", "48")], 1.0),
        ]);
        assert_eq!(
            h,
            vec![
                DcgmHealth {
                    uuid: "GPU-a".into(),
                    watches: vec![("THERMAL".into(), 20.0)],
                    xids: vec![79],
                },
                DcgmHealth {
                    uuid: "GPU-b".into(),
                    ..DcgmHealth::default()
                },
            ]
        );
    }
}
