//! The optional webhook of the notice before a stop (`--cull-notice-webhook-url-file`): one POST
//! per notice written or cancelled, in the background, so a slow or failing receiver never holds
//! the culling cycle back.
//!
//! Two bodies (docs/culling.md): Alertmanager's webhook format (`version` 4, one alert that is
//! `firing` while the stop is scheduled and `resolved` when it is cancelled), which anything that
//! takes Alertmanager webhooks routes; and Slack's incoming-webhook format (`text`). The URL is
//! read from a file (a mounted Secret: it usually carries a token) at every post, so a rotated
//! Secret is picked up, and it never appears in a log line, an error or a metric. Redirects are
//! not followed (a 3xx is a failed post) and no `Referer` is sent, so the notice and the URL's
//! token go to the URL in the Secret and nowhere else.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::IntCounterVec;
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::actuator::notice_event;
use super::plan::{Notice, rfc3339};

/// Bound of one POST (connect, send, answer).
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// `--cull-notice-webhook-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WebhookFormat {
    /// Alertmanager's webhook body (`version` 4).
    #[default]
    Alertmanager,
    /// Slack's incoming-webhook body (`{"text": …}`).
    Slack,
}

/// Why the webhook cannot be used or a post failed. Never holds the URL.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("reading the notice webhook URL file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the notice webhook URL file {path} does not hold an http:// or https:// URL")]
    Url { path: PathBuf },
    #[error("building the webhook HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("posting the notice webhook")]
    Post(#[source] reqwest::Error),
    #[error("the notice webhook answered HTTP {0}")]
    Status(u16),
    /// A 3xx. Following it would send the notice (and, as `Referer`, the URL with its token) to
    /// a host the Secret does not name; the `Location` is not logged, it may carry a token too.
    #[error(
        "the notice webhook answered HTTP {0} (a redirect, not followed: put the final URL in the URL file)"
    )]
    Redirect(u16),
}

/// The body of one notice in `format`, as of `now` (the cycle's time).
pub fn payload(notice: &Notice, format: WebhookFormat, now: DateTime<Utc>) -> Value {
    let (namespace, notebook, _) = notice.object();
    let event = notice_event(notice);
    let kind = notice.target().identity().kind;
    match format {
        WebhookFormat::Alertmanager => {
            // Alertmanager's webhook_config body, version 4 (prometheus.io/docs/alerting/latest/
            // configuration/#webhook_config; e.g. the sample v4 payload of the
            // alertmanager-webhook-types crate): a firing alert while the stop is scheduled, the
            // same alert resolved when it is cancelled.
            let (status, ends_at) = match notice {
                Notice::Schedule { .. } => ("firing", "0001-01-01T00:00:00Z".to_string()),
                Notice::Cancel { .. } => ("resolved", rfc3339(now)),
            };
            let (Notice::Schedule { pod, stop_at, .. } | Notice::Cancel { pod, stop_at, .. }) =
                notice;
            let labels = json!({
                "alertname": "GpuIdleStopScheduled",
                "namespace": namespace,
                "notebook": notebook,
                "pod": pod,
                "severity": "warning",
            });
            let annotations = json!({
                "summary": format!("{kind} {namespace}/{notebook} stops at {} unless it is used or snoozed", rfc3339(*stop_at)),
                "description": event.note,
                "stop_at": rfc3339(*stop_at),
            });
            json!({
                "version": "4",
                "groupKey": format!("{{}}:{{namespace=\"{namespace}\", notebook=\"{notebook}\"}}"),
                "truncatedAlerts": 0,
                "status": status,
                "receiver": "gpu-ledger",
                "groupLabels": {"namespace": namespace, "notebook": notebook},
                "commonLabels": labels,
                "commonAnnotations": annotations,
                "externalURL": "",
                "alerts": [{
                    "status": status,
                    "labels": labels,
                    "annotations": annotations,
                    "startsAt": rfc3339(now),
                    "endsAt": ends_at,
                    "generatorURL": "",
                    "fingerprint": "",
                }],
            })
        }
        // Slack's incoming webhooks take a JSON body whose `text` is the message
        // (api.slack.com/messaging/webhooks).
        WebhookFormat::Slack => json!({
            "text": format!("*{}* {namespace}/{notebook}: {}", event.reason, event.note),
        }),
    }
}

/// Reads and checks the URL in `path` (surrounding whitespace ignored).
pub fn read_url(path: &Path) -> Result<reqwest::Url, WebhookError> {
    let text = std::fs::read_to_string(path).map_err(|source| WebhookError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    reqwest::Url::parse(text.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
        .ok_or_else(|| WebhookError::Url {
            path: path.to_path_buf(),
        })
}

/// Posts notices to the URL in a file.
#[derive(Clone)]
pub struct Webhook {
    url_file: PathBuf,
    format: WebhookFormat,
    client: reqwest::Client,
    /// `gpu_ledger_cull_notice_webhook_total{result}` (`sent`, `error`), when registered.
    counter: Option<IntCounterVec>,
}

impl Webhook {
    /// Checks the URL file now, so a bad mount fails at start-up rather than at the first notice.
    pub fn new(url_file: &Path, format: WebhookFormat) -> Result<Self, WebhookError> {
        read_url(url_file)?;
        // No redirects and no `Referer`: reqwest follows up to 10 redirects by default, a 307/308
        // with the body, and names the webhook URL (its token in path and query) as `Referer` to
        // the next host. The URL in the Secret is the only receiver.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .timeout(WEBHOOK_TIMEOUT)
            .connect_timeout(WEBHOOK_TIMEOUT)
            .user_agent(concat!("gpu-ledger/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(WebhookError::Client)?;
        Ok(Webhook {
            url_file: url_file.to_path_buf(),
            format,
            client,
            counter: None,
        })
    }

    #[must_use]
    pub fn with_counter(mut self, counter: IntCounterVec) -> Self {
        self.counter = Some(counter);
        self
    }

    /// One POST, bounded by [`WEBHOOK_TIMEOUT`]. Errors carry no URL.
    pub async fn send(&self, notice: &Notice, now: DateTime<Utc>) -> Result<(), WebhookError> {
        let url = read_url(&self.url_file)?;
        let body = payload(notice, self.format, now);
        let answer = self
            .client
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| WebhookError::Post(e.without_url()))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else if status.is_redirection() {
            Err(WebhookError::Redirect(status.as_u16()))
        } else {
            Err(WebhookError::Status(status.as_u16()))
        }
    }

    /// Posts in the background: the culling cycle never waits for the receiver. A failure is
    /// logged (without the URL) and counted.
    pub fn post(&self, notice: &Notice, now: DateTime<Utc>) -> tokio::task::JoinHandle<()> {
        let (this, notice) = (self.clone(), notice.clone());
        tokio::spawn(async move {
            let (namespace, notebook, _) = notice.object();
            let result = match this.send(&notice, now).await {
                Ok(()) => {
                    debug!(%namespace, %notebook, kind = notice.kind(), "notice webhook sent");
                    "sent"
                }
                Err(e) => {
                    warn!(%namespace, %notebook, kind = notice.kind(), error = &e as &dyn std::error::Error, "notice webhook failed");
                    "error"
                }
            };
            if let Some(c) = &this.counter {
                c.with_label_values(&[result]).inc();
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
