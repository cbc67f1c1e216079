//! `gpu-ledger serve`: sources publish into the hub, the hub publishes snapshots, sinks read them.
//!
//! ```text
//! claims watches ──▶ Stores ──┐                        ┌─▶ /metrics, /api/v1/ledger (ArcSwap)
//!                             ├─▶ hub: ledger::build ──┤
//! usage refresh ──▶ latest ───┘   (own task)           └─▶ culler (own task, watch channel)
//! ```
//!
//! The hub loop is `hub.rs`, the supervisor `tasks.rs`, the re-check before a stop `recheck.rs`;
//! this file wires them and runs the refresh and the culling loops.
//!
//! Every task is supervised — the hub, the refresh, the culler, the HTTP server, each claims
//! watch and the culling Lease election: one that ends (or panics) before shutdown cancels the
//! rest and the process exits non-zero, so a dead task can never hide behind a live HTTP server.
//! A sink reads the latest snapshot and never blocks a source or another sink. Every API call
//! and every step is bounded, and the probes tell the truth: `/healthz` fails when a loop stops
//! making progress, `/readyz` also while a claims watch stays broken (then
//! `gpu_ledger_source_up{source="kubernetes"}` is 0 and culling is held back).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use chrono::Utc;
use futures::future::BoxFuture;
use kube::Client;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;
use tracing::{Span, error, info, info_span, warn};

use super::clients::{KUBE_CONNECT_TIMEOUT, KUBE_READ_TIMEOUT, kube_config, prom_client};
use super::error::AppError;
use super::hub::{CullInput, HUB_STALL_BOUND, Health, Hub, Refreshed, hub_loop};
use super::recheck::{RecheckContext, query_scope};
use super::settings::{cull_config, live_settings};
use super::tasks::{Beat, Tasks, spawn_signal_handler};
use crate::claims::watch::{self, Stores};
use crate::config::ServeArgs;
use crate::cull::Culler;
use crate::cull::plan::Action;
use crate::export::{SelfMetrics, auth, server, tls};
use crate::ledger::Ledger;
use crate::ledger::accounting::Snapshot;
use crate::test_hooks;
use crate::usage::live::{Fetched, LiveUsage, Scope};
use crate::usage::prom::{PromClient, PromError};

/// Bound of the notebook-ownership step of a refresh (StatefulSet GETs, each bounded too).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one culling cycle (each of its calls is bounded as well).
const CULL_CYCLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a waiting loop still reports progress.
const IDLE_BEAT: Duration = Duration::from_secs(5);

/// The two Kubernetes clients. Watches get no read timeout (kube-runtime's watcher has an idle
/// timeout of its own, and a quiet watch reads nothing for minutes); every other call goes
/// through a client whose responses must start within [`KUBE_READ_TIMEOUT`]. Both send a
/// `User-Agent` naming this replica, so the API server's audit log tells replicas apart.
async fn kube_clients(
    args: &crate::config::KubeArgs,
    identity: &str,
) -> Result<(Client, Client), AppError> {
    let mut config = kube_config(args).await?;
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
    let scope_label = Some(args.shard_query_scope.clone()).filter(|l| l != "none");
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
    // Sharded, every series says which shard counted it (docs/metrics.md: shards add up, HA
    // replicas of one shard count once).
    let shard_label = crate::export::shard_label(args.shard, args.total_shards);
    let registry = crate::export::registry(shard_label).map_err(AppError::Metrics)?;
    let metrics = SelfMetrics::register(&registry).map_err(AppError::Metrics)?;
    crate::export::register_process_metrics(&registry).map_err(AppError::Metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(
        Snapshot::new(Ledger::empty(Utc::now())).with_shard(shard_label),
    ));
    // The ledger families are rendered straight from `shared` by the /metrics handler
    // (`export::render_with_ledger`), not gathered through the registry.
    let mut cull_cfg = cull_config(&args.cull, &policy)?;
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
            kueue_config_map: args.ledger.kueue_config_map.resolve(),
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
        page: Arc::new(super::page::HtmlPage),
    };
    let server_cancel = tasks.cancel.clone();
    // TLS and API authentication (docs/security.md): export::tls, export::auth.
    let kube_auth =
        (args.api_auth == crate::config::ApiAuthFlag::Kubernetes).then(|| client.clone());
    let api_auth = auth::ApiAuth::new(args.api_token_file.clone(), kube_auth, &registry)?;
    let history = crate::export::history::HistoryState::new(
        prom.clone().map(super::showback::prometheus_history),
    );
    let responses = server::ResponseLimits {
        max_inflight: args.max_inflight_responses as usize,
    };
    let app = auth::protect(
        server::router_with_limits(state, history, responses),
        api_auth,
    );
    let limits = tls::Limits {
        max_connections: args.max_connections as usize,
        // Positive by its parser, so always representable.
        write_timeout: args
            .write_timeout
            .to_std()
            .unwrap_or(tls::DEFAULT_WRITE_TIMEOUT),
    };
    tasks.spawn_critical("http", info_span!("http"), async move {
        if let Err(e) = tls::serve(listener, app, tls_config, limits, server_cancel).await {
            error!(error = &e as &dyn std::error::Error, "http server failed");
        }
    });

    // Source: Prometheus is asked on its own task, so a slow refresh never holds back a claims
    // change.
    let mut source = LiveUsage::new(prom.clone(), settings);
    source.read_gpu_health(args.ledger.dcgm_health);
    source.start_bootstrap(&tasks.tracker, &tasks.cancel);
    let (usage_tx, usage_rx) = channel::channel::<Option<Arc<Refreshed>>>(None);
    tasks.spawn_critical(
        "refresh",
        info_span!("refresh"),
        refresh_loop(RefreshLoop {
            source,
            prom: prom.clone(),
            stores: stores.clone(),
            shard,
            scope_label: scope_label.clone(),
            client: client.clone(),
            metrics: metrics.clone(),
            every,
            fetch_timeout,
            tx: usage_tx,
            beat: refresh_beat,
            health: health.clone(),
            cancel: tasks.cancel.clone(),
            fields_checked: None,
            fields_every: args
                .dcgm_fields_check_interval
                .to_std()
                .unwrap_or(Duration::from_secs(60)),
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
        scope_label,
    };
    tasks.spawn_critical(
        "cull",
        info_span!("cull"),
        cull_loop(culler, cull_rx, rechecks, cull_beat, tasks.cancel.clone()),
    );

    tasks.cancel.cancelled().await;
    info!("shutting down");
    tasks.drain().await;
    match tasks.failed() {
        Some(name) => Err(AppError::TaskEnded(name)),
        None => Ok(()),
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

/// The refresh task's inputs.
struct RefreshLoop {
    source: LiveUsage,
    /// The source's client, for the field-coverage count (`None`: no Prometheus configured).
    prom: Option<Arc<PromClient>>,
    stores: Stores,
    /// This replica's shard and the label its query is narrowed by ([`query_scope`]).
    shard: (u32, u32),
    scope_label: Option<String>,
    client: Client,
    metrics: SelfMetrics,
    every: Duration,
    /// Bound of the Prometheus part of one refresh.
    fetch_timeout: Duration,
    tx: channel::Sender<Option<Arc<Refreshed>>>,
    beat: Arc<Beat>,
    health: Arc<Health>,
    cancel: CancellationToken,
    /// When the field-coverage count last ran, and what it found ([`count_fields_missing`]).
    fields_checked: Option<(Instant, u64)>,
    /// How often the field-coverage count runs (`--dcgm-fields-check-interval`): it changes when
    /// an exporter is upgraded, not from one refresh to the next, so it need not cost Prometheus
    /// a query every refresh.
    fields_every: Duration,
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
        let scope = query_scope(&r.stores, r.shard, r.scope_label.as_deref());
        r.source.set_scope(scope.clone());
        let fetched = tokio::time::timeout(r.fetch_timeout, r.source.fetch())
            .await
            .ok();
        if r.fields_checked
            .is_none_or(|(at, _)| at.elapsed() >= r.fields_every)
        {
            count_fields_missing(&mut r, &scope).await;
        }
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

/// Sets `gpu_ledger_dcgm_devices_fields_missing` for the devices of `scope` (one instant query,
/// bounded like the refresh's) and warns when the count changes to a non-zero value; on
/// failure the gauge keeps its last value and the failure is counted as a query error.
async fn count_fields_missing(r: &mut RefreshLoop, scope: &Scope) {
    let Some(prom) = r.prom.clone() else {
        return;
    };
    let before = r.fields_checked.map(|(_, n)| n);
    // A failed count is not retried before the next turn either; the gauge keeps its value.
    r.fields_checked = Some((Instant::now(), before.unwrap_or(0)));
    if scope.is_empty() {
        r.metrics.dcgm_devices_fields_missing.set(0.0);
        r.fields_checked = Some((Instant::now(), 0));
        return;
    }
    let matcher = scope.matcher();
    let asked = prom.devices_fields_missing(&matcher, Utc::now());
    match tokio::time::timeout(r.fetch_timeout, asked).await {
        Ok(Ok(n)) => {
            r.fields_checked = Some((Instant::now(), n));
            if n > 0 && before != Some(n) {
                warn!(
                    devices = n,
                    "DCGM series without any field gpu-ledger reads: their utilisation is unknown (see GpuLedgerDcgmFieldsMissing)"
                );
            }
            r.metrics.dcgm_devices_fields_missing.set(n as f64);
        }
        Ok(Err(e)) => {
            r.metrics.prometheus_query_errors.inc();
            warn!(
                error = &e as &dyn std::error::Error,
                "counting DCGM devices without read fields failed"
            );
        }
        Err(_) => {
            r.metrics.prometheus_query_errors.inc();
            warn!("counting DCGM devices without read fields timed out");
        }
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

#[cfg(test)]
mod tests {
    use super::super::hub::tests::refused_by_several_clusters;
    use super::*;

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
