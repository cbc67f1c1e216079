//! The runtime edges: `serve` (watches, refresh loop, HTTP server, culling) and the one-shot
//! `report`. Everything here is I/O and wiring; decisions live in `ledger` and `cull`.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span, warn};

use crate::claims::{self, Claims, ResourceNames, project, watch};
use crate::config::{LedgerArgs, Output, ReportArgs, ServeArgs};
use crate::export::{self, SelfMetrics, Snapshot, server};
use crate::ledger::{self, Ledger, Policy};
use crate::report;
use crate::usage::history::{self, History};
use crate::usage::prom::{PromClient, PromConfig, PromError};
use crate::usage::{Usage, Window};

/// How often the serve loop checks whether claims changed since the last ledger build.
const CLAIMS_REBUILD_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Why the process could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("connecting to the Kubernetes API (kubeconfig or in-cluster)")]
    Kube(#[source] kube::Error),
    #[error("listing {0}")]
    List(&'static str, #[source] kube::Error),
    #[error("binding {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("http server")]
    Serve(#[source] std::io::Error),
    #[error("prometheus")]
    Prometheus(#[source] PromError),
    #[error("registering metrics")]
    Metrics(#[source] prometheus::Error),
    #[error(transparent)]
    Offline(#[from] report::offline::OfflineError),
    #[error("writing output")]
    Output(#[source] std::io::Error),
    #[error("culling")]
    Cull(#[source] crate::cull::CullError),
}

impl AppError {
    /// Exit code: 2 for bad input or configuration, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Offline(_) => 2,
            _ => 1,
        }
    }
}

fn window_of(args: &LedgerArgs, interval: chrono::Duration) -> Window {
    Window {
        length: args.window,
        interval,
        idle_threshold: args.idle_threshold,
        max_staleness: args.max_staleness,
    }
}

fn prom_client(args: &LedgerArgs) -> Result<Option<Arc<PromClient>>, AppError> {
    let Some(url) = args.prometheus_url.clone() else {
        return Ok(None);
    };
    let cfg = PromConfig {
        url,
        bearer_token_file: args.prometheus_bearer_token_file.clone(),
        ca_file: args.prometheus_ca_file.clone(),
        insecure_skip_verify: args.prometheus_insecure_skip_verify,
        timeout: args
            .prometheus_timeout
            .to_std()
            .map_err(|e| AppError::Config(format!("--prometheus-timeout: {e}")))?,
    };
    PromClient::new(cfg)
        .map(|c| Some(Arc::new(c)))
        .map_err(AppError::Prometheus)
}

/// Usage source for the live paths: Prometheus plus the idle history.
struct UsageSource {
    client: Option<Arc<PromClient>>,
    history: Option<History>,
    /// The start-up history query, running beside the refreshes (`serve` only).
    bootstrap: Option<tokio::task::JoinHandle<History>>,
    /// When the last successful refresh was merged into `history`: activity before it is known.
    merged_at: Option<chrono::DateTime<Utc>>,
    args: LedgerArgs,
    window: Window,
}

/// Rebuilds the idle history with one query over the lookback. A failed or slow bootstrap must not
/// stop anything: the history then starts empty (idle time accrues from now), and the log says so.
async fn bootstrap_history(
    client: Arc<PromClient>,
    args: LedgerArgs,
    window: Window,
    now: chrono::DateTime<Utc>,
) -> History {
    let result = async {
        let scheme = client
            .detect_scheme(args.label_scheme, &window, now)
            .await?;
        history::bootstrap(
            &client,
            &scheme,
            &window,
            args.history_lookback,
            args.min_coverage,
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
            warn!(error = %e, "idle history bootstrap failed; idle time accrues from now");
            History::new(args.history_lookback)
        }
    }
}

impl UsageSource {
    fn new(client: Option<Arc<PromClient>>, args: &LedgerArgs, window: Window) -> Self {
        UsageSource {
            client,
            history: None,
            bootstrap: None,
            merged_at: None,
            args: args.clone(),
            window,
        }
    }

    /// Starts the start-up history query in the background; refreshes go on with an empty history
    /// until it answers (its cost grows with the samples in lookback × GPUs).
    fn start_bootstrap(&mut self, tracker: &TaskTracker, cancel: &CancellationToken) {
        let Some(client) = self.client.clone() else {
            return;
        };
        self.history = Some(History::new(self.args.history_lookback));
        let (args, window, cancel) = (self.args.clone(), self.window, cancel.clone());
        let lookback = args.history_lookback;
        self.bootstrap = Some(
            tracker.spawn(
                async move {
                    tokio::select! {
                        h = bootstrap_history(client, args, window, Utc::now()) => h,
                        () = cancel.cancelled() => History::new(lookback),
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
                .get_or_insert_with(|| History::new(self.args.history_lookback))
                .absorb(boot),
            Err(e) => warn!(error = %e, "idle history bootstrap task failed"),
        }
    }

    async fn fetch(&mut self, metrics: Option<&SelfMetrics>) -> Usage {
        let now = Utc::now();
        let Some(client) = self.client.clone() else {
            return Usage::default();
        };
        // One-shot paths (report) rebuild the history inline: they have one refresh only.
        if self.history.is_none() {
            self.history =
                Some(bootstrap_history(client.clone(), self.args.clone(), self.window, now).await);
        }
        self.absorb_bootstrap().await;
        match client
            .fetch_usage_since(self.args.label_scheme, &self.window, now, self.merged_at)
            .await
        {
            Ok((mut devices, stats)) => {
                if let Some(m) = metrics {
                    m.prometheus_queries.inc_by(u64::from(stats.queries));
                }
                if let Some(h) = self.history.as_mut() {
                    h.merge(&mut devices, &self.window, self.args.min_coverage, now);
                    self.merged_at = Some(now);
                }
                Usage {
                    devices,
                    available: true,
                }
            }
            Err(e) => {
                if let Some(m) = metrics {
                    m.prometheus_query_errors.inc();
                }
                warn!(error = %e, kind = e.kind(), "prometheus refresh failed; utilisation is unknown until it recovers");
                Usage::default()
            }
        }
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

/// `gpu-ledger serve`.
pub async fn serve(args: ServeArgs) -> Result<(), AppError> {
    validate(&args)?;
    let policy = args.ledger.policy();
    let names = policy.names.clone();
    let interval = args
        .ledger
        .scrape_interval
        .unwrap_or(chrono::Duration::seconds(30));
    let window = window_of(&args.ledger, interval);
    let prom = prom_client(&args.ledger)?;
    if prom.is_none() {
        warn!(
            "no --prometheus-url: utilisation is unknown; claims and capacity are still exported"
        );
    }

    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    spawn_signal_handler(&tracker, cancel.clone());

    let client = Client::try_default().await.map_err(AppError::Kube)?;
    let registry = prometheus::Registry::new();
    let metrics = SelfMetrics::register(&registry).map_err(AppError::Metrics)?;
    let shared = Arc::new(ArcSwap::from_pointee(Snapshot::new(Ledger::empty(
        Utc::now(),
    ))));
    // The ledger families are rendered straight from `shared` by the /metrics handler
    // (`export::render_with_ledger`), not gathered through the registry.
    let mut culler = crate::cull::Culler::from_args(
        &args.cull,
        &policy,
        Some(client.clone()),
        &registry,
        &tracker,
        &cancel,
    )
    .map_err(AppError::Cull)?;

    let restarts = metrics.watch_restarts.clone();
    let stores = watch::start(
        client.clone(),
        watch::WatchConfig {
            namespaces: args.ledger.namespaces.clone(),
            names: names.clone(),
        },
        &tracker,
        cancel.clone(),
        Arc::new(move |resource| restarts.with_label_values(&[resource]).inc()),
    )
    .await;

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
        names: names.clone(),
        ready: ready.clone(),
    };
    let server_cancel = cancel.clone();
    let server =
        tracker.spawn(server::serve(listener, state, server_cancel).instrument(info_span!("http")));

    let prom_for_recheck = prom.clone();
    let mut source = UsageSource::new(prom, &args.ledger, window);
    source.start_bootstrap(&tracker, &cancel);
    // Prometheus is asked on its own task, so a slow refresh never holds back a claims change.
    let (usage_tx, mut usage_rx) = tokio::sync::mpsc::channel(1);
    tracker.spawn(
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
            cancel: cancel.clone(),
        })
        .instrument(info_span!("refresh")),
    );
    // Claims changes (a pod deleted, a pod bound) reach the ledger within this, with the last
    // usage.
    let mut claims_tick = tokio::time::interval(CLAIMS_REBUILD_INTERVAL);
    claims_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut built_generation = None;
    let mut latest: Option<Refreshed> = None;
    loop {
        let refreshed = tokio::select! {
            () = cancel.cancelled() => break,
            r = usage_rx.recv() => match r {
                Some(r) => Some(r),
                None => break,
            },
            _ = claims_tick.tick() => None,
        };
        let new_usage = refreshed.is_some();
        if let Some(r) = refreshed {
            latest = Some(r);
        }
        // Nothing is published before the first refresh (which waits for the watches to sync).
        let Some(current) = latest.as_ref() else {
            continue;
        };
        let generation = stores.generation();
        if !new_usage && built_generation == Some(generation) {
            continue;
        }
        built_generation = Some(generation);
        let ledger = rebuild_from_claims(
            &stores,
            &current.usage,
            &policy,
            (args.shard, args.total_shards),
        );
        let next = shared.load().advance(ledger);
        shared.store(Arc::new(next));
        ready.store(true, Ordering::Relaxed);
        if !new_usage {
            continue;
        }
        let recheck = Rechecker {
            client: prom_for_recheck.clone(),
            history: current.history.clone(),
            args: args.ledger.clone(),
            window,
            stores: stores.clone(),
            policy: policy.clone(),
            cull_policy: culler.config().policy.clone(),
            shard: (args.shard, args.total_shards),
        };
        cull_cycle(&mut culler, &shared.load_full().ledger, recheck)
            .instrument(info_span!("cull"))
            .await;
    }

    shut_down(culler, tracker, server).await
}

/// Bounded shutdown: release the lease, stop every task, drain the HTTP server.
async fn shut_down(
    mut culler: crate::cull::Culler,
    tracker: TaskTracker,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<(), AppError> {
    info!("shutting down");
    culler.shutdown().await;
    tracker.close();
    if tokio::time::timeout(std::time::Duration::from_secs(10), tracker.wait())
        .await
        .is_err()
    {
        warn!("tasks did not stop within 10 s; exiting anyway");
    }
    match server.await {
        Ok(Ok(())) | Err(_) => Ok(()),
        Ok(Err(e)) => Err(AppError::Serve(e)),
    }
}

/// One culling cycle on the ledger just published, re-checking each stop with `recheck`.
async fn cull_cycle(culler: &mut crate::cull::Culler, ledger: &Ledger, mut recheck: Rechecker) {
    culler
        .cycle(
            ledger,
            Utc::now(),
            &mut |action: &crate::cull::plan::Action| recheck.run(action),
        )
        .await;
}

/// A ledger from the current claims and the last usage (no Prometheus query, no API call).
fn rebuild_from_claims(
    stores: &watch::Stores,
    usage: &Usage,
    policy: &Policy,
    (shard, total_shards): (u32, u32),
) -> Ledger {
    let claims = stores.claims_for(shard, total_shards);
    let mut ledger = ledger::build(&claims, usage, Utc::now(), policy);
    ledger.retain_shard(shard, total_shards);
    ledger
}

/// What one refresh hands the serve loop.
struct Refreshed {
    usage: Usage,
    /// The idle history after this refresh, for re-checks before a stop.
    history: Option<Arc<History>>,
}

/// The refresh task's inputs.
struct RefreshLoop {
    source: UsageSource,
    stores: watch::Stores,
    client: Client,
    metrics: SelfMetrics,
    every: std::time::Duration,
    tx: tokio::sync::mpsc::Sender<Refreshed>,
    cancel: CancellationToken,
}

/// Every `every` (first as soon as the watches have synced): verify notebook ownership, query
/// usage, record health, hand the result to the serve loop.
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
            warn!(error = %e, "cannot verify notebook ownership this refresh");
        }
        let usage = r.source.fetch(Some(&r.metrics)).await;
        record_refresh(&r.metrics, &usage, started);
        let refreshed = Refreshed {
            usage,
            history: r.source.history.clone().map(Arc::new),
        };
        if r.tx.send(refreshed).await.is_err() {
            return;
        }
    }
}

/// Health of one refresh: sources up, its duration, when it happened.
fn record_refresh(metrics: &SelfMetrics, usage: &Usage, started: Instant) {
    metrics
        .source_up
        .with_label_values(&["kubernetes"])
        .set(1.0);
    metrics
        .source_up
        .with_label_values(&["prometheus"])
        .set(if usage.available { 1.0 } else { 0.0 });
    metrics
        .refresh_duration
        .observe(started.elapsed().as_secs_f64());
    metrics
        .last_refresh
        .set(Utc::now().timestamp_millis() as f64 / 1000.0);
    info!(
        devices = usage.devices.len(),
        usage = usage.available,
        took_ms = started.elapsed().as_millis() as u64,
        "refreshed"
    );
}

/// Re-checks a planned stop right before acting: fresh claims from the stores, a fresh
/// Prometheus query, the same history, the same rules. Anything short of "still a candidate"
/// cancels the stop.
struct Rechecker {
    client: Option<Arc<PromClient>>,
    history: Option<Arc<History>>,
    args: LedgerArgs,
    window: Window,
    stores: watch::Stores,
    policy: Policy,
    cull_policy: crate::cull::plan::CullPolicy,
    shard: (u32, u32),
}

impl Rechecker {
    fn run(
        &mut self,
        action: &crate::cull::plan::Action,
    ) -> impl std::future::Future<Output = Result<bool, crate::cull::actuator::RecheckError>> + use<>
    {
        let client = self.client.clone();
        let mut history = self.history.as_deref().cloned();
        let (args, window, policy, cull_policy) = (
            self.args.clone(),
            self.window,
            self.policy.clone(),
            self.cull_policy.clone(),
        );
        let claims = self.stores.claims_for(self.shard.0, self.shard.1);
        let crate::cull::plan::Action::Stop { pod_uid, .. } = action;
        let pod_uid = pod_uid.clone();
        async move {
            let Some(client) = client else {
                return Ok(false);
            };
            let now = Utc::now();
            let (mut devices, _) = client.fetch_usage(args.label_scheme, &window, now).await?;
            if let Some(h) = history.as_mut() {
                h.merge(&mut devices, &window, args.min_coverage, now);
            }
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
                .is_some_and(|row| crate::cull::plan::judge(row, &cull_policy, now).is_ok()))
        }
    }
}

fn spawn_signal_handler(tracker: &TaskTracker, cancel: CancellationToken) {
    tracker.spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    error!(error = %e, "cannot listen for SIGTERM");
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
    });
}

/// Lists claims once from the live API (the one-shot report).
async fn list_claims(
    client: &Client,
    names: &ResourceNames,
    namespaces: &[String],
) -> Result<Claims, AppError> {
    let mut claims = Claims::default();
    let lp = ListParams::default();
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    for ns in &scopes {
        let pods: Api<Pod> = ns.map_or_else(
            || Api::all(client.clone()),
            |n| Api::namespaced(client.clone(), n),
        );
        for p in pods
            .list(&lp)
            .await
            .map_err(|e| AppError::List("pods", e))?
        {
            match project::pod(names, &p) {
                Ok(Some(c)) => claims.pods.push(c),
                Ok(None) => {}
                Err(e) => warn!(error = %e, "ignoring pod"),
            }
        }
        let quotas: Api<ResourceQuota> = ns.map_or_else(
            || Api::all(client.clone()),
            |n| Api::namespaced(client.clone(), n),
        );
        for q in quotas
            .list(&lp)
            .await
            .map_err(|e| AppError::List("resourcequotas", e))?
        {
            if let Ok(Some(info)) = project::quota(names, &q) {
                claims.quotas.push(info);
            }
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes
        .list(&lp)
        .await
        .map_err(|e| AppError::List("nodes", e))?
    {
        match project::node(names, &n) {
            Ok(info) => claims.nodes.push(info),
            Err(e) => warn!(error = %e, "ignoring node"),
        }
    }
    if let Ok(group) = kube::discovery::group(client, "kubeflow.org").await
        && let Some((ar, _)) = group.recommended_kind("Notebook")
    {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = api
            .list(&lp)
            .await
            .map_err(|e| AppError::List("notebooks", e))?;
        claims.notebooks = list
            .items
            .iter()
            .map(|o| project::notebook(&o.metadata))
            .collect();
        claims.notebooks_enabled = true;
        let mut sets = std::collections::BTreeSet::new();
        for p in &claims.pods {
            if let Some(c) = p
                .controller
                .as_ref()
                .filter(|c| c.kind == "StatefulSet" && c.group == "apps")
            {
                sets.insert((p.namespace.clone(), c.name.clone()));
            }
        }
        for (ns, name) in sets {
            let api: Api<k8s_openapi::api::apps::v1::StatefulSet> =
                Api::namespaced(client.clone(), &ns);
            if let Ok(Some(sts)) = api.get_opt(&name).await {
                claims.statefulsets.push(project::statefulset(&sts));
            }
        }
    }
    Ok(claims)
}

/// The ledger from dump files (`--from DIR` or one flag per file).
fn offline_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
    let mut input = if let Some(dir) = &args.from {
        report::offline::OfflineInput::from_dir(dir)
    } else {
        let mut i = report::offline::OfflineInput::from_dir(std::path::Path::new("."));
        i.paths = claims::files::DumpPaths {
            pods: args.pods.clone().unwrap_or_default(),
            nodes: args.nodes.clone().unwrap_or_default(),
            notebooks: args.notebooks.clone(),
            quotas: args.quotas.clone(),
            statefulsets: args.statefulsets.clone(),
        };
        i.dcgm = args.dcgm.clone().unwrap_or_default();
        i
    };
    input.at = args.at;
    input.window = args.ledger.window;
    input.scrape_interval = args.ledger.scrape_interval;
    input.scheme = args.ledger.label_scheme;
    input.policy = policy.clone();
    let offline = report::offline::load(&input, Utc::now())?;
    for w in &offline.warnings {
        eprintln!("warning: {w}");
    }
    Ok(offline.ledger)
}

/// The ledger from the live API (one list per resource) and Prometheus.
async fn live_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
    if args.ledger.prometheus_url.is_none() {
        return Err(AppError::Config(
            "report needs --from DIR (or --pods/--nodes/--dcgm files), or a live cluster with --prometheus-url".into(),
        ));
    }
    let client = Client::try_default().await.map_err(AppError::Kube)?;
    let claims = list_claims(&client, &policy.names, &args.ledger.namespaces).await?;
    let interval = args
        .ledger
        .scrape_interval
        .unwrap_or(chrono::Duration::seconds(30));
    let mut source = UsageSource::new(
        prom_client(&args.ledger)?,
        &args.ledger,
        window_of(&args.ledger, interval),
    );
    let usage = source.fetch(None).await;
    if !usage.available {
        eprintln!("warning: prometheus did not answer; utilisation is unknown");
    }
    Ok(ledger::build(&claims, &usage, Utc::now(), policy))
}

/// `gpu-ledger report`.
pub async fn report(args: ReportArgs) -> Result<(), AppError> {
    let policy = args.ledger.policy();
    let ledger = if args.from.is_some() || args.pods.is_some() {
        offline_ledger(&args, &policy)?
    } else {
        live_ledger(&args, &policy).await?
    };
    let written = write_report(&args, &ledger, &policy);
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(AppError::Output),
    }
}

fn write_report(args: &ReportArgs, ledger: &Ledger, policy: &Policy) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.output {
        Output::Table => report::table::render_table(ledger, &mut out)?,
        Output::Json => report::table::render_json(ledger, &mut out)?,
        Output::Metrics => {
            let text = export::render_snapshot(&Snapshot::new(ledger.clone()), &policy.names)
                .map_err(std::io::Error::other)?;
            out.write_all(text.as_bytes())?;
        }
    }
    if args.cull_dry_run {
        let plan = crate::cull::plan::plan(
            ledger,
            &crate::cull::policy_from_args(&args.cull, policy),
            ledger.generated_at,
        );
        crate::cull::render_plan(&plan, &mut out)?;
    }
    out.flush()
}
