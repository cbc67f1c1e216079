//! Idle history kept across refreshes, and rebuilt at bounded cost after a restart.
//!
//! A refresh only sees its window (minutes); "idle since" and "covered since" need hours. At
//! start-up the live source (`live::bootstrap`, the bootstrap's one home) asks
//! Prometheus once over the lookback, in buckets (one query, 8 s at 4,000 GPUs with half an hour
//! of data, more with a full lookback; times err late by up to one bucket, never early), builds
//! the history from the answer here ([`History::from_bootstrap_rows`], pure), runs it beside the
//! first refreshes and folds it in with [`History::absorb`]. Afterwards [`History::merge`]
//! keeps both up to date from each refresh (pure, no I/O), which also lets a refresh scan
//! activity only since the previous one.
//!
//! Rules per device, keyed by [`DeviceKey`] (UUID and GPU instance; never the host label, which
//! may name the exporter pod and change when it restarts):
//! * `last_active_at` only moves forward: max(history, this refresh), over every utilisation
//!   signal (a busy `GPU_UTIL` counts even where `GR_ENGINE_ACTIVE` reads 0).
//! * `covered_since` holds while every refresh has coverage ≥ `min_coverage`; a refresh below it
//!   (a gap: missing data proves nothing) resets it to `now`. A refresh with enough coverage proves
//!   its own window, so `covered_since` is at most `now − window × coverage`; refreshes further
//!   apart than that break the chain.
//! * Entries unseen for longer than the lookback are dropped.
//! * The start-up query judges buckets and runs at `window.interval`, which the live source sets
//!   to the shortest sample interval the window's samples show (`--scrape-interval` only before
//!   any sample is held), so a fast scrape is never judged at a slower assumed one. A refresh's
//!   coverage is already measured at each device's own interval (`series`), so `now − window ×
//!   coverage` never reaches before what its samples prove.
//! * Times come from Prometheus: a bootstrap time the query cannot produce (before the lookback,
//!   allowing one window and Prometheus' 5-minute lookback delta, or after `now`) proves no
//!   covered run, and activity stamped after `now` counts as activity at `now`. Instant
//!   arithmetic saturates at chrono's range instead of panicking.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::prom::{FIELD_LABEL, STAT_LABEL, Sample};
use super::scheme::LabelScheme;
use crate::ledger::usage::{DeviceKey, DeviceUsage, Window};

/// Default lookback of the start-up query.
pub const DEFAULT_LOOKBACK: chrono::Duration = chrono::Duration::hours(24);

/// Prometheus' default lookback delta: how far before an evaluation step `timestamp(f)` may reach.
const LOOKBACK_DELTA: chrono::Duration = chrono::Duration::minutes(5);

/// `t - d`, or the earliest instant chrono represents.
fn minus(t: DateTime<Utc>, d: chrono::Duration) -> DateTime<Utc> {
    t.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A device of the history.
pub type HistoryKey = DeviceKey;

/// What is remembered about one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub last_active_at: Option<DateTime<Utc>>,
    pub covered_since: Option<DateTime<Utc>>,
    /// Last refresh (or bootstrap) that saw the device.
    pub last_seen: DateTime<Utc>,
}

/// Per-device idle history.
#[derive(Debug, Clone)]
pub struct History {
    entries: BTreeMap<HistoryKey, Entry>,
    lookback: chrono::Duration,
}

impl Default for History {
    fn default() -> Self {
        Self::new(DEFAULT_LOOKBACK)
    }
}

fn secs(v: f64) -> Option<DateTime<Utc>> {
    if v.is_finite() {
        DateTime::from_timestamp_millis((v * 1000.0).round() as i64)
    } else {
        None
    }
}

impl History {
    /// An empty history that forgets devices unseen for longer than `lookback`.
    pub fn new(lookback: chrono::Duration) -> Self {
        Self {
            entries: BTreeMap::new(),
            lookback,
        }
    }

    /// Builds the history from the answer to [`queries::bootstrap_query`] (pure).
    ///
    /// Per device, every utilisation field counts: the last activity is the newest on any field,
    /// and the covered run is where every field's run overlaps (the latest start). A field's run
    /// starts at the first sample after its newest break (or its first sample); it is trusted
    /// only when the samples since the first one cover at least `min_coverage` of the expected
    /// count, otherwise the device is covered from `now` only.
    pub fn from_bootstrap_rows(
        rows: &[Sample],
        scheme: &LabelScheme,
        window: &Window,
        lookback: chrono::Duration,
        min_coverage: f64,
        now: DateTime<Utc>,
    ) -> Self {
        // device → field → stat → value
        let mut by: BTreeMap<HistoryKey, BTreeMap<String, BTreeMap<String, f64>>> = BTreeMap::new();
        for s in rows {
            let (Some(uuid), Some(stat), Some(field)) = (
                s.labels.get(scheme.uuid),
                s.labels.get(STAT_LABEL),
                s.labels.get(FIELD_LABEL),
            ) else {
                continue;
            };
            let key = DeviceKey {
                uuid: uuid.clone(),
                gpu_instance: s.labels.get(scheme.gpu_instance).cloned(),
            };
            by.entry(key)
                .or_default()
                .entry(field.clone())
                .or_default()
                .insert(stat.clone(), s.value);
        }
        let mut h = Self::new(lookback);
        // Earliest time the bootstrap query can answer (buckets are at most one window wide).
        let earliest = minus(minus(minus(now, lookback), window.length), LOOKBACK_DELTA);
        let possible = |t: &DateTime<Utc>| *t >= earliest && *t <= now;
        let interval_ms = window.interval.num_milliseconds().max(1) as f64;
        for (key, fields) in by {
            let mut last_active_at = None;
            let mut run_start: Option<DateTime<Utc>> = None;
            let mut trusted = true;
            for stats in fields.values() {
                let get = |n: &str| stats.get(n).copied().and_then(secs);
                let active = |n: &str| get(n).map(|t| t.min(now)).filter(|t| *t >= earliest);
                last_active_at = last_active_at
                    .max(active("active"))
                    .max(active("active_now"));
                let first = get("first");
                let gap_end = get("gap_end");
                run_start = run_start.max(first.max(gap_end));
                let count = stats.get("count").copied().unwrap_or(0.0);
                trusted &=
                    first.is_some_and(|t| possible(&t)) && gap_end.is_none_or(|t| possible(&t));
                trusted &= first.is_some_and(|f| {
                    let expected = ((now - f).num_milliseconds() as f64 / interval_ms)
                        .floor()
                        .max(1.0);
                    (count / expected).min(1.0) >= min_coverage
                });
            }
            let covered_since = if trusted {
                run_start.map(|t| t.min(now))
            } else {
                Some(now)
            };
            h.entries.insert(
                key,
                Entry {
                    last_active_at,
                    covered_since,
                    last_seen: now,
                },
            );
        }
        h
    }

    /// Entry of one device.
    pub fn get(&self, key: &DeviceKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Folds one refresh into the history and writes `last_active_at` / `covered_since` back into
    /// `devices` (pure).
    pub fn merge(
        &mut self,
        devices: &mut [DeviceUsage],
        window: &Window,
        min_coverage: f64,
        now: DateTime<Utc>,
    ) {
        for d in devices.iter_mut() {
            let key = d.key.clone();
            let prev = self.entries.get(&key).copied();
            let last_active_at = prev.and_then(|e| e.last_active_at).max(d.last_active_at);
            let covered_since = if d.coverage >= min_coverage {
                // This refresh proves (at least) the covered part of its own window.
                let proven_ms =
                    (window.length.num_milliseconds() as f64 * d.coverage.min(1.0)) as i64;
                let proven = minus(now, chrono::Duration::milliseconds(proven_ms));
                match prev {
                    // The chain holds only if the previous refresh lies inside what this one proves.
                    Some(e) if e.last_seen >= proven => {
                        e.covered_since.map_or(proven, |c| c.min(proven))
                    }
                    _ => proven,
                }
            } else {
                now
            };
            self.entries.insert(
                key,
                Entry {
                    last_active_at,
                    covered_since: Some(covered_since),
                    last_seen: now,
                },
            );
            d.last_active_at = last_active_at;
            d.covered_since = Some(covered_since);
        }
        let horizon = minus(now, self.lookback);
        self.entries.retain(|_, e| e.last_seen >= horizon);
    }

    /// Folds in a start-up history that answered after refreshes had already begun (`serve` runs
    /// the slow bootstrap beside them). Last activity is the later of both. The refreshes' covered
    /// run extends the bootstrap's only when it began no later than the bootstrap's instant, so
    /// nothing unproven lies between them; a run broken since then stands as it is.
    pub fn absorb(&mut self, boot: History) {
        for (key, b) in boot.entries {
            match self.entries.get_mut(&key) {
                None => {
                    self.entries.insert(key, b);
                }
                Some(e) => {
                    e.last_active_at = e.last_active_at.max(b.last_active_at);
                    if let (Some(ours), Some(theirs)) = (e.covered_since, b.covered_since)
                        && ours <= b.last_seen
                    {
                        e.covered_since = Some(ours.min(theirs));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::series::Labels;

    const T0: i64 = 1_700_000_000;

    fn at(offset_s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(T0 + offset_s, 0).expect("time")
    }

    fn window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    fn device(uuid: &str, coverage: f64, last_active: Option<i64>) -> DeviceUsage {
        DeviceUsage {
            key: DeviceKey {
                uuid: uuid.into(),
                gpu_instance: None,
            },
            hostname: Some("h".into()),
            exporter: None,
            instance: None,
            model: None,
            mig_profile: None,
            mig_uuid: None,
            workloads: vec![],
            per_pod_utilization: vec![],
            per_pod_memory_bytes: Vec::new(),
            per_pod_windows: Vec::new(),
            signal: None,
            utilization: Some(0.0),
            peak: Some(0.0),
            coverage,
            last_sample_at: None,
            memory_used_bytes: None,
            last_active_at: last_active.map(at),
            covered_since: None,
        }
    }

    #[test]
    fn new_device_with_full_coverage_is_covered_for_the_window() {
        let mut h = History::default();
        let mut d = vec![device("a", 1.0, None)];
        h.merge(&mut d, &window(), 0.95, at(0));
        assert_eq!(d[0].covered_since, Some(at(-600)));
        assert_eq!(d[0].last_active_at, None);
        let mut d = vec![device("b", 0.5, None)];
        h.merge(&mut d, &window(), 0.95, at(0));
        assert_eq!(
            d[0].covered_since,
            Some(at(0)),
            "partial coverage proves nothing"
        );
    }

    #[test]
    fn covered_since_holds_then_resets_on_a_gap() {
        let mut h = History::default();
        let w = window();
        let mut d = vec![device("a", 1.0, None)];
        h.merge(&mut d, &w, 0.95, at(0));
        for i in 1..=10 {
            let mut d = vec![device("a", 1.0, None)];
            h.merge(&mut d, &w, 0.95, at(i * 30));
            assert_eq!(d[0].covered_since, Some(at(-600)), "holds at refresh {i}");
        }
        let mut d = vec![device("a", 0.5, None)];
        h.merge(&mut d, &w, 0.95, at(400));
        assert_eq!(d[0].covered_since, Some(at(400)), "a gap resets");
        // Once the window is fully covered again, the run is proven back to the window start.
        let mut d = vec![device("a", 1.0, None)];
        h.merge(&mut d, &w, 0.95, at(1100));
        assert_eq!(d[0].covered_since, Some(at(500)));
        let mut d = vec![device("a", 1.0, None)];
        h.merge(&mut d, &w, 0.95, at(1130));
        assert_eq!(
            d[0].covered_since,
            Some(at(500)),
            "never moves later while covered"
        );
    }

    #[test]
    fn last_active_is_monotonic() {
        let mut h = History::default();
        let w = window();
        let mut d = vec![device("a", 1.0, Some(-100))];
        h.merge(&mut d, &w, 0.95, at(0));
        assert_eq!(d[0].last_active_at, Some(at(-100)));
        // Refresh whose window no longer holds the active sample.
        let mut d = vec![device("a", 1.0, None)];
        h.merge(&mut d, &w, 0.95, at(1000));
        assert_eq!(d[0].last_active_at, Some(at(-100)));
        // An older value never wins.
        let mut d = vec![device("a", 1.0, Some(-500))];
        h.merge(&mut d, &w, 0.95, at(1030));
        assert_eq!(d[0].last_active_at, Some(at(-100)));
        let mut d = vec![device("a", 1.0, Some(1040))];
        h.merge(&mut d, &w, 0.95, at(1060));
        assert_eq!(d[0].last_active_at, Some(at(1040)));
    }

    #[test]
    fn devices_are_keyed_by_uuid_not_host_and_forgotten_after_lookback() {
        let mut h = History::new(chrono::Duration::hours(1));
        let w = window();
        let mut d = vec![device("a", 1.0, Some(0))];
        h.merge(&mut d, &w, 0.95, at(0));
        // The exporter restarted: its pod name (the host label without NODE_NAME) changed.
        let mut other = device("a", 1.0, None);
        other.hostname = Some("nvidia-dcgm-exporter-x7k2p".into());
        let mut d = vec![other];
        h.merge(&mut d, &w, 0.95, at(30));
        assert_eq!(
            d[0].last_active_at,
            Some(at(0)),
            "the same UUID is the same device whatever the host label says"
        );
        assert_eq!(h.len(), 1);
        let mut d = vec![device("b", 1.0, None)];
        h.merge(&mut d, &w, 0.95, at(3700));
        assert_eq!(h.len(), 1);
        assert!(
            h.get(&DeviceKey {
                uuid: "a".into(),
                gpu_instance: None
            })
            .is_none()
        );
    }

    fn row(uuid: &str, field: &str, stat: &str, v: f64) -> Sample {
        let labels: Labels = [
            ("UUID", uuid),
            ("Hostname", "h"),
            (FIELD_LABEL, field),
            (STAT_LABEL, stat),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
        Sample {
            labels,
            time: T0 as f64,
            value: v,
        }
    }

    #[test]
    fn restart_bootstrap_then_merge() {
        let now = at(0);
        let ts = |s: i64| (T0 + s) as f64;
        let rows = vec![
            // a: GR_ENGINE_ACTIVE for 24 h, active 3 h ago, unbroken.
            row("a", "gr", "active", ts(-3 * 3600)),
            row("a", "gr", "first", ts(-24 * 3600)),
            row("a", "gr", "gap_end", ts(-24 * 3600)),
            row("a", "gr", "count", 2880.0),
            // Its GPU_UTIL was busy a minute ago: every signal counts.
            row("a", "util", "active", ts(-60)),
            row("a", "util", "first", ts(-24 * 3600)),
            row("a", "util", "gap_end", ts(-24 * 3600)),
            row("a", "util", "count", 2880.0),
            // b: GPU_UTIL only, a break 2 h ago.
            row("b", "util", "first", ts(-10 * 3600)),
            row("b", "util", "gap_end", ts(-2 * 3600)),
            row("b", "util", "count", 1100.0),
            // c: sparse data: untrusted.
            row("c", "gr", "first", ts(-10 * 3600)),
            row("c", "gr", "count", 100.0),
        ];
        let w = window();
        let mut h = History::from_bootstrap_rows(
            &rows,
            &LabelScheme::default(),
            &w,
            DEFAULT_LOOKBACK,
            0.9,
            now,
        );
        let key = |u: &str| DeviceKey {
            uuid: u.into(),
            gpu_instance: None,
        };
        let dev_a = *h.get(&key("a")).expect("a");
        assert_eq!(dev_a.last_active_at, Some(at(-60)));
        assert_eq!(dev_a.covered_since, Some(at(-24 * 3600)));
        let dev_b = *h.get(&key("b")).expect("b");
        assert_eq!(dev_b.last_active_at, None);
        assert_eq!(dev_b.covered_since, Some(at(-2 * 3600)));
        assert_eq!(h.get(&key("c")).expect("c").covered_since, Some(now));
        // First refresh after the restart keeps the bootstrapped history.
        let mut d = vec![device("a", 1.0, None), device("b", 0.4, None)];
        h.merge(&mut d, &w, 0.9, at(30));
        assert_eq!(d[0].last_active_at, Some(at(-60)));
        assert_eq!(d[0].covered_since, Some(at(-24 * 3600)));
        assert_eq!(d[1].covered_since, Some(at(30)));
    }

    #[test]
    fn a_late_bootstrap_extends_unbroken_runs_only() {
        let now = at(0);
        let ts = |s: i64| (T0 + s) as f64;
        let boot_rows = vec![
            // a and b: covered and idle for 5 h before the bootstrap's instant; a active 4 h ago.
            row("a", "gr", "active", ts(-4 * 3600)),
            row("a", "gr", "first", ts(-5 * 3600)),
            row("a", "gr", "count", 600.0),
            row("b", "gr", "first", ts(-5 * 3600)),
            row("b", "gr", "count", 600.0),
            // c: only in the bootstrap (no refresh has seen it yet).
            row("c", "gr", "first", ts(-5 * 3600)),
            row("c", "gr", "count", 600.0),
        ];
        let w = window();
        let boot = History::from_bootstrap_rows(
            &boot_rows,
            &LabelScheme::default(),
            &w,
            DEFAULT_LOOKBACK,
            0.9,
            now,
        );
        // Refreshes ran while the bootstrap was slow: a unbroken, b broken by a gap at +60 s.
        let mut h = History::default();
        let mut d = vec![device("a", 1.0, Some(-30)), device("b", 1.0, None)];
        h.merge(&mut d, &w, 0.9, at(30));
        let mut d = vec![device("a", 1.0, None), device("b", 0.2, None)];
        h.merge(&mut d, &w, 0.9, at(60));
        h.absorb(boot);
        let key = |u: &str| DeviceKey {
            uuid: u.into(),
            gpu_instance: None,
        };
        let a = *h.get(&key("a")).expect("a");
        assert_eq!(a.last_active_at, Some(at(-30)), "the later activity wins");
        assert_eq!(
            a.covered_since,
            Some(at(-5 * 3600)),
            "unbroken run extends back"
        );
        let b = *h.get(&key("b")).expect("b");
        assert_eq!(
            b.covered_since,
            Some(at(60)),
            "a gap after the bootstrap stands"
        );
        let c = *h.get(&key("c")).expect("c");
        assert_eq!(c.covered_since, Some(at(-5 * 3600)));
        assert_eq!(c.last_seen, now);
    }

    #[test]
    fn impossible_bootstrap_times_prove_nothing_and_extreme_instants_do_not_panic() {
        let now = at(0);
        let ts = |s: i64| (T0 + s) as f64;
        let rows = vec![
            // A run that "began" 31 years ago, far outside the lookback the query reads.
            row("a", "gr", "first", ts(-1_000_000_000)),
            row("a", "gr", "gap_end", ts(-1_000_000_000)),
            row("a", "gr", "count", 1e12),
            // Activity stamped a day ahead counts as activity now, not later.
            row("b", "gr", "active", ts(86_400)),
            row("b", "gr", "first", ts(-3600)),
            row("b", "gr", "count", 120.0),
            // Times no clock can show.
            row("c", "gr", "active", f64::MAX),
            row("c", "gr", "first", -f64::MAX),
            row("c", "gr", "gap_end", f64::NAN),
            row("c", "gr", "count", f64::INFINITY),
        ];
        let w = window();
        let h = History::from_bootstrap_rows(
            &rows,
            &LabelScheme::default(),
            &w,
            DEFAULT_LOOKBACK,
            0.9,
            now,
        );
        let key = |u: &str| DeviceKey {
            uuid: u.into(),
            gpu_instance: None,
        };
        assert_eq!(h.get(&key("a")).expect("a").covered_since, Some(now));
        let b = h.get(&key("b")).expect("b");
        assert_eq!(b.last_active_at, Some(now));
        assert_eq!(b.covered_since, Some(at(-3600)));
        let c = h.get(&key("c")).expect("c");
        assert_eq!(c.covered_since, Some(now));
        assert_eq!(c.last_active_at, None);
        // Merging at the ends of time must not panic (chrono's `-` does on overflow).
        for now in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
            let mut h = History::default();
            let mut d = vec![device("x", 1.0, None)];
            d[0].last_active_at = Some(DateTime::<Utc>::MIN_UTC);
            h.merge(&mut d, &w, 0.9, now);
            h.merge(&mut d, &w, 0.9, now);
            assert_eq!(h.len(), 1);
        }
    }
}
