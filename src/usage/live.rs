//! The live usage source: Prometheus refreshes folded into the idle history.
//!
//! `serve` starts the slow start-up history query in the background and keeps refreshing beside
//! it; a one-shot caller (`report` against a live cluster) rebuilds the history inline.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use super::history::{self, History};
use super::prom::{PromClient, PromError, QueryStats};
use super::scheme::SchemeChoice;
use crate::ledger::usage::{Usage, Window};

/// What the live source needs besides the client.
#[derive(Debug, Clone, Copy)]
pub struct LiveSettings {
    pub scheme: SchemeChoice,
    pub window: Window,
    /// How far back the start-up query reads idle history.
    pub history_lookback: chrono::Duration,
    /// Share of expected samples needed to extend a covered run.
    pub min_coverage: f64,
}

/// One refresh: the usage, and how it went.
#[derive(Debug)]
pub struct Fetched {
    pub usage: Usage,
    pub stats: QueryStats,
    /// Why Prometheus could not be used (the usage is then unavailable).
    pub error: Option<PromError>,
}

/// Prometheus plus the idle history.
pub struct LiveUsage {
    client: Option<Arc<PromClient>>,
    history: Option<History>,
    /// The start-up history query, running beside the refreshes (`serve` only).
    bootstrap: Option<tokio::task::JoinHandle<History>>,
    /// When the last successful refresh was merged into `history`: activity before it is known.
    merged_at: Option<DateTime<Utc>>,
    settings: LiveSettings,
}

/// Rebuilds the idle history with one query over the lookback. A failed or slow bootstrap must not
/// stop anything: the history then starts empty (idle time accrues from now), and the log says so.
async fn bootstrap_history(
    client: Arc<PromClient>,
    settings: LiveSettings,
    now: DateTime<Utc>,
) -> History {
    let result = async {
        let scheme = client
            .detect_scheme(settings.scheme, &settings.window, now)
            .await?;
        history::bootstrap(
            &client,
            &scheme,
            &settings.window,
            settings.history_lookback,
            settings.min_coverage,
            now,
        )
        .await
    }
    .await;
    match result {
        Ok(h) => {
            info!(devices = h.len(), "idle history rebuilt from prometheus");
            h
        }
        Err(e) => {
            warn!(
                error = &e as &dyn std::error::Error,
                "idle history bootstrap failed; idle time accrues from now"
            );
            History::new(settings.history_lookback)
        }
    }
}

impl LiveUsage {
    pub fn new(client: Option<Arc<PromClient>>, settings: LiveSettings) -> Self {
        LiveUsage {
            client,
            history: None,
            bootstrap: None,
            merged_at: None,
            settings,
        }
    }

    /// The idle history as of the last refresh (for re-checks before a stop).
    pub fn history(&self) -> Option<&History> {
        self.history.as_ref()
    }

    /// Starts the start-up history query in the background; refreshes go on with an empty history
    /// until it answers (its cost grows with the samples in lookback × GPUs).
    pub fn start_bootstrap(&mut self, tracker: &TaskTracker, cancel: &CancellationToken) {
        let Some(client) = self.client.clone() else {
            return;
        };
        self.history = Some(History::new(self.settings.history_lookback));
        let (settings, cancel) = (self.settings, cancel.clone());
        self.bootstrap = Some(
            tracker.spawn(
                async move {
                    tokio::select! {
                        h = bootstrap_history(client, settings, Utc::now()) => h,
                        () = cancel.cancelled() => History::new(settings.history_lookback),
                    }
                }
                .instrument(info_span!("history_bootstrap")),
            ),
        );
    }

    /// Folds the background bootstrap into the history once it has answered.
    async fn absorb_bootstrap(&mut self) {
        let Some(task) = self.bootstrap.take_if(|t| t.is_finished()) else {
            return;
        };
        match task.await {
            Ok(boot) => self
                .history
                .get_or_insert_with(|| History::new(self.settings.history_lookback))
                .absorb(boot),
            Err(e) => warn!(
                error = &e as &dyn std::error::Error,
                "idle history bootstrap task failed"
            ),
        }
    }

    /// One refresh at the current time. Without a client the usage is unavailable.
    pub async fn fetch(&mut self) -> Fetched {
        let now = Utc::now();
        let Some(client) = self.client.clone() else {
            return Fetched {
                usage: Usage::default(),
                stats: QueryStats::default(),
                error: None,
            };
        };
        // One-shot paths (report) rebuild the history inline: they have one refresh only.
        if self.history.is_none() {
            self.history = Some(bootstrap_history(client.clone(), self.settings, now).await);
        }
        self.absorb_bootstrap().await;
        let window = self.settings.window;
        match client
            .fetch_usage_since(self.settings.scheme, &window, now, self.merged_at)
            .await
        {
            Ok((mut devices, stats)) => {
                if let Some(h) = self.history.as_mut() {
                    h.merge(&mut devices, &window, self.settings.min_coverage, now);
                    self.merged_at = Some(now);
                }
                Fetched {
                    usage: Usage {
                        devices,
                        available: true,
                    },
                    stats,
                    error: None,
                }
            }
            Err(e) => Fetched {
                usage: Usage::default(),
                stats: QueryStats::default(),
                error: Some(e),
            },
        }
    }
}
