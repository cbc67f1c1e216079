//! The page at `/`: [`crate::report::html`] over the latest snapshot, served with its
//! Content-Security-Policy; the page refreshes itself from `/api/v1/ledger`.

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::server::AppState;
use crate::report::html::{self, PageOptions, View};

/// `GET /?namespace=…&node=…&sort=…&dir=asc|desc`.
pub async fn index(State(state): State<AppState>, Query(view): Query<View>) -> Response {
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
