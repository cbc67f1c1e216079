//! Webhook bodies, and posts to a tiny local HTTP receiver (a test double standing in for
//! Alertmanager or Slack: it records what it was sent and answers with a chosen status).

use axum::http::StatusCode;
use chrono::{Duration, TimeZone};
use tokio::sync::mpsc;

use super::*;
use crate::cull::plan::CancelReason;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0)
        .single()
        .expect("time")
}

/// The stop the notices come before: `team-a/nb` (uid `nb-uid`, pod `nb-0`), idle 3h.
fn noticed_stop() -> crate::cull::plan::Action {
    crate::cull::plan::Action::notebook_stop("team-a", "nb")
        .with_uid("nb-uid")
        .idle_for(3.0 * 3600.0, Some(0.008))
}

fn schedule() -> Notice {
    noticed_stop().notice(now() + Duration::minutes(30))
}

fn cancel() -> Notice {
    noticed_stop().notice_cancelled(now() + Duration::minutes(30), CancelReason::Activity)
}

/// The test double: a local HTTP receiver on a secret-looking path, answering `status`.
pub(crate) async fn receiver(status: StatusCode) -> (String, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hooks/s3cr3t-token",
        axum::routing::post(move |axum::Json(v): axum::Json<Value>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(v);
                status
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hooks/s3cr3t-token"), rx)
}

pub(crate) fn url_file(url: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("tmp");
    // A mounted Secret may end in a newline.
    std::fs::write(f.path(), format!("{url}\n")).expect("write");
    f
}

fn counter() -> IntCounterVec {
    IntCounterVec::new(prometheus::Opts::new("t", "t"), &["result"]).expect("counter")
}

#[test]
fn alertmanager_body_fires_on_schedule_and_resolves_on_cancel() {
    let body = payload(&schedule(), WebhookFormat::Alertmanager, now());
    assert_eq!(body["version"], "4");
    assert_eq!(body["status"], "firing");
    let alert = &body["alerts"][0];
    assert_eq!(alert["status"], "firing");
    assert_eq!(alert["labels"]["alertname"], "GpuIdleStopScheduled");
    assert_eq!(alert["labels"]["namespace"], "team-a");
    assert_eq!(alert["labels"]["notebook"], "nb");
    assert_eq!(alert["startsAt"], "2026-01-31T12:00:00Z");
    assert_eq!(alert["endsAt"], "0001-01-01T00:00:00Z");
    assert_eq!(alert["annotations"]["stop_at"], "2026-01-31T12:30:00Z");
    let description = alert["annotations"]["description"].as_str().expect("text");
    assert!(
        description.contains("unless it is used or snoozed")
            && description.contains("gpu-ledger.io/snooze-until="),
        "{description}"
    );
    let body = payload(&cancel(), WebhookFormat::Alertmanager, now());
    assert_eq!(body["status"], "resolved");
    assert_eq!(body["alerts"][0]["endsAt"], "2026-01-31T12:00:00Z");
    assert_eq!(
        body["alerts"][0]["labels"]["alertname"],
        "GpuIdleStopScheduled"
    );
}

#[test]
fn slack_body_is_one_text() {
    let body = payload(&schedule(), WebhookFormat::Slack, now());
    let text = body["text"].as_str().expect("text");
    assert!(
        text.starts_with("*GpuIdleStopScheduled* team-a/nb: gpu-ledger will stop this notebook at 2026-01-31T12:30:00Z"),
        "{text}"
    );
    let body = payload(&cancel(), WebhookFormat::Slack, now());
    assert!(
        body["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("*GpuIdleStopCancelled* team-a/nb:")),
        "{body}"
    );
    assert_eq!(body.as_object().map(serde_json::Map::len), Some(1));
}

#[tokio::test]
async fn posts_the_body_to_the_url_in_the_file() {
    let (url, mut got) = receiver(StatusCode::OK).await;
    let file = url_file(&url);
    let c = counter();
    let hook = Webhook::new(file.path(), WebhookFormat::Slack)
        .expect("webhook")
        .with_counter(c.clone());
    hook.post(&schedule(), now()).await.expect("post task");
    let body = got.recv().await.expect("received");
    assert_eq!(body, payload(&schedule(), WebhookFormat::Slack, now()));
    assert_eq!(c.with_label_values(&["sent"]).get(), 1);
    assert_eq!(c.with_label_values(&["error"]).get(), 0);
}

#[tokio::test]
async fn failures_are_counted_and_never_name_the_url() {
    let (url, mut got) = receiver(StatusCode::INTERNAL_SERVER_ERROR).await;
    let file = url_file(&url);
    let c = counter();
    let hook = Webhook::new(file.path(), WebhookFormat::Alertmanager)
        .expect("webhook")
        .with_counter(c.clone());
    hook.post(&schedule(), now()).await.expect("post task");
    assert!(got.recv().await.is_some());
    assert_eq!(c.with_label_values(&["error"]).get(), 1);
    let e = hook.send(&schedule(), now()).await.expect_err("HTTP 500");
    assert_eq!(e.to_string(), "the notice webhook answered HTTP 500");

    // Nobody listens: a connection error, without the URL or its token in any cause.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    std::fs::write(
        file.path(),
        format!("http://127.0.0.1:{port}/hooks/s3cr3t-token"),
    )
    .expect("rotate the secret");
    let e = hook.send(&schedule(), now()).await.expect_err("refused");
    let text = crate::cull::actuator::chain(&e);
    assert!(text.starts_with("posting the notice webhook"), "{text}");
    assert!(
        !text.contains("s3cr3t") && !text.contains("127.0.0.1"),
        "{text}"
    );
}

#[test]
fn a_bad_url_file_fails_naming_the_file_not_its_content() {
    let missing = Webhook::new(Path::new("/nonexistent/url"), WebhookFormat::Slack)
        .err()
        .expect("missing file");
    assert!(
        missing.to_string().contains("/nonexistent/url"),
        "{missing}"
    );
    for bad in ["", "s3cr3t-token", "ftp://example.invalid/s3cr3t-token"] {
        let file = url_file(bad);
        let e = Webhook::new(file.path(), WebhookFormat::Slack)
            .err()
            .expect("not an http URL");
        assert!(matches!(e, WebhookError::Url { .. }), "{bad:?}: {e}");
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}

/// What the redirect target saw: method, `Referer` header, body.
type Seen = (String, Option<String>, String);

/// A receiver that records everything sent to any path (the redirect target).
async fn recorder() -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(
        move |method: axum::http::Method, headers: axum::http::HeaderMap, body: String| {
            let tx = tx.clone();
            async move {
                let referer = headers
                    .get(axum::http::header::REFERER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let _ = tx.send((method.to_string(), referer, body));
                StatusCode::OK
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rx)
}

/// A webhook URL (token in the path and the query) that answers `status` with a `Location` on
/// another loopback server: 307 and 308 keep the method and body when followed, 301/302/303
/// turn them into a GET.
async fn redirector(status: StatusCode, location: String) -> String {
    let app = axum::Router::new().fallback(move || {
        let location = location.clone();
        async move { (status, [(axum::http::header::LOCATION, location)]) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/hooks/s3cr3t-path?token=s3cr3t-query")
}

#[tokio::test]
async fn redirects_are_not_followed_and_nothing_reaches_their_target() {
    for status in [
        StatusCode::TEMPORARY_REDIRECT,
        StatusCode::PERMANENT_REDIRECT,
        StatusCode::MOVED_PERMANENTLY,
        StatusCode::FOUND,
        StatusCode::SEE_OTHER,
    ] {
        let (target, mut seen) = recorder().await;
        let url = redirector(status, format!("http://{target}/elsewhere")).await;
        let file = url_file(&url);
        let c = counter();
        let hook = Webhook::new(file.path(), WebhookFormat::Alertmanager)
            .expect("webhook")
            .with_counter(c.clone());
        let sent = hook.send(&schedule(), now()).await;
        // The post is done (it awaited its answer): had the redirect been followed, the target
        // would hold the request by now.
        let reached = seen.try_recv();
        assert!(
            reached.is_err(),
            "{status}: the redirect target received (method, Referer, body) {reached:?}"
        );
        let e = sent.expect_err("a redirect is a failed delivery");
        let text = crate::cull::actuator::chain(&e);
        assert_eq!(
            text,
            format!(
                "the notice webhook answered HTTP {} (a redirect, not followed: put the final URL in the URL file)",
                status.as_u16()
            )
        );
        assert!(
            !text.contains("s3cr3t") && !text.contains("127.0.0.1"),
            "{text}"
        );
        hook.post(&schedule(), now()).await.expect("post task");
        assert_eq!(c.with_label_values(&["error"]).get(), 1, "{status}");
        assert_eq!(c.with_label_values(&["sent"]).get(), 0, "{status}");
        let reached = seen.try_recv();
        assert!(
            reached.is_err(),
            "{status}: the redirect target received {reached:?}"
        );
    }
}
