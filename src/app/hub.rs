//! The hub of `serve`: the only writer of the published snapshot. It rebuilds the ledger when
//! the claims stores change or a usage refresh arrives, publishes it for the HTTP sinks and hands
//! each snapshot built from a fresh refresh to the culler; it also records what the probes
//! (`/healthz`, `/readyz`) report ([`Health`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::tasks::Beat;
use crate::claims::watch::Stores;
use crate::export::{SelfMetrics, server};
use crate::ledger::accounting::Snapshot;
use crate::ledger::usage::Usage;
use crate::ledger::{self, Ledger, Policy};
use crate::test_hooks;
use crate::usage::history::History;
use crate::usage::live::Fetched;
use crate::usage::prom::PromError;

/// How often the hub checks whether claims changed since the last ledger build.
const CLAIMS_REBUILD_INTERVAL: Duration = Duration::from_millis(250);
/// A claims watch failing for this long is broken: its store may be frozen. Then
/// `gpu_ledger_source_up{source="kubernetes"}` is 0, `/readyz` fails and culling is held back
/// (circuit `claims_stale`) until it works again.
pub const WATCH_BROKEN_AFTER: Duration = Duration::from_secs(60);
/// The hub builds every 250 ms; a build of a large cluster takes well under a second.
pub(super) const HUB_STALL_BOUND: Duration = Duration::from_secs(60);

/// What `/healthz` and `/readyz` report, from the loops themselves.
pub(super) struct Health {
    /// The first snapshot is published (every watch synced, one refresh done).
    pub(super) started: AtomicBool,
    /// Claims watches failing for longer than [`WATCH_BROKEN_AFTER`].
    pub(super) broken_watches: Mutex<Vec<&'static str>>,
    /// Why the last refresh refused Prometheus' answer although Prometheus answered (DCGM
    /// series of several clusters and no selector): an operator must act, so not ready.
    pub(super) usage_refused: Mutex<Option<String>>,
    pub(super) beats: Vec<Arc<Beat>>,
    /// The claims stores, to tell which watches have not synced yet and why.
    pub(super) stores: Option<Stores>,
}

impl Health {
    /// Keeps why the last refresh refused Prometheus' answer although it came (several clusters'
    /// series without a selector), for `/readyz`; any other outcome clears it.
    pub(super) fn record_usage_refusal(&self, fetched: Option<&Fetched>) {
        let refused = fetched
            .and_then(|f| f.error.as_ref())
            .filter(|e| matches!(e, PromError::SeveralClusters { .. }))
            .map(ToString::to_string);
        *self
            .usage_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = refused;
    }

    /// Why nothing is published yet: the watches that have not synced (and the last error one
    /// of them saw), or the first refresh still under way.
    fn waiting_reason(&self) -> String {
        let unsynced = self
            .stores
            .as_ref()
            .map(Stores::unsynced)
            .unwrap_or_default();
        if unsynced.is_empty() {
            return "the Kubernetes watches have synced; the first refresh is under way".into();
        }
        let names: Vec<&str> = unsynced.iter().map(|(label, _)| *label).collect();
        let why = format!(
            "the Kubernetes watches have not delivered their first list: {}",
            names.join(", ")
        );
        match unsynced
            .iter()
            .find_map(|(label, e)| e.as_ref().map(|e| (label, e)))
        {
            Some((label, error)) => format!("{why}; last error ({label}): {error}"),
            None => why,
        }
    }
}

impl server::Probes for Health {
    fn waiting(&self) -> Option<server::Waiting> {
        if self.started.load(Ordering::Relaxed) {
            return None;
        }
        let synced = self.stores.as_ref().is_none_or(Stores::synced);
        Some(server::Waiting {
            state: if synced {
                server::WaitingState::FirstRefresh
            } else {
                server::WaitingState::FirstSync
            },
            reason: self.waiting_reason(),
        })
    }

    fn live(&self) -> Result<(), String> {
        for b in &self.beats {
            let silent = b.silent_for();
            if silent > b.bound {
                return Err(format!(
                    "{} loop made no progress for {}s (bound {}s)",
                    b.name,
                    silent.as_secs(),
                    b.bound.as_secs()
                ));
            }
        }
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.stores
            .as_ref()
            .map(Stores::pending_apis)
            .unwrap_or_default()
    }

    fn page_notes(&self) -> Vec<String> {
        self.stores
            .as_ref()
            .map(Stores::pending_apis_for_page)
            .unwrap_or_default()
    }

    fn ready(&self) -> Result<(), String> {
        self.live()?;
        if let Some(waiting) = self.waiting() {
            return Err(format!("{}: {}", waiting.state.text(), waiting.reason));
        }
        let broken = self
            .broken_watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !broken.is_empty() {
            return Err(format!(
                "kubernetes watches failing for over {}s: {}",
                WATCH_BROKEN_AFTER.as_secs(),
                broken.join(", ")
            ));
        }
        drop(broken);
        if let Some(why) = self
            .usage_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            return Err(why.clone());
        }
        Ok(())
    }
}

/// One usage refresh, as the hub and the culler see it.
pub(super) struct Refreshed {
    pub(super) usage: Usage,
    /// The idle history after this refresh, for re-checks before a stop.
    pub(super) history: Option<Arc<History>>,
}

/// What the culler sink reads: the snapshot built from a fresh refresh.
#[derive(Clone)]
pub(super) struct CullInput {
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) history: Option<Arc<History>>,
    /// No claims watch was broken when the snapshot was built.
    pub(super) claims_fresh: bool,
}

/// The hub task's inputs.
pub(super) struct Hub {
    pub(super) stores: Stores,
    pub(super) usage: channel::Receiver<Option<Arc<Refreshed>>>,
    pub(super) policy: Policy,
    pub(super) shard: (u32, u32),
    pub(super) shared: crate::export::SharedSnapshot,
    pub(super) health: Arc<Health>,
    pub(super) metrics: SelfMetrics,
    pub(super) beat: Arc<Beat>,
    pub(super) cull: channel::Sender<Option<CullInput>>,
    pub(super) cancel: CancellationToken,
}

impl Hub {
    /// Records which watches are broken (source health, readiness); returns whether none is.
    fn check_watches(&self) -> bool {
        let broken = self.stores.broken(WATCH_BROKEN_AFTER);
        let fresh = broken.is_empty();
        let mut known = self
            .health
            .broken_watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *known != broken {
            if fresh {
                info!("kubernetes watches work again");
            } else {
                warn!(
                    watches = ?broken,
                    bound_seconds = WATCH_BROKEN_AFTER.as_secs(),
                    "kubernetes watches failing past their bound: source down, not ready, culling held back"
                );
            }
            known.clone_from(&broken);
        }
        self.metrics
            .source_up
            .with_label_values(&["kubernetes"])
            .set(if fresh { 1.0 } else { 0.0 });
        fresh
    }
}

/// Rebuilds the ledger when claims change (within [`CLAIMS_REBUILD_INTERVAL`], with the last
/// usage) or a refresh arrives, and publishes it. Nothing is published before the first refresh
/// (which waits for the watches to sync).
pub(super) async fn hub_loop(mut hub: Hub) {
    let mut claims_tick = tokio::time::interval(CLAIMS_REBUILD_INTERVAL);
    claims_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut built_generation = None;
    loop {
        hub.beat.beat();
        let claims_fresh = hub.check_watches();
        let new_usage = tokio::select! {
            () = hub.cancel.cancelled() => return,
            changed = hub.usage.changed() => {
                if changed.is_err() {
                    // The refresh task is gone: its supervisor reports it.
                    hub.cancel.cancelled().await;
                    return;
                }
                true
            }
            _ = claims_tick.tick() => false,
        };
        // Only a change seen through `changed()` counts as new usage (it triggers a cull cycle).
        let current = if new_usage {
            hub.usage.borrow_and_update().clone()
        } else {
            hub.usage.borrow().clone()
        };
        let Some(current) = current else {
            continue;
        };
        let generation = hub.stores.generation();
        if !new_usage && built_generation == Some(generation) {
            continue;
        }
        built_generation = Some(generation);
        let ledger = rebuild_from_claims(&hub.stores, &current.usage, &hub.policy, hub.shard);
        let next = Arc::new(hub.shared.load().advance(ledger));
        hub.shared.store(next.clone());
        hub.health.started.store(true, Ordering::Relaxed);
        if new_usage {
            hub.cull.send_replace(Some(CullInput {
                snapshot: next,
                history: current.history.clone(),
                claims_fresh,
            }));
        }
        test_hooks::panic_point("hub");
    }
}

/// A ledger from the current claims and the last usage (no Prometheus query, no API call).
pub(super) fn rebuild_from_claims(
    stores: &Stores,
    usage: &Usage,
    policy: &Policy,
    (shard, total_shards): (u32, u32),
) -> Ledger {
    let claims = stores.claims_for(shard, total_shards);
    let mut ledger = ledger::build(&claims, usage, Utc::now(), policy);
    ledger.retain_shard(shard, total_shards);
    ledger
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::export::server::Probes as _;
    use crate::usage::live::Rejected;
    use crate::usage::prom::QueryStats;

    pub(in crate::app) fn refused_by_several_clusters() -> Fetched {
        Fetched {
            usage: Usage::default(),
            stats: QueryStats::default(),
            error: Some(PromError::SeveralClusters {
                clusters: vec!["cluster=\"east\"".into(), "cluster=\"west\"".into()],
            }),
            rejected: Rejected::default(),
        }
    }

    #[test]
    fn several_clusters_make_serve_not_ready_and_say_so_until_a_clean_refresh() {
        let health = Health {
            started: AtomicBool::new(true),
            broken_watches: Mutex::default(),
            usage_refused: Mutex::default(),
            beats: Vec::new(),
            stores: None,
        };
        assert!(health.ready().is_ok());
        health.record_usage_refusal(Some(&refused_by_several_clusters()));
        let why = health
            .ready()
            .expect_err("not ready while the store is ambiguous");
        assert!(
            why.contains("cluster=\"east\"") && why.contains("--prometheus-selector"),
            "{why}"
        );
        // The next refresh without that refusal clears it.
        health.record_usage_refusal(Some(&Fetched {
            error: None,
            ..refused_by_several_clusters()
        }));
        assert!(health.ready().is_ok());
    }
}
