//! `gpu-ledger showback` against a REAL Prometheus 2.42 holding 31 days of gpu-ledger's own
//! series, written with `promtool tsdb create-blocks-from openmetrics`: a counter reset (a quick
//! restart), a 6 h gap (gpu-ledger down, then restarted: another reset), a namespace that
//! appears late, a burst for the peak, HA replica duplicates, MIG and time-sliced holders in GPU
//! equivalents (as the ledger's counters already count them), and kube-state-metrics'
//! namespace labels and annotations for grouping. Every number is computed by hand below.
//!
//! SYNTHETIC DATA, shaped like gpu-ledger's exposition (src/export/collector.rs, docs/metrics.md)
//! and kube-state-metrics' `kube_namespace_labels{label_<key>}` /
//! `kube_namespace_annotations{annotation_<key>}` (kube-state-metrics docs/developer/cli-arguments.md,
//! `--metric-labels-allowlist`, `--metric-annotations-allowlist`). The `owner` annotation is the
//! one Kubeflow's Profile controller writes on a Profile's namespace
//! (kubeflow/kubeflow components/profile-controller/controllers/profile_controller.go:
//! `Annotations: map[string]string{"owner": instance.Spec.Owner.Name}`).
//!
//! Never skips: a missing Prometheus or promtool fails with what to install.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use gpu_ledger_testkit::Prometheus;

/// gpu-ledger's counters as Prometheus scraped them: every 5 minutes (a real scrape is 30 s;
/// 5 min keeps 31 days small enough for promtool on a busy machine), with `--resolution 15m`
/// (showback reads `increase()` per window, which needs at least two samples in each).
const SCRAPE: i64 = 300;
const RESOLUTION: &str = "15m";
const DAY: i64 = 86_400;
const HOUR: i64 = 3_600;
const PERIOD: i64 = 31 * DAY;

const A100: &str = "NVIDIA-A100-SXM4-80GB";
const A1000: &str = "NVIDIA-RTX-A1000";
const H100: &str = "NVIDIA-H100-80GB-HBM3";

/// OpenMetrics text, family by family (a family's samples must be contiguous).
#[derive(Default)]
struct Om {
    families: BTreeMap<String, String>,
}

impl Om {
    fn series(&mut self, name: &str, labels: &[(&str, &str)], samples: &[(i64, f64)]) {
        let body = self.families.entry(name.to_string()).or_default();
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect::<Vec<_>>()
            .join(",");
        for (t, v) in samples {
            writeln!(body, "{name}{{{labels}}} {v} {t}").expect("write");
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for (name, body) in &self.families {
            writeln!(out, "# TYPE {name} gauge").expect("write");
            out.push_str(body);
        }
        out.push_str("# EOF\n");
        out
    }
}

/// The timeline of one synthetic month.
struct Month {
    /// Period start (a day boundary, so every step is aligned).
    start: i64,
    /// gpu-ledger restarted between `reset - SCRAPE` and `reset`: counters start again at 0.
    reset: i64,
    /// Last sample before gpu-ledger went down.
    down: i64,
    /// First sample after it came back (counters at 0 again).
    up: i64,
    /// A namespace that first claims a GPU here.
    late: i64,
    /// One scrape where team-a held 4 GPUs instead of 2.
    burst: i64,
}

impl Month {
    fn new() -> Self {
        // Ends two days ago at midnight UTC: well in the past, so nothing is clamped to now.
        let now = Utc::now().timestamp();
        let end = now - now.rem_euclid(DAY) - 2 * DAY;
        let start = end - PERIOD;
        Month {
            start,
            reset: start + 10 * DAY,
            down: start + 20 * DAY,
            // Back 6 h 20 min later: at 15-minute steps (each [t - 15m, t] in Prometheus 2),
            // the windows ending at down + 30m .. down + 6h15m saw no sample: a 6 h gap.
            up: start + 20 * DAY + 6 * HOUR + 900 + SCRAPE,
            late: start + 25 * DAY,
            burst: start + 5 * DAY + 7 * HOUR,
        }
    }

    fn end(&self) -> i64 {
        self.start + PERIOD
    }

    /// Scrape times from `from` to the period's end, without the outage.
    fn scrapes(&self, from: i64) -> Vec<i64> {
        (from..=self.end())
            .step_by(SCRAPE as usize)
            .filter(|t| *t <= self.down || *t >= self.up)
            .collect()
    }

    /// A counter gpu-ledger accumulates at `rate` GPU equivalents from `from` (its first
    /// sample, 0): each process starts it at 0 (at `reset` and at `up`).
    fn counter(&self, rate: f64, from: i64) -> Vec<(i64, f64)> {
        self.scrapes(from)
            .into_iter()
            .map(|t| {
                let origin = [from, self.reset, self.up]
                    .into_iter()
                    .filter(|o| *o <= t)
                    .max()
                    .unwrap_or(from);
                (t, rate * (t - origin) as f64)
            })
            .collect()
    }

    /// GPU-seconds a namespace holding `rate` since `from` was counted: everything but the
    /// scrape interval lost at the restart and the time between `down` and `up`.
    fn counted(&self, rate: f64, from: i64) -> f64 {
        let mut secs = self.end() - from;
        if from < self.reset {
            secs -= SCRAPE;
        }
        if from < self.down {
            secs -= self.up - self.down;
        }
        rate * secs as f64
    }
}

/// (namespace, claimed, idle, [(model, activity, rate)], first sample).
type Holder = (
    &'static str,
    f64,
    f64,
    &'static [(&'static str, &'static str, f64)],
    bool,
);

const HOLDERS: &[Holder] = &[
    // Two whole A100s, one busy, one proven idle.
    (
        "team-a",
        2.0,
        1.0,
        &[(A100, "busy", 1.0), (A100, "idle", 1.0)],
        false,
    ),
    // A MIG 3g.40gb slice of an A100: 3/7 of a GPU, busy.
    (
        "team-mig",
        3.0 / 7.0,
        0.0,
        &[(A100, "busy", 3.0 / 7.0)],
        false,
    ),
    // A time-sliced share on a node with nvidia.com/gpu.replicas=4: 1/4 GPU, proven idle.
    ("team-ts", 0.25, 0.25, &[(A1000, "idle", 0.25)], false),
    // An H100 without DCGM series: neither busy nor idle is proven.
    ("team-h", 1.0, 0.0, &[(H100, "unknown", 1.0)], false),
    // A busy A100 from day 25 on.
    ("team-late", 1.0, 0.0, &[(A100, "busy", 1.0)], true),
];

fn history(m: &Month) -> String {
    let mut om = Om::default();
    for (ns, claimed, idle, models, late) in HOLDERS {
        let from = if *late { m.late } else { m.start };
        om.series(
            "gpu_ledger_gpu_seconds_claimed_total",
            &[("namespace", ns), ("instance", "replica-1")],
            &m.counter(*claimed, from),
        );
        om.series(
            "gpu_ledger_gpu_seconds_idle_total",
            &[("namespace", ns), ("instance", "replica-1")],
            &m.counter(*idle, from),
        );
        for (model, activity, rate) in *models {
            om.series(
                "gpu_ledger_gpu_seconds_by_model_total",
                &[
                    ("namespace", ns),
                    ("model", model),
                    ("activity", activity),
                    ("instance", "replica-1"),
                ],
                &m.counter(*rate, from),
            );
        }
        let held: Vec<(i64, f64)> = m
            .scrapes(from)
            .into_iter()
            .map(|t| {
                let burst = *ns == "team-a" && t == m.burst;
                (t, if burst { 4.0 } else { *claimed })
            })
            .collect();
        om.series(
            "gpu_ledger_namespace_gpus_claimed",
            &[("namespace", ns), ("instance", "replica-1")],
            &held,
        );
    }
    // A second replica of an HA deployment exports the same counter for its own lifetime (the
    // first 5 days): counted once, not twice.
    let replica: Vec<(i64, f64)> = m
        .counter(2.0, m.start)
        .into_iter()
        .filter(|(t, _)| *t <= m.start + 5 * DAY)
        .collect();
    om.series(
        "gpu_ledger_gpu_seconds_claimed_total",
        &[("namespace", "team-a"), ("instance", "replica-2")],
        &replica,
    );
    let refresh: Vec<(i64, f64)> = m
        .scrapes(m.start)
        .into_iter()
        .map(|t| (t, t as f64))
        .collect();
    om.series(
        "gpu_ledger_last_refresh_timestamp_seconds",
        &[("instance", "replica-1")],
        &refresh,
    );
    // kube-state-metrics, every hour. team-ts moved from vision to nlp on day 15; team-h has
    // no team label (no label_team on its series).
    let hourly = |from: i64, to: i64| -> Vec<(i64, f64)> {
        (from..=to)
            .step_by(HOUR as usize)
            .map(|t| (t, 1.0))
            .collect()
    };
    let (start, end) = (m.start, m.end());
    for (ns, team) in [
        ("team-a", "vision"),
        ("team-mig", "vision"),
        ("team-late", "vision"),
    ] {
        om.series(
            "kube_namespace_labels",
            &[("namespace", ns), ("label_team", team)],
            &hourly(start, end),
        );
    }
    om.series(
        "kube_namespace_labels",
        &[("namespace", "team-ts"), ("label_team", "vision")],
        &hourly(start, start + 15 * DAY),
    );
    om.series(
        "kube_namespace_labels",
        &[("namespace", "team-ts"), ("label_team", "nlp")],
        &hourly(start + 15 * DAY + HOUR, end),
    );
    om.series(
        "kube_namespace_labels",
        &[("namespace", "team-h")],
        &hourly(start, end),
    );
    for (ns, owner) in [
        ("team-a", "alice@example.com"),
        ("team-mig", "alice@example.com"),
        ("team-ts", "bob@example.com"),
    ] {
        om.series(
            "kube_namespace_annotations",
            &[("namespace", ns), ("annotation_owner", owner)],
            &hourly(start, end),
        );
    }
    om.text()
}

fn rfc3339(t: i64) -> String {
    DateTime::<Utc>::from_timestamp(t, 0)
        .expect("time")
        .to_rfc3339()
}

/// `gpu-ledger showback` over `[since, until)` against `prom`, whatever its exit status; the
/// environment's selector and minimum coverage do not leak in.
fn showback_between(
    prom: &Prometheus,
    since: i64,
    until: i64,
    extra: &[&str],
) -> std::process::Output {
    let (since, until) = (rfc3339(since), rfc3339(until));
    showback_for(prom, &["--since", &since, "--until", &until], extra)
}

/// `gpu-ledger showback` for `period` (`--since … --until …` or `--month …`) against `prom`.
fn showback_for(prom: &Prometheus, period: &[&str], extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args([
            "showback",
            "--prometheus-url",
            prom.url(),
            "--prometheus-timeout",
            "120s",
            "--resolution",
            RESOLUTION,
        ])
        .args(period)
        .args(extra)
        .env_remove("GPU_LEDGER_PROMETHEUS_SELECTOR")
        .env_remove("GPU_LEDGER_SHOWBACK_MIN_COVERAGE")
        .output()
        .expect("run gpu-ledger showback")
}

fn showback(prom: &Prometheus, m: &Month, extra: &[&str]) -> std::process::Output {
    let out = showback_between(prom, m.start, m.end(), extra);
    assert!(
        out.status.success(),
        "showback {extra:?} failed: {}\nprometheus log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        prom.log_tail(20)
    );
    out
}

fn json(prom: &Prometheus, m: &Month, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["-o", "json"];
    args.extend_from_slice(extra);
    let out = showback(prom, m, &args);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "showback -o json: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn group<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["group"] == name)
        .unwrap_or_else(|| panic!("no group {name} in {v:#}"))
}

#[track_caller]
fn near(v: &serde_json::Value, expected: f64, what: &str) {
    let got = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {v} is not a number"));
    assert!(
        (got - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{what}: got {got}, computed by hand {expected}"
    );
}

#[allow(clippy::too_many_lines)] // one month, every number checked in order
#[tokio::test(flavor = "multi_thread")]
async fn a_month_of_counters_becomes_a_showback_with_its_gap() {
    let m = Month::new();
    let prom = Prometheus::start_with_backfill(&history(&m))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42 and promtool (`apt-get install prometheus`, \
                 or PROMETHEUS_BIN/PROMTOOL_BIN): {e:#}"
            )
        });
    let h = |gpu_seconds: f64| gpu_seconds / 3600.0;
    let a100 = 2.10;
    let a1000 = 0.25;
    let prices = ["--price", "A100=2.10,RTX-A1000=0.25"];

    let v = json(&prom, &m, &prices);
    assert_eq!(v["group_by"], "namespace");
    let a = group(&v, "team-a");
    near(
        &a["gpu_hours_claimed"],
        h(m.counted(2.0, m.start)),
        "team-a claimed: reset and gap, the second replica counted once",
    );
    near(
        &a["gpu_hours_busy"],
        h(m.counted(1.0, m.start)),
        "team-a busy",
    );
    near(
        &a["gpu_hours_idle"],
        h(m.counted(1.0, m.start)),
        "team-a idle",
    );
    near(&a["gpu_hours_unknown"], 0.0, "team-a unknown");
    near(&a["idle_share"], 0.5, "team-a idle share");
    near(&a["peak_gpus"], 4.0, "team-a peak: the burst");
    near(&a["cost"], h(m.counted(2.0, m.start)) * a100, "team-a cost");
    let mig = group(&v, "team-mig");
    near(
        &mig["gpu_hours_claimed"],
        h(m.counted(3.0 / 7.0, m.start)),
        "MIG 3g: 3/7 GPU",
    );
    near(&mig["peak_gpus"], 3.0 / 7.0, "MIG peak in GPU equivalents");
    near(
        &mig["cost"],
        h(m.counted(3.0 / 7.0, m.start)) * a100,
        "MIG cost at the A100 price",
    );
    let ts = group(&v, "team-ts");
    near(
        &ts["gpu_hours_claimed"],
        h(m.counted(0.25, m.start)),
        "time-sliced: 1/4 GPU",
    );
    near(
        &ts["gpu_hours_idle"],
        h(m.counted(0.25, m.start)),
        "time-sliced idle",
    );
    near(&ts["idle_share"], 1.0, "time-sliced idle share");
    near(
        &ts["cost"],
        h(m.counted(0.25, m.start)) * a1000,
        "A1000 price, not A100's",
    );
    let hh = group(&v, "team-h");
    near(
        &hh["gpu_hours_claimed"],
        h(m.counted(1.0, m.start)),
        "team-h claimed",
    );
    near(&hh["gpu_hours_busy"], 0.0, "team-h busy");
    near(
        &hh["gpu_hours_unknown"],
        h(m.counted(1.0, m.start)),
        "team-h unknown",
    );
    assert!(hh["cost"].is_null(), "an H100 has no price: {hh}");
    assert_eq!(v["unpriced_models"], serde_json::json!([H100]));
    let late = group(&v, "team-late");
    near(
        &late["gpu_hours_claimed"],
        6.0 * 24.0,
        "team-late: six days",
    );
    near(&late["cost"], 6.0 * 24.0 * a100, "team-late cost");
    let total_claimed: f64 = HOLDERS
        .iter()
        .map(|(_, c, _, _, l)| h(m.counted(*c, if *l { m.late } else { m.start })))
        .sum();
    near(
        &v["total"]["gpu_hours_claimed"],
        total_claimed,
        "total claimed",
    );
    assert!(
        v["total"]["cost"].is_null(),
        "one unknown cost: total unknown"
    );
    near(
        &v["total"]["peak_gpus"],
        4.0 + 3.0 / 7.0 + 0.25 + 1.0,
        "total peak: the burst, before team-late",
    );
    assert_eq!(
        v["gaps"],
        serde_json::json!([{ "start": rfc3339(m.down + 15 * 60).replace("+00:00", "Z"), "seconds": 6 * HOUR }]),
        "the outage is a gap, not zero use"
    );
    near(
        &v["coverage"],
        1.0 - (6 * HOUR) as f64 / PERIOD as f64,
        "coverage",
    );

    let by_team = json(&prom, &m, &["--group-by-label", "team"]);
    assert_eq!(by_team["group_by"], "label:team");
    let vision = group(&by_team, "vision");
    assert_eq!(
        vision["namespaces"],
        serde_json::json!(["team-a", "team-late", "team-mig"])
    );
    near(
        &vision["gpu_hours_claimed"],
        h(m.counted(2.0, m.start) + m.counted(3.0 / 7.0, m.start) + m.counted(1.0, m.late)),
        "vision claimed",
    );
    near(
        &vision["peak_gpus"],
        4.0 + 3.0 / 7.0,
        "vision peak: summed per step",
    );
    assert_eq!(
        group(&by_team, "nlp")["namespaces"],
        serde_json::json!(["team-ts"]),
        "relabelled mid-month: its newest team"
    );
    assert_eq!(
        group(&by_team, "(none)")["namespaces"],
        serde_json::json!(["team-h"])
    );

    let by_owner = json(&prom, &m, &["--group-by-profile-owner"]);
    assert_eq!(
        group(&by_owner, "alice@example.com")["namespaces"],
        serde_json::json!(["team-a", "team-mig"])
    );
    assert_eq!(
        group(&by_owner, "(not in kube-state-metrics)")["namespaces"],
        serde_json::json!(["team-h", "team-late"])
    );

    let csv = String::from_utf8(showback(&prom, &m, &["-o", "csv"]).stdout).expect("utf-8");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0].starts_with("group,namespaces,gpu_hours_claimed,"),
        "{csv}"
    );
    assert_eq!(
        lines.len(),
        1 + HOLDERS.len() + 1,
        "header, groups, total: {csv}"
    );
    assert!(
        lines[1].starts_with("team-a,team-a,"),
        "most GPU-hours first: {csv}"
    );
    assert!(
        lines.last().is_some_and(|l| l.starts_with("total,")),
        "{csv}"
    );

    let out = showback(&prom, &m, &prices);
    let table = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        table.contains("gap: no gpu-ledger counters from"),
        "{table}"
    );
    assert!(table.contains("for 6h0m"), "{table}");
    println!("{table}");
}

#[test]
fn bad_arguments_exit_2_naming_the_input() {
    let closed = "http://127.0.0.1:9";
    for (args, says) in [
        (vec!["showback", "--prometheus-url", closed], "--month"),
        (
            vec!["showback", "--prometheus-url", closed, "--month", "2026-13"],
            "--month \"2026-13\"",
        ),
        (
            vec![
                "showback",
                "--prometheus-url",
                closed,
                "--month",
                "last",
                "--price",
                "A100=x",
            ],
            "price \"A100=x\": the price is not a number",
        ),
        (
            vec![
                "showback",
                "--prometheus-url",
                closed,
                "--month",
                "last",
                "--price-file",
                "/nonexistent/prices",
            ],
            "--price-file /nonexistent/prices",
        ),
        (vec!["showback", "--month", "last"], "--prometheus-url"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
            .args(&args)
            .env_remove("GPU_LEDGER_PROMETHEUS_URL")
            .output()
            .expect("run gpu-ledger");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says:?}: {stderr}"
        );
    }
}

/// Ten days in which one namespace holds 2 GPUs throughout: 480 GPU-hours, as gpu-ledger counted
/// them wherever some replica of it ran. Each scenario is one "cluster" of a shared store (a
/// `cluster` label, as kube-prometheus-stack's external labels or Thanos add it), so one
/// Prometheus holds them all and `--prometheus-selector` picks one.
const TEN_DAYS: i64 = 10 * DAY;
const HELD: f64 = 2.0;
const TRUTH: f64 = HELD * 240.0;

/// One gpu-ledger process: its pod (series labels), its shard (`shard` label; empty:
/// unsharded, no label), when it ran `[from, to)`, and so which scrapes saw it: every scrape
/// strictly inside its life, its counter at GPU-seconds since it started (a process starts its
/// counters at 0).
struct Process {
    pod: &'static str,
    shard: &'static str,
    from: i64,
    to: i64,
}

/// A replica of an unsharded deployment.
fn replica(pod: &'static str, from: i64, to: i64) -> Process {
    Process {
        pod,
        shard: "",
        from,
        to,
    }
}

/// GPUs a process of a scenario saw team-a hold at Unix second `t` (constant over each scrape
/// interval, which begins at a multiple of [`SCRAPE`]).
type Held<'a> = &'a dyn Fn(&Process, i64) -> f64;

/// The integral of `held` over `[from, to)`: GPU-seconds a process counted.
fn gpu_seconds(p: &Process, held: Held<'_>, from: i64, to: i64) -> f64 {
    let mut sum = 0.0;
    let mut t = from;
    while t < to {
        let next = (t - t.rem_euclid(SCRAPE) + SCRAPE).min(to);
        sum += held(p, t) * (next - t) as f64;
        t = next;
    }
    sum
}

/// Each process's series, scraped every [`SCRAPE`] over `[span.0, span.1]`.
fn ten_days_of(om: &mut Om, start: i64, cluster: &str, processes: &[Process]) {
    processes_of(
        om,
        (start, start + TEN_DAYS),
        cluster,
        processes,
        &|_, _| HELD,
    );
}

fn processes_of(
    om: &mut Om,
    span: (i64, i64),
    cluster: &str,
    processes: &[Process],
    held: Held<'_>,
) {
    for p in processes {
        let scrapes: Vec<i64> = (span.0..=span.1)
            .step_by(SCRAPE as usize)
            .filter(|t| *t > p.from && *t < p.to)
            .collect();
        let mut labels = vec![("cluster", cluster), ("pod", p.pod), ("instance", p.pod)];
        if !p.shard.is_empty() {
            labels.push(("shard", p.shard));
        }
        let mut with_ns = labels.clone();
        with_ns.push(("namespace", "team-a"));
        om.series(
            "gpu_ledger_gpu_seconds_claimed_total",
            &with_ns,
            &scrapes
                .iter()
                .map(|t| (*t, gpu_seconds(p, held, p.from, *t)))
                .collect::<Vec<_>>(),
        );
        om.series(
            "gpu_ledger_namespace_gpus_claimed",
            &with_ns,
            &scrapes
                .iter()
                .map(|t| (*t, held(p, *t - 1)))
                .collect::<Vec<_>>(),
        );
        om.series(
            "gpu_ledger_last_refresh_timestamp_seconds",
            &labels,
            &scrapes.iter().map(|t| (*t, *t as f64)).collect::<Vec<_>>(),
        );
    }
}

/// Ten days ending at midnight UTC two days ago.
fn ten_days_start() -> i64 {
    let now = Utc::now().timestamp();
    now - now.rem_euclid(DAY) - 2 * DAY - TEN_DAYS
}

/// The scenarios, each `[from, to)` relative to the start; `END` runs past the period.
fn scenarios(start: i64) -> String {
    const END: i64 = TEN_DAYS + DAY;
    let at = |d: i64, h: i64| start + d * DAY + h * HOUR;
    let mut om = Om::default();
    // `helm upgrade` of the chart's two HA replicas (RollingUpdate, one surge pod: r3 starts,
    // r1 goes, r4 starts, r2 goes), an eviction of r3 replaced by r5 on day 7, and a container
    // restart of r4 on day 8 (same pod, counter back to 0).
    ten_days_of(
        &mut om,
        start,
        "rollout",
        &[
            replica("r1", at(0, 0) - DAY, at(4, 1)),
            replica("r2", at(0, 0) - DAY, at(4, 2)),
            replica("r3", at(4, 0), at(7, 0)),
            replica("r4", at(4, 1), at(8, 0)),
            replica("r4", at(8, 0), start + END),
            replica("r5", at(7, 0), start + END),
        ],
    );
    // Two HA replicas down at different times (r1 days 2-4, r2 days 6-8): one always counted.
    ten_days_of(
        &mut om,
        start,
        "staggered",
        &[
            replica("r1", at(0, 0) - DAY, at(2, 0)),
            replica("r1", at(4, 0), start + END),
            replica("r2", at(0, 0) - DAY, at(6, 0)),
            replica("r2", at(8, 0), start + END),
        ],
    );
    // r2 down from day 2 12:00, then r1 too from day 3 to day 4 (no replica: a gap of 24 h),
    // both back on day 4; 48 GPU-hours were never counted.
    ten_days_of(
        &mut om,
        start,
        "gap",
        &[
            replica("r1", at(0, 0) - DAY, at(3, 0)),
            replica("r1", at(4, 0), start + END),
            replica("r2", at(0, 0) - DAY, at(2, 12)),
            replica("r2", at(4, 0), start + END),
        ],
    );
    // One replica, replaced once in the middle of a 15-minute window (Recreate, or an
    // eviction of the only pod).
    ten_days_of(
        &mut om,
        start,
        "single",
        &[
            replica("s1", at(0, 0) - DAY, at(5, 0) + 7 * 60),
            replica("s2", at(5, 0) + 7 * 60, start + END),
        ],
    );
    // `--total-shards 2` (the chart's StatefulSet, one pod per shard, no HA inside a shard):
    // each shard counts the pods on its own nodes, half of team-a's GPUs, and the shards' sums
    // add up. gpu-ledger-1's container restarts on day 5 (same pod, counter back to 0).
    processes_of(
        &mut om,
        (start, start + TEN_DAYS),
        "shards",
        &[
            sharded("gpu-ledger-0", "0", at(0, 0) - DAY, start + END),
            sharded("gpu-ledger-1", "1", at(0, 0) - DAY, at(5, 0)),
            sharded("gpu-ledger-1", "1", at(5, 0), start + END),
        ],
        &|_, _| HELD / 2.0,
    );
    // The same two shards, gpu-ledger-1 down from day 3 to day 4 while gpu-ledger-0 runs on: its
    // half of team-a was counted by nobody that day, a gap although some replica reported.
    processes_of(
        &mut om,
        (start, start + TEN_DAYS),
        "shard-down",
        &[
            sharded("gpu-ledger-0", "0", at(0, 0) - DAY, start + END),
            sharded("gpu-ledger-1", "1", at(0, 0) - DAY, at(3, 0)),
            sharded("gpu-ledger-1", "1", at(4, 0), start + END),
        ],
        &|_, _| HELD / 2.0,
    );
    om.text()
}

/// The pod of one shard of a sharded deployment.
fn sharded(pod: &'static str, shard: &'static str, from: i64, to: i64) -> Process {
    Process {
        pod,
        shard,
        from,
        to,
    }
}

fn run(prom: &Prometheus, start: i64, args: &[&str]) -> std::process::Output {
    showback_between(prom, start, start + TEN_DAYS, args)
}

fn parsed(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "showback -o json: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[allow(clippy::too_many_lines)] // one store, every scenario checked in order
#[tokio::test(flavor = "multi_thread")]
async fn hours_survive_rollouts_restarts_and_ha_and_only_a_time_without_any_replica_is_a_gap() {
    let start = ten_days_start();
    let prom = Prometheus::start_with_backfill(&scenarios(start))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42 and promtool (`apt-get install prometheus`, \
                 or PROMETHEUS_BIN/PROMTOOL_BIN): {e:#}"
            )
        });
    let one = |cluster: &str, extra: &[&str]| {
        let sel = format!("cluster=\"{cluster}\"");
        let mut args = vec!["-o", "json", "--prometheus-selector", sel.as_str()];
        args.extend_from_slice(extra);
        let out = run(&prom, start, &args);
        (
            out.status.code(),
            parsed(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, v, stderr) = one("rollout", &[]);
    assert_eq!(code, Some(0), "{stderr}");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        TRUTH,
        "a rolling upgrade of two HA replicas, an eviction and a restart: 480 GPU-hours, once",
    );
    near(&v["coverage"], 1.0, "some replica counted throughout");
    assert_eq!(v["gaps"], serde_json::json!([]));
    assert_eq!(v["status"], "complete");
    near(
        &group(&v, "team-a")["peak_gpus"],
        HELD,
        "peak: replicas once",
    );

    let (code, v, stderr) = one("staggered", &[]);
    assert_eq!(code, Some(0), "{stderr}");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        TRUTH,
        "two replicas down at different times: the other counted",
    );
    near(&v["coverage"], 1.0, "one of two down is no gap");
    assert_eq!(v["gaps"], serde_json::json!([]));

    let (code, v, stderr) = one("single", &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let got = group(&v, "team-a")["gpu_hours_claimed"]
        .as_f64()
        .expect("hours");
    // Old and new pod share one 15-minute window; each reported part of it, and the larger
    // part counts: at most half a step of the 2 GPUs is lost (docs/showback.md).
    let bound = HELD * 7.5 / 60.0;
    assert!(
        (TRUTH - bound..=TRUTH + 1e-9).contains(&got),
        "the only replica replaced: {got}, expected within {bound} of {TRUTH}"
    );
    near(&v["coverage"], 1.0, "single coverage");

    let (code, v, stderr) = one("shards", &[]);
    assert_eq!(code, Some(0), "{stderr}");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        TRUTH,
        "two shards, each counting half of team-a (one restarted): added, not the larger one",
    );
    near(
        &group(&v, "team-a")["peak_gpus"],
        HELD,
        "peak: both shards' halves at once",
    );
    near(&v["coverage"], 1.0, "shards coverage");

    let (code, v, stderr) = one("shard-down", &[]);
    assert_eq!(code, Some(4), "a shard's day missing is partial: {stderr}");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        TRUTH - HELD / 2.0 * 24.0,
        "what was counted: all but gpu-ledger-1's half for the day it was down",
    );
    near(
        &v["coverage"],
        0.9,
        "a day of ten in which one shard did not report",
    );
    assert_eq!(
        v["gaps"],
        serde_json::json!([{ "start": rfc3339(start + 3 * DAY).replace("+00:00", "Z"), "seconds": DAY }]),
        "the day gpu-ledger-1 was down, although gpu-ledger-0 reported"
    );

    // Below the default --min-coverage of 95 %: the JSON says partial, the exit code is 4.
    let (code, v, stderr) = one("gap", &[]);
    assert_eq!(code, Some(4), "90 % coverage is partial: {stderr}");
    assert_eq!(v["status"], "partial");
    near(&v["min_coverage"], 0.95, "the default minimum");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        TRUTH - HELD * 24.0,
        "what was counted: everything but the day without any replica",
    );
    near(&v["coverage"], 0.9, "one day of ten without any replica");
    assert_eq!(
        v["gaps"],
        serde_json::json!([{ "start": rfc3339(start + 3 * DAY).replace("+00:00", "Z"), "seconds": DAY }]),
        "the day without any replica, not r2's half day alone"
    );
    assert!(stderr.contains("PARTIAL"), "{stderr}");
    let (code, v, stderr) = one("gap", &["--min-coverage", "85%"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(v["status"], "complete");
    let sel = "cluster=\"gap\"";
    let out = run(&prom, start, &["-o", "csv", "--prometheus-selector", sel]);
    assert_eq!(out.status.code(), Some(4));
    let csv = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        csv.lines()
            .next()
            .is_some_and(|h| h.ends_with(",coverage,status")),
        "{csv}"
    );
    assert!(
        csv.lines().skip(1).all(|l| l.ends_with(",0.9,partial")),
        "every CSV line says partial: {csv}"
    );
    let out = run(&prom, start, &["--prometheus-selector", sel]);
    assert_eq!(out.status.code(), Some(4));
    let table = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        table.starts_with("PARTIAL: gpu-ledger reported for only 90.0%"),
        "{table}"
    );

    // Nothing in Prometheus for the period: unknown, never zero.
    let (code, v, _) = one("nowhere", &[]);
    assert_eq!(code, Some(4), "no data at all is not a bill");
    assert_eq!(v["status"], "unknown");
    assert!(v["total"]["gpu_hours_claimed"].is_null(), "{v}");
    assert!(v["total"]["peak_gpus"].is_null(), "{v}");
    near(&v["coverage"], 0.0, "nothing covered");
    let out = run(
        &prom,
        start,
        &["--prometheus-selector", "cluster=\"nowhere\""],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("UNKNOWN: no gpu-ledger series"),
        "{table}"
    );
    assert!(table.contains("a month needs 32 days"), "{table}");

    // Several clusters' series and no selector: refused like `report`, naming them and the flag.
    let out = run(&prom, start, &["-o", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "several clusters without --prometheus-selector are refused as bad input; stdout: {}; stderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    for c in [
        "rollout",
        "staggered",
        "gap",
        "single",
        "shards",
        "shard-down",
    ] {
        assert!(
            stderr.contains(&format!("cluster=\"{c}\"")),
            "names cluster {c}: {stderr}"
        );
    }
    assert!(stderr.contains("--prometheus-selector"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing added up on stdout");

    // Progress on stderr when asked (not a terminal here, so only with `always`), never on
    // stdout: the JSON stays clean.
    let out = run(
        &prom,
        start,
        &[
            "-o",
            "json",
            "--prometheus-selector",
            "cluster=\"rollout\"",
            "--progress",
            "always",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("showback: [1/") && stderr.contains("gpu_ledger_gpu_seconds_claimed_total"),
        "{stderr}"
    );
    parsed(&out);
    let out = run(
        &prom,
        start,
        &["-o", "json", "--prometheus-selector", "cluster=\"rollout\""],
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("showback: ["),
        "auto: no progress when stderr is not a terminal"
    );
}

/// The calendar month before last (`--month YYYY-MM`): Unix seconds of its first instant and
/// of the next month's, and its spec. Always wholly in the past, with days after it in the
/// past too, whatever day the test runs.
fn month_before_last() -> (i64, i64, String) {
    use chrono::{Datelike as _, Months, NaiveDate};
    let today = Utc::now().date_naive();
    let this = NaiveDate::from_ymd_opt(today.year(), today.month(), 1).expect("first of month");
    let first = this.checked_sub_months(Months::new(2)).expect("month");
    let next = this.checked_sub_months(Months::new(1)).expect("month");
    let at = |d: NaiveDate| d.and_time(chrono::NaiveTime::MIN).and_utc().timestamp();
    (at(first), at(next), first.format("%Y-%m").to_string())
}

/// Everything at once, over a calendar month: two shards, shard 0 run by two HA replicas that a
/// rolling upgrade replaces on day 10, shard 1 a single pod whose container restarts on day 15,
/// no replica of any shard from day 20 to day 21 (a gap), and counters that started two days
/// before the month and run on two days past it, at other holdings than inside it (so a window
/// read across either boundary shows).
fn month_across_shards(start: i64, end: i64) -> String {
    let at = |d: i64, h: i64| start + d * DAY + h * HOUR;
    let (before, after) = (start - 2 * DAY, end + 2 * DAY);
    let (down, up) = (at(20, 0), at(21, 0));
    let mut om = Om::default();
    processes_of(
        &mut om,
        (before, after),
        "month",
        &[
            sharded("gpu-ledger-a1", "0", before, at(10, 1)),
            sharded("gpu-ledger-a2", "0", before, at(10, 2)),
            sharded("gpu-ledger-a3", "0", at(10, 0), down),
            sharded("gpu-ledger-a3", "0", up, after),
            sharded("gpu-ledger-a4", "0", at(10, 1), down),
            sharded("gpu-ledger-a4", "0", up, after),
            sharded("gpu-ledger-b", "1", before, at(15, 0)),
            sharded("gpu-ledger-b", "1", at(15, 0), down),
            sharded("gpu-ledger-b", "1", up, after),
        ],
        &|p, t| match ((start..end).contains(&t), p.shard) {
            (true, _) => 1.0,
            (false, "0") => 5.0,
            (false, _) => 3.0,
        },
    );
    // The month's boundaries alone: one replica throughout, 1 GPU inside the month, 4 outside.
    processes_of(
        &mut om,
        (before, after),
        "boundary",
        &[replica("r1", before, after)],
        &|_, t| if (start..end).contains(&t) { 1.0 } else { 4.0 },
    );
    om.text()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_month_of_two_shards_with_a_rollout_a_restart_and_a_gap_counts_only_its_own_hours() {
    let (start, end, spec) = month_before_last();
    let prom = Prometheus::start_with_backfill(&month_across_shards(start, end))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42 and promtool (`apt-get install prometheus`, \
                 or PROMETHEUS_BIN/PROMTOOL_BIN): {e:#}"
            )
        });
    let out = showback_for(
        &prom,
        &["--month", &spec],
        &["-o", "json", "--prometheus-selector", "cluster=\"month\""],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v = parsed(&out);
    let days = (end - start) / DAY;
    assert_eq!(
        out.status.code(),
        Some(0),
        "one day of {days} missing is above the 95 % minimum: {stderr}"
    );
    assert_eq!(v["since"], rfc3339(start).replace("+00:00", "Z"), "{v}");
    assert_eq!(v["until"], rfc3339(end).replace("+00:00", "Z"), "{v}");
    near(
        &group(&v, "team-a")["gpu_hours_claimed"],
        2.0 * 24.0 * (days - 1) as f64,
        "two shards of 1 GPU each, added; HA replicas and the rollout once; the restart and \
         the month's boundaries exact; the day without any replica not counted",
    );
    near(
        &group(&v, "team-a")["peak_gpus"],
        2.0,
        "peak: both shards, inside the month only",
    );
    near(
        &v["coverage"],
        (days - 1) as f64 / days as f64,
        "one day without any replica",
    );
    assert_eq!(
        v["gaps"],
        serde_json::json!([{ "start": rfc3339(start + 20 * DAY).replace("+00:00", "Z"), "seconds": DAY }]),
        "the day without any replica"
    );

    let out = showback_for(
        &prom,
        &["--month", &spec],
        &[
            "-o",
            "json",
            "--prometheus-selector",
            "cluster=\"boundary\"",
        ],
    );
    let v = parsed(&out);
    assert_eq!(out.status.code(), Some(0), "{v}");
    let a = group(&v, "team-a");
    near(
        &a["gpu_hours_claimed"],
        24.0 * days as f64,
        "the month's hours only: not the 4 GPUs of the window before its first or after its last",
    );
    near(
        &a["peak_gpus"],
        1.0,
        "peak: the month's, not its neighbours'",
    );
    near(&v["coverage"], 1.0, "boundary coverage");
}

#[test]
fn showback_help_lists_its_exit_codes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["showback", "--help"])
        .output()
        .expect("run gpu-ledger");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Exit codes:"), "{help}");
    assert!(help.contains("4  partial"), "{help}");
    assert!(help.contains("--min-coverage"), "{help}");
}

/// kube-state-metrics' `kube_namespace_labels` over ten days (every 5 minutes, `cluster="here"`),
/// with gpu-ledger holding one GPU for each namespace that has a `(from, to)` life: every way a
/// namespace's team can change within a period, for `--group-by-label team`. Each entry is
/// `(namespace, [(first sample, last sample, team or "" for no label)])`.
type Timeline = (&'static str, Vec<(i64, i64, &'static str)>);

fn label_timelines(start: i64) -> Vec<Timeline> {
    let end = start + TEN_DAYS;
    let at = |d: i64, h: i64| start + d * DAY + h * HOUR;
    let last_day = |h: i64| end - DAY + h * HOUR;
    vec![
        ("stays", vec![(start - DAY, end, "a")]),
        // Relabelled in the middle: its newest team.
        (
            "moved",
            vec![
                (start - DAY, at(5, 12), "a"),
                (at(5, 12) + SCRAPE, end, "b"),
            ],
        ),
        // Relabelled twice within the period's last day: the last of the three.
        (
            "twice",
            vec![
                (start - DAY, last_day(8), "a"),
                (last_day(8) + SCRAPE, last_day(16), "b"),
                (last_day(16) + SCRAPE, end, "c"),
            ],
        ),
        // Away and back within the last day: back where it was.
        (
            "back",
            vec![
                (start - DAY, last_day(6), "a"),
                (last_day(6) + SCRAPE, last_day(18), "b"),
                (last_day(18) + SCRAPE, end, "a"),
            ],
        ),
        // Deleted on day 6: its series ends, its team stays its last.
        ("deleted", vec![(start - DAY, at(6, 5), "a")]),
        // Relabelled and deleted the same day (day 4).
        (
            "deleted-relabelled",
            vec![
                (start - DAY, at(4, 10), "a"),
                (at(4, 10) + SCRAPE, at(4, 14), "b"),
            ],
        ),
        // Its team label removed on day 7: no team from then on.
        (
            "unlabelled",
            vec![(start - DAY, at(7, 0), "a"), (at(7, 0) + SCRAPE, end, "")],
        ),
        // Last seen 2 minutes before the period: Prometheus' 5-minute lookback still shows it at
        // the period's first step (Prometheus 2 includes a subquery's first step).
        ("lookback", vec![(start - DAY, start - 120, "a")]),
        // Last seen 2 hours before the period: not in kube-state-metrics during it.
        ("gone-before", vec![(start - DAY, start - 2 * HOUR, "a")]),
        // Never in kube-state-metrics.
        ("never", vec![]),
    ]
}

fn label_history(start: i64) -> String {
    let mut om = Om::default();
    let end = start + TEN_DAYS;
    for (ns, lives) in label_timelines(start) {
        for (from, to, team) in lives {
            let mut labels = vec![("namespace", ns), ("cluster", "here")];
            if !team.is_empty() {
                labels.push(("label_team", team));
            }
            let samples: Vec<(i64, f64)> = (from..=to)
                .step_by(SCRAPE as usize)
                .chain(std::iter::once(to))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|t| (t, 1.0))
                .collect();
            om.series("kube_namespace_labels", &labels, &samples);
        }
        let scrapes: Vec<i64> = (start - DAY..=end + DAY).step_by(SCRAPE as usize).collect();
        om.series(
            "gpu_ledger_gpu_seconds_claimed_total",
            &[("namespace", ns), ("cluster", "here"), ("instance", "r1")],
            &scrapes
                .iter()
                .map(|t| (*t, (t - start + DAY) as f64))
                .collect::<Vec<_>>(),
        );
        om.series(
            "gpu_ledger_namespace_gpus_claimed",
            &[("namespace", ns), ("cluster", "here"), ("instance", "r1")],
            &scrapes.iter().map(|t| (*t, 1.0)).collect::<Vec<_>>(),
        );
    }
    om.series(
        "gpu_ledger_last_refresh_timestamp_seconds",
        &[("cluster", "here"), ("instance", "r1")],
        &(start - DAY..=end + DAY)
            .step_by(SCRAPE as usize)
            .map(|t| (t, t as f64))
            .collect::<Vec<_>>(),
    );
    // Another cluster's kube-state-metrics in the same store, for the refusal below.
    om.series(
        "kube_namespace_labels",
        &[
            ("namespace", "stays"),
            ("cluster", "there"),
            ("label_team", "z"),
        ],
        &(start..=end)
            .step_by(HOUR as usize)
            .map(|t| (t, 1.0))
            .collect::<Vec<_>>(),
    );
    om.text()
}

/// Namespace → group of a `showback -o json` answer.
fn group_of_each_namespace(v: &serde_json::Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for g in v["groups"].as_array().expect("groups") {
        for ns in g["namespaces"].as_array().expect("namespaces") {
            out.insert(
                ns.as_str().expect("namespace").to_string(),
                g["group"].as_str().expect("group").to_string(),
            );
        }
    }
    out
}

/// What the month's label query asked Prometheus before issue 37, in one subquery of the
/// whole period (quadratic in its length on Prometheus 2): namespace → team, the newest
/// `timestamp()` winning. The new plan must answer the same.
async fn whole_period_answer(prom: &Prometheus, start: i64) -> BTreeMap<String, String> {
    let q = format!(
        "max by (namespace, label_team, cluster, cluster_id) (max_over_time(timestamp(kube_namespace_labels{{cluster=\"here\"}})[{}ms:900000ms]))",
        TEN_DAYS * 1000
    );
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/api/v1/query", prom.url()))
        .form(&[
            ("query", q.as_str()),
            ("time", &(start + TEN_DAYS).to_string()),
        ])
        .send()
        .await
        .expect("query prometheus")
        .json()
        .await
        .expect("json");
    let mut newest: BTreeMap<String, (f64, String)> = BTreeMap::new();
    for s in v["data"]["result"].as_array().expect("result") {
        let ns = s["metric"]["namespace"].as_str().expect("namespace");
        let team = s["metric"]["label_team"].as_str().unwrap_or("(none)");
        let t: f64 = s["value"][1]
            .as_str()
            .expect("value")
            .parse()
            .expect("number");
        let e = newest
            .entry(ns.to_string())
            .or_insert((f64::NEG_INFINITY, String::new()));
        if t > e.0 {
            *e = (t, team.to_string());
        }
    }
    newest
        .into_iter()
        .map(|(ns, (_, team))| (ns, team))
        .collect()
}

/// The namespaces each `timestamp()` query in Prometheus' query log (from byte `from` on) was
/// narrowed to, and its subquery's range in milliseconds; `None` for a query over every
/// namespace.
fn timestamp_queries(log: &std::path::Path, from: usize) -> Vec<(Option<Vec<String>>, i64)> {
    let text = std::fs::read_to_string(log).expect("query log");
    text[from..]
        .lines()
        .filter_map(|l| {
            let entry: serde_json::Value = serde_json::from_str(l).expect("query log line");
            let q = entry["params"]["query"]
                .as_str()
                .expect("query")
                .to_string();
            q.contains("timestamp(").then_some(q)
        })
        .map(|q| {
            let namespaces = q.split_once("namespace=~\"").map(|(_, rest)| {
                rest.split_once('"')
                    .expect("closing quote")
                    .0
                    .replace('\\', "")
                    .split('|')
                    .map(str::to_string)
                    .collect()
            });
            let range_ms = q
                .rsplit_once(")[")
                .and_then(|(_, r)| r.split_once("ms:"))
                .and_then(|(ms, _)| ms.parse().ok())
                .unwrap_or_else(|| panic!("no subquery range in {q}"));
            (namespaces, range_ms)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn label_groups_are_the_newest_value_and_only_a_last_day_with_several_values_is_asked_finely()
{
    let start = ten_days_start();
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("queries.log");
    let config = format!("global:\n  query_log_file: {}\n", log.display());
    let prom = Prometheus::start_with_backfill_and_config(&label_history(start), &config)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42 and promtool (`apt-get install prometheus`, \
                 or PROMETHEUS_BIN/PROMTOOL_BIN): {e:#}"
            )
        });
    let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
    let out = run(
        &prom,
        start,
        &[
            "-o",
            "json",
            "--group-by-label",
            "team",
            "--prometheus-selector",
            "cluster=\"here\"",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = group_of_each_namespace(&parsed(&out));
    // Read before the test's own whole-period query below lands in the log.
    let asked = timestamp_queries(&log, logged_before);

    let by_hand: BTreeMap<String, String> = [
        ("stays", "a"),
        ("moved", "b"),
        ("twice", "c"),
        ("back", "a"),
        ("deleted", "a"),
        ("deleted-relabelled", "b"),
        ("unlabelled", "(none)"),
        ("lookback", "a"),
        ("gone-before", "(not in kube-state-metrics)"),
        ("never", "(not in kube-state-metrics)"),
    ]
    .into_iter()
    .map(|(ns, g)| (ns.to_string(), g.to_string()))
    .collect();
    assert_eq!(got, by_hand, "each namespace in its newest team");
    let mut whole = whole_period_answer(&prom, start).await;
    for ns in by_hand.keys() {
        whole
            .entry(ns.clone())
            .or_insert_with(|| "(not in kube-state-metrics)".to_string());
    }
    assert_eq!(got, whole, "the same answer as the whole period's subquery");

    // The cost: `timestamp()` (a subquery quadratic in its length) only for the namespaces
    // whose last day held several values, or that were last seen by the period's first day,
    // each over about a day (the day and one 15-minute step).
    let mut asked_namespaces = std::collections::BTreeSet::new();
    for (namespaces, range_ms) in &asked {
        let namespaces = namespaces
            .as_ref()
            .unwrap_or_else(|| panic!("a timestamp() subquery over every namespace: {asked:?}"));
        assert!(
            *range_ms <= (DAY + 900) * 1000,
            "a timestamp() subquery over {range_ms} ms, more than a day and a step: {asked:?}"
        );
        asked_namespaces.extend(namespaces.iter().cloned());
    }
    assert_eq!(
        asked_namespaces,
        [
            "twice",
            "back",
            "deleted-relabelled",
            "lookback",
            "gone-before"
        ]
        .into_iter()
        .map(str::to_string)
        .collect(),
        "asked finely: {asked:?}"
    );
    assert_eq!(
        asked.len(),
        3,
        "one query per last day asked (the last day, day 5, the first day): {asked:?}"
    );

    // Without the selector, the other cluster's kube-state-metrics is refused, not joined.
    let out = run(&prom, start, &["-o", "json", "--group-by-label", "team"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("kube_namespace_labels")
            && stderr.contains("cluster=\"there\"")
            && stderr.contains("cluster=\"here\""),
        "{stderr}"
    );
}
