//! Showback: who held how many GPU-hours over a period, how many were busy, idle or unknown,
//! the peak held and the cost, per namespace, namespace label or Kubeflow Profile owner — from
//! gpu-ledger's own counters as Prometheus answered them (docs/showback.md).
//!
//! Pure: `app::showback` queries Prometheus and hands the decoded answers in as [`Inputs`];
//! everything here is data in, data out. Prometheus' values are untrusted: negative, NaN,
//! infinite or absurd numbers become unknown (`None`), never zero.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use serde::Serialize;

/// Why a showback cannot be computed from the given arguments.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShowbackError {
    #[error("--month {0:?}: expected YYYY-MM (e.g. 2026-11), `last` or `this`")]
    Month(String),
    #[error("period {since} .. {until}: {why}")]
    Period {
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        why: String,
    },
    #[error("price {entry:?}: {why}")]
    Price { entry: String, why: String },
    #[error(
        "GPU model {model:?} matches several prices equally well ({keys}); name it more exactly"
    )]
    AmbiguousPrice { model: String, keys: String },
}

/// More GPU equivalents than any one namespace can hold: a value above is untrusted.
const MAX_GPUS: f64 = 1_000_000.0;
/// Highest price per GPU-hour accepted.
const MAX_PRICE: f64 = 1_000_000.0;
/// Longest period (a year and a day, as every other duration flag).
const MAX_PERIOD_DAYS: i64 = 366;

/// The half-open period `[since, until)` a showback covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Period {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

impl Period {
    /// A checked period: `since` before `until`, at most a year long, `until` no later than
    /// `now` (the future has no counters yet: it would read as a gap).
    pub fn new(
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Self, ShowbackError> {
        let err = |why: &str| ShowbackError::Period {
            since,
            until,
            why: why.to_string(),
        };
        let until = until.min(now);
        if since >= until {
            return Err(err("the start must be before the end (and before now)"));
        }
        if until - since > Duration::days(MAX_PERIOD_DAYS) {
            return Err(err("longer than a year"));
        }
        Ok(Period { since, until })
    }

    /// `YYYY-MM` (UTC calendar month), `last` (the previous month) or `this` (this month so
    /// far), relative to `now`.
    pub fn month(spec: &str, now: DateTime<Utc>) -> Result<Self, ShowbackError> {
        let bad = || ShowbackError::Month(spec.to_string());
        let (year, month) = match spec.trim() {
            "this" => (now.year(), now.month()),
            "last" if now.month() == 1 => (now.year().checked_sub(1).ok_or_else(bad)?, 12),
            "last" => (now.year(), now.month() - 1),
            s => {
                let (y, m) = s.split_once('-').ok_or_else(bad)?;
                let (y, m): (i32, u32) =
                    (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
                if !(1970..=9999).contains(&y) || m.to_string().len() > 2 {
                    return Err(bad());
                }
                (y, m)
            }
        };
        let first = NaiveDate::from_ymd_opt(year, month, 1).ok_or_else(bad)?;
        let next = if month == 12 {
            NaiveDate::from_ymd_opt(year.checked_add(1).ok_or_else(bad)?, 1, 1)
        } else {
            NaiveDate::from_ymd_opt(year, month + 1, 1)
        }
        .ok_or_else(bad)?;
        let at = |d: NaiveDate| Utc.from_utc_datetime(&d.and_time(chrono::NaiveTime::MIN));
        Period::new(at(first), at(next), now)
    }

    pub fn seconds(&self) -> f64 {
        (self.until - self.since).num_milliseconds() as f64 / 1000.0
    }
}

/// How namespaces are grouped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    Namespace,
    /// A namespace label, as kube-state-metrics exports it (`kube_namespace_labels`).
    Label(String),
    /// The `owner` annotation the Kubeflow Profile controller writes on its namespace.
    ProfileOwner,
}

impl Grouping {
    /// The `GROUP` column title and JSON `group_by` value.
    pub fn name(&self) -> String {
        match self {
            Grouping::Namespace => "namespace".into(),
            Grouping::Label(l) => format!("label:{l}"),
            Grouping::ProfileOwner => "profile-owner".into(),
        }
    }
}

/// kube-state-metrics' label name for a Kubernetes label or annotation key: every character
/// outside `[a-zA-Z0-9_]` becomes `_`, behind `label_` or `annotation_`.
pub fn ksm_label(prefix: &str, key: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + key.len());
    out.push_str(prefix);
    out.extend(key.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

/// Group of a namespace whose label (or owner annotation) is empty or missing.
pub const NO_VALUE: &str = "(none)";
/// Group of a namespace kube-state-metrics never reported in the period.
pub const NOT_SEEN: &str = "(not in kube-state-metrics)";

/// Prices per GPU-hour by GPU model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    /// (key as given, its `-`/`_`/space-separated upper-case tokens, price).
    entries: Vec<(String, Vec<String>, f64)>,
}

fn tokens(s: &str) -> Vec<String> {
    s.split(['-', '_', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

impl Prices {
    /// Parses `MODEL=PRICE` entries separated by commas or new lines; `#` starts a comment.
    pub fn parse(text: &str) -> Result<Self, ShowbackError> {
        let mut entries = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for entry in line.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let bad = |why: &str| ShowbackError::Price {
                    entry: entry.to_string(),
                    why: why.to_string(),
                };
                let (model, price) = entry
                    .split_once('=')
                    .ok_or_else(|| bad("expected MODEL=PRICE, e.g. A100=2.10"))?;
                let model = model.trim();
                let toks = tokens(model);
                if toks.is_empty() {
                    return Err(bad("no GPU model before `=`"));
                }
                let price: f64 = price
                    .trim()
                    .parse()
                    .map_err(|_| bad("the price is not a number"))?;
                if !(0.0..=MAX_PRICE).contains(&price) {
                    return Err(bad("the price must be between 0 and 1000000 per GPU-hour"));
                }
                if entries.iter().any(|(_, t, _)| *t == toks) {
                    return Err(bad("this model is priced twice"));
                }
                entries.push((model.to_string(), toks, price));
            }
        }
        Ok(Prices { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The price of `model` (GFD's product label, e.g. `NVIDIA-A100-SXM4-80GB`): the key whose
    /// tokens appear in the model's tokens as a run, the longest such key winning. Tokens, not
    /// substrings: `A100` must not price an `RTX-A1000`.
    pub fn price_of(&self, model: &str) -> Result<Option<f64>, ShowbackError> {
        let m = tokens(model);
        let mut best: Vec<&(String, Vec<String>, f64)> = Vec::new();
        for e in &self.entries {
            if e.1.len() <= m.len() && m.windows(e.1.len()).any(|w| w == e.1.as_slice()) {
                match best.first() {
                    Some(b) if b.1.len() > e.1.len() => {}
                    Some(b) if b.1.len() == e.1.len() => best.push(e),
                    _ => best = vec![e],
                }
            }
        }
        match best.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.2)),
            several => Err(ShowbackError::AmbiguousPrice {
                model: model.to_string(),
                keys: several
                    .iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

/// GPU-seconds of one (namespace, model, activity) over the period.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSeconds {
    pub namespace: String,
    pub model: String,
    /// `busy`, `idle` or `unknown`.
    pub activity: String,
    pub seconds: f64,
}

/// The windows showback reads Prometheus in: `step` long, the last ending at the period's end
/// and each one before it ending where the next begins, back to the first that reaches the
/// period's start (it may begin before it: [`Grid::share`]). Anchored at the end rather than
/// at multiples of the step since the epoch, so a period of whole steps (a month at the default
/// 5m) is tiled exactly, whatever its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    since: i64,
    until: i64,
    step: i64,
}

impl Grid {
    /// The grid of `period` in steps of `step` (whole seconds, at least one).
    pub fn new(period: &Period, step: Duration) -> Self {
        Grid {
            since: period.since.timestamp(),
            until: period.until.timestamp(),
            step: step.num_seconds().max(1),
        }
    }

    pub fn step_seconds(&self) -> i64 {
        self.step
    }

    /// How many windows cover the period.
    pub fn len(&self) -> i64 {
        let span = (self.until - self.since).max(0);
        span.div_euclid(self.step) + i64::from(span.rem_euclid(self.step) != 0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unix seconds at which window `j` ends, counted back from the period's end (0: the last).
    pub fn end(&self, j: i64) -> i64 {
        self.until - j * self.step
    }

    /// The window ending at `t` (Unix seconds), if one does.
    pub fn window_ending(&self, t: i64) -> Option<i64> {
        let back = self.until - t;
        (back >= 0 && back.rem_euclid(self.step) == 0 && back / self.step < self.len())
            .then_some(back / self.step)
    }

    /// The share of window `j` inside the period: 1, except for a first window that begins
    /// before the period (its value is pro-rated, as if used evenly over the window).
    pub fn share(&self, j: i64) -> f64 {
        let end = self.end(j);
        let start = (end - self.step).max(self.since);
        (end - start).max(0) as f64 / self.step as f64
    }
}

/// Per key, the sum of its windows' values, each times its [`Grid::share`] of the period, folded
/// series by series as Prometheus' answers arrive, so no point is kept: a month of 5-minute
/// windows over 500 namespaces is millions of points (docs/benchmarks.md). Points off the grid
/// are ignored; a window answered twice for one key counts once (the first answer: one bit per
/// key and window remembers it). NaN, negative or infinite values carry into the sum, for
/// [`compute`] to reject.
#[derive(Debug, Clone)]
pub struct WindowSums<K> {
    grid: Grid,
    /// Per key: the sum so far and the windows already counted (a bit per window).
    sums: BTreeMap<K, (f64, Vec<u64>)>,
}

impl<K: Ord> WindowSums<K> {
    pub fn new(grid: &Grid) -> Self {
        WindowSums {
            grid: *grid,
            sums: BTreeMap::new(),
        }
    }

    /// Adds one series of `key`: its points as (Unix seconds the window ends, value).
    pub fn add_series(&mut self, key: K, points: impl IntoIterator<Item = (i64, f64)>) {
        let words = usize::try_from(self.grid.len().max(0))
            .unwrap_or(0)
            .div_ceil(64);
        // A key gets a sum at its first point on the grid, as when every point was kept.
        let grid = self.grid;
        let mut on_grid = points
            .into_iter()
            .filter_map(|(t, v)| Some((grid.window_ending(t)?, v)))
            .peekable();
        if on_grid.peek().is_none() {
            return;
        }
        let (sum, seen) = self
            .sums
            .entry(key)
            .or_insert_with(|| (0.0, vec![0; words]));
        for (j, v) in on_grid {
            // `window_ending` answers only windows of the grid: 0 <= j < len.
            let (word, bit) = (usize::try_from(j / 64).unwrap_or(usize::MAX), j % 64);
            let Some(w) = seen.get_mut(word) else {
                continue;
            };
            if *w & (1 << bit) != 0 {
                continue;
            }
            *w |= 1 << bit;
            *sum += v * self.grid.share(j);
        }
    }

    /// The sum per key.
    pub fn finish(self) -> BTreeMap<K, f64> {
        self.sums.into_iter().map(|(k, (v, _))| (k, v)).collect()
    }
}

/// The group a namespace's numbers go to: itself, or its label's (owner's) value from
/// `groups`, [`NOT_SEEN`] when kube-state-metrics never reported it.
pub fn group_of(grouping: &Grouping, groups: &BTreeMap<String, String>, ns: &str) -> String {
    match grouping {
        Grouping::Namespace => ns.to_string(),
        _ => groups
            .get(ns)
            .cloned()
            .unwrap_or_else(|| NOT_SEEN.to_string()),
    }
}

/// The most each group (and the cluster) held at once: per window, the sum of the GPUs each
/// group's namespaces held at most in it ([`Inputs::held`]), the largest over the windows.
/// Folded one answer at a time ([`Held::begin_answer`], [`Held::add_series`],
/// [`Held::end_answer`]): each answer holds whole windows that no other answer holds, so only
/// one answer's windows are summed at once.
#[derive(Debug, Clone, Default)]
pub struct Held {
    by_group: BTreeMap<String, f64>,
    total: f64,
    /// Groups with an untrusted value in some window: their peak is unknown.
    unknown: BTreeSet<String>,
    /// Namespaces that held anything in the period.
    namespaces: BTreeSet<String>,
    /// Untrusted values, as [`Showback::rejected_values`] lists them: the first
    /// [`MAX_REJECTED_LISTED`].
    rejected: Vec<String>,
    /// Untrusted values beyond those listed (a NaN in every window of a month is thousands).
    rejected_more: usize,
    /// The windows (grid indexes) of the answer being folded.
    windows: std::ops::Range<i64>,
    /// Per group, the GPUs its namespaces held in each window of the answer being folded.
    answer: BTreeMap<String, Vec<f64>>,
}

impl Held {
    /// Starts an answer holding the grid's windows `windows` (indexes, see [`Grid::end`]).
    pub fn begin_answer(&mut self, windows: std::ops::Range<i64>) {
        self.windows = windows;
        self.answer.clear();
    }

    /// Adds the most `namespace` (in `group`) held in each window: (Unix seconds the window
    /// ends, GPUs). Points outside the period or the answer's windows are ignored.
    pub fn add_series(
        &mut self,
        period: &Period,
        grid: &Grid,
        namespace: &str,
        group: &str,
        points: impl IntoIterator<Item = (i64, f64)>,
    ) {
        let (since, until) = (period.since.timestamp(), period.until.timestamp());
        let len = usize::try_from(self.windows.end - self.windows.start).unwrap_or(0);
        for (t, v) in points {
            if t <= since || t > until {
                continue;
            }
            let Some(at) = grid
                .window_ending(t)
                .filter(|j| self.windows.contains(j))
                .and_then(|j| usize::try_from(j - self.windows.start).ok())
            else {
                continue;
            };
            if let Some(v) = checked(v, MAX_GPUS) {
                let sums = match self.answer.get_mut(group) {
                    Some(s) => s,
                    None => self
                        .answer
                        .entry(group.to_string())
                        .or_insert(vec![0.0; len]),
                };
                if let Some(s) = sums.get_mut(at) {
                    *s += v;
                }
            } else {
                if self.rejected.len() < MAX_REJECTED_LISTED {
                    self.rejected.push(format!("GPUs held of {namespace}: {v}"));
                } else {
                    self.rejected_more = self.rejected_more.saturating_add(1);
                }
                self.unknown.insert(group.to_string());
            }
            if !self.namespaces.contains(namespace) {
                self.namespaces.insert(namespace.to_string());
            }
        }
    }

    /// Folds the answer's per-window sums into the peaks.
    pub fn end_answer(&mut self) {
        let len = usize::try_from(self.windows.end - self.windows.start).unwrap_or(0);
        let mut total = vec![0.0; len];
        for (g, sums) in std::mem::take(&mut self.answer) {
            let peak = self.by_group.entry(g).or_insert(0.0);
            for (t, v) in total.iter_mut().zip(&sums) {
                *peak = peak.max(*v);
                *t += v;
            }
        }
        self.total = total.into_iter().fold(self.total, f64::max);
    }
}

/// What Prometheus answered, decoded (values as given: checked here).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// `increase()` of `gpu_ledger_gpu_seconds_claimed_total` per namespace.
    pub claimed: BTreeMap<String, f64>,
    /// `increase()` of `gpu_ledger_gpu_seconds_idle_total` per namespace.
    pub idle: BTreeMap<String, f64>,
    /// `increase()` of `gpu_ledger_gpu_seconds_by_model_total`.
    pub by_model: Vec<ModelSeconds>,
    /// The most each group held at once, from the most each namespace held in each window
    /// (folded with [`group_of`] of the same grouping).
    pub held: Held,
    /// Unix seconds at which the [`Grid`]'s windows end in which some replica of gpu-ledger
    /// had a sample (any replica: one of two HA replicas down leaves no gap), and every shard
    /// did ([`reported_by_every_shard`]).
    pub reported: BTreeSet<i64>,
    /// Step of the [`Grid`], `held` and `reported`.
    pub resolution: Duration,
    /// Namespace → group (only when grouping by label or owner).
    pub groups: BTreeMap<String, String>,
}

/// A stretch of the period without any sample of gpu-ledger's series: use there is unknown,
/// not zero.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gap {
    pub start: DateTime<Utc>,
    pub seconds: i64,
}

/// One group's totals; `None` is unknown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub group: String,
    pub namespaces: Vec<String>,
    pub gpu_hours_claimed: Option<f64>,
    pub gpu_hours_busy: Option<f64>,
    pub gpu_hours_idle: Option<f64>,
    /// Claimed, neither proven busy nor proven idle.
    pub gpu_hours_unknown: Option<f64>,
    pub idle_share: Option<f64>,
    pub peak_gpus: Option<f64>,
    /// Claimed GPU-hours times the price of each hour's GPU model; `None` without prices or
    /// when some hours are on a model without a price.
    pub cost: Option<f64>,
}

/// Whether the numbers cover the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// gpu-ledger reported for at least the minimum coverage of the period.
    Complete,
    /// It reported for less: the hours are what was counted, a lower bound.
    Partial,
    /// It never reported in the period (or Prometheus no longer holds it): nothing is known.
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Complete => "complete",
            Status::Partial => "partial",
            Status::Unknown => "unknown",
        }
    }
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Showback {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub group_by: String,
    pub groups: Vec<Row>,
    pub total: Row,
    /// `complete`, `partial` (coverage below `min_coverage`) or `unknown` (no data at all).
    pub status: Status,
    /// Share of the period in which some replica of gpu-ledger reported (0..1).
    pub coverage: f64,
    /// The coverage below which the showback is partial (`--min-coverage`).
    pub min_coverage: f64,
    pub gaps: Vec<Gap>,
    pub resolution_seconds: i64,
    /// Models that held GPU-hours but have no price (their groups' cost is unknown).
    pub unpriced_models: Vec<String>,
    /// Values Prometheus answered that cannot be true, shown as unknown.
    pub rejected_values: Vec<String>,
}

/// Most untrusted values listed one by one in [`Showback::rejected_values`]; the rest are
/// counted in its last entry, so a value that is wrong in every window of a month (a NaN held
/// 8,928 times per namespace at 5-minute steps) cannot grow the list, the JSON or the table
/// without bound.
pub const MAX_REJECTED_LISTED: usize = 100;

/// A value from Prometheus when it is finite, not negative and at most `max`.
fn checked(v: f64, max: f64) -> Option<f64> {
    (v.is_finite() && (0.0..=max).contains(&v)).then_some(v)
}

/// Sums where any unknown part makes the whole unknown.
fn add(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}

/// The windows (the Unix second each ends) that count as reported: some shard of gpu-ledger
/// reported in them, and every shard that reported both before and after them reported in them
/// too. `per_shard`: the windows in which each shard (its `shard` label; "" unsharded) had a
/// sample. A shard that stops and comes back leaves a gap in between, since the pods of its
/// nodes were counted by no one there, however many other shards reported; one that starts
/// late or stops for good (resharding, `--total-shards` changed) leaves none.
pub fn reported_by_every_shard(per_shard: &BTreeMap<String, BTreeSet<i64>>) -> BTreeSet<i64> {
    let any: BTreeSet<i64> = per_shard.values().flatten().copied().collect();
    any.into_iter()
        .filter(|t| {
            per_shard
                .values()
                .all(|seen| match (seen.first(), seen.last()) {
                    (Some(first), Some(last)) if first < t && t < last => seen.contains(t),
                    _ => true,
                })
        })
        .collect()
}

/// The grid's windows whose end is not in `reported`, merged into gaps (the first window
/// clipped to the period's start).
fn gaps(grid: &Grid, reported: &BTreeSet<i64>) -> Vec<Gap> {
    let mut out: Vec<Gap> = Vec::new();
    let mut open: Option<i64> = None;
    // Oldest window first.
    for j in (0..grid.len()).rev() {
        let end = grid.end(j);
        let start = (end - grid.step).max(grid.since);
        if reported.contains(&end) {
            if let Some(s) = open.take() {
                push_gap(&mut out, s, start);
            }
        } else if open.is_none() {
            open = Some(start);
        }
    }
    if let Some(s) = open {
        push_gap(&mut out, s, grid.until);
    }
    out
}

fn push_gap(out: &mut Vec<Gap>, start: i64, end: i64) {
    if end > start
        && let Some(s) = DateTime::from_timestamp(start, 0)
    {
        out.push(Gap {
            start: s,
            seconds: end - start,
        });
    }
}

/// Per-namespace numbers before grouping.
#[derive(Default)]
struct Ns {
    claimed: Option<f64>,
    idle: Option<f64>,
    busy: Option<f64>,
    cost: Option<f64>,
}

/// Computes the showback of `inputs` over `period`; below `min_coverage` (0..1) it is partial.
pub fn compute(
    period: &Period,
    grouping: &Grouping,
    prices: &Prices,
    inputs: &Inputs,
    min_coverage: f64,
) -> Result<Showback, ShowbackError> {
    let max_seconds = period.seconds() * MAX_GPUS;
    let mut rejected = Vec::new();
    let mut check = |what: &str, ns: &str, v: f64, max: f64| {
        let c = checked(v, max);
        if c.is_none() {
            rejected.push(format!("{what} of {ns}: {v}"));
        }
        c
    };
    let mut per_ns: BTreeMap<String, Ns> = BTreeMap::new();
    for (ns, v) in &inputs.claimed {
        per_ns.entry(ns.clone()).or_default().claimed =
            check("claimed GPU-seconds", ns, *v, max_seconds);
    }
    for (ns, v) in &inputs.idle {
        per_ns.entry(ns.clone()).or_default().idle = check("idle GPU-seconds", ns, *v, max_seconds);
    }
    // Busy and cost from the per-model counter: unknown where it has no series.
    let mut model_rows: BTreeMap<&str, Vec<&ModelSeconds>> = BTreeMap::new();
    for m in &inputs.by_model {
        model_rows.entry(m.namespace.as_str()).or_default().push(m);
    }
    let mut unpriced = BTreeSet::new();
    for (ns, rows) in &model_rows {
        let mut busy = Some(0.0);
        let mut cost = (!prices.is_empty()).then_some(0.0);
        for m in rows {
            let what = format!("{} GPU-seconds on {}", m.activity, m.model);
            let secs = check(&what, ns, m.seconds, max_seconds);
            if m.activity == "busy" {
                busy = add(busy, secs);
            }
            if cost.is_some() && secs.is_some_and(|s| s > 0.0) {
                if let Some(p) = prices.price_of(&m.model)? {
                    cost = add(cost, secs.map(|s| s / 3600.0 * p));
                } else {
                    unpriced.insert(m.model.clone());
                    cost = None;
                }
            } else if secs.is_none() {
                cost = None;
            }
        }
        let entry = per_ns.entry((*ns).to_string()).or_default();
        entry.busy = busy;
        entry.cost = cost;
    }
    // A namespace that held nothing has nothing unknown about it.
    for n in per_ns.values_mut() {
        if n.claimed == Some(0.0) {
            n.busy.get_or_insert(0.0);
            if !prices.is_empty() {
                n.cost.get_or_insert(0.0);
            }
        }
    }
    let group_of = |ns: &str| group_of(grouping, &inputs.groups, ns);
    let peaks = &inputs.held;
    rejected.extend(peaks.rejected.iter().cloned());
    for ns in &peaks.namespaces {
        per_ns.entry(ns.clone()).or_default();
    }
    let held_unknown = &peaks.unknown;
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for (ns, n) in &per_ns {
        let g = group_of(ns);
        let row = rows.entry(g.clone()).or_insert_with(|| {
            let peak = if held_unknown.contains(&g) {
                None
            } else {
                Some(peaks.by_group.get(&g).copied().unwrap_or(0.0))
            };
            empty_row(g, Vec::new(), peak, !prices.is_empty())
        });
        row.namespaces.push(ns.clone());
        let hours = |s: Option<f64>| s.map(|s| s / 3600.0);
        row.gpu_hours_claimed = add(row.gpu_hours_claimed, hours(n.claimed));
        row.gpu_hours_idle = add(row.gpu_hours_idle, hours(n.idle));
        row.gpu_hours_busy = add(row.gpu_hours_busy, hours(n.busy));
        if !prices.is_empty() {
            row.cost = add(row.cost, n.cost);
        }
    }
    let mut groups: Vec<Row> = rows.into_values().map(finish).collect();
    let mut total = empty_row(
        "total".into(),
        per_ns.keys().cloned().collect(),
        held_unknown.is_empty().then_some(peaks.total),
        !prices.is_empty(),
    );
    for r in &groups {
        total.gpu_hours_claimed = add(total.gpu_hours_claimed, r.gpu_hours_claimed);
        total.gpu_hours_busy = add(total.gpu_hours_busy, r.gpu_hours_busy);
        total.gpu_hours_idle = add(total.gpu_hours_idle, r.gpu_hours_idle);
        total.cost = add(total.cost, r.cost);
    }
    let grid = Grid::new(period, inputs.resolution);
    let gaps = gaps(&grid, &inputs.reported);
    let (status, coverage) = coverage(period, &gaps, &inputs.reported, min_coverage);
    if status == Status::Unknown {
        // Nothing was reported: the cluster's use is not zero, it is not known.
        total.gpu_hours_claimed = None;
        total.gpu_hours_busy = None;
        total.gpu_hours_idle = None;
        total.peak_gpus = None;
        total.cost = None;
    }
    let total = finish(total);
    // Most GPU-hours first: the question is "who used them".
    groups.sort_by(|a, b| {
        b.gpu_hours_claimed
            .unwrap_or(-1.0)
            .total_cmp(&a.gpu_hours_claimed.unwrap_or(-1.0))
            .then_with(|| a.group.cmp(&b.group))
    });
    Ok(Showback {
        since: period.since,
        until: period.until,
        group_by: grouping.name(),
        groups,
        total,
        status,
        coverage,
        min_coverage,
        gaps,
        resolution_seconds: grid.step_seconds(),
        unpriced_models: unpriced.into_iter().collect(),
        rejected_values: capped(rejected, peaks.rejected_more),
    })
}

/// The first [`MAX_REJECTED_LISTED`] of `rejected`, and one entry counting the rest (`more`
/// were left out before they reached the list).
fn capped(mut rejected: Vec<String>, more: usize) -> Vec<String> {
    let more = more.saturating_add(rejected.len().saturating_sub(MAX_REJECTED_LISTED));
    rejected.truncate(MAX_REJECTED_LISTED);
    if more > 0 {
        rejected.push(format!("… and {more} more values that cannot be true"));
    }
    rejected
}

/// The status and the share of `period` outside `gaps`.
fn coverage(
    period: &Period,
    gaps: &[Gap],
    reported: &BTreeSet<i64>,
    min_coverage: f64,
) -> (Status, f64) {
    let missing: i64 = gaps.iter().map(|g| g.seconds).sum();
    let coverage = (1.0 - missing as f64 / period.seconds()).clamp(0.0, 1.0);
    let status = if reported.is_empty() {
        Status::Unknown
    } else if coverage < min_coverage {
        Status::Partial
    } else {
        Status::Complete
    };
    (status, coverage)
}

/// A row to sum into: zero hours (and cost, when priced), its peak as found.
fn empty_row(group: String, namespaces: Vec<String>, peak: Option<f64>, priced: bool) -> Row {
    Row {
        group,
        namespaces,
        gpu_hours_claimed: Some(0.0),
        gpu_hours_busy: Some(0.0),
        gpu_hours_idle: Some(0.0),
        gpu_hours_unknown: None,
        idle_share: None,
        peak_gpus: peak,
        cost: priced.then_some(0.0),
    }
}

/// Unknown hours and idle share from the sums.
fn finish(mut r: Row) -> Row {
    if let (Some(c), Some(b), Some(i)) = (r.gpu_hours_claimed, r.gpu_hours_busy, r.gpu_hours_idle) {
        let u = c - b - i;
        // Float dust from summing is zero; more than that means the counters disagree
        // (e.g. replicas of different ages), and the remainder is not known.
        let dust = 1e-9 * c.max(1.0);
        r.gpu_hours_unknown = if u >= -dust { Some(u.max(0.0)) } else { None };
    }
    r.idle_share = match (r.gpu_hours_idle, r.gpu_hours_claimed) {
        (Some(i), Some(c)) if c > 0.0 => Some((i / c).min(1.0)),
        _ => None,
    };
    r
}

#[cfg(test)]
mod tests;
