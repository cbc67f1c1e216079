//! The live usage source: raw DCGM samples from Prometheus, kept for the window, reduced by the
//! same device reduction as an offline dump ([`series::reduce`]'s, through
//! [`RunningReduction`], which keeps the grouping of series by device between refreshes), and
//! folded into the idle history.
//!
//! Every window read goes one way: the refresh, the pre-stop re-check ([`fetch_window_in`]) and
//! scheme detection send the same selector ([`PromClient::window`]) and decode its answer with
//! the same decoder ([`PromClient::window_series`]); the refresh and the re-check then keep and reduce it
//! alike ([`read_window`], [`reduce_window`]), the re-check on an empty window.
//!
//! The first refresh reads the whole window; every later one reads only the samples since the
//! previous refresh (plus two sample intervals of overlap for ingestion lag, at the longest
//! interval the held samples show and at least `--scrape-interval`; samples already held are
//! skipped by timestamp), so a refresh costs Prometheus a chunk read of a few samples per
//! series. Coverage never uses the configured interval where the samples show their own
//! ([`series`]); the start-up history query reads at the shortest interval the window's
//! samples show, so it runs after the first window has been read.
//!
//! The idle history's start-up bootstrap lives here, whole: the one query over the lookback
//! ([`bootstrap`]; the history is built from its answer by the pure
//! [`History::from_bootstrap_rows`]), the fallback to an empty history when it fails, and its
//! run beside the refreshes: `serve` hands [`LiveUsage::start_bootstrap`] its supervisor and
//! keeps refreshing, each refresh folding the answer in once it has come; a one-shot caller
//! (`report` against a live cluster) rebuilds the history inline on its one refresh. The history
//! reaches the hub with each refresh ([`LiveUsage::history`]).
//!
//! Samples stamped after the query time (the range selector asks for samples at or before it, so
//! only a misbehaving backend or a hostile answer sends them) or at a time no DCGM reading can
//! carry are dropped before they reach the window and counted in [`Fetched::rejected`]: one
//! sample a day ahead would otherwise hold back every later sample of its series for a day.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use std::collections::HashMap;

use super::exposition::plausible_sample_ms;
use super::fields;
use super::history::History;
use super::prom::decode::WindowSeries;
use super::prom::{Answered, PromClient, PromError, QueryStats, queries};
use super::running::{HeldSeries, RunningReduction};
use super::scheme::{LabelScheme, READ_LABELS, SchemeChoice};
use super::series::{self, Labels, Series};
use crate::ledger::usage::{DeviceUsage, Usage, Window};

/// What the live source needs besides the client.
#[derive(Debug, Clone, Copy)]
pub struct LiveSettings {
    pub scheme: SchemeChoice,
    pub window: Window,
    /// How far back the start-up query reads idle history.
    pub history_lookback: chrono::Duration,
    /// Share of the window a refresh must prove to extend a covered run.
    pub min_coverage: f64,
}

/// One refresh: the usage, and how it went.
#[derive(Debug)]
pub struct Fetched {
    pub usage: Usage,
    pub stats: QueryStats,
    /// Why Prometheus could not be used (the usage is then unavailable).
    pub error: Option<PromError>,
    /// Samples of the answer that were dropped, by reason.
    pub rejected: Rejected,
}

/// Samples of one answer dropped before the window (`gpu_ledger_prometheus_samples_rejected_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rejected {
    /// Stamped after the query time.
    pub future: u64,
    /// Stamped before 2000 or after 9999 (or not a finite time).
    pub impossible: u64,
}

/// Drops the samples of a window answer stamped after `now_ms` or at an impossible time, and
/// counts them.
fn reject_implausible_answer(fresh: &mut WindowSeries<'_>, now_ms: i64) -> Rejected {
    let mut rejected = Rejected::default();
    fresh.retain_samples(|t| rejected.plausible(t, now_ms));
    rejected
}

impl Rejected {
    /// Whether a sample at `t` is kept; counts it by reason when not.
    fn plausible(&mut self, t: i64, now_ms: i64) -> bool {
        if t > now_ms {
            self.future += 1;
            false
        } else if !plausible_sample_ms(t) {
            self.impossible += 1;
            false
        } else {
            true
        }
    }
}

/// The raw samples of the window: one series per metric name and label set (labels cut to
/// those the reduction reads), samples in time order. The reduction reads the held series in
/// place: a refresh copies only the samples Prometheus sent since the previous one.
///
/// Memory (a heap profile at 2,000 GPUs put three fifths of the service's live heap here): the
/// fields of one device share one label map, and each series' buffer grows to the samples the
/// window holds, not to the next power of two.
#[derive(Debug)]
pub struct SampleWindow {
    /// Tells this window from any other (a reset window is a new one), for the reduction's
    /// cached grouping ([`super::running::RunningReduction`]).
    id: u64,
    /// Bumped whenever a series is added or dropped: positions in `series` hold between bumps.
    layout: u64,
    series: Vec<Series>,
    /// Hash of (name, labels) → positions in `series` with that hash.
    index: HashMap<u64, Vec<usize>>,
    /// Every label map held, once.
    labels: foldhash::HashSet<Arc<Labels>>,
}

impl Default for SampleWindow {
    fn default() -> Self {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            layout: 0,
            series: Vec::new(),
            index: HashMap::new(),
            labels: foldhash::HashSet::default(),
        }
    }
}

/// Hash of a series' identity: its name and its (name-ordered) labels. The owned [`Labels`] of a
/// held series and the borrowed [`super::prom::decode::WindowLabels`] of an answer's series hash alike when equal.
fn identity_hash<'a>(name: &str, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    // A fixed seed: the index lives as long as the window, and equal identities must collide.
    let mut h = foldhash::fast::FixedState::with_seed(0x6770_755f_6c65_6467).build_hasher();
    name.hash(&mut h);
    for (k, v) in labels {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

fn pairs(labels: &Labels) -> impl Iterator<Item = (&str, &str)> {
    labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

/// Appends the samples of `fresh` newer than what `held` holds, and drops those at or before
/// `keep_after`.
fn merge(held: &mut Vec<(i64, f64)>, fresh: &[(i64, f64)], keep_after: i64) {
    // Old samples go first, so the buffer only grows past what the window holds.
    let cut = held.partition_point(|(t, _)| *t <= keep_after);
    held.drain(..cut);
    let newest = held.last().map(|(t, _)| *t);
    let wanted = |t: i64| newest.is_none_or(|n| t > n) && t > keep_after;
    held.reserve_exact(fresh.iter().filter(|(t, _)| wanted(*t)).count());
    held.extend(fresh.iter().copied().filter(|(t, _)| wanted(*t)));
}

impl SampleWindow {
    /// Adds fresh samples (those newer than what a series holds) and forgets samples older than
    /// `keep_after` (ms), and series left empty. The live refresh uses [`Self::absorb_answer`];
    /// this owned form is its reference (tests check both keep the same window; the `window`
    /// bench compares them).
    pub fn absorb(&mut self, fresh: Vec<Series>, keep_after: i64) {
        for s in fresh {
            let mut labels = Arc::unwrap_or_clone(s.labels);
            labels.retain(|k, _| READ_LABELS.contains(&k.as_str()));
            let h = identity_hash(&s.name, pairs(&labels));
            let i = match self.find(h, |held| held.name == s.name && *held.labels == labels) {
                Some(i) => i,
                None => self.hold(h, s.name, labels),
            };
            merge(&mut self.series[i].samples, &s.samples, keep_after);
        }
        self.age(keep_after);
    }

    /// [`Self::absorb`] for an answer decoded borrowing from its body ([`WindowSeries`]): a
    /// series already held is found by its borrowed labels, so only a new series makes an owned
    /// label map (interned, shared by the fields of its device).
    pub fn absorb_answer(&mut self, fresh: &WindowSeries<'_>, keep_after: i64) {
        for s in fresh.iter() {
            let h = identity_hash(s.name, s.labels.iter());
            let same = |held: &Series| {
                held.name == s.name
                    && held.labels.len() == s.labels.len()
                    && pairs(&held.labels).eq(s.labels.iter())
            };
            let i = match self.find(h, same) {
                Some(i) => i,
                None => self.hold(h, s.name.to_string(), s.labels.to_labels()),
            };
            merge(&mut self.series[i].samples, s.samples, keep_after);
        }
        self.age(keep_after);
    }

    /// The position of the held series with identity hash `h` that `same` accepts.
    fn find(&self, h: u64, same: impl Fn(&Series) -> bool) -> Option<usize> {
        self.index
            .get(&h)?
            .iter()
            .copied()
            .find(|&i| same(&self.series[i]))
    }

    /// Holds a new, empty series (its label map interned), and returns its position.
    fn hold(&mut self, h: u64, name: String, labels: Labels) -> usize {
        let shared = if let Some(held) = self.labels.get(&labels) {
            Arc::clone(held)
        } else {
            let held = Arc::new(labels);
            self.labels.insert(Arc::clone(&held));
            held
        };
        self.series.push(Series {
            name,
            labels: shared,
            samples: Vec::new(),
        });
        self.layout = self.layout.wrapping_add(1);
        let i = self.series.len() - 1;
        self.index.entry(h).or_default().push(i);
        i
    }

    /// Forgets samples at or before `keep_after`, and series left empty.
    fn age(&mut self, keep_after: i64) {
        let mut emptied = false;
        for s in &mut self.series {
            let cut = s.samples.partition_point(|(t, _)| *t <= keep_after);
            s.samples.drain(..cut);
            emptied |= s.samples.is_empty();
        }
        if emptied {
            self.layout = self.layout.wrapping_add(1);
            self.series.retain(|s| !s.samples.is_empty());
            self.labels.retain(|l| Arc::strong_count(l) > 1);
            self.index.clear();
            for (i, s) in self.series.iter().enumerate() {
                self.index
                    .entry(identity_hash(&s.name, pairs(&s.labels)))
                    .or_default()
                    .push(i);
            }
        }
    }

    /// The shortest and the longest sample interval the held utilisation series show
    /// ([`series::own_interval_ms`] over the window they hold); `None` while no series holds two
    /// samples.
    pub fn intervals(&self) -> Option<(chrono::Duration, chrono::Duration)> {
        let mut spacings = self
            .series
            .iter()
            .filter(|s| {
                matches!(
                    fields::canonical(&s.name),
                    Some(fields::GR_ENGINE_ACTIVE | fields::GPU_UTIL)
                )
            })
            .filter_map(|s| series::own_interval_ms(&s.samples, i64::MIN, i64::MAX));
        let first = spacings.next()?;
        let (shortest, longest) =
            spacings.fold((first, first), |(lo, hi), i| (lo.min(i), hi.max(i)));
        Some((
            chrono::Duration::milliseconds(shortest),
            chrono::Duration::milliseconds(longest),
        ))
    }

    /// The held series, for [`series::reduce`].
    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// This window's identity and its layout version: while both are unchanged, every held
    /// series keeps its position and its labels (only samples come and go).
    pub(crate) fn layout(&self) -> (u64, u64) {
        (self.id, self.layout)
    }

    /// Label names present on the held DCGM series (for scheme detection: HAMi's monitor
    /// series keep their own label names, `usage::hami`).
    pub(crate) fn label_names(&self) -> impl Iterator<Item = &str> {
        self.series
            .iter()
            .filter(|s| fields::canonical(&s.name).is_some())
            .flat_map(|s| s.labels.keys().map(String::as_str))
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Every distinct label map held (one per device and label set).
    pub fn label_sets(&self) -> impl Iterator<Item = &Labels> {
        self.labels.iter().map(|l| &**l)
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

impl HeldSeries for SampleWindow {
    fn layout(&self) -> (u64, u64) {
        SampleWindow::layout(self)
    }

    fn series(&self) -> &[Series] {
        SampleWindow::series(self)
    }

    fn label_names(&self) -> impl Iterator<Item = &str> {
        SampleWindow::label_names(self)
    }
}

/// Every accepted spelling of the fields the reduction reads.
fn field_names() -> Vec<&'static str> {
    fields::all_spellings().collect()
}

/// What the window reads: the DCGM fields and HAMi's vGPU monitor families.
fn read_names() -> Vec<&'static str> {
    fields::read_names().collect()
}

/// The label scheme of the DCGM series Prometheus holds now (one cheap query over the last
/// minutes; the override wins when given).
pub async fn detect_scheme(
    client: &PromClient,
    choice: SchemeChoice,
    now: DateTime<Utc>,
) -> Result<LabelScheme, PromError> {
    detect_scheme_in(client, &Scope::All, choice, now).await
}

/// As [`detect_scheme`], from the devices of `scope` only (a shard's).
async fn detect_scheme_in(
    client: &PromClient,
    scope: &Scope,
    choice: SchemeChoice,
    now: DateTime<Utc>,
) -> Result<LabelScheme, PromError> {
    if choice != SchemeChoice::Auto {
        return Ok(LabelScheme::of(choice));
    }
    // Label names only: a partial answer names the scheme as well as a complete one.
    let body = client
        .window(
            &scope.matcher(),
            &field_names(),
            chrono::Duration::minutes(5),
            now,
        )
        .await?;
    let recent = client.window_series(&body)?.value;
    Ok(LabelScheme::detect(
        choice,
        recent
            .iter()
            .flat_map(|s| s.labels.iter().map(|(name, _)| name)),
    ))
}

/// The usage of the whole window ending at `now`, read fresh (the pre-stop re-check), with the
/// history merged into it. A partial answer is an error ([`PromError::Partial`]): a stop needs
/// complete evidence.
pub async fn fetch_window(
    client: &PromClient,
    settings: &LiveSettings,
    history: Option<&mut History>,
    now: DateTime<Utc>,
) -> Result<Vec<DeviceUsage>, PromError> {
    fetch_window_in(client, settings, &Scope::All, history, now).await
}

/// As [`fetch_window`], for the devices of `scope` only (a shard's re-check): the refresh's
/// path on an empty window ([`read_window`], then [`reduce_window`]), so the re-check reads,
/// keeps and reduces what a refresh would.
pub async fn fetch_window_in(
    client: &PromClient,
    settings: &LiveSettings,
    scope: &Scope,
    history: Option<&mut History>,
    now: DateTime<Utc>,
) -> Result<Vec<DeviceUsage>, PromError> {
    let window = settings.window;
    if scope.is_empty() {
        return Ok(Vec::new());
    }
    let mut held = SampleWindow::default();
    read_window(client, scope, &window, window.length, now, &mut held)
        .await?
        .complete()?;
    let mut devices = reduce_window(&held, &mut RunningReduction::default(), settings, now)?;
    if let Some(h) = history {
        h.merge(&mut devices, &window, settings.min_coverage, now);
    }
    Ok(devices)
}

/// One read of the window's selector narrowed by `scope`, over `range` at `now`, folded into
/// `held`: the answer decoded by the one window decoder ([`PromClient::window_series`], label values
/// borrowed from the body), its implausible samples dropped ([`reject_implausible_answer`]),
/// the rest absorbed ([`SampleWindow::absorb_answer`]; samples older than the window forgotten).
/// What was dropped, with the answer's warnings (a partial answer is absorbed all the same).
async fn read_window(
    client: &PromClient,
    scope: &Scope,
    window: &Window,
    range: chrono::Duration,
    now: DateTime<Utc>,
    held: &mut SampleWindow,
) -> Result<Answered<Rejected>, PromError> {
    let body = client
        .window(&scope.matcher(), &read_names(), range, now)
        .await?;
    let Answered {
        value: mut fresh,
        warnings,
    } = client.window_series(&body)?;
    let rejected = reject_implausible_answer(&mut fresh, now.timestamp_millis());
    let keep_after = now
        .timestamp_millis()
        .saturating_sub(window.length.num_milliseconds());
    held.absorb_answer(&fresh, keep_after);
    Ok(Answered {
        value: rejected,
        warnings,
    })
}

/// The devices `held` shows at `now`: refused when its series come from several clusters
/// ([`one_cluster`], checked when a series came or went), else reduced under the label scheme
/// they show (or the configured one) by `running`, which keeps the grouping of the series by
/// device while no series comes or goes.
fn reduce_window(
    held: &SampleWindow,
    running: &mut RunningReduction,
    settings: &LiveSettings,
    now: DateTime<Utc>,
) -> Result<Vec<DeviceUsage>, PromError> {
    if !running.is_current(held, settings.scheme) {
        one_cluster(held.label_sets())?;
    }
    Ok(running.reduce(held, settings.scheme, &settings.window, now))
}

/// Refuses series of several clusters (a shared Thanos, Mimir or VictoriaMetrics without
/// `--prometheus-selector`): joined by pod name, another cluster's GPUs would be taken for this
/// cluster's.
fn one_cluster<'a>(labels: impl IntoIterator<Item = &'a Labels>) -> Result<(), PromError> {
    let clusters = super::prom::clusters_of(labels);
    if clusters.len() > 1 {
        Err(PromError::SeveralClusters { clusters })
    } else {
        Ok(())
    }
}

/// Which devices a refresh asks Prometheus for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every device (one replica, or `--shard-query-scope=none`).
    #[default]
    All,
    /// The devices whose `label` names one of `values` (a shard's nodes and the exporter pods on
    /// them): each shard reads only its own devices, so the fleet's Prometheus work does not
    /// grow with the number of shards. No values: nothing is asked.
    Named { label: String, values: Vec<String> },
}

impl Scope {
    /// The `,`-prefixed matcher narrowing the window's selector (empty for [`Scope::All`]).
    pub fn matcher(&self) -> String {
        match self {
            Self::All => String::new(),
            Self::Named { label, values } => queries::scope_matcher(label, values),
        }
    }

    /// A named scope without a value: this shard owns no node, so no device.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Named { values, .. } if values.is_empty())
    }
}

/// Prometheus, the samples of the window, and the idle history.
pub struct LiveUsage {
    client: Option<Arc<PromClient>>,
    samples: SampleWindow,
    /// The reduction of `samples`, its grouping kept while no series comes or goes.
    running: RunningReduction,
    history: Option<History>,
    /// The start-up history query, running beside the refreshes (`serve` only).
    bootstrap: Option<tokio::task::JoinHandle<History>>,
    /// Where to start it once the first refresh has answered ([`Self::start_bootstrap`]).
    bootstrap_deferred: Option<(TaskTracker, CancellationToken)>,
    /// When the last successful refresh read Prometheus.
    fetched_at: Option<DateTime<Utc>>,
    settings: LiveSettings,
    /// The devices the next refresh asks for ([`Self::set_scope`]).
    scope: Scope,
    /// A named scope matched no series (warned once until it matches again).
    scope_unmatched: bool,
    /// Whether each refresh also reads DCGM's health families ([`Self::read_gpu_health`]).
    gpu_health: bool,
}

/// Timeout of the start-up query: it reads every sample of the lookback (hours × every GPU), so
/// it is given far more headroom than a refresh query; `serve` runs it beside the refreshes.
pub const BOOTSTRAP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// One start-up query over `lookback` (default [`super::history::DEFAULT_LOOKBACK`]) rebuilding the
/// history.
pub async fn bootstrap(
    client: &PromClient,
    scheme: &LabelScheme,
    window: &Window,
    lookback: chrono::Duration,
    min_coverage: f64,
    now: DateTime<Utc>,
) -> Result<History, PromError> {
    bootstrap_in(client, "", scheme, window, lookback, min_coverage, now).await
}

/// As [`bootstrap`], narrowed by `scope` (`,`-prefixed matchers: a shard's devices).
async fn bootstrap_in(
    client: &PromClient,
    scope: &str,
    scheme: &LabelScheme,
    window: &Window,
    lookback: chrono::Duration,
    min_coverage: f64,
    now: DateTime<Utc>,
) -> Result<History, PromError> {
    let matchers = format!("{}{scope}", client.matchers());
    let rows = client
        .instant_with_timeout(
            &queries::bootstrap_query(scheme, window, lookback, min_coverage, &matchers),
            now,
            BOOTSTRAP_TIMEOUT,
        )
        .await?;
    Ok(History::from_bootstrap_rows(
        &rows,
        scheme,
        window,
        lookback,
        min_coverage,
        now,
    ))
}

/// Rebuilds the idle history with one query over the lookback. A failed or slow bootstrap must not
/// stop anything: the history then starts empty (idle time accrues from now), and the log says so.
async fn bootstrap_history(
    client: Arc<PromClient>,
    settings: LiveSettings,
    scope: Scope,
    now: DateTime<Utc>,
) -> History {
    if scope.is_empty() {
        return History::new(settings.history_lookback);
    }
    let result = async {
        let scheme = detect_scheme_in(&client, &scope, settings.scheme, now).await?;
        bootstrap_in(
            &client,
            &scope.matcher(),
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
            samples: SampleWindow::default(),
            running: RunningReduction::default(),
            bootstrap: None,
            bootstrap_deferred: None,
            fetched_at: None,
            settings,
            scope: Scope::All,
            scope_unmatched: false,
            gpu_health: false,
        }
    }

    /// Also read dcgm-exporter's health families each refresh (`--dcgm-health`; one more query).
    pub fn read_gpu_health(&mut self, on: bool) {
        self.gpu_health = on;
    }

    /// Narrows the following refreshes to `scope` (a shard's devices).
    pub fn set_scope(&mut self, scope: Scope) {
        self.scope = scope;
    }

    /// Says once when a named scope finds no series: the label names neither the nodes nor the
    /// exporter pods (`--shard-query-scope` then needs another label, or `none`).
    fn warn_if_scope_unmatched(&mut self) {
        let Scope::Named { label, values } = &self.scope else {
            return;
        };
        let unmatched = self.samples.is_empty();
        if unmatched && !self.scope_unmatched {
            warn!(
                label = label.as_str(),
                names = values.len(),
                "no DCGM series names this shard's nodes or exporter pods: utilisation is unknown; check --shard-query-scope"
            );
        }
        self.scope_unmatched = unmatched;
    }

    /// The idle history as of the last refresh (for re-checks before a stop).
    pub fn history(&self) -> Option<&History> {
        self.history.as_ref()
    }

    /// Arranges the start-up history query to run in the background, started once the first
    /// refresh has answered: then it neither competes with that refresh for Prometheus nor reads
    /// other shards' devices (the scope is known once the watches have synced). Refreshes go on
    /// with an empty history until it answers (its cost grows with the samples in lookback ×
    /// GPUs).
    pub fn start_bootstrap(&mut self, tracker: &TaskTracker, cancel: &CancellationToken) {
        if self.client.is_none() {
            return;
        }
        self.history = Some(History::new(self.settings.history_lookback));
        self.bootstrap_deferred = Some((tracker.clone(), cancel.clone()));
    }

    /// The settings of the start-up history query: the configured ones, with the sample interval
    /// the held window shows (the shortest, so no device's history is judged at a slower spacing
    /// than its samples have) in place of `--scrape-interval`, which stands only while no held
    /// series shows its spacing.
    fn bootstrap_settings(&self) -> LiveSettings {
        let mut settings = self.settings;
        if let Some((shortest, _)) = self.samples.intervals() {
            settings.window.interval = shortest;
        }
        settings
    }

    /// Spawns the history query [`Self::start_bootstrap`] arranged, over the current scope, as
    /// of `now` (the refresh that started it).
    fn spawn_deferred_bootstrap(&mut self, now: DateTime<Utc>) {
        let (Some(client), Some((tracker, cancel))) =
            (self.client.clone(), self.bootstrap_deferred.take())
        else {
            return;
        };
        let (settings, scope) = (self.bootstrap_settings(), self.scope.clone());
        self.bootstrap = Some(
            tracker.spawn(
                async move {
                    tokio::select! {
                        h = bootstrap_history(client, settings, scope, now) => h,
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
        self.fetch_at(Utc::now()).await
    }

    /// One refresh as of `now`. A partial answer (Prometheus `warnings`) gives a usage marked
    /// [`Usage::partial`] (busy samples count, nothing is proven idle), and is then forgotten:
    /// it is not folded into the idle history, and the next refresh reads the whole window
    /// afresh, so what the partial answer missed cannot read as idle later.
    pub async fn fetch_at(&mut self, now: DateTime<Utc>) -> Fetched {
        let fetched = self.refresh_at(now).await;
        self.spawn_deferred_bootstrap(now);
        fetched
    }

    /// [`Self::fetch_at`] without starting a deferred history query.
    async fn refresh_at(&mut self, now: DateTime<Utc>) -> Fetched {
        let Some(client) = self.client.clone() else {
            return Fetched {
                usage: Usage::default(),
                stats: QueryStats::default(),
                error: None,
                rejected: Rejected::default(),
            };
        };
        // One-shot paths (report) rebuild the history inline, once the window is read (its
        // samples show the interval the history query reads at): they have one refresh only.
        let one_shot = self.history.is_none();
        self.absorb_bootstrap().await;
        let window = self.settings.window;
        // Since the previous refresh, with two intervals of overlap for samples ingested late:
        // the longest interval the held samples show, at least the configured one.
        let spacing = self
            .samples
            .intervals()
            .map_or(window.interval, |(_, longest)| longest.max(window.interval));
        let range = self.fetched_at.map_or(window.length, |t| {
            spacing
                .checked_mul(2)
                .and_then(|overlap| (now - t).checked_add(&overlap))
                .map_or(window.length, |r| r.max(spacing).min(window.length))
        });
        if self.scope.is_empty() {
            // A shard without nodes has no device to ask for.
            self.samples = SampleWindow::default();
            self.fetched_at = Some(now);
            if one_shot {
                self.history = Some(History::new(self.settings.history_lookback));
            }
            return Fetched {
                usage: Usage {
                    available: true,
                    ..Usage::default()
                },
                stats: QueryStats::default(),
                error: None,
                rejected: Rejected::default(),
            };
        }
        let started = std::time::Instant::now();
        let answer =
            read_window(&client, &self.scope, &window, range, now, &mut self.samples).await;
        let stats = QueryStats {
            queries: 1,
            duration: started.elapsed(),
            warnings: client.take_warnings(),
        };
        match answer {
            Ok(answer) => {
                let (partial, rejected) = (answer.is_partial(), answer.value);
                if rejected != Rejected::default() {
                    warn!(
                        future = rejected.future,
                        impossible = rejected.impossible,
                        "ignored prometheus samples stamped after the query time or at an impossible time"
                    );
                }
                self.warn_if_scope_unmatched();
                let reduced = reduce_window(&self.samples, &mut self.running, &self.settings, now);
                let mut devices = match reduced {
                    Ok(devices) => devices,
                    Err(e) => {
                        // Nothing of a mixed answer is kept: the next refresh reads the window
                        // anew.
                        self.samples = SampleWindow::default();
                        self.fetched_at = None;
                        return Fetched {
                            usage: Usage::default(),
                            stats,
                            error: Some(e),
                            rejected,
                        };
                    }
                };
                if one_shot {
                    self.history = Some(
                        bootstrap_history(
                            client.clone(),
                            self.bootstrap_settings(),
                            self.scope.clone(),
                            now,
                        )
                        .await,
                    );
                }
                if partial {
                    self.samples = SampleWindow::default();
                    self.fetched_at = None;
                } else {
                    self.fetched_at = Some(now);
                    if let Some(h) = self.history.as_mut() {
                        h.merge(&mut devices, &window, self.settings.min_coverage, now);
                    }
                }
                // Health layer: a failed health query leaves health unknown (never sick), and
                // the devices' readings stand.
                let mut stats = stats;
                let gpu_health = if self.gpu_health {
                    stats.queries += 1;
                    match client
                        .gpu_health(&self.scope.matcher(), window.length, now)
                        .await
                    {
                        Ok(h) => h,
                        Err(e) => {
                            warn!(error = %e, "prometheus GPU health query failed: GPU health from DCGM is unknown");
                            Vec::new()
                        }
                    }
                } else {
                    Vec::new()
                };
                Fetched {
                    usage: Usage {
                        devices,
                        available: true,
                        partial,
                        hami: super::hami::reduce(self.samples.series(), &window, now),
                        gpu_health,
                    },
                    stats,
                    error: None,
                    rejected,
                }
            }
            Err(e) => Fetched {
                usage: Usage::default(),
                stats,
                error: Some(e),
                rejected: Rejected::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)], samples: &[(i64, f64)]) -> Series {
        Series {
            name: name.into(),
            labels: Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            ),
            samples: samples.to_vec(),
        }
    }

    /// `series` as Prometheus answers the window's range-vector selector.
    fn answer_body(series: &[Series]) -> String {
        let result: Vec<serde_json::Value> = series
            .iter()
            .map(|s| {
                let mut metric = serde_json::Map::new();
                metric.insert("__name__".into(), s.name.clone().into());
                for (k, v) in s.labels.iter() {
                    metric.insert(k.clone(), v.clone().into());
                }
                let values: Vec<serde_json::Value> = s
                    .samples
                    .iter()
                    .map(|(t, v)| serde_json::json!([*t as f64 / 1000.0, v.to_string()]))
                    .collect();
                serde_json::json!({"metric": metric, "values": values})
            })
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": result}})
            .to_string()
    }

    /// `body` decoded as the live refresh decodes it, borrowing from it.
    fn decoded(body: &str) -> WindowSeries<'_> {
        crate::usage::prom::decode::window(body.as_bytes()).expect("a matrix")
    }

    #[test]
    fn the_window_appends_only_new_samples_and_forgets_old_ones() {
        let mut w = SampleWindow::default();
        let labels = [("UUID", "GPU-a"), ("job", "dcgm"), ("pod", "p")];
        w.absorb(
            vec![series(
                fields::GPU_UTIL,
                &labels,
                &[(1_000, 1.0), (2_000, 2.0)],
            )],
            0,
        );
        // Overlapping fetch (ingestion lag margin): 2_000 again, then 3_000.
        w.absorb(
            vec![
                series(fields::GPU_UTIL, &labels, &[(2_000, 2.0), (3_000, 3.0)]),
                series(fields::FB_USED, &[("UUID", "GPU-a")], &[(3_000, 10.0)]),
            ],
            1_500,
        );
        assert_eq!(w.len(), 2);
        let util = &w.series()[0];
        assert_eq!(util.samples, vec![(2_000, 2.0), (3_000, 3.0)]);
        assert!(
            !util.labels.contains_key("job"),
            "labels the reduction never reads are cut"
        );
        // Everything ages out: the series go, and the index stays consistent for new ones.
        w.absorb(vec![], 5_000);
        assert!(w.is_empty());
        w.absorb(
            vec![series(fields::GPU_UTIL, &labels, &[(6_000, 6.0)])],
            5_000,
        );
        w.absorb(
            vec![series(fields::GPU_UTIL, &labels, &[(7_000, 7.0)])],
            5_000,
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w.series()[0].samples, vec![(6_000, 6.0), (7_000, 7.0)]);
    }

    #[test]
    fn the_fields_of_a_device_share_one_label_map_and_buffers_stay_window_sized() {
        let mut w = SampleWindow::default();
        let labels = [("UUID", "GPU-a"), ("pod", "p"), ("namespace", "ml")];
        // A 10-minute window of 15 s samples, refreshed every 10 s with 30 s of overlap.
        let interval = 15_000;
        let length = 600_000;
        let mut now = length;
        let upto = |now: i64, from: i64| -> Vec<(i64, f64)> {
            (0..=now / interval)
                .map(|k| k * interval)
                .filter(|t| *t > from)
                .map(|t| (t, 1.0))
                .collect()
        };
        w.absorb(
            vec![
                series(fields::GPU_UTIL, &labels, &upto(now, 0)),
                series(fields::FB_USED, &labels, &upto(now, 0)),
            ],
            0,
        );
        for _ in 0..200 {
            now += 10_000;
            w.absorb(
                vec![
                    series(fields::GPU_UTIL, &labels, &upto(now, now - 40_000)),
                    series(fields::FB_USED, &labels, &upto(now, now - 40_000)),
                ],
                now - length,
            );
        }
        let [util, fb] = w.series() else {
            panic!("two series")
        };
        assert!(Arc::ptr_eq(&util.labels, &fb.labels), "one map per device");
        assert_eq!(w.labels.len(), 1);
        let held = (length / interval) as usize;
        assert_eq!(util.samples.len(), held);
        assert!(
            util.samples.capacity() <= held + 1,
            "capacity {} for {held} samples",
            util.samples.capacity()
        );
        // When the device goes, so does its map.
        w.absorb(vec![], now + 1);
        assert!(w.is_empty());
        assert!(w.labels.is_empty());
    }

    /// A held series: name, label map (by address) and samples.
    type Held = (String, *const Labels, Vec<(i64, f64)>);

    fn held(w: &SampleWindow) -> Vec<Held> {
        w.series()
            .iter()
            .map(|s| (s.name.clone(), Arc::as_ptr(&s.labels), s.samples.clone()))
            .collect()
    }

    #[test]
    fn a_steady_answer_finds_the_held_series_by_borrowed_labels() {
        let a = [
            ("UUID", "GPU-a"),
            ("Hostname", "n1"),
            ("pod", "p"),
            ("namespace", "ml"),
            ("job", "dcgm"),
        ];
        // An escaped value takes the owned path of the decoder: found all the same.
        let b = [
            ("UUID", "GPU-b"),
            ("Hostname", "n1"),
            ("pod", r#"caf\u00e9 \"x\""#),
        ];
        let b_decoded = [("UUID", "GPU-b"), ("Hostname", "n1"), ("pod", "café \"x\"")];
        // Two fields of both devices, each with `samples`.
        let both_devices = |samples: &[(i64, f64)]| -> Vec<Series> {
            [fields::GPU_UTIL, fields::FB_USED]
                .into_iter()
                .flat_map(|f| [series(f, &a, samples), series(f, &b_decoded, samples)])
                .collect()
        };
        let first = both_devices(&[(1_000, 1.0), (2_000, 2.0)]);
        // Held through the owned entry point: the borrowed one must hash and compare alike.
        let mut w = SampleWindow::default();
        w.absorb(first.clone(), 0);
        let mut borrowed = SampleWindow::default();
        borrowed.absorb_answer(&decoded(&answer_body(&first)), 0);
        assert_eq!(
            w.series(),
            borrowed.series(),
            "both entry points hold the same"
        );
        assert_eq!(w.len(), 4);
        assert_eq!(w.labels.len(), 2, "one map per device");
        let before = held(&w);
        let steady = both_devices(&[(2_000, 2.0), (3_000, 3.0)]);
        let body = answer_body(&steady);
        assert!(body.contains("café"), "serde_json writes é as is: {body}");
        let body = body.replace(r#"café \"x\""#, b[2].1);
        assert!(body.contains(r"\u00e9"), "{body}");
        let fresh = decoded(&body);
        w.absorb_answer(&fresh, 1_500);
        let after = held(&w);
        assert_eq!(after.len(), 4, "no series added");
        assert_eq!(w.labels.len(), 2, "no label map interned");
        for ((name, map, samples), (name_before, map_before, _)) in after.iter().zip(&before) {
            assert_eq!(name, name_before);
            assert_eq!(map, map_before, "{name}: the held map, not a new one");
            assert_eq!(samples, &[(2_000, 2.0), (3_000, 3.0)], "{name}");
        }
        // A new device in a later answer is held beside them, its fields sharing one map.
        let c = [("UUID", "GPU-c")];
        let later = [
            series(fields::GPU_UTIL, &c, &[(4_000, 4.0)]),
            series(fields::FB_USED, &c, &[(4_000, 4.0)]),
        ];
        w.absorb_answer(&decoded(&answer_body(&later)), 1_500);
        assert_eq!(w.len(), 6);
        assert_eq!(w.labels.len(), 3);
        let [.., util, fb] = w.series() else {
            panic!("six series")
        };
        assert!(Arc::ptr_eq(&util.labels, &fb.labels));
    }

    #[test]
    fn both_entry_points_keep_the_same_window() {
        // The refresh pattern of the capacity test above: 15 s samples, 10 s refreshes with 30 s
        // of overlap, a 10-minute window; one device leaves half way, another arrives.
        let interval = 15_000;
        let length = 600_000;
        let upto = |now: i64, from: i64| -> Vec<(i64, f64)> {
            (0..=now / interval)
                .map(|k| k * interval)
                .filter(|t| *t > from)
                .map(|t| (t, (t / interval % 7) as f64))
                .collect()
        };
        let (mut owned, mut borrowed) = (SampleWindow::default(), SampleWindow::default());
        let mut now = length;
        let mut from = 0;
        for step in 0..150 {
            let mut fresh = Vec::new();
            for (device, present) in [("GPU-a", true), ("GPU-b", step < 60), ("GPU-c", step > 40)] {
                if present {
                    let labels = [("UUID", device), ("pod", "p"), ("namespace", "ml")];
                    fresh.push(series(fields::GPU_UTIL, &labels, &upto(now, from)));
                    fresh.push(series(fields::GR_ENGINE_ACTIVE, &labels, &upto(now, from)));
                }
            }
            let body = answer_body(&fresh);
            owned.absorb(fresh, now - length);
            borrowed.absorb_answer(&decoded(&body), now - length);
            assert_eq!(owned.series(), borrowed.series(), "step {step}");
            assert_eq!(owned.labels, borrowed.labels, "step {step}");
            from = now - 30_000;
            now += 10_000;
        }
        assert_eq!(borrowed.len(), 4, "GPU-b aged out");
    }

    #[test]
    fn implausible_samples_of_an_answer_are_dropped_and_counted() {
        let labels = [("UUID", "GPU-a")];
        let body = answer_body(&[
            series(
                fields::GPU_UTIL,
                &labels,
                &[(-5_000, 1.0), (T_MS, 2.0), (T_MS + 1, 3.0)],
            ),
            series(
                fields::FB_USED,
                &labels,
                &[(T_MS - 1, 4.0), (T_MS + 60_000, 5.0)],
            ),
        ]);
        let mut fresh = decoded(&body);
        let rejected = reject_implausible_answer(&mut fresh, T_MS);
        assert_eq!(
            rejected,
            Rejected {
                future: 2,
                impossible: 1
            }
        );
        let expected = vec![
            series(fields::GPU_UTIL, &labels, &[(T_MS, 2.0)]),
            series(fields::FB_USED, &labels, &[(T_MS - 1, 4.0)]),
        ];
        assert_eq!(fresh.into_series(), expected);
    }

    const T_MS: i64 = 1_700_000_000_000;
}
