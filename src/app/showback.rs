//! `gpu-ledger showback`: asks Prometheus for gpu-ledger's counters over a period, window by
//! window (a handful of queries per week of windows), and prints what `report::showback` makes
//! of them.
//! Also the page's history source (`export::history`): the same counters over 24 h and 7 d.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};

use super::clients::prometheus_client;
use super::error::AppError;
use crate::config::{Progress as ProgressChoice, ShowbackArgs, ShowbackOutput};
use crate::export::history::{Fetch, HistorySource, Points, Raw, Span};
use crate::ledger::showback::{
    self, Grid, Grouping, Held, Inputs, ModelSeconds, NO_VALUE, Period, Prices, WindowSums,
    group_of, ksm_label,
};
use crate::report::showback as render;
use crate::usage::prom::decode::MatrixRow;
use crate::usage::prom::queries::{CLUSTER_LABELS, clusters_of, duration};
use crate::usage::prom::{PromClient, PromError, Sample};
use crate::usage::series::Labels;

/// Largest price file read.
const MAX_PRICE_FILE_BYTES: u64 = 1 << 20;

/// `metric{matchers}` with the client's extra matchers (`--prometheus-selector`).
fn selector(name: &str, client: &PromClient) -> String {
    format!("{name}{{{}}}", client.matchers().trim_start_matches(','))
}

fn label<'a>(s: &'a Sample, name: &str) -> &'a str {
    s.labels.get(name).map_or("", String::as_str)
}

/// Most windows asked for in one query: a week of the default 5-minute steps, so each query
/// stays well inside the timeout and the progress moves.
const WINDOWS_PER_QUERY: i64 = 2016;

/// Most points (series × windows) asked for in one query, as far as the series already seen
/// tell: an answer's body (about 27 bytes a point) and its decoded series (16 bytes a point)
/// are held at once, so this bounds showback's memory at about 11 MB per answer once a read's
/// series are known; a read's first query is sized from the reads before it, so its answer can
/// be larger (series × its windows, e.g. a by-model read with more series than the reads
/// before it).
const POINTS_PER_QUERY: usize = 250_000;

/// The series a read's first query is sized for before any answer said how many there are.
const SERIES_GUESS: usize = 1_000;

/// Counts the queries and, when asked, says each one on stderr as it is answered.
struct Progress {
    show: bool,
    done: usize,
    /// Queries still to come after the current read's, as far as known ([`Self::plan`]).
    later: usize,
    total: usize,
    started: Instant,
    /// Most series in any answer so far: sizes the next read's first query.
    most_series: usize,
}

impl Progress {
    fn new(choice: ProgressChoice, total: usize) -> Self {
        let show = match choice {
            ProgressChoice::Always => true,
            ProgressChoice::Never => false,
            ProgressChoice::Auto => std::io::stderr().is_terminal(),
        };
        Progress {
            show,
            done: 0,
            later: total,
            total,
            started: Instant::now(),
            most_series: 0,
        }
    }

    /// The current read expects `queries` more queries (with the one being answered): the
    /// total shown becomes what is done, those, and the queries of later reads.
    fn plan(&mut self, queries: usize) {
        self.total = self.done.saturating_add(queries).saturating_add(self.later);
    }

    /// A read begins that was counted as `counted` queries of the later ones.
    fn begin_read(&mut self, counted: usize) {
        self.later = self.later.saturating_sub(counted);
    }

    fn answered(&mut self, what: &str) {
        self.done += 1;
        self.total = self.total.max(self.done);
        if self.show {
            eprintln!(
                "showback: [{}/{}] {what} ({:.1}s)",
                self.done,
                self.total,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// Windows per query for answers of `series` series: [`POINTS_PER_QUERY`] points, at least one
/// window, at most [`WINDOWS_PER_QUERY`].
fn windows_for(series: usize) -> i64 {
    i64::try_from(POINTS_PER_QUERY / series.max(1))
        .unwrap_or(WINDOWS_PER_QUERY)
        .clamp(1, WINDOWS_PER_QUERY)
}

/// One answer of a [`stepped`] read: the grid's windows it holds (indexes, [`Grid::end`]) and
/// its series, each with its labels once.
struct StepAnswer<'a> {
    windows: std::ops::Range<i64>,
    rows: &'a [MatrixRow],
    grid: &'a Grid,
    shift: i64,
}

impl StepAnswer<'_> {
    /// Each series: its labels and its points as (Unix seconds its window ends, value), only
    /// those of this answer's windows.
    fn series(&self) -> impl Iterator<Item = (&Labels, impl Iterator<Item = (i64, f64)> + '_)> {
        self.rows.iter().map(move |row| {
            let points = row.points().filter_map(move |(t, v)| {
                let end = (t.round() as i64).saturating_sub(self.shift);
                // Prometheus 2 includes a step at the range's start, Prometheus 3 does not:
                // keep only this query's windows.
                self.grid
                    .window_ending(end)
                    .is_some_and(|j| self.windows.contains(&j))
                    .then_some((end, v))
            });
            (row.labels(), points)
        })
    }
}

/// `inner` evaluated for every window of `grid` (`inner` is given the ` offset …` to put after
/// its range selector), each answer handed to `fold` as it arrives and then dropped: nothing of
/// it is kept here. Each query asks for about [`POINTS_PER_QUERY`] points (series × windows, the
/// series counted in the answers so far), at most [`WINDOWS_PER_QUERY`] windows. Subquery steps
/// fall on multiples of the step since the epoch; the offset moves each window to end on the
/// grid, at the period's end and whole steps before it.
async fn stepped(
    client: &PromClient,
    grid: &Grid,
    inner: &dyn Fn(&str) -> String,
    what: &str,
    progress: &mut Progress,
    fold: &mut dyn FnMut(&StepAnswer<'_>),
) -> Result<(), PromError> {
    let step = grid.step_seconds();
    let shift = (step - grid.end(0).rem_euclid(step)).rem_euclid(step);
    let offset = if shift == 0 {
        String::new()
    } else {
        format!(" offset {}", duration(chrono::Duration::seconds(shift)))
    };
    let expr = inner(&offset);
    progress.begin_read(queries_per_read(grid));
    let mut per_query = windows_for(progress.most_series.max(SERIES_GUESS));
    let mut first = 0;
    while first < grid.len() {
        let last = (first + per_query).min(grid.len());
        let at =
            DateTime::from_timestamp(grid.end(first) + shift, 0).unwrap_or(DateTime::UNIX_EPOCH);
        let q = format!(
            "({expr})[{}:{}]",
            duration(chrono::Duration::seconds((last - first) * step)),
            duration(chrono::Duration::seconds(step))
        );
        let rows = client.instant_series(&q, at).await?;
        fold(&StepAnswer {
            windows: first..last,
            rows: &rows,
            grid,
            shift,
        });
        progress.most_series = progress.most_series.max(rows.len());
        per_query = windows_for(rows.len());
        drop(rows);
        let left = grid.len() - last;
        progress.plan(
            1 + usize::try_from(
                left.div_euclid(per_query) + i64::from(left.rem_euclid(per_query) != 0),
            )
            .unwrap_or(0),
        );
        let (from, to) = (grid.end(last - 1) - step, grid.end(first));
        progress.answered(&format!(
            "{what}, {} .. {}",
            DateTime::from_timestamp(from, 0)
                .unwrap_or_default()
                .format("%Y-%m-%d %H:%M"),
            DateTime::from_timestamp(to, 0)
                .unwrap_or_default()
                .format("%Y-%m-%d %H:%M")
        ));
        first = last;
    }
    Ok(())
}

/// Queries a [`stepped`] read is expected to make over `grid` before its answers say how many
/// series it has (for the progress' total).
fn queries_per_read(grid: &Grid) -> usize {
    let len = grid.len().max(1);
    let per_query = windows_for(SERIES_GUESS);
    usize::try_from(len.div_euclid(per_query) + i64::from(len.rem_euclid(per_query) != 0))
        .unwrap_or(usize::MAX)
}

/// `inner` (an expression over one gpu-ledger family) combined across gpu-ledger's replicas
/// into one value per `by` (docs/metrics.md, "Replicas and shards"): HA replicas of one shard
/// export the same numbers, so `max` counts them once; shards count different pods, so their
/// values add; unsharded series have no `shard` label and form one group.
pub(crate) fn across_replicas(by: &str, inner: &str) -> String {
    format!("sum by ({by}) (max by ({by}, {SHARD}) ({inner}))")
}

/// The label a sharded replica puts on every series (`export::SHARD_LABEL`; `app` wires the
/// two, so the query and the exposition cannot drift apart).
const SHARD: &str = crate::export::SHARD_LABEL;

/// GPU-seconds of `counter` per namespace over the period: per window, `increase()` of each
/// series, the largest across a shard's series (HA replicas count the same seconds: once),
/// added across shards (each counts its own nodes' pods), summed over the windows (a replaced
/// replica's series and its successor's follow each other: both count). Restart-safe as
/// `increase()` is; a window in which no replica reported adds nothing.
async fn gpu_seconds_by_namespace(
    client: &PromClient,
    grid: &Grid,
    counter: &str,
    progress: &mut Progress,
) -> Result<BTreeMap<String, f64>, PromError> {
    let sel = selector(counter, client);
    let window = duration(chrono::Duration::seconds(grid.step_seconds()));
    let mut sums = WindowSums::new(grid);
    stepped(
        client,
        grid,
        &|off| across_replicas("namespace", &format!("increase({sel}[{window}]{off})")),
        counter,
        progress,
        &mut |answer| {
            for (labels, points) in answer.series() {
                let namespace = labels.get("namespace").cloned().unwrap_or_default();
                sums.add_series(namespace, points);
            }
        },
    )
    .await?;
    Ok(sums.finish())
}

/// Namespace → group from kube-state-metrics' `metric` (`kube_namespace_labels` or
/// `kube_namespace_annotations`) and its label `key`: the value of the series seen last in the
/// period (a namespace relabelled mid-month goes to its newest group). Refuses series of
/// several clusters.
///
/// "Seen last" is what `max by (namespace, key) (max_over_time(timestamp(metric)[period:step]))`
/// answers, but that subquery costs Prometheus 2 time quadratic in its length (a 31-day month:
/// seconds per series, so minutes for a few hundred namespaces). So it is asked only where it
/// decides something, over a day: one cheap query first finds, per day of the period, which
/// values each namespace had ([`KsmDays`]); a namespace whose last day holds one value has its
/// answer; only those whose last day holds several values (relabelled that day), and those last
/// seen on the period's first day (whether Prometheus' lookback still sees them), are asked the
/// exact question over their last day ([`newest_seen`]), a few namespaces per query.
async fn groups_from_ksm(
    client: &PromClient,
    metric: &str,
    key: &str,
    period: &Period,
    resolution: chrono::Duration,
) -> Result<BTreeMap<String, String>, AppError> {
    let step_ms = resolution.num_milliseconds().max(1);
    let since_ms = period.since.timestamp_millis();
    // The subquery's last step: its steps are multiples of the step since the epoch.
    let last_step_ms = period.until.timestamp_millis().div_euclid(step_ms) * step_ms;
    if last_step_ms.saturating_sub(since_ms) <= 2 * KSM_DAY_MS {
        // Two days or less: the exact question over the whole period is cheap.
        let answer = newest_seen(
            client,
            metric,
            key,
            None,
            period.since,
            period.until,
            step_ms,
        )
        .await?;
        one_cluster(metric, answer.iter().map(|s| &s.labels))?;
        return Ok(fold_newest(&answer, key));
    }
    let days = KsmDays::read(client, metric, key, since_ms, last_step_ms).await?;
    one_cluster(metric, days.in_period.iter())?;
    let mut groups = BTreeMap::new();
    // Namespaces still to ask, by the end of the day from which to ask (milliseconds).
    let mut ask: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (namespace, (day, values)) in &days.last {
        match (values.len(), values.first()) {
            (1, Some(only)) if *day >= 2 => {
                groups.insert(namespace.clone(), only.clone());
            }
            _ => ask
                .entry((*day).max(1))
                .or_default()
                .push(namespace.clone()),
        }
    }
    let mut asked_labels = Vec::new();
    for (day, namespaces) in ask {
        // The day's own steps and the next one (a sample late in the day is seen by the first
        // step after it); from the period's start for its first day, as the period's question.
        let end_ms = days.end_of(day);
        let until = millis(end_ms.saturating_add(step_ms).min(last_step_ms));
        let from = if day <= 1 {
            period.since
        } else {
            millis(days.end_of(day - 1))
        };
        for chunk in namespace_matchers(&namespaces) {
            let answer =
                newest_seen(client, metric, key, Some(&chunk), from, until, step_ms).await?;
            groups.extend(fold_newest(&answer, key));
            asked_labels.extend(answer.into_iter().map(|s| s.labels));
        }
    }
    one_cluster(metric, days.in_period.iter().chain(asked_labels.iter()))?;
    Ok(groups)
}

/// Length of the windows in which [`KsmDays`] looks for label values: a day, so a month is
/// one query of 32 points per series.
const KSM_DAY_MS: i64 = 86_400_000;

/// Most bytes of namespace names in one `namespace=~` matcher of [`newest_seen`] (the query is
/// POSTed, so this bounds the work per query rather than a URL).
const MAX_NAMESPACE_MATCHER_BYTES: usize = 16 * 1024;

/// `Utc` time of a Unix millisecond.
fn millis(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::UNIX_EPOCH)
}

/// The value of `key` on a kube-state-metrics sample, [`NO_VALUE`] when empty or absent.
fn ksm_value(s: &Sample, key: &str) -> String {
    match label(s, key) {
        "" => NO_VALUE.to_string(),
        v => v.to_string(),
    }
}

/// Per namespace, the value of its series that `timestamp()` saw last, at steps of `step_ms`
/// from `from` to `until`: `max by (namespace, key, cluster labels)
/// (max_over_time(timestamp(metric{namespace=~…})[until - from:step]))` at `until`, the
/// period's own question when `from` is its start. `namespaces` (a `namespace=~` regex)
/// narrows it to those asked.
async fn newest_seen(
    client: &PromClient,
    metric: &str,
    key: &str,
    namespaces: Option<&str>,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    step_ms: i64,
) -> Result<Vec<Sample>, AppError> {
    let sel = match namespaces {
        None => selector(metric, client),
        Some(re) => format!("{metric}{{namespace=~\"{re}\"{}}}", client.matchers()),
    };
    let q = format!(
        "max by (namespace, {key}, {clusters}) (max_over_time(timestamp({sel})[{}:{}]))",
        duration(until - from),
        duration(chrono::Duration::milliseconds(step_ms)),
        clusters = CLUSTER_LABELS.join(", ")
    );
    client
        .instant(&q, until)
        .await
        .map_err(AppError::Prometheus)
}

/// Namespace → the value of its newest series in `answer` (of [`newest_seen`]); on equal times
/// the first in Prometheus' answer wins.
fn fold_newest(answer: &[Sample], key: &str) -> BTreeMap<String, String> {
    let mut seen: BTreeMap<String, (f64, String)> = BTreeMap::new();
    for s in answer {
        let e = seen
            .entry(label(s, "namespace").to_string())
            .or_insert((f64::NEG_INFINITY, String::new()));
        if s.value > e.0 {
            *e = (s.value, ksm_value(s, key));
        }
    }
    seen.into_iter().map(|(ns, (_, g))| (ns, g)).collect()
}

/// `namespaces` as `namespace=~` regexes (escaped for the regex and for the PromQL string), at
/// most [`MAX_NAMESPACE_MATCHER_BYTES`] of names each.
fn namespace_matchers(namespaces: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for ns in namespaces {
        let quoted = regex::escape(ns).replace('\\', "\\\\").replace('"', "\\\"");
        if !current.is_empty() && current.len() + 1 + quoted.len() > MAX_NAMESPACE_MATCHER_BYTES {
            out.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('|');
        }
        current.push_str(&quoted);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Which values of a kube-state-metrics label each namespace had, per day, from one query:
/// `group by (namespace, key, cluster labels) (count_over_time(metric[1d]))` for every day
/// ending at the period's last step, whole days back to before the period's start. It reads
/// every sample once (cost linear in the period) and has no subquery of `timestamp()`.
struct KsmDays {
    /// End of day 0 (milliseconds); day `j` is `(end - 1d, end]` with `end = first_end + j·1d`.
    /// Day 0 ends at or before the period's start: it holds what only Prometheus' lookback
    /// may still see at the period's first step.
    first_end_ms: i64,
    /// Per namespace, the last day it had a series and the values it had that day.
    last: BTreeMap<String, (i64, BTreeSet<String>)>,
    /// Labels of every series seen from day 1 on (the cluster check).
    in_period: Vec<BTreeMap<String, String>>,
}

impl KsmDays {
    async fn read(
        client: &PromClient,
        metric: &str,
        key: &str,
        since_ms: i64,
        last_step_ms: i64,
    ) -> Result<Self, AppError> {
        // Days ending at the last step, back to the one ending at or before the period's start.
        let span_ms = last_step_ms.saturating_sub(since_ms).max(0);
        let days = (span_ms.saturating_add(KSM_DAY_MS - 1)).div_euclid(KSM_DAY_MS) + 1;
        let first_end_ms = last_step_ms.saturating_sub((days - 1).saturating_mul(KSM_DAY_MS));
        // Subquery steps fall on whole days since the epoch: evaluate at the next such step
        // and shift each window back onto the days by `offset`.
        let shift_ms = (KSM_DAY_MS - last_step_ms.rem_euclid(KSM_DAY_MS)).rem_euclid(KSM_DAY_MS);
        let offset = if shift_ms == 0 {
            String::new()
        } else {
            format!(
                " offset {}",
                duration(chrono::Duration::milliseconds(shift_ms))
            )
        };
        let day = duration(chrono::Duration::milliseconds(KSM_DAY_MS));
        let q = format!(
            "(group by (namespace, {key}, {clusters}) (count_over_time({sel}[{day}]{offset})))[{}:{day}]",
            duration(chrono::Duration::milliseconds(
                days.saturating_mul(KSM_DAY_MS)
            )),
            sel = selector(metric, client),
            clusters = CLUSTER_LABELS.join(", ")
        );
        let answer = client
            .instant_matrix(&q, millis(last_step_ms.saturating_add(shift_ms)))
            .await
            .map_err(AppError::Prometheus)?;
        let mut out = KsmDays {
            first_end_ms,
            last: BTreeMap::new(),
            in_period: Vec::new(),
        };
        for s in answer {
            let end_ms = ((s.time * 1000.0).round() as i64).saturating_sub(shift_ms);
            let since_first = end_ms.saturating_sub(first_end_ms);
            // Prometheus 2 adds a step at the range's start (the day before day 0): not ours.
            if since_first.rem_euclid(KSM_DAY_MS) != 0 {
                continue;
            }
            let day = since_first.div_euclid(KSM_DAY_MS);
            if !(0..days).contains(&day) {
                continue;
            }
            let value = ksm_value(&s, key);
            let e = out
                .last
                .entry(label(&s, "namespace").to_string())
                .or_insert((day, BTreeSet::new()));
            if day > e.0 {
                *e = (day, BTreeSet::new());
            }
            if day == e.0 {
                e.1.insert(value);
            }
            if day >= 1 {
                out.in_period.push(s.labels);
            }
        }
        Ok(out)
    }

    /// End of day `day` (milliseconds).
    fn end_of(&self, day: i64) -> i64 {
        self.first_end_ms
            .saturating_add(day.saturating_mul(KSM_DAY_MS))
    }
}

/// Refuses `what`'s series when they come from several clusters (a shared Thanos, Mimir or
/// VictoriaMetrics without `--prometheus-selector`): `max by (namespace)` would take one
/// cluster's team-a for all of them, as `report` and `serve` refuse to join them.
fn one_cluster<'a>(
    what: &str,
    labels: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
) -> Result<(), AppError> {
    let clusters = clusters_of(labels);
    if clusters.len() > 1 {
        return Err(AppError::Config(format!(
            "{what}: series of {} clusters in this Prometheus ({}): showback adds up one \
             cluster; pass --prometheus-selector with its label, e.g. --prometheus-selector '{}'",
            clusters.len(),
            clusters.join(", "),
            clusters
                .iter()
                .find(|c| c.as_str() != "(none)")
                .map_or("cluster=\"…\"", String::as_str)
        )));
    }
    Ok(())
}

/// Namespace → group for `grouping` (empty by namespace), from kube-state-metrics.
async fn groups(
    client: &PromClient,
    period: &Period,
    grouping: &Grouping,
    resolution: chrono::Duration,
    progress: &mut Progress,
) -> Result<BTreeMap<String, String>, AppError> {
    if *grouping != Grouping::Namespace {
        // Counted among the later queries at the start; now this read's own.
        progress.begin_read(1);
        progress.plan(1);
    }
    Ok(match grouping {
        Grouping::Namespace => BTreeMap::new(),
        Grouping::Label(key) => {
            let g = groups_from_ksm(
                client,
                "kube_namespace_labels",
                &ksm_label("label_", key),
                period,
                resolution,
            )
            .await?;
            progress.answered("kube_namespace_labels");
            g
        }
        Grouping::ProfileOwner => {
            let g = groups_from_ksm(
                client,
                "kube_namespace_annotations",
                &ksm_label("annotation_", "owner"),
                period,
                resolution,
            )
            .await?;
            progress.answered("kube_namespace_annotations");
            g
        }
    })
}

/// Reads everything the showback needs from Prometheus.
async fn inputs(
    client: &PromClient,
    period: &Period,
    grouping: &Grouping,
    resolution: chrono::Duration,
    progress: ProgressChoice,
) -> Result<Inputs, AppError> {
    let grid = Grid::new(period, resolution);
    let per_read = queries_per_read(&grid);
    let grouping_queries = usize::from(*grouping != Grouping::Namespace);
    let mut progress = Progress::new(progress, 5 * per_read + grouping_queries);
    let window = duration(chrono::Duration::seconds(grid.step_seconds()));
    // A shard of gpu-ledger reported in a window when any of its series has a sample there:
    // all its replicas' series together, so one of two HA replicas down is no gap; a shard
    // silent between two reports is (`reported_by_every_shard`).
    // `last_refresh_timestamp_seconds` is exported whenever gpu-ledger runs, GPUs or not. By
    // cluster label too, to refuse several clusters before adding anything up.
    let matchers = client.matchers().to_string();
    // Windows each shard reported in, and the label sets seen (a handful: one per cluster and
    // shard) for the cluster check.
    let mut per_shard: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut reporting_labels: BTreeSet<Labels> = BTreeSet::new();
    stepped(
        client,
        &grid,
        &|off| {
            format!(
                "group by ({}, {SHARD}) (count_over_time({{__name__=~\"gpu_ledger_last_refresh_timestamp_seconds|gpu_ledger_gpu_seconds_claimed_total\"{matchers}}}[{window}]{off}))",
                CLUSTER_LABELS.join(", ")
            )
        },
        "gpu-ledger reporting",
        &mut progress,
        &mut |answer| {
            for (labels, points) in answer.series() {
                let windows = per_shard
                    .entry(labels.get(SHARD).cloned().unwrap_or_default())
                    .or_default();
                windows.extend(points.map(|(t, _)| t));
                if !reporting_labels.contains(labels) {
                    reporting_labels.insert(labels.clone());
                }
            }
        },
    )
    .await
    .map_err(AppError::Prometheus)?;
    one_cluster("gpu-ledger", reporting_labels.iter())?;
    let reported = showback::reported_by_every_shard(&per_shard);
    let claimed = gpu_seconds_by_namespace(
        client,
        &grid,
        "gpu_ledger_gpu_seconds_claimed_total",
        &mut progress,
    )
    .await
    .map_err(AppError::Prometheus)?;
    let idle = gpu_seconds_by_namespace(
        client,
        &grid,
        "gpu_ledger_gpu_seconds_idle_total",
        &mut progress,
    )
    .await
    .map_err(AppError::Prometheus)?;
    let sel = selector("gpu_ledger_gpu_seconds_by_model_total", client);
    let mut by_model = WindowSums::new(&grid);
    stepped(
        client,
        &grid,
        &|off| {
            across_replicas(
                "namespace, model, activity",
                &format!("increase({sel}[{window}]{off})"),
            )
        },
        "gpu_ledger_gpu_seconds_by_model_total",
        &mut progress,
        &mut |answer| {
            for (labels, points) in answer.series() {
                let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
                by_model.add_series((get("namespace"), get("model"), get("activity")), points);
            }
        },
    )
    .await
    .map_err(AppError::Prometheus)?;
    let by_model = by_model
        .finish()
        .into_iter()
        .map(|((namespace, model, activity), seconds)| ModelSeconds {
            namespace,
            model,
            activity,
            seconds,
        })
        .collect();
    // The groups before the GPUs held: the peak is summed per group window by window as the
    // answers arrive, so each namespace's group must be known by then.
    let groups = groups(client, period, grouping, resolution, &mut progress).await?;
    // The most each namespace held in each window (per shard, added: at most what it held at
    // once), summed per group and window into the peaks. The range leaves out the window's
    // first second: Prometheus 2 includes a sample at the range's start, which belongs to the
    // window before (a month's first window would show the previous month's last sample).
    let sel = selector("gpu_ledger_namespace_gpus_claimed", client);
    let held_range = duration(chrono::Duration::seconds((grid.step_seconds() - 1).max(1)));
    let mut held = Held::default();
    stepped(
        client,
        &grid,
        &|off| {
            across_replicas(
                "namespace",
                &format!("max_over_time({sel}[{held_range}]{off})"),
            )
        },
        "gpu_ledger_namespace_gpus_claimed",
        &mut progress,
        &mut |answer| {
            held.begin_answer(answer.windows.clone());
            for (labels, points) in answer.series() {
                let namespace = labels.get("namespace").map_or("", String::as_str);
                let group = group_of(grouping, &groups, namespace);
                held.add_series(period, &grid, namespace, &group, points);
            }
            held.end_answer();
        },
    )
    .await
    .map_err(AppError::Prometheus)?;
    Ok(Inputs {
        claimed,
        idle,
        by_model,
        held,
        reported,
        resolution,
        groups,
    })
}

fn prices(args: &ShowbackArgs) -> Result<Prices, AppError> {
    let text = match (&args.price, &args.price_file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => {
            let len = std::fs::metadata(path)
                .map_err(|e| AppError::Config(format!("--price-file {}: {e}", path.display())))?
                .len();
            if len > MAX_PRICE_FILE_BYTES {
                return Err(AppError::Config(format!(
                    "--price-file {}: {len} bytes, more than {MAX_PRICE_FILE_BYTES}",
                    path.display()
                )));
            }
            std::fs::read_to_string(path)
                .map_err(|e| AppError::Config(format!("--price-file {}: {e}", path.display())))?
        }
        (None, None) => String::new(),
    };
    Prices::parse(&text).map_err(|e| AppError::Config(e.to_string()))
}

fn period(args: &ShowbackArgs, now: DateTime<Utc>) -> Result<Period, AppError> {
    let p = match (&args.month, args.since) {
        (Some(m), _) => Period::month(m, now),
        (None, Some(since)) => Period::new(since, args.until.unwrap_or(now), now),
        (None, None) => {
            return Err(AppError::Config("showback needs --month or --since".into()));
        }
    };
    p.map_err(|e| AppError::Config(e.to_string()))
}

/// Runs `gpu-ledger showback`.
pub async fn showback(args: ShowbackArgs) -> Result<(), AppError> {
    let now = Utc::now();
    let period = period(&args, now)?;
    let prices = prices(&args)?;
    let grouping = match (&args.group_by_label, args.group_by_profile_owner) {
        (Some(key), _) if key.trim().is_empty() => {
            return Err(AppError::Config(
                "--group-by-label needs a label key".into(),
            ));
        }
        (Some(key), _) => Grouping::Label(key.trim().to_string()),
        (None, true) => Grouping::ProfileOwner,
        (None, false) => Grouping::Namespace,
    };
    // Prometheus evaluates at most 11,000 points per series: a longer period gets a coarser step.
    let min_step = chrono::Duration::seconds(((period.seconds() / 10_000.0).ceil() as i64).max(1));
    // Whole seconds: the grid's windows end on whole seconds.
    let asked = chrono::Duration::seconds(
        args.resolution.num_seconds() + i64::from(args.resolution.subsec_nanos() != 0),
    );
    let resolution = asked.max(min_step);
    let client = prometheus_client(&args.prometheus)?.ok_or_else(|| {
        AppError::Config("showback reads gpu-ledger's counters: set --prometheus-url".into())
    })?;
    let inputs = inputs(&client, &period, &grouping, resolution, args.progress).await?;
    let result = showback::compute(&period, &grouping, &prices, &inputs, args.min_coverage)
        .map_err(|e| AppError::Config(e.to_string()))?;
    for g in &result.gaps {
        tracing::warn!(
            start = %g.start.to_rfc3339(),
            seconds = g.seconds,
            "gap in gpu-ledger's counters: use there is unknown, not zero"
        );
    }
    if !result.unpriced_models.is_empty() {
        tracing::warn!(
            models = %result.unpriced_models.join(", "),
            "GPU models without a price: cost unknown where they held GPU-hours"
        );
    }
    let text = match args.output {
        ShowbackOutput::Table => render::render_table(&result, !prices.is_empty()),
        ShowbackOutput::Csv => render::render_csv(&result),
        ShowbackOutput::Json => render::render_json(&result)
            .map_err(|e| AppError::Config(format!("encoding the showback as JSON: {e}")))?,
    };
    if let Some(path) = &args.output_file {
        std::fs::write(path, text.as_bytes())
            .map_err(|e| AppError::OutputFile(format!("--output-file {}", path.display()), e))?;
    } else {
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(AppError::Output(e));
            }
            _ => {}
        }
    }
    // Written, and marked, but a CronJob must not take it for the month's bill.
    match render::warning(&result) {
        Some(w) => Err(AppError::Partial(w)),
        None => Ok(()),
    }
}

/// The page's history from gpu-ledger's counters: per namespace and step, the mean GPUs
/// claimed, busy and idle (`rate()` of the GPU-second counters over the step).
struct PromHistory {
    client: Arc<PromClient>,
}

impl PromHistory {
    async fn points(
        &self,
        inner: &str,
        span: Span,
        now: DateTime<Utc>,
    ) -> Result<Points, PromError> {
        let q = format!(
            "({inner})[{}:{}]",
            duration(span.length()),
            duration(span.step())
        );
        Ok(self
            .client
            .instant_matrix(&q, now)
            .await?
            .into_iter()
            .map(|s| {
                (
                    label(&s, "namespace").to_string(),
                    s.time.round() as i64,
                    s.value,
                )
            })
            .collect())
    }

    async fn raw(&self, span: Span, now: DateTime<Utc>) -> Result<Raw, PromError> {
        let step = duration(span.step());
        let c = &*self.client;
        // Replicas combined as showback combines them: HA once, shards added.
        let claimed = across_replicas(
            "namespace",
            &format!(
                "rate({}[{step}])",
                selector("gpu_ledger_gpu_seconds_claimed_total", c)
            ),
        );
        let idle = across_replicas(
            "namespace",
            &format!(
                "rate({}[{step}])",
                selector("gpu_ledger_gpu_seconds_idle_total", c)
            ),
        );
        let busy = format!(
            "sum by (namespace) ({})",
            across_replicas(
                "namespace, model, activity",
                &format!(
                    "rate(gpu_ledger_gpu_seconds_by_model_total{{activity=\"busy\"{}}}[{step}])",
                    c.matchers()
                ),
            )
        );
        Ok(Raw {
            claimed: self.points(&claimed, span, now).await?,
            busy: self.points(&busy, span, now).await?,
            idle: self.points(&idle, span, now).await?,
        })
    }
}

impl HistorySource for PromHistory {
    fn fetch(&self, span: Span, now: DateTime<Utc>) -> Fetch<'_> {
        // The chain, since the page shows it: a transport error's cause is its source.
        Box::pin(async move {
            self.raw(span, now)
                .await
                .map_err(|e| crate::telemetry::error_chain(&e))
        })
    }
}

/// The page's history source over `client`.
pub fn prometheus_history(client: Arc<PromClient>) -> Arc<dyn HistorySource> {
    Arc::new(PromHistory { client })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_matchers_escape_each_name_and_stay_within_their_bound() {
        let names = vec!["team-a".to_string(), "a.b\\\"c|d".to_string()];
        assert_eq!(
            namespace_matchers(&names),
            vec![r#"team\\-a|a\\.b\\\\\"c\\|d"#.to_string()]
        );
        let many: Vec<String> = (0..3000).map(|i| format!("namespace-{i:05}")).collect();
        let chunks = namespace_matchers(&many);
        assert!(chunks.len() > 1, "{} chunks", chunks.len());
        assert!(
            chunks
                .iter()
                .all(|c| c.len() <= MAX_NAMESPACE_MATCHER_BYTES),
            "a chunk over the bound"
        );
        let back: Vec<String> = chunks
            .iter()
            .flat_map(|c| c.split('|'))
            .map(|n| n.replace("\\\\", ""))
            .collect();
        assert_eq!(back, many, "every name once, in order");
    }

    /// An answer as Prometheus 2 gives it (a step at the range's start too, which is the next
    /// query's window) yields only its own windows, each at the grid time it ends: a window at
    /// a boundary between two queries counts once.
    #[test]
    fn an_answer_yields_its_own_windows_once_at_query_boundaries() {
        let at = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .expect("time")
                .with_timezone(&Utc)
        };
        // 10:02 .. 11:02 in 5-minute windows: subquery steps on multiples of 5 minutes, so
        // the grid is shifted by 3 minutes (the offset).
        let period = Period::new(
            at("2026-11-01T10:02:00Z"),
            at("2026-11-01T11:02:00Z"),
            at("2026-12-01T00:00:00Z"),
        )
        .expect("period");
        let grid = Grid::new(&period, chrono::Duration::minutes(5));
        let shift = 180;
        let until = period.until.timestamp();
        // Two queries: windows 0..5 and 5..12. Each answer holds its windows and, as
        // Prometheus 2 answers, the step at its range's start (window 5, then 12: before the
        // period).
        let answer = |windows: std::ops::Range<i64>| {
            let values: Vec<String> = (windows.start..=windows.end)
                .rev()
                .map(|j| format!("[{},\"{}\"]", until - j * 300 + shift, 100 + j))
                .collect();
            let json = format!(
                "[{{\"metric\":{{\"namespace\":\"team-a\"}},\"values\":[{}]}}]",
                values.join(",")
            );
            serde_json::from_str::<Vec<MatrixRow>>(&json).expect("rows")
        };
        let mut seen = Vec::new();
        for windows in [0..5, 5..12] {
            let rows = answer(windows.clone());
            let a = StepAnswer {
                windows,
                rows: &rows,
                grid: &grid,
                shift,
            };
            for (labels, points) in a.series() {
                assert_eq!(labels.get("namespace").map(String::as_str), Some("team-a"));
                seen.extend(points);
            }
        }
        seen.sort_by_key(|p| p.0);
        let want: Vec<(i64, f64)> = (0..12)
            .rev()
            .map(|j| (until - j * 300, (100 + j) as f64))
            .collect();
        assert_eq!(seen, want, "every window once, at its grid end");
    }
}
