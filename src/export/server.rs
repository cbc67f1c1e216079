//! The admin HTTP server: `/` (the page, `page.rs`), `/metrics`, `/healthz`, `/readyz`,
//! `/api/v1/ledger`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use super::SharedSnapshot;

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub registry: Registry,
    pub snapshot: SharedSnapshot,
    /// GPU resource names, for rendering the ledger families of `snapshot` into `/metrics`.
    pub names: crate::ledger::claims::ResourceNames,
    /// Set once every watch has synced and one refresh has completed.
    pub ready: Arc<AtomicBool>,
}

/// Builds the router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(super::page::index))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/ledger", get(ledger))
        .layer(axum::middleware::from_fn(with_timeout))
        .with_state(state)
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
    let (snapshot, names) = (state.snapshot.load_full(), state.names.clone());
    match tokio::task::spawn_blocking(move || {
        super::render_with_ledger(&registry, &snapshot, &names)
    })
    .await
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

async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for watches to sync and the first refresh",
        )
            .into_response()
    }
}

async fn ledger(State(state): State<AppState>) -> Response {
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

/// Serves until `cancel` fires, then drains in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}
