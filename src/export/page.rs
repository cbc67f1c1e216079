//! The page at `/`: [`crate::report::html`] over the latest snapshot, served with its
//! Content-Security-Policy; the page refreshes itself from `/api/v1/ledger`.

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::server::{AppState, Waiting};
use crate::report::html::{self, PageOptions, View};

/// `GET /?namespace=…&node=…&sort=…&dir=asc|desc`.
pub async fn index(State(state): State<AppState>, Query(view): Query<View>) -> Response {
    if let Some(waiting) = state.probes.waiting() {
        return waiting_page(&waiting);
    }
    let snapshot = state.snapshot.load_full();
    // Rendering walks every pod: keep it off the async workers, like /metrics.
    let rendered = tokio::task::spawn_blocking(move || {
        html::render_page(&snapshot.ledger, &PageOptions { live: true, view })
    })
    .await;
    match rendered {
        Ok(page) => (
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
            ],
            page,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("render task: {e}"),
        )
            .into_response(),
    }
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
    (
        StatusCode::SERVICE_UNAVAILABLE,
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
        ],
        page,
    )
        .into_response()
}
