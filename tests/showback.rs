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

/// gpu-ledger's counters as Prometheus scraped them: every 15 minutes (a real scrape is 30 s;
/// 15 min keeps 31 days small enough for promtool on a busy machine), with `--resolution 15m`.
const SCRAPE: i64 = 900;
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
            // 25 scrapes missing: at 15-minute steps, 6 h in which no step saw a sample.
            up: start + 20 * DAY + 6 * HOUR + 2 * SCRAPE,
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

fn showback(prom: &Prometheus, m: &Month, extra: &[&str]) -> std::process::Output {
    let (since, until) = (rfc3339(m.start), rfc3339(m.end()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args([
            "showback",
            "--prometheus-url",
            prom.url(),
            "--prometheus-timeout",
            "120s",
            "--since",
            &since,
            "--until",
            &until,
            "--resolution",
            RESOLUTION,
        ])
        .args(extra)
        .output()
        .expect("run gpu-ledger showback");
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
        serde_json::json!([{ "start": rfc3339(m.down + SCRAPE).replace("+00:00", "Z"), "seconds": 6 * HOUR }]),
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
