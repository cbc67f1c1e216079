//! Coverage and idle duration come from the samples' own timestamps, whatever the DCGM scrape
//! interval (issue 36, item 3): for every interval from 1 s to 5 min, with and without jitter, a
//! missed scrape, and less history than the window, neither the live path (samples held by
//! [`SampleWindow`] across refreshes, reduced, folded into the [`History`]) nor the offline path
//! (a timestamped dump read by [`dump::load`]) claims more than the samples prove, and both
//! agree on whether the GPU is proven idle.
//!
//! What the samples prove: a reading at `t` vouches for one sample interval up to it, so the
//! oldest sample `o` of an unbroken run proves the GPU's state since `o − interval` and no
//! earlier. Coverage × window can then be at most `now − (o − interval)`, and the covered run
//! (idle duration is measured from it) can start no earlier than `o − interval`.
//!
//! Pure: no Prometheus, no cluster (the live test against a real Prometheus is in
//! `tests/prometheus_usage.rs`, the report's in `tests/fast_scrapes_live.rs`).

use std::fmt::Write as _;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use gpu_ledger::ledger::usage::{DeviceUsage, Window};
use gpu_ledger::usage::LabelScheme;
use gpu_ledger::usage::dump::{self, DumpSettings};
use gpu_ledger::usage::fields;
use gpu_ledger::usage::history::History;
use gpu_ledger::usage::live::SampleWindow;
use gpu_ledger::usage::scheme::SchemeChoice;
use gpu_ledger::usage::series::{self, Series};

/// Every interval the issue names: 1 s to 5 min.
const INTERVALS_SECS: [i64; 9] = [1, 2, 5, 10, 15, 30, 60, 120, 300];
const WINDOW_SECS: i64 = 600;
/// The live default of `--scrape-interval` (the fallback for a series that cannot show its own).
const CONFIGURED_SECS: i64 = 30;
const MIN_COVERAGE: f64 = 0.9;
const NOW_MS: i64 = 1_700_000_000_000;

fn window() -> Window {
    Window {
        length: Duration::seconds(WINDOW_SECS),
        interval: Duration::seconds(CONFIGURED_SECS),
        idle_threshold: 0.05,
        max_staleness: Duration::minutes(2),
    }
}

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).expect("valid time")
}

/// How the samples of one case are laid out.
#[derive(Debug, Clone, Copy)]
struct Case {
    interval_secs: i64,
    /// History held, ending at the newest sample.
    span_secs: i64,
    /// Up to ±2 % of the interval on every sample time.
    jitter: bool,
    /// One scrape missed in the middle of the history.
    missed: bool,
}

/// Sample times (ms, ascending) of an idle GPU scraped as `case` says, the newest at `NOW_MS`.
fn times(case: Case) -> Vec<i64> {
    let i = case.interval_secs * 1000;
    let n = (case.span_secs * 1000 / i).max(1);
    let mut out: Vec<i64> = (0..n)
        .map(|k| {
            let jitter = if case.jitter && k > 0 {
                // Deterministic, ±2 % of the interval.
                let r = (k.wrapping_mul(2_654_435_761) % 41) - 20;
                r * i / 1000
            } else {
                0
            };
            NOW_MS - k * i + jitter
        })
        .collect();
    if case.missed && n > 2 {
        out.remove((n / 2) as usize);
    }
    out.reverse();
    out
}

fn labels() -> Arc<series::Labels> {
    Arc::new(
        [
            ("UUID", "GPU-a"),
            ("Hostname", "node-1"),
            ("pod", "nb-0"),
            ("namespace", "team-ml"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect(),
    )
}

/// Both utilisation fields of the GPU, idle, at `times`.
fn device_series(times: &[i64]) -> Vec<Series> {
    [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL]
        .into_iter()
        .map(|name| Series {
            name: name.to_string(),
            labels: labels(),
            samples: times.iter().map(|t| (*t, 0.0)).collect(),
        })
        .collect()
}

/// The live path as `serve` runs it: a refresh every `refresh_secs` from the first sample on,
/// each absorbing what Prometheus holds by then (the window's range) and folding the reduction
/// into the history; the device as the last refresh (at `NOW_MS`) publishes it.
fn live(times: &[i64], refresh_secs: i64) -> DeviceUsage {
    let w = window();
    let mut held = SampleWindow::default();
    let mut history = History::default();
    let first = times.first().copied().expect("a sample");
    let mut refreshes: Vec<i64> = (first..NOW_MS)
        .step_by(usize::try_from(refresh_secs * 1000).expect("a positive step"))
        .collect();
    refreshes.push(NOW_MS);
    let mut last = None;
    for now in refreshes {
        let keep_after = now - WINDOW_SECS * 1000;
        let fresh: Vec<i64> = times
            .iter()
            .copied()
            .filter(|t| *t <= now && *t > keep_after)
            .collect();
        held.absorb(device_series(&fresh), keep_after);
        let scheme = LabelScheme::default();
        let mut devices = series::reduce(held.series(), &scheme, &w, at(now));
        history.merge(&mut devices, &w, MIN_COVERAGE, at(now));
        last = devices.into_iter().next();
    }
    last.expect("the device")
}

/// The offline path: the same samples as a timestamped dump, read by `report --from`.
fn offline(times: &[i64]) -> DeviceUsage {
    let mut text = String::new();
    for name in [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL] {
        for t in times {
            writeln!(
                text,
                "{name}{{UUID=\"GPU-a\",Hostname=\"node-1\",pod=\"nb-0\",namespace=\"team-ml\"}} 0 {t}"
            )
            .expect("write to string");
        }
    }
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("dcgm.prom");
    std::fs::write(&path, text).expect("write dump");
    let settings = DumpSettings {
        at: Some(at(NOW_MS)),
        window: Duration::seconds(WINDOW_SECS),
        scrape_interval: None,
        scheme: SchemeChoice::Auto,
        idle_threshold: 0.05,
        max_staleness: Duration::minutes(2),
        max_bytes: dump::DEFAULT_MAX_DUMP_BYTES,
        selector: None,
    };
    let loaded = dump::load(&path, &settings, at(NOW_MS)).expect("dump loads");
    loaded.usage.devices.into_iter().next().expect("the device")
}

/// The checks every case must pass; `what` names the case and path.
fn assert_within_proof(d: &DeviceUsage, times: &[i64], case: Case, what: &str) {
    let i_ms = case.interval_secs * 1000;
    let oldest = times.first().copied().expect("a sample");
    // What the timestamps prove: back to one interval (with jitter, its upper bound) before the
    // oldest sample of the run.
    let slack = if case.jitter { i_ms / 50 + 1 } else { 0 };
    let proven_since = oldest - i_ms - slack;
    let proven_ms = (NOW_MS - proven_since).min(WINDOW_SECS * 1000);
    let claimed_ms = d.coverage * (WINDOW_SECS * 1000) as f64;
    assert!(
        claimed_ms <= proven_ms as f64 + 1.0,
        "{what}: coverage {:.3} claims {:.0} s of the {WINDOW_SECS} s window, the samples prove {:.0} s",
        d.coverage,
        claimed_ms / 1000.0,
        proven_ms as f64 / 1000.0
    );
    let since = d
        .covered_since
        .expect("a covered run start")
        .timestamp_millis();
    assert!(
        since >= proven_since,
        "{what}: covered (and so idle) since {} s before now, the samples prove {} s",
        (NOW_MS - since) / 1000,
        (NOW_MS - proven_since) / 1000
    );
}

#[test]
fn coverage_and_idle_duration_never_exceed_what_the_timestamps_prove() {
    let mut cases = Vec::new();
    for interval_secs in INTERVALS_SECS {
        // Less history than the window (the 143 s among them), about the window, more.
        for span_secs in [143, 2 * interval_secs, 300, 599, 610, 900, 3600] {
            for (jitter, missed) in [(false, false), (true, false), (false, true)] {
                cases.push(Case {
                    interval_secs,
                    span_secs: span_secs.max(interval_secs),
                    jitter,
                    missed,
                });
            }
        }
    }
    for case in cases {
        let t = times(case);
        let what = format!("{case:?}, {} samples", t.len());
        let off = offline(&t);
        assert_within_proof(&off, &t, case, &format!("offline, {what}"));
        for refresh_secs in [10, 30] {
            let on = live(&t, refresh_secs);
            let what = format!("live (refresh every {refresh_secs} s), {what}");
            assert_within_proof(&on, &t, case, &what);
            assert!(
                (on.coverage - off.coverage).abs() <= 0.05,
                "{what}: live coverage {:.3}, offline {:.3}",
                on.coverage,
                off.coverage
            );
            assert_eq!(
                on.coverage >= MIN_COVERAGE,
                off.coverage >= MIN_COVERAGE,
                "{what}: live and offline disagree on whether the window is covered ({:.3} vs {:.3})",
                on.coverage,
                off.coverage
            );
        }
    }
}

/// The rule must not make idleness unprovable: a GPU scraped steadily (any interval up to half
/// the window, with jitter) for longer than the window is covered on both paths, and the live
/// history proves it idle for the window.
#[test]
fn a_steadily_scraped_window_is_covered_at_every_interval() {
    for interval_secs in INTERVALS_SECS {
        for jitter in [false, true] {
            let case = Case {
                interval_secs,
                span_secs: 3600,
                jitter,
                missed: false,
            };
            let t = times(case);
            let off = offline(&t);
            let on = live(&t, 30);
            for (d, path) in [(&off, "offline"), (&on, "live")] {
                assert!(
                    d.coverage >= MIN_COVERAGE,
                    "{path}, {case:?}: coverage {:.3}",
                    d.coverage
                );
            }
            let since = on.covered_since.expect("covered").timestamp_millis();
            assert!(
                NOW_MS - since >= WINDOW_SECS * 1000 * 9 / 10,
                "live, {case:?}: covered only {} s",
                (NOW_MS - since) / 1000
            );
        }
    }
}

/// The case: 5 s scrapes, 143 s of samples, a 10-minute window. Neither path may call
/// the window covered, and the live history's run starts no earlier than the samples do.
#[test]
fn five_second_scrapes_over_143_seconds_prove_no_ten_minute_window() {
    let case = Case {
        interval_secs: 5,
        span_secs: 143,
        jitter: false,
        missed: false,
    };
    let t = times(case);
    for (d, path) in [(live(&t, 30), "live"), (offline(&t), "offline")] {
        assert!(
            d.coverage < MIN_COVERAGE,
            "{path}: coverage {:.3} from {} samples over 143 s",
            d.coverage,
            t.len()
        );
        let since = d.covered_since.expect("covered").timestamp_millis();
        assert!(
            NOW_MS - since <= 150_000,
            "{path}: covered since {} s ago",
            (NOW_MS - since) / 1000
        );
    }
}

/// A series with a single sample cannot show its spacing: the configured interval stands in,
/// and the claim stays within what one sample and that interval allow (never the window).
#[test]
fn a_lone_sample_falls_back_to_the_configured_interval_and_claims_little() {
    let t = [NOW_MS];
    let d = live(&t, 30);
    assert!(
        d.coverage <= 2.0 * CONFIGURED_SECS as f64 / WINDOW_SECS as f64 + 1e-9,
        "coverage {:.3} from one sample",
        d.coverage
    );
    assert!(d.coverage < MIN_COVERAGE);
}
