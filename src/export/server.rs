//! The admin HTTP server's router and handlers, in one place: `/` (the page: report's HTML
//! renderer over the latest snapshot, served with its Content-Security-Policy; it refreshes
//! itself from `/api/v1/ledger`), `/metrics`, `/healthz`, `/readyz`, `/livez`, `/api/v1/ledger`,
//! `/api/v1/history` (`history.rs`). Serving it (TLS or plain) is `tls.rs`.
//!
//! `/livez` answers while the process serves HTTP. `/healthz` (the liveness probe) and `/readyz`
//! (the readiness probe) ask [`Probes`], which the app backs with real state: loop progress for
//! liveness; that, the first snapshot and healthy sources for readiness.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;

use super::SharedSnapshot;
use crate::report::html::{self, PageOptions, View};

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub registry: Registry,
    pub snapshot: SharedSnapshot,
    pub probes: Arc<dyn Probes>,
}

/// Nothing published yet: what the process waits for, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub state: WaitingState,
    /// E.g. the watches not synced yet and the last error one of them saw.
    pub reason: String,
}

/// What a process that has published nothing yet waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingState {
    /// The Kubernetes watches have not all delivered their first complete list.
    FirstSync,
    /// The watches have synced; the first Prometheus refresh has not finished.
    FirstRefresh,
}

impl WaitingState {
    /// The words the page and `/readyz` use.
    pub fn text(self) -> &'static str {
        match self {
            WaitingState::FirstSync => "waiting for the first sync",
            WaitingState::FirstRefresh => "waiting for the first refresh",
        }
    }
}

/// The 503 body of `/api/v1/ledger` before the first snapshot (docs/report-json.md).
#[derive(serde::Serialize)]
struct WaitingBody<'a> {
    state: WaitingState,
    message: &'static str,
    reason: &'a str,
}

/// What the probes report; `Err` carries the reason, served as the 503 body.
pub trait Probes: Send + Sync {
    /// `Some` until the first snapshot is published: the empty ledger served until then is no
    /// picture of the cluster, so the page and the API say so instead.
    fn waiting(&self) -> Option<Waiting> {
        None
    }
    /// `/healthz`: every loop makes progress (a stalled loop warrants a restart).
    fn live(&self) -> Result<(), String>;
    /// `/readyz`: live, the first snapshot is published, and no source is broken.
    fn ready(&self) -> Result<(), String>;
    /// What `/readyz` says beside "ready" (one `note:` line each): an optional API not found
    /// yet, looked for again in the background. No reason to be unready.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The notes the page shows.
    fn page_notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Builds the router; `/api/v1/history` answers that no Prometheus is configured.
pub fn router(state: AppState) -> Router {
    router_with_history(state, super::history::HistoryState::new(None))
}

/// Builds the router with `/api/v1/history` asking `history`'s source.
pub fn router_with_history(state: AppState, history: super::history::HistoryState) -> Router {
    let history = Router::new()
        .route("/api/v1/history", get(super::history::history))
        .with_state(history);
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/ledger", get(ledger))
        .with_state(state)
        .merge(history)
        .layer(axum::middleware::from_fn(with_timeout))
}

/// Bounds every request so a stuck client cannot hold shutdown forever.
async fn with_timeout(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(Duration::from_secs(30), next.run(req)).await {
        Ok(r) => r,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "request timed out").into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    // Rendering is CPU work over the whole snapshot: keep it off the async workers.
    let registry = state.registry.clone();
    let snapshot = state.snapshot.load_full();
    match tokio::task::spawn_blocking(move || super::render_with_ledger(&registry, &snapshot)).await
    {
        Ok(Ok(body)) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("render task: {e}"),
        )
            .into_response(),
    }
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.probes.live() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.probes.ready() {
        Ok(()) => {
            let mut body = String::from("ready");
            for note in state.probes.notes() {
                body.push_str("\nnote: ");
                body.push_str(&note);
            }
            (StatusCode::OK, body).into_response()
        }
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn ledger(State(state): State<AppState>) -> Response {
    if let Some(waiting) = state.probes.waiting() {
        return waiting_json(&waiting);
    }
    let snap = state.snapshot.load_full();
    match serde_json::to_vec(&snap.ledger) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding ledger: {e}"),
        )
            .into_response(),
    }
}

/// `503` with `{"state", "message", "reason"}`: nothing is known yet, which an empty ledger
/// would hide.
fn waiting_json(waiting: &Waiting) -> Response {
    let body = WaitingBody {
        state: waiting.state,
        message: waiting.state.text(),
        reason: &waiting.reason,
    };
    match serde_json::to_vec(&body) {
        Ok(body) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::RETRY_AFTER, "5"),
            ],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding state: {e}"),
        )
            .into_response(),
    }
}

/// `GET /?namespace=…&node=…&sort=…&dir=asc|desc`.
pub async fn index(State(state): State<AppState>, Query(view): Query<View>) -> Response {
    if let Some(waiting) = state.probes.waiting() {
        return waiting_page(&waiting);
    }
    let snapshot = state.snapshot.load_full();
    let notes = state.probes.page_notes();
    // Rendering walks every pod: keep it off the async workers, like /metrics.
    let rendered = tokio::task::spawn_blocking(move || {
        html::render_page(
            &snapshot.ledger,
            &PageOptions {
                live: true,
                view,
                notes,
            },
        )
    })
    .await;
    match rendered {
        Ok(page) => (page_headers(), page).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("render task: {e}"),
        )
            .into_response(),
    }
}

/// The headers of both pages: HTML under the page's Content-Security-Policy, never framed,
/// sniffed, cached or referred.
fn page_headers() -> [(header::HeaderName, String); 5] {
    [
        (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
        (
            header::CONTENT_SECURITY_POLICY,
            format!(
                "{}; frame-ancestors 'none'",
                html::content_security_policy(true)
            ),
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        (header::REFERRER_POLICY, "no-referrer".to_string()),
        (header::CACHE_CONTROL, "no-store".to_string()),
    ]
}

/// The page before the first snapshot: what it waits for and why, never an empty ledger that
/// reads like a cluster without GPU pods. It reloads itself (a meta refresh: no script, so the
/// Content-Security-Policy needs no hash for it).
fn waiting_page(waiting: &Waiting) -> Response {
    let page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>gpu-ledger: {state}</title></head>\
         <body><h1>gpu-ledger: {state}</h1><p>No ledger yet: {reason}.</p>\
         <p>This page reloads every 5 s.</p></body></html>\n",
        state = html::escape(waiting.state.text()),
        reason = html::escape(&waiting.reason),
    );
    (StatusCode::SERVICE_UNAVAILABLE, page_headers(), page).into_response()
}
