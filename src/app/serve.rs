//! `gpu-ledger serve`: sources publish into the hub, the hub publishes snapshots, sinks read them.
//!
//! ```text
//! claims watches ──▶ Stores ──┐                        ┌─▶ /metrics, /api/v1/ledger (ArcSwap)
//!                             ├─▶ hub: ledger::build ──┤
//! usage refresh ──▶ latest ───┘   (own task)           └─▶ culler (own task, watch channel)
//! ```
//!
//! Every task is supervised — the hub, the refresh, the culler, the HTTP server, each claims
//! watch and the culling Lease election: one that ends (or panics) before shutdown cancels the
//! rest and the process exits non-zero, so a dead task can never hide behind a live HTTP server.
//! A sink reads the latest snapshot and never blocks a source or another sink. Every API call
//! and every step is bounded, and the probes tell the truth: `/healthz` fails when a loop stops
//! making progress, `/readyz` also while a claims watch stays broken (then
//! `gpu_ledger_source_up{source="kubernetes"}` is 0 and culling is held back).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use chrono::Utc;
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, error, info, info_span, warn};

use super::{
    AppError, KUBE_CONNECT_TIMEOUT, KUBE_READ_TIMEOUT, cull_config, live_settings, prom_client,
};
use crate::claims::watch::{self, Stores};
use crate::config::ServeArgs;
use crate::cull::actuator::RecheckError;
use crate::cull::plan::{Action, CullPolicy};
use crate::cull::{self, Culler};
use crate::export::{SelfMetrics, Snapshot, auth, server, tls};
use crate::ledger::usage::Usage;
use crate::ledger::{self, Ledger, Policy};
use crate::test_hooks;
use crate::usage::history::History;
use crate::usage::live::{Fetched, LiveSettings, LiveUsage};
use crate::usage::prom::{PromClient, PromError};

/// How often the hub checks whether claims changed since the last ledger build.
const CLAIMS_REBUILD_INTERVAL: Duration = Duration::from_millis(250);
/// Longest wait for tasks to stop after cancellation.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// A claims watch failing for this long is broken: its store may be frozen. Then
/// `gpu_ledger_source_up{source="kubernetes"}` is 0, `/readyz` fails and culling is held back
/// (circuit `claims_stale`) until it works again.
pub const WATCH_BROKEN_AFTER: Duration = Duration::from_secs(60);
/// Bound of the notebook-ownership step of a refresh (StatefulSet GETs, each bounded too).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one culling cycle (each of its calls is bounded as well).
const CULL_CYCLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The hub builds every 250 ms; a build of a large cluster takes well under a second.
const HUB_STALL_BOUND: Duration = Duration::from_secs(60);
/// How often a waiting loop still reports progress.
const IDLE_BEAT: Duration = Duration::from_secs(5);

/// The tasks of one `serve` process: one cancellation tree, and the first unexpected end.
#[derive(Clone)]
struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
    failed: Arc<Mutex<Option<String>>>,
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
    fn spawn_critical<F>(&self, name: impl Into<String>, span: Span, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
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
                error!(task = %name, how, "task ended before shutdown; stopping the process");
                failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(name);
                cancel.cancel();
            }
            .instrument(span),
        );
    }

    fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// One loop's heartbeat: when it last made progress, and how long it may go without.
struct Beat {
    name: &'static str,
    bound: Duration,
    last: Mutex<Instant>,
}

impl Beat {
    fn new(name: &'static str, bound: Duration) -> Arc<Self> {
        Arc::new(Beat {
            name,
            bound,
            last: Mutex::new(Instant::now()),
        })
    }

    fn beat(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn silent_for(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
    }
}

/// What `/healthz` and `/readyz` report, from the loops themselves.
struct Health {
    /// The first snapshot is published (every watch synced, one refresh done).
    started: AtomicBool,
    /// Claims watches failing for longer than [`WATCH_BROKEN_AFTER`].
    broken_watches: Mutex<Vec<&'static str>>,
    /// Why the last refresh refused Prometheus' answer although Prometheus answered (DCGM
    /// series of several clusters and no selector): an operator must act, so not ready.
    usage_refused: Mutex<Option<String>>,
    beats: Vec<Arc<Beat>>,
    /// The claims stores, to tell which watches have not synced yet and why.
    stores: Option<Stores>,
}

impl Health {
    /// Keeps why the last refresh refused Prometheus' answer although it came (several clusters'
    /// series without a selector), for `/readyz`; any other outcome clears it.
    fn record_usage_refusal(&self, fetched: Option<&Fetched>) {
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

/// The two Kubernetes clients. Watches get no read timeout (kube-runtime's watcher has an idle
/// timeout of its own, and a quiet watch reads nothing for minutes); every other call goes
/// through a client whose responses must start within [`KUBE_READ_TIMEOUT`]. Both send a
/// `User-Agent` naming this replica, so the API server's audit log tells replicas apart.
async fn kube_clients(
    args: &crate::config::KubeArgs,
    identity: &str,
) -> Result<(Client, Client), AppError> {
    let mut config = super::kube_config(args).await?;
    config.connect_timeout = Some(KUBE_CONNECT_TIMEOUT);
    let agent = format!("gpu-ledger/{} ({identity})", env!("CARGO_PKG_VERSION"));
    if let Ok(v) = axum::http::HeaderValue::from_str(&agent) {
        config.headers.push((axum::http::header::USER_AGENT, v));
    } else {
        warn!(
            identity,
            "identity is not a valid header value; default user agent"
        );
    }
    let mut calls = config.clone();
    calls.read_timeout = Some(KUBE_READ_TIMEOUT);
    // Count the read timeout from when a request is sent, not from when its pooled connection
    // went idle.
    calls.reset_reader_on_write = true;
    let watches = Client::try_from(config).map_err(AppError::Kube)?;
    let calls = Client::try_from(calls).map_err(AppError::Kube)?;
    Ok((watches, calls))
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
    /// No claims watch was broken when the snapshot was built.
    claims_fresh: bool,
}

/// `gpu-ledger serve`.
#[allow(clippy::too_many_lines)] // the wiring of every task, in order
pub async fn serve(args: ServeArgs) -> Result<(), AppError> {
    validate(&args)?;
    let tls_config = tls::from_files(args.tls_cert_file.clone(), args.tls_key_file.clone())?;
    let policy = args.ledger.policy();
    let settings = live_settings(&args.ledger);
    let prom = prom_client(&args.ledger)?;
    if prom.is_none() {
        warn!(
            "no --prometheus-url: utilisation is unknown; claims and capacity are still exported"
        );
    }
    let shard = (args.shard, args.total_shards);
    let every = args
        .refresh_interval
        .to_std()
        .unwrap_or(Duration::from_secs(30));
    // A refresh makes a handful of PromQL queries, each bounded by --prometheus-timeout.
    let fetch_timeout = args
        .ledger
        .prometheus
        .prometheus_timeout
        .to_std()
        .unwrap_or(Duration::from_secs(20))
        .saturating_mul(4)
        + Duration::from_secs(10);

    let tasks = Tasks::new();
    spawn_signal_handler(&tasks);
    let spawn = |name: String, task: BoxFuture<'static, ()>| {
        tasks.spawn_critical(name, Span::none(), task);
    };

    let (watch_client, client) =
        kube_clients(&args.kube, &crate::cull::lease::default_identity()).await?;
    let registry = prometheus::Registry::new();
    let metrics = SelfMetrics::register(&registry).map_err(AppError::Metrics)?;
    crate::export::register_process_metrics(&registry).map_err(AppError::Metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(Snapshot::new(Ledger::empty(
        Utc::now(),
    ))));
    // The ledger families are rendered straight from `shared` by the /metrics handler
    // (`export::render_with_ledger`), not gathered through the registry.
    let mut cull_cfg = cull_config(&args.cull, &policy);
    cull_cfg.lease_clock_offset = test_hooks::lease_clock_offset();
    let culler = Culler::start(
        cull_cfg,
        Some(client.clone()),
        &registry,
        &spawn,
        &tasks.cancel,
    )
    .map_err(AppError::Cull)?;

    let restarts = metrics.watch_restarts.clone();
    let stores = watch::start_with(
        watch_client,
        watch::WatchConfig {
            namespaces: args.ledger.namespaces.clone(),
            exporter_namespaces: args.ledger.exporter_namespaces.clone(),
            names: policy.names.clone(),
        },
        &spawn,
        tasks.cancel.clone(),
        Arc::new(move |resource| restarts.with_label_values(&[resource]).inc()),
    )
    .await;
    metrics
        .source_up
        .with_label_values(&["kubernetes"])
        .set(1.0);
    crate::claims::dra::register_enabled(&registry, &stores.dra_enabled)
        .map_err(AppError::Metrics)?;

    let (hub_beat, refresh_beat, cull_beat) = (
        Beat::new("hub", HUB_STALL_BOUND),
        Beat::new(
            "refresh",
            every + RESOLVE_TIMEOUT + fetch_timeout + Duration::from_secs(30),
        ),
        Beat::new("cull", CULL_CYCLE_TIMEOUT + Duration::from_secs(60)),
    );
    let health = Arc::new(Health {
        started: AtomicBool::new(false),
        broken_watches: Mutex::default(),
        usage_refused: Mutex::default(),
        beats: vec![hub_beat.clone(), refresh_beat.clone(), cull_beat.clone()],
        stores: Some(stores.clone()),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: args.listen,
            source,
        })?;
    info!(listen = %args.listen, "serving /metrics, /healthz, /readyz, /livez, /api/v1/ledger, /api/v1/history");
    let state = server::AppState {
        registry: registry.clone(),
        snapshot: shared.clone(),
        probes: health.clone(),
    };
    let server_cancel = tasks.cancel.clone();
    // TLS and API authentication (docs/security.md): export::tls, export::auth.
    let kube_auth =
        (args.api_auth == crate::config::ApiAuthFlag::Kubernetes).then(|| client.clone());
    let api_auth = auth::ApiAuth::new(args.api_token_file.clone(), kube_auth, &registry)?;
    let history = crate::export::history::HistoryState::new(
        prom.clone().map(super::showback::prometheus_history),
    );
    let app = auth::protect(server::router_with_history(state, history), api_auth);
    let limits = tls::Limits {
        max_connections: args.max_connections as usize,
    };
    tasks.spawn_critical("http", info_span!("http"), async move {
        if let Err(e) = tls::serve(listener, app, tls_config, limits, server_cancel).await {
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
            every,
            fetch_timeout,
            tx: usage_tx,
            beat: refresh_beat,
            health: health.clone(),
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
            health,
            metrics,
            beat: hub_beat,
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
        cull_loop(culler, cull_rx, rechecks, cull_beat, tasks.cancel.clone()),
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
    health: Arc<Health>,
    metrics: SelfMetrics,
    beat: Arc<Beat>,
    cull: channel::Sender<Option<CullInput>>,
    cancel: CancellationToken,
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
async fn hub_loop(mut hub: Hub) {
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

/// Runs a culling cycle on every snapshot built from a fresh refresh; a slow cycle only delays
/// culling (the next cycle takes the newest snapshot, skipping any in between). A cycle is
/// bounded by [`CULL_CYCLE_TIMEOUT`].
async fn cull_loop(
    mut culler: Culler,
    mut inputs: channel::Receiver<Option<CullInput>>,
    rechecks: RecheckContext,
    beat: Arc<Beat>,
    cancel: CancellationToken,
) {
    let mut idle = tokio::time::interval(IDLE_BEAT);
    loop {
        beat.beat();
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = idle.tick() => continue,
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
        let cycle = tokio::time::timeout(
            CULL_CYCLE_TIMEOUT,
            culler.cycle(
                &input.snapshot.ledger,
                input.claims_fresh,
                Utc::now(),
                &mut recheck,
            ),
        );
        tokio::select! {
            () = cancel.cancelled() => break,
            done = cycle => if done.is_err() {
                warn!(
                    timeout_seconds = CULL_CYCLE_TIMEOUT.as_secs(),
                    "culling cycle timed out; the next refresh starts a new one"
                );
            },
        }
        test_hooks::panic_point("cull");
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
    every: Duration,
    /// Bound of the Prometheus part of one refresh.
    fetch_timeout: Duration,
    tx: channel::Sender<Option<Arc<Refreshed>>>,
    beat: Arc<Beat>,
    health: Arc<Health>,
    cancel: CancellationToken,
}

/// Every `every` (first as soon as the watches have synced): verify notebook ownership, query
/// usage, record health, publish the result to the hub. Each step is bounded.
async fn refresh_loop(mut r: RefreshLoop) {
    let mut waiting = tokio::time::interval(Duration::from_millis(100));
    let mut told = false;
    while !r.stores.synced() {
        r.beat.beat();
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
        r.beat.beat();
        tokio::select! {
            () = r.cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let started = Instant::now();
        match tokio::time::timeout(RESOLVE_TIMEOUT, r.stores.resolve_statefulsets(&r.client)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(
                error = &e as &dyn std::error::Error,
                "cannot verify notebook ownership this refresh"
            ),
            Err(_) => warn!(
                timeout_seconds = RESOLVE_TIMEOUT.as_secs(),
                "verifying notebook ownership timed out this refresh"
            ),
        }
        let fetched = tokio::time::timeout(r.fetch_timeout, r.source.fetch())
            .await
            .ok();
        if fetched.is_none() {
            warn!(
                timeout_seconds = r.fetch_timeout.as_secs(),
                "prometheus refresh timed out; utilisation is unknown until it recovers"
            );
            r.metrics.prometheus_query_errors.inc();
        }
        record_refresh(&r.metrics, fetched.as_ref(), started);
        r.health.record_usage_refusal(fetched.as_ref());
        let refreshed = Refreshed {
            usage: fetched.map(|f| f.usage).unwrap_or_default(),
            history: r.source.history().cloned().map(Arc::new),
        };
        r.tx.send_replace(Some(Arc::new(refreshed)));
        test_hooks::panic_point("refresh");
    }
}

/// Health of one refresh: Prometheus up, its duration, when it happened (`None`: it timed out).
/// The kubernetes source's health is the watches' (set by the hub).
fn record_refresh(metrics: &SelfMetrics, fetched: Option<&Fetched>, started: Instant) {
    if let Some(fetched) = fetched {
        metrics
            .prometheus_queries
            .inc_by(u64::from(fetched.stats.queries));
        metrics.prometheus_warnings.inc_by(fetched.stats.warnings);
        for (reason, n) in [
            ("future", fetched.rejected.future),
            ("impossible", fetched.rejected.impossible),
        ] {
            // Touched at 0 too, so the series exist from the first refresh (alerts need them).
            metrics
                .prometheus_samples_rejected
                .with_label_values(&[reason])
                .inc_by(n);
        }
    }
    if let Some(e) = fetched.and_then(|f| f.error.as_ref()) {
        metrics.prometheus_query_errors.inc();
        warn!(
            error = e as &dyn std::error::Error,
            kind = e.kind(),
            "prometheus refresh failed; utilisation is unknown until it recovers"
        );
    }
    let several = fetched
        .and_then(|f| f.error.as_ref())
        .is_some_and(|e| matches!(e, PromError::SeveralClusters { .. }));
    metrics
        .prometheus_several_clusters
        .set(if several { 1.0 } else { 0.0 });
    let available = fetched.is_some_and(|f| f.usage.available);
    metrics
        .source_up
        .with_label_values(&["prometheus"])
        .set(if available { 1.0 } else { 0.0 });
    metrics
        .refresh_duration
        .observe(started.elapsed().as_secs_f64());
    metrics
        .last_refresh
        .set(Utc::now().timestamp_millis() as f64 / 1000.0);
    info!(
        devices = fetched.map_or(0, |f| f.usage.devices.len()),
        usage = available,
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
                    partial: false,
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
    let (cancel, failed) = (tasks.cancel.clone(), tasks.failed.clone());
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
                        // Not an expected end: the process must exit non-zero.
                        failed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert_with(|| "signals".to_string());
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
                drop(failed);
                let _ = tokio::signal::ctrl_c().await;
            }
            cancel.cancel();
        }
        .instrument(info_span!("signals")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::server::Probes as _;
    use crate::usage::live::Rejected;
    use crate::usage::prom::QueryStats;

    fn refused_by_several_clusters() -> Fetched {
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

    #[test]
    fn several_clusters_set_their_gauge_and_the_source_down() {
        let registry = prometheus::Registry::new();
        let metrics = SelfMetrics::register(&registry).expect("metrics");
        record_refresh(
            &metrics,
            Some(&refused_by_several_clusters()),
            Instant::now(),
        );
        assert_eq!(metrics.prometheus_several_clusters.get(), 1.0);
        assert_eq!(
            metrics.source_up.with_label_values(&["prometheus"]).get(),
            0.0
        );
        let mut clean = refused_by_several_clusters();
        clean.error = None;
        clean.usage.available = true;
        record_refresh(&metrics, Some(&clean), Instant::now());
        assert_eq!(metrics.prometheus_several_clusters.get(), 0.0);
        assert_eq!(
            metrics.source_up.with_label_values(&["prometheus"]).get(),
            1.0
        );
    }
}
