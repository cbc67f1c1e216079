//! The showback math: periods, prices, the grid, gaps, peaks and the untrusted values.

use super::*;

/// Sums per key the values of the grid's windows (`(key, Unix seconds the window ends, value)`),
/// each times its [`Grid::share`] of the period, as [`WindowSums`] does.
fn integrate<K: Ord>(
    grid: &Grid,
    points: impl IntoIterator<Item = (K, i64, f64)>,
) -> BTreeMap<K, f64> {
    let mut sums = WindowSums::new(grid);
    for (k, t, v) in points {
        sums.add_series(k, [(t, v)]);
    }
    sums.finish()
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("valid")
        .with_timezone(&Utc)
}

#[test]
fn months_are_utc_calendar_months() {
    let now = at("2026-12-02T08:00:00Z");
    let p = Period::month("2026-11", now).expect("month");
    assert_eq!(
        (p.since, p.until),
        (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"))
    );
    assert_eq!(Period::month("last", now), Ok(p));
    let jan = Period::month("last", at("2027-01-05T00:00:00Z")).expect("december");
    assert_eq!(jan.since, at("2026-12-01T00:00:00Z"));
    let this = Period::month("this", now).expect("this month");
    assert_eq!((this.since, this.until), (at("2026-12-01T00:00:00Z"), now));
    for bad in ["2026-13", "2026", "26-11", "2026-1x", "next", "2026-11-01"] {
        assert!(Period::month(bad, now).is_err(), "{bad}");
    }
    assert!(
        Period::month("2027-01", now).is_err(),
        "a month that has not started has nothing to show"
    );
}

#[test]
fn prices_match_whole_tokens_and_the_longest_key() {
    let p = Prices::parse("A100=2.10, RTX-A1000=0.25\n# comment\nH100-80GB=4 # inline\n")
        .expect("prices");
    assert_eq!(p.price_of("NVIDIA-A100-SXM4-80GB"), Ok(Some(2.10)));
    assert_eq!(p.price_of("NVIDIA-RTX-A1000"), Ok(Some(0.25)));
    assert_eq!(p.price_of("NVIDIA H100 80GB HBM3"), Ok(Some(4.0)));
    assert_eq!(
        p.price_of("NVIDIA-A10"),
        Ok(None),
        "A100 does not price an A10"
    );
    let only_a100 = Prices::parse("A100=2").expect("prices");
    assert_eq!(
        only_a100.price_of("NVIDIA-RTX-A1000"),
        Ok(None),
        "a substring is not a model"
    );
    let both = Prices::parse("A100=2,SXM4=3").expect("prices");
    assert!(matches!(
        both.price_of("NVIDIA-A100-SXM4-80GB"),
        Err(ShowbackError::AmbiguousPrice { .. })
    ));
    for bad in [
        "A100",
        "=2",
        "A100=x",
        "A100=-1",
        "A100=NaN",
        "A100=1,a100=2",
    ] {
        assert!(Prices::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn ksm_label_names_are_sanitised() {
    assert_eq!(ksm_label("label_", "team"), "label_team");
    assert_eq!(
        ksm_label("label_", "app.kubernetes.io/part-of"),
        "label_app_kubernetes_io_part_of"
    );
}

fn period() -> Period {
    Period::new(
        at("2026-11-01T00:00:00Z"),
        at("2026-11-02T00:00:00Z"),
        at("2026-12-01T00:00:00Z"),
    )
    .expect("period")
}

#[test]
fn a_shard_that_stops_and_comes_back_leaves_a_gap_one_that_starts_or_ends_does_not() {
    let windows = |r: std::ops::RangeInclusive<i64>| r.collect::<BTreeSet<i64>>();
    let per_shard = BTreeMap::from([
        // Shard 1 silent in windows 4..=5, back from 6 on.
        ("0".to_string(), windows(1..=10)),
        (
            "1".to_string(),
            windows(1..=3).union(&windows(6..=10)).copied().collect(),
        ),
    ]);
    let got = reported_by_every_shard(&per_shard);
    assert_eq!(
        got,
        windows(1..=3).union(&windows(6..=10)).copied().collect()
    );
    // Unsharded until window 5, two shards after (resharded): no window is missing.
    let resharded = BTreeMap::from([
        (String::new(), windows(1..=5)),
        ("0".to_string(), windows(6..=10)),
        ("1".to_string(), windows(6..=10)),
    ]);
    assert_eq!(reported_by_every_shard(&resharded), windows(1..=10));
    // One group (unsharded): as reported.
    let one = BTreeMap::from([(String::new(), windows(2..=4))]);
    assert_eq!(reported_by_every_shard(&one), windows(2..=4));
}

#[test]
fn gaps_are_runs_of_silent_steps() {
    let p = period();
    let start = p.since.timestamp();
    let step = 300;
    let grid = Grid::new(&p, Duration::seconds(step));
    // Reported everywhere but 06:00..12:00.
    let reported = (1..=288)
        .map(|i| start + i * step)
        .filter(|t| !(start + 6 * 3600 + step..=start + 12 * 3600).contains(t))
        .collect();
    let g = gaps(&grid, &reported);
    assert_eq!(
        g,
        vec![Gap {
            start: at("2026-11-01T06:00:00Z"),
            seconds: 6 * 3600
        }]
    );
    let none = gaps(&grid, &BTreeSet::new());
    assert_eq!(none.len(), 1);
    assert_eq!(
        none[0].seconds, 86_400,
        "nothing reported: all of it is a gap"
    );
}

#[test]
fn the_grid_ends_at_the_period_end_and_pro_rates_a_first_window_reaching_before_it() {
    // 10:07:30 .. 11:00:00 in 15-minute windows: 10:45, 10:30, 10:15 whole, 10:00..10:15
    // half inside.
    let p = Period::new(
        at("2026-11-01T10:07:30Z"),
        at("2026-11-01T11:00:00Z"),
        at("2026-12-01T00:00:00Z"),
    )
    .expect("period");
    let grid = Grid::new(&p, Duration::minutes(15));
    assert_eq!(grid.len(), 4);
    let until = p.until.timestamp();
    assert_eq!(grid.window_ending(until), Some(0));
    assert_eq!(grid.window_ending(until - 900 * 3), Some(3));
    assert_eq!(
        grid.window_ending(until - 900 * 4),
        None,
        "before the period"
    );
    assert_eq!(grid.window_ending(until - 60), None, "off the grid");
    assert!((grid.share(3) - 0.5).abs() < 1e-12);
    let sums = integrate(
        &grid,
        (0..5)
            .map(|j| ("a", until - j * 900, 900.0))
            .chain([("a", until, 900.0), ("b", until - 30, 1.0)]),
    );
    assert_eq!(
        sums,
        [("a", 3.5 * 900.0)].into(),
        "three whole windows, half of the first, the window answered twice once, off-grid and earlier points ignored"
    );
    let gap = gaps(&grid, &[until, until - 900].into());
    assert_eq!(
        gap,
        vec![Gap {
            start: p.since,
            seconds: 1350
        }],
        "the first gap is clipped to the period"
    );
}

/// A NaN held in every window (3 namespaces × 288 windows of a day) and 150 NaN claims:
/// the first 100 listed, one entry counting the rest, all still unknown.
#[test]
fn rejected_values_are_listed_up_to_a_bound_and_the_rest_counted() {
    let p = period();
    let grid = Grid::new(&p, Duration::minutes(5));
    let mut held = Held::default();
    held.begin_answer(0..grid.len());
    for n in 0..3 {
        let ns = format!("ns-{n}");
        let points: Vec<(i64, f64)> = (0..grid.len()).map(|j| (grid.end(j), f64::NAN)).collect();
        held.add_series(&p, &grid, &ns, &ns, points);
    }
    held.end_answer();
    let inputs = Inputs {
        claimed: (0..150).map(|i| (format!("c-{i}"), f64::NAN)).collect(),
        held,
        resolution: Duration::minutes(5),
        ..Inputs::default()
    };
    let s = compute(&p, &Grouping::Namespace, &Prices::default(), &inputs, 0.95).expect("compute");
    assert_eq!(s.rejected_values.len(), MAX_REJECTED_LISTED + 1);
    let last = s.rejected_values.last().expect("the count");
    let more =
        150 + 3 * usize::try_from(grid.len()).expect("a day's windows") - MAX_REJECTED_LISTED;
    assert_eq!(
        last,
        &format!("… and {more} more values that cannot be true"),
        "{:?}",
        &s.rejected_values[..3]
    );
    assert_eq!(s.total.gpu_hours_claimed, None);
    assert_eq!(s.total.peak_gpus, None);
}

/// `integrate` before answers were folded: every point kept, a window answered twice
/// keeping its last value.
fn integrate_kept(grid: &Grid, points: &[(u8, i64, f64)]) -> BTreeMap<u8, f64> {
    let mut by_window: BTreeMap<(u8, i64), f64> = BTreeMap::new();
    for (k, t, v) in points {
        if let Some(j) = grid.window_ending(*t) {
            by_window.insert((*k, j), v * grid.share(j));
        }
    }
    let mut out: BTreeMap<u8, f64> = BTreeMap::new();
    for ((k, _), v) in by_window {
        *out.entry(k).or_insert(0.0) += v;
    }
    out
}

/// The peaks before answers were folded: every (namespace, window end, GPUs) kept, summed
/// per group and window, then the largest.
#[allow(clippy::type_complexity)]
fn peaks_kept(
    period: &Period,
    held: &[(String, i64, f64)],
    group_of: &dyn Fn(&str) -> String,
) -> (
    BTreeMap<String, f64>,
    f64,
    BTreeSet<String>,
    BTreeSet<String>,
    Vec<String>,
) {
    let mut sums: BTreeMap<(String, i64), f64> = BTreeMap::new();
    let (mut unknown, mut namespaces, mut rejected) =
        (BTreeSet::new(), BTreeSet::new(), Vec::new());
    let (since, until) = (period.since.timestamp(), period.until.timestamp());
    for (ns, t, v) in held {
        if *t <= since || *t > until {
            continue;
        }
        let g = group_of(ns);
        if let Some(v) = checked(*v, MAX_GPUS) {
            *sums.entry((g, *t)).or_insert(0.0) += v;
        } else {
            rejected.push(format!("GPUs held of {ns}: {v}"));
            unknown.insert(g);
        }
        namespaces.insert(ns.clone());
    }
    let (mut by_group, mut per_t) = (BTreeMap::new(), BTreeMap::new());
    for ((g, t), v) in &sums {
        let p = by_group.entry(g.clone()).or_insert(0.0_f64);
        *p = p.max(*v);
        *per_t.entry(*t).or_insert(0.0) += v;
    }
    let total = per_t.values().copied().fold(0.0, f64::max);
    (by_group, total, unknown, namespaces, rejected)
}

fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(1.0)
}

proptest::proptest! {
    /// Folding series by series equals summing every kept point: windows anywhere in the
    /// period (the first one pro-rated), off the grid and before it, NaN and negative
    /// values, a window answered twice (with the same value: an answer repeated).
    #[test]
    fn window_sums_equal_integrating_every_point(
        raw in proptest::collection::vec(
            (0_u8..4, -3_i64..40, 0_i64..3, proptest::prop_oneof![
                8 => 0.0_f64..1e6, 1 => proptest::strategy::Just(f64::NAN),
                1 => -10.0_f64..0.0,
            ]),
            0..200,
        ),
        repeat in 0_usize..20,
    ) {
        // 10:07:30 .. 12:00 in 15-minute windows: the first one is half inside.
        let p = Period::new(
            at("2026-11-01T10:07:30Z"),
            at("2026-11-01T18:00:00Z"),
            at("2026-12-01T00:00:00Z"),
        ).expect("period");
        let grid = Grid::new(&p, Duration::minutes(15));
        let until = p.until.timestamp();
        // Window j (or a second off it when `off` is 1; 2 is on the grid too).
        let mut points: Vec<(u8, i64, f64)> = raw
            .iter()
            .map(|(k, j, off, v)| (*k, until - j * 900 - i64::from(*off == 1), *v))
            .collect();
        // One (key, window) at most once, as Prometheus answers, then `repeat` answered again.
        let mut seen = BTreeSet::new();
        points.retain(|(k, t, _)| seen.insert((*k, *t)));
        let again: Vec<_> = points.iter().take(repeat).copied().collect();
        points.extend(again);
        let want = integrate_kept(&grid, &points);
        let mut sums = WindowSums::new(&grid);
        // Series by series, as the answers arrive: each key's points in runs.
        for chunk in points.chunks(7) {
            for k in 0..4_u8 {
                sums.add_series(k, chunk.iter().filter(|p| p.0 == k).map(|p| (p.1, p.2)));
            }
        }
        let got = sums.finish();
        proptest::prop_assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
        for (k, v) in &want {
            proptest::prop_assert!(close(got[k], *v), "{}: {} != {}", k, got[k], v);
        }
    }

    /// Peaks folded answer by answer (each answer whole windows, as `stepped` asks them)
    /// equal the peaks of every kept point: per group, the total, unknown groups, the
    /// namespaces listed and the rejected values.
    #[test]
    fn held_folded_per_answer_equals_the_peaks_of_every_point(
        raw in proptest::collection::vec(
            (0_usize..6, 0_i64..32, proptest::prop_oneof![
                8 => 0.0_f64..8.0, 1 => proptest::strategy::Just(f64::NAN),
                1 => proptest::strategy::Just(-1.0),
            ]),
            0..150,
        ),
        per_answer in 1_i64..12,
    ) {
        let p = Period::new(
            at("2026-11-01T10:00:00Z"),
            at("2026-11-01T18:00:00Z"),
            at("2026-12-01T00:00:00Z"),
        ).expect("period");
        let grid = Grid::new(&p, Duration::minutes(15));
        let until = p.until.timestamp();
        let groups: BTreeMap<String, String> =
            (0..5).map(|i| (format!("ns-{i}"), format!("team-{}", i % 2))).collect();
        let grouping = Grouping::Label("team".into());
        let group = |ns: &str| group_of(&grouping, &groups, ns);
        // One value per namespace and window, as one answer of `across_replicas` gives.
        let mut seen = BTreeSet::new();
        let points: Vec<(String, i64, f64)> = raw
            .iter()
            .filter(|(n, j, _)| seen.insert((*n, *j)))
            .map(|(n, j, v)| (format!("ns-{n}"), until - j * 900, *v))
            .collect();
        // The answers, newest windows first; within one, series by namespace.
        let mut held = Held::default();
        let mut in_order = Vec::new();
        let mut first = 0;
        while first < grid.len() {
            let last = (first + per_answer).min(grid.len());
            held.begin_answer(first..last);
            for n in 0..6 {
                let ns = format!("ns-{n}");
                let series: Vec<(i64, f64)> = points
                    .iter()
                    .filter(|(s, t, _)| *s == ns
                        && grid.window_ending(*t).is_some_and(|j| (first..last).contains(&j)))
                    .map(|(_, t, v)| (*t, *v))
                    .collect();
                in_order.extend(series.iter().map(|(t, v)| (ns.clone(), *t, *v)));
                held.add_series(&p, &grid, &ns, &group(&ns), series);
            }
            held.end_answer();
            first = last;
        }
        let (by_group, total, unknown, namespaces, rejected) = peaks_kept(&p, &in_order, &group);
        proptest::prop_assert_eq!(&held.by_group, &by_group);
        proptest::prop_assert!(close(held.total, total), "{} != {}", held.total, total);
        proptest::prop_assert_eq!(&held.unknown, &unknown);
        proptest::prop_assert_eq!(&held.namespaces, &namespaces);
        proptest::prop_assert_eq!(&held.rejected, &rejected);
    }
}
