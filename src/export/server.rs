//! The admin HTTP server's router and handlers, in one place: `/` (the page: the
//! [`PageRenderer`] `app` hands in, report's HTML renderer, over the latest snapshot, served with
//! its Content-Security-Policy; it refreshes itself from `/api/v1/ledger`), `/metrics`, `/healthz`, `/readyz`, `/livez`, `/api/v1/ledger`,
//! `/api/v1/history` (`history.rs`). Serving it (TLS or plain) is `tls.rs`.
//!
//! `/livez` answers while the process serves HTTP. `/healthz` (the liveness probe) and `/readyz`
//! (the readiness probe) ask [`Probes`], which the app backs with real state: loop progress for
//! liveness; that, the first snapshot and healthy sources for readiness.
//!
//! The large answers (`/`, `/metrics`, `/api/v1/ledger`, `/api/v1/history`) are rendered and
//! sent at most [`ResponseLimits::max_inflight`] at a time ([`bounded`]): a client that does not
//! read keeps its whole answer in memory until the write timeout drops it, so without the cap
//! slow readers grew the process by one answer each.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::SharedSnapshot;
use crate::ledger::Ledger;

/// Renders the page at `/`. `app` hands in report's HTML renderer (as it hands in the
/// [`super::history::HistorySource`]), so this sink imports no other.
pub trait PageRenderer: Send + Sync {
    /// The page of `ledger` as `query` asks (the page's own parameters: `namespace`, `node`,
    /// `sort`, `dir`), with `notes` under its header.
    fn page(&self, ledger: &Ledger, query: &BTreeMap<String, String>, notes: Vec<String>)
    -> String;
    /// The page before the first snapshot: what the process waits for (`state`) and why.
    fn waiting(&self, state: &str, reason: &str) -> String;
    /// The pages' Content-Security-Policy.
    fn content_security_policy(&self) -> String;
}

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub registry: Registry,
    pub snapshot: SharedSnapshot,
    pub probes: Arc<dyn Probes>,
    pub page: Arc<dyn PageRenderer>,
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

/// Default of `--max-inflight-responses`.
pub const DEFAULT_MAX_INFLIGHT_RESPONSES: usize = 16;
/// Longest a request for a large answer waits for a slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Largest piece of an answer handed to the connection at once: the connection buffers a few
/// pieces, never a copy of the whole answer.
const CHUNK_BYTES: usize = 16 * 1024;

/// Bounds on the large answers in memory at once.
#[derive(Debug, Clone, Copy)]
pub struct ResponseLimits {
    /// Large answers rendered or being sent at once (`--max-inflight-responses`); each holds its
    /// slot until it is sent or its connection is dropped.
    pub max_inflight: usize,
}

impl Default for ResponseLimits {
    fn default() -> Self {
        ResponseLimits {
            max_inflight: DEFAULT_MAX_INFLIGHT_RESPONSES,
        }
    }
}

/// Builds the router; `/api/v1/history` answers that no Prometheus is configured.
pub fn router(state: AppState) -> Router {
    router_with_history(state, super::history::HistoryState::new(None))
}

/// Builds the router with `/api/v1/history` asking `history`'s source, default limits.
pub fn router_with_history(state: AppState, history: super::history::HistoryState) -> Router {
    router_with_limits(state, history, ResponseLimits::default())
}

/// Builds the router with `/api/v1/history` asking `history`'s source, under `limits`.
pub fn router_with_limits(
    state: AppState,
    history: super::history::HistoryState,
    limits: ResponseLimits,
) -> Router {
    let slots = Arc::new(Semaphore::new(limits.max_inflight.max(1)));
    let history = Router::new()
        .route("/api/v1/history", get(super::history::history))
        .with_state(history);
    let large = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/api/v1/ledger", get(ledger))
        .with_state(state.clone())
        .merge(history)
        .route_layer(axum::middleware::from_fn_with_state(slots, bounded));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(large)
        .layer(axum::middleware::from_fn(with_timeout))
}

/// Renders and sends a large answer under one of `slots`, held until the answer is sent or
/// dropped with its connection; 503 when no slot frees within [`SLOT_WAIT`].
async fn bounded(
    State(slots): State<Arc<Semaphore>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Ok(Ok(slot)) = tokio::time::timeout(SLOT_WAIT, slots.acquire_owned()).await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::RETRY_AFTER, "5"),
                // Frees the connection slot too: a busy server keeps no idle connection.
                (header::CONNECTION, "close"),
            ],
            "busy: too many large answers in flight, retry later\n",
        )
            .into_response();
    };
    let (mut parts, body) = next.run(req).await.into_parts();
    // The handlers render the whole answer; collecting it takes the one buffer, no copy.
    let whole = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("collecting the answer: {e}"),
            )
                .into_response();
        }
    };
    parts.headers.insert(
        header::CONTENT_LENGTH,
        header::HeaderValue::from(whole.len()),
    );
    Response::from_parts(parts, Body::from_stream(chunks(whole, slot)))
}

/// `whole` in pieces of at most [`CHUNK_BYTES`] (views of the one buffer); `slot` is released
/// when the stream ends or is dropped with its connection.
fn chunks(
    whole: Bytes,
    slot: OwnedSemaphorePermit,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    futures::stream::unfold((whole, Some(slot)), |(mut rest, slot)| async move {
        if rest.is_empty() {
            return None;
        }
        let piece = rest.split_to(rest.len().min(CHUNK_BYTES));
        Some((Ok(piece), (rest, slot)))
    })
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
pub async fn index(
    State(state): State<AppState>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let csp = state.page.content_security_policy();
    if let Some(waiting) = state.probes.waiting() {
        let page = state.page.waiting(waiting.state.text(), &waiting.reason);
        return (StatusCode::SERVICE_UNAVAILABLE, page_headers(&csp), page).into_response();
    }
    let snapshot = state.snapshot.load_full();
    let notes = state.probes.page_notes();
    let renderer = state.page.clone();
    // Rendering walks every pod: keep it off the async workers, like /metrics.
    let rendered =
        tokio::task::spawn_blocking(move || renderer.page(&snapshot.ledger, &query, notes)).await;
    match rendered {
        Ok(page) => (page_headers(&csp), page).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("render task: {e}"),
        )
            .into_response(),
    }
}

/// The headers of both pages: HTML under the page's Content-Security-Policy (`csp`), never
/// framed, sniffed, cached or referred.
fn page_headers(csp: &str) -> [(header::HeaderName, String); 5] {
    [
        (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
        (
            header::CONTENT_SECURITY_POLICY,
            format!("{csp}; frame-ancestors 'none'"),
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        (header::REFERRER_POLICY, "no-referrer".to_string()),
        (header::CACHE_CONTROL, "no-store".to_string()),
    ]
}
