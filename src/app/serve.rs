//! `gpu-ledger serve`: sources publish into the hub, the hub publishes snapshots, sinks read them.
//!
//! ```text
//! claims watches ──▶ Stores ──┐                        ┌─▶ /metrics, /api/v1/ledger (ArcSwap)
//!                             ├─▶ hub: ledger::build ──┤
//! usage refresh ──▶ latest ───┘   (own task)           └─▶ culler (own task, watch channel)
//! ```
//!
//! Every task is supervised: one that ends (or panics) before shutdown cancels the rest and the
//! process exits non-zero, so a dead refresh can never hide behind a live HTTP server. A sink
//! reads the latest snapshot and never blocks a source or another sink.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use chrono::Utc;
use futures::FutureExt;
use kube::Client;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, error, info, info_span, warn};

use super::{AppError, cull_config, live_settings, prom_client};
use crate::claims::watch::{self, Stores};
use crate::config::ServeArgs;
use crate::cull::actuator::RecheckError;
use crate::cull::plan::{Action, CullPolicy};
use crate::cull::{self, Culler};
use crate::export::{SelfMetrics, Snapshot, server};
use crate::ledger::usage::Usage;
use crate::ledger::{self, Ledger, Policy};
use crate::usage::history::History;
use crate::usage::live::{Fetched, LiveSettings, LiveUsage};
use crate::usage::prom::PromClient;

/// How often the hub checks whether claims changed since the last ledger build.
const CLAIMS_REBUILD_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);
/// Longest wait for tasks to stop after cancellation.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The tasks of one `serve` process: one cancellation tree, and the first unexpected end.
#[derive(Clone)]
struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
    failed: Arc<Mutex<Option<&'static str>>>,
}

impl Tasks {
    fn new() -> Self {
        Tasks {
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            failed: Arc::default(),
        }
    }

    /// Spawns a task that must run until shutdown. If it returns or panics first, everything is
    /// cancelled and [`Tasks::failed`] names it.
    fn spawn_critical<F>(&self, name: &'static str, span: Span, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (cancel, failed) = (self.cancel.clone(), self.failed.clone());
        self.tracker.spawn(
            async move {
                let ended = std::panic::AssertUnwindSafe(task).catch_unwind().await;
                if cancel.is_cancelled() {
                    return;
                }
                let how = if ended.is_ok() {
                    "returned"
                } else {
                    "panicked"
                };
                error!(
                    task = name,
                    how, "task ended before shutdown; stopping the process"
                );
                failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(name);
                cancel.cancel();
            }
            .instrument(span),
        );
    }

    fn failed(&self) -> Option<&'static str> {
        *self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Rejects flag combinations that cannot work, before any socket is bound.
fn validate(args: &ServeArgs) -> Result<(), AppError> {
    if args.total_shards == 0 || args.shard >= args.total_shards {
        return Err(AppError::Config(format!(
            "--shard {} must be below --total-shards {}",
            args.shard, args.total_shards
        )));
    }
    if args.refresh_interval <= chrono::Duration::zero() {
        return Err(AppError::Config(
            "--refresh-interval must be positive".into(),
        ));
    }
    Ok(())
}

/// One usage refresh, as the hub and the culler see it.
struct Refreshed {
    usage: Usage,
    /// The idle history after this refresh, for re-checks before a stop.
    history: Option<Arc<History>>,
}

/// What the culler sink reads: the snapshot built from a fresh refresh.
#[derive(Clone)]
struct CullInput {
    snapshot: Arc<Snapshot>,
    history: Option<Arc<History>>,
}

/// `gpu-ledger serve`.
pub async fn serve(args: ServeArgs) -> Result<(), AppError> {
    validate(&args)?;
    let policy = args.ledger.policy();
    let settings = live_settings(&args.ledger);
    let prom = prom_client(&args.ledger)?;
    if prom.is_none() {
        warn!(
            "no --prometheus-url: utilisation is unknown; claims and capacity are still exported"
        );
    }
    let shard = (args.shard, args.total_shards);

    let tasks = Tasks::new();
    spawn_signal_handler(&tasks);

    let client = Client::try_default().await.map_err(AppError::Kube)?;
    let registry = prometheus::Registry::new();
    let metrics = SelfMetrics::register(&registry).map_err(AppError::Metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(Snapshot::new(Ledger::empty(
        Utc::now(),
    ))));
    // The ledger families are rendered straight from `shared` by the /metrics handler
    // (`export::render_with_ledger`), not gathered through the registry.
    let culler = Culler::start(
        cull_config(&args.cull, &policy),
        Some(client.clone()),
        &registry,
        &tasks.tracker,
        &tasks.cancel,
    )
    .map_err(AppError::Cull)?;

    let restarts = metrics.watch_restarts.clone();
    let stores = watch::start(
        client.clone(),
        watch::WatchConfig {
            namespaces: args.ledger.namespaces.clone(),
            exporter_namespaces: args.ledger.exporter_namespaces.clone(),
            names: policy.names.clone(),
        },
        &tasks.tracker,
        tasks.cancel.clone(),
        Arc::new(move |resource| restarts.with_label_values(&[resource]).inc()),
    )
    .await;
    crate::claims::dra::register_enabled(&registry, &stores).map_err(AppError::Metrics)?;

    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: args.listen,
            source,
        })?;
    info!(listen = %args.listen, "serving /metrics, /healthz, /readyz, /api/v1/ledger");
    let state = server::AppState {
        registry: registry.clone(),
        snapshot: shared.clone(),
        names: policy.names.clone(),
        ready: ready.clone(),
    };
    let server_cancel = tasks.cancel.clone();
    tasks.spawn_critical("http", info_span!("http"), async move {
        if let Err(e) = server::serve(listener, state, server_cancel).await {
            error!(error = &e as &dyn std::error::Error, "http server failed");
        }
    });

    // Source: Prometheus is asked on its own task, so a slow refresh never holds back a claims
    // change.
    let mut source = LiveUsage::new(prom.clone(), settings);
    source.start_bootstrap(&tasks.tracker, &tasks.cancel);
    let (usage_tx, usage_rx) = channel::channel::<Option<Arc<Refreshed>>>(None);
    tasks.spawn_critical(
        "refresh",
        info_span!("refresh"),
        refresh_loop(RefreshLoop {
            source,
            stores: stores.clone(),
            client: client.clone(),
            metrics: metrics.clone(),
            every: args
                .refresh_interval
                .to_std()
                .unwrap_or(std::time::Duration::from_secs(30)),
            tx: usage_tx,
            cancel: tasks.cancel.clone(),
        }),
    );

    // Hub: the only writer of the published snapshot.
    let (cull_tx, cull_rx) = channel::channel::<Option<CullInput>>(None);
    tasks.spawn_critical(
        "hub",
        info_span!("hub"),
        hub_loop(Hub {
            stores: stores.clone(),
            usage: usage_rx,
            policy: policy.clone(),
            shard,
            shared,
            ready,
            cull: cull_tx,
            cancel: tasks.cancel.clone(),
        }),
    );

    // Sink: culling, on its own task over the latest snapshot.
    let rechecks = RecheckContext {
        client: prom,
        settings,
        stores,
        policy,
        cull_policy: culler.config().policy.clone(),
        shard,
    };
    tasks.spawn_critical(
        "cull",
        info_span!("cull"),
        cull_loop(culler, cull_rx, rechecks, tasks.cancel.clone()),
    );

    tasks.cancel.cancelled().await;
    info!("shutting down");
    tasks.tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.tracker.wait())
        .await
        .is_err()
    {
        warn!(
            grace_seconds = SHUTDOWN_GRACE.as_secs(),
            "tasks did not stop in time; exiting anyway"
        );
    }
    match tasks.failed() {
        Some(name) => Err(AppError::TaskEnded(name)),
        None => Ok(()),
    }
}

/// The hub task's inputs.
struct Hub {
    stores: Stores,
    usage: channel::Receiver<Option<Arc<Refreshed>>>,
    policy: Policy,
    shard: (u32, u32),
    shared: crate::export::SharedSnapshot,
    ready: Arc<AtomicBool>,
    cull: channel::Sender<Option<CullInput>>,
    cancel: CancellationToken,
}

/// Rebuilds the ledger when claims change (within [`CLAIMS_REBUILD_INTERVAL`], with the last
/// usage) or a refresh arrives, and publishes it. Nothing is published before the first refresh
/// (which waits for the watches to sync).
async fn hub_loop(mut hub: Hub) {
    let mut claims_tick = tokio::time::interval(CLAIMS_REBUILD_INTERVAL);
    claims_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut built_generation = None;
    loop {
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
        hub.ready.store(true, Ordering::Relaxed);
        if new_usage {
            hub.cull.send_replace(Some(CullInput {
                snapshot: next,
                history: current.history.clone(),
            }));
        }
    }
}

/// Runs a culling cycle on every snapshot built from a fresh refresh; a slow cycle only delays
/// culling (the next cycle takes the newest snapshot, skipping any in between).
async fn cull_loop(
    mut culler: Culler,
    mut inputs: channel::Receiver<Option<CullInput>>,
    rechecks: RecheckContext,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            changed = inputs.changed() => if changed.is_err() {
                cancel.cancelled().await;
                break;
            },
        }
        let Some(input) = inputs.borrow_and_update().clone() else {
            continue;
        };
        let mut recheck = rechecks.with_history(input.history);
        let mut recheck = |action: &Action| recheck.run(action);
        let cycle = culler.cycle(&input.snapshot.ledger, Utc::now(), &mut recheck);
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = cycle => {}
        }
    }
    culler.shutdown().await;
}

/// A ledger from the current claims and the last usage (no Prometheus query, no API call).
fn rebuild_from_claims(
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

/// The refresh task's inputs.
struct RefreshLoop {
    source: LiveUsage,
    stores: Stores,
    client: Client,
    metrics: SelfMetrics,
    every: std::time::Duration,
    tx: channel::Sender<Option<Arc<Refreshed>>>,
    cancel: CancellationToken,
}

/// Every `every` (first as soon as the watches have synced): verify notebook ownership, query
/// usage, record health, publish the result to the hub.
async fn refresh_loop(mut r: RefreshLoop) {
    let mut waiting = tokio::time::interval(std::time::Duration::from_millis(100));
    let mut told = false;
    while !r.stores.synced() {
        if !told {
            info!("waiting for watches to sync");
            told = true;
        }
        tokio::select! {
            () = r.cancel.cancelled() => return,
            _ = waiting.tick() => {}
        }
    }
    let mut ticker = tokio::time::interval(r.every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = r.cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let started = Instant::now();
        if let Err(e) = r.stores.resolve_statefulsets(&r.client).await {
            warn!(
                error = &e as &dyn std::error::Error,
                "cannot verify notebook ownership this refresh"
            );
        }
        let fetched = r.source.fetch().await;
        record_refresh(&r.metrics, &fetched, started);
        let refreshed = Refreshed {
            usage: fetched.usage,
            history: r.source.history().cloned().map(Arc::new),
        };
        r.tx.send_replace(Some(Arc::new(refreshed)));
    }
}

/// Health of one refresh: sources up, its duration, when it happened.
fn record_refresh(metrics: &SelfMetrics, fetched: &Fetched, started: Instant) {
    metrics
        .prometheus_queries
        .inc_by(u64::from(fetched.stats.queries));
    if let Some(e) = &fetched.error {
        metrics.prometheus_query_errors.inc();
        warn!(
            error = e as &dyn std::error::Error,
            kind = e.kind(),
            "prometheus refresh failed; utilisation is unknown until it recovers"
        );
    }
    metrics
        .source_up
        .with_label_values(&["kubernetes"])
        .set(1.0);
    metrics
        .source_up
        .with_label_values(&["prometheus"])
        .set(if fetched.usage.available { 1.0 } else { 0.0 });
    metrics
        .refresh_duration
        .observe(started.elapsed().as_secs_f64());
    metrics
        .last_refresh
        .set(Utc::now().timestamp_millis() as f64 / 1000.0);
    info!(
        devices = fetched.usage.devices.len(),
        usage = fetched.usage.available,
        took_ms = started.elapsed().as_millis() as u64,
        "refreshed"
    );
}

/// What a pre-stop re-check needs besides the history of the refresh being acted on.
struct RecheckContext {
    client: Option<Arc<PromClient>>,
    settings: LiveSettings,
    stores: Stores,
    policy: Policy,
    cull_policy: CullPolicy,
    shard: (u32, u32),
}

impl RecheckContext {
    fn with_history(&self, history: Option<Arc<History>>) -> Rechecker<'_> {
        Rechecker { ctx: self, history }
    }
}

/// Re-checks a planned stop right before acting: fresh claims from the stores, a fresh
/// Prometheus query, the same history, the same rules. Anything short of "still a candidate"
/// cancels the stop.
struct Rechecker<'a> {
    ctx: &'a RecheckContext,
    history: Option<Arc<History>>,
}

impl Rechecker<'_> {
    fn run(&mut self, action: &Action) -> impl Future<Output = Result<bool, RecheckError>> + use<> {
        let client = self.ctx.client.clone();
        let mut history = self.history.as_deref().cloned();
        let (settings, policy, cull_policy) = (
            self.ctx.settings,
            self.ctx.policy.clone(),
            self.ctx.cull_policy.clone(),
        );
        let claims = self
            .ctx
            .stores
            .claims_for(self.ctx.shard.0, self.ctx.shard.1);
        let Action::Stop { pod_uid, .. } = action;
        let pod_uid = pod_uid.clone();
        async move {
            let Some(client) = client else {
                return Ok(false);
            };
            let now = Utc::now();
            let devices =
                crate::usage::live::fetch_window(&client, &settings, history.as_mut(), now).await?;
            let ledger = ledger::build(
                &claims,
                &Usage {
                    devices,
                    available: true,
                },
                now,
                &policy,
            );
            Ok(ledger
                .pods
                .iter()
                .find(|p| p.evidence.uid == pod_uid)
                .is_some_and(|row| cull::plan::judge(row, &cull_policy, now).is_ok()))
        }
    }
}

/// SIGTERM or Ctrl-C cancels everything (an expected end: not a failure).
fn spawn_signal_handler(tasks: &Tasks) {
    let cancel = tasks.cancel.clone();
    tasks.tracker.spawn(
        async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let mut term = match signal(SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        error!(
                            error = &e as &dyn std::error::Error,
                            "cannot listen for SIGTERM"
                        );
                        cancel.cancel();
                        return;
                    }
                };
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => info!("interrupt received"),
                    () = cancel.cancelled() => return,
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
            cancel.cancel();
        }
        .instrument(info_span!("signals")),
    );
}
