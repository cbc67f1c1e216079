//! The running reduction against the full-window one, refresh after refresh.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::usage::fields;
use crate::usage::live::SampleWindow;
use crate::usage::series::Series;

const T0: i64 = 1_800_000_000_000;
const SCRAPE_MS: i64 = 15_000;

fn window() -> Window {
    Window {
        length: chrono::Duration::minutes(10),
        interval: chrono::Duration::seconds(30),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    }
}

/// One exporter series over time: which device and field, whose labels, the scrape steps it
/// is written at, and how late each sample reaches the store.
#[derive(Debug, Clone)]
struct Stream {
    device: u8,
    field: u8,
    /// 0: device-level without pod labels; 1..=3: pod `p<n>` (a restart or a time-slice
    /// copy); 4..=5: per-process series (`pod_uid`) of pod `p<n>`.
    holder: u8,
    from_step: i64,
    steps: i64,
    /// Steps missed (a gap), as a bit mask over the first 64 steps.
    missed: u64,
    /// Per step: the value's kind (see [`value`]) and the ingestion delay in seconds.
    values: Vec<(u8, u8)>,
}

fn stream() -> impl Strategy<Value = Stream> {
    (
        0_u8..3,
        0_u8..3,
        0_u8..6,
        0_i64..40,
        1_i64..60,
        any::<u64>(),
        prop::collection::vec((0_u8..12, 0_u8..50), 60),
    )
        .prop_map(
            |(device, field, holder, from_step, steps, missed, values)| Stream {
                device,
                field,
                holder,
                from_step,
                steps,
                // Most steps are scraped: gaps are sparse runs.
                missed: missed & missed.rotate_left(7) & missed.rotate_left(19),
                values,
            },
        )
}

/// A reading of the stream's field: mostly plausible, sometimes idle, sometimes unknown.
fn value(field: &str, kind: u8) -> f64 {
    let full = if field == fields::GR_ENGINE_ACTIVE {
        1.0
    } else if field == fields::GPU_UTIL {
        100.0
    } else {
        80_000.0
    };
    match kind {
        0..=3 => 0.0,
        4 => f64::NAN,
        5 => 9.2e18,
        6 => -1.0,
        7 => full * 1.5,
        8 => full * 0.03,
        _ => full * f64::from(kind) / 12.0,
    }
}

fn labels(s: &Stream) -> Arc<BTreeMap<String, String>> {
    let mut l = BTreeMap::from([
        ("UUID".to_string(), format!("GPU-{}", s.device)),
        ("Hostname".to_string(), "node-a".to_string()),
        ("instance".to_string(), "10.0.0.1:9400".to_string()),
    ]);
    if s.holder > 0 {
        let pod = (s.holder - 1) % 3;
        l.insert("pod".into(), format!("p{pod}"));
        l.insert("namespace".into(), "ns".into());
        if s.holder >= 4 {
            l.insert("pod_uid".into(), format!("uid-{pod}"));
        }
    }
    Arc::new(l)
}

/// What Prometheus answers at `now` for `range`: every sample stamped in
/// `(now − range, now]` that has reached the store by `now`.
fn answer(streams: &[Stream], now: i64, range: i64) -> Vec<Series> {
    let names = [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED];
    streams
        .iter()
        .map(|s| {
            let name = names[usize::from(s.field)];
            let samples = (0..s.steps.min(60))
                .filter(|k| s.missed & (1 << k) == 0)
                .filter_map(|k| {
                    let (kind, delay) = s.values[usize::try_from(k).ok()?];
                    let t = T0 + (s.from_step + k) * SCRAPE_MS + i64::from(kind) * 97;
                    let seen = t + i64::from(delay) * 1_000 <= now;
                    (seen && t <= now && t > now - range).then(|| (t, value(name, kind)))
                })
                .collect();
            Series {
                name: name.to_string(),
                labels: labels(s),
                samples,
            }
        })
        .filter(|s| !s.samples.is_empty())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Refresh after refresh (gaps, late samples, a pod restarting under new labels,
    /// time-slice copies, per-process series, unknown readings, devices appearing and
    /// leaving), the running reduction equals the full-window reduction of what is held.
    #[test]
    fn the_running_reduction_equals_the_full_window_reduction(
        streams in prop::collection::vec(stream(), 1..8),
        steps in prop::collection::vec(3_i64..90, 1..40),
    ) {
        let window = window();
        let length = window.length.num_milliseconds();
        let mut held = SampleWindow::default();
        let mut running = RunningReduction::default();
        let mut now = T0;
        let mut previous: Option<i64> = None;
        for step in steps {
            now += step * 1_000;
            // As the live refresh asks: the whole window first, then since the previous
            // refresh with two intervals of overlap.
            let range = previous.map_or(length, |p| (now - p + 2 * 30_000).min(length));
            held.absorb(answer(&streams, now, range), now - length);
            previous = Some(now);
            let at = DateTime::from_timestamp_millis(now).expect("a time");
            let incremental = running.reduce(&held, SchemeChoice::Auto, &window, at);
            let scheme = LabelScheme::detect(SchemeChoice::Auto, held.label_names());
            let full = series::reduce(held.series(), &scheme, &window, at);
            prop_assert_eq!(incremental, full, "at {}", now - T0);
        }
    }
}

#[test]
fn the_grouping_is_worked_out_again_only_when_a_series_comes_or_goes() {
    let window = window();
    let s = |pod: &str, t: i64| Series {
        name: fields::GPU_UTIL.to_string(),
        labels: Arc::new(BTreeMap::from([
            ("UUID".to_string(), "GPU-0".to_string()),
            ("pod".to_string(), pod.to_string()),
            ("namespace".to_string(), "ns".to_string()),
        ])),
        samples: vec![(t, 50.0)],
    };
    let at = |t: i64| DateTime::from_timestamp_millis(t).expect("a time");
    let mut held = SampleWindow::default();
    let mut running = RunningReduction::default();
    held.absorb(vec![s("a", T0)], T0 - 600_000);
    running.reduce(&held, SchemeChoice::Auto, &window, at(T0));
    // A new sample of a held series: same layout.
    held.absorb(vec![s("a", T0 + 15_000)], T0 + 15_000 - 600_000);
    assert!(running.is_current(&held, SchemeChoice::Auto));
    // Another choice of scheme, a new series, a reset window: worked out again.
    assert!(!running.is_current(&held, SchemeChoice::Legacy));
    held.absorb(vec![s("b", T0 + 30_000)], T0 + 30_000 - 600_000);
    assert!(!running.is_current(&held, SchemeChoice::Auto));
    let both = running.reduce(&held, SchemeChoice::Auto, &window, at(T0 + 30_000));
    assert_eq!(
        both[0].workloads.len(),
        1,
        "only the newest series holds the card"
    );
    assert!(running.is_current(&held, SchemeChoice::Auto));
    assert!(!running.is_current(&SampleWindow::default(), SchemeChoice::Auto));
}
