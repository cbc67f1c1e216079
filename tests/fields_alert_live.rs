//! `GpuLedgerDcgmFieldsMissing` fires live (issue 37 item 1): a real `gpu-ledger serve` (shared
//! tier A kube-apiserver, the shipped read-only RBAC) reads a real Prometheus 2.42 that scrapes
//! three dcgm-exporter pages (replayed verbatim by `testkit::dcgm::ReplayExporter`) and
//! gpu-ledger's own `/metrics`, and evaluates the SHIPPED `alerts/gpu-ledger.rules.yaml`:
//!
//! * legacy names: the real H100 page of `tests/fixtures/dcgm-real/01-whole-gpus-dcp`;
//! * DCGM 4.7 canonical names only: the newest scrape of `tests/fixtures/dcgm-renamed/dcgm.prom`
//!   (the homelab dump under `DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO`, `DCGM_FI_DEV_GPU_UTIL_RATIO`,
//!   `DCGM_FI_DEV_FB_USED_BYTES`, …), as `/federate` wrote it (`honor_labels: true`);
//! * an exporter whose counters CSV has none of the fields gpu-ledger reads: the same H100 page's
//!   `DCGM_FI_DEV_GPU_TEMP` and `DCGM_FI_DEV_POWER_USAGE` lines only, for two other GPUs on
//!   another node.
//!
//! While the third exporter is scraped, gpu-ledger counts exactly its two GPUs (the legacy and the
//! canonical devices are read, not missing) and `ALERTS{alertname="GpuLedgerDcgmFieldsMissing",
//! alertstate="firing"}` appears; once it is removed from the scrape config (its series go
//! stale), the count goes to 0, the alert resolves and stays silent.
//!
//! The shipped rule waits `for: 15m`. A test cannot wait that long, and Prometheus' restore of
//! `for` state (`ALERTS_FOR_STATE`) would need a forged pending history plus its own grace period,
//! which proves less than it fakes. So Prometheus loads a copy of the shipped file in which only
//! that alert's `for` is shortened ([`shorten_for`], which fails if the alert or its `for` is not
//! found, and checks that no other line changed); `alerts/tests/fields.test.yml` (promtool)
//! covers the real 15 minutes.
//!
//! Tests never skip: a missing Prometheus or control plane fails them naming what to install.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::util::free_port;
use gpu_ledger_testkit::{ControlPlane, Prometheus, ReplayExporter};
use serde_json::Value;
use support::grant_shipped_read_only;

const ALERT: &str = "GpuLedgerDcgmFieldsMissing";
/// The alert's `for` in the test's copy of the rules (the shipped one is 15m).
const SHORT_FOR: &str = "5s";
/// How long anything here may take on a busy 2-core machine: gpu-ledger counts every 2 s here
/// (`--dcgm-fields-check-interval`), then a scrape, then the shortened `for`; the rest is
/// margin for a loaded machine.
const WAIT: Duration = Duration::from_secs(240);

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `shipped` (a Prometheus rules file) with the `for:` of alert `alert` set to `duration`.
/// Panics when the alert is not there exactly once, or has no `for` before the next rule.
fn shorten_for(shipped: &str, alert: &str, duration: &str) -> String {
    let lines: Vec<&str> = shipped.lines().collect();
    let header = format!("- alert: {alert}");
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == header)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        starts.len(),
        1,
        "alert {alert} must be in the rules file exactly once (found {})",
        starts.len()
    );
    let start = starts[0];
    let next_rule = lines[start + 1..]
        .iter()
        .position(|l| {
            let t = l.trim_start();
            t.starts_with("- alert:") || t.starts_with("- record:") || t.starts_with("- name:")
        })
        .map_or(lines.len(), |p| start + 1 + p);
    let for_line = (start + 1..next_rule)
        .find(|&i| lines[i].trim_start().starts_with("for:"))
        .unwrap_or_else(|| panic!("alert {alert} has no `for:` in the rules file"));
    let indent = &lines[for_line][..lines[for_line].len() - lines[for_line].trim_start().len()];
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_string()).collect();
    out[for_line] = format!("{indent}for: {duration}");
    let changed = out
        .iter()
        .zip(&lines)
        .filter(|(new, old)| new.as_str() != **old)
        .count();
    assert_eq!(changed, 1, "only the alert's `for` may change");
    out.join("\n") + "\n"
}

/// The newest scrape of a `/federate` dump with sample timestamps: the samples stamped with the
/// dump's newest time, without their timestamps (Prometheus stamps each scrape itself), and the
/// comment lines.
fn newest_scrape(dump: &str) -> String {
    let stamp = |l: &str| l.rsplit(' ').next().and_then(|t| t.parse::<i64>().ok());
    let newest = dump
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(stamp)
        .max()
        .expect("a sample with a timestamp");
    let mut out = String::new();
    for line in dump.lines() {
        if line.starts_with("# HELP") || line.starts_with("# TYPE") {
            out.push_str(line);
            out.push('\n');
        } else if !line.starts_with('#') && stamp(line) == Some(newest) {
            let (sample, _) = line.rsplit_once(' ').expect("sample with timestamp");
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// An exporter whose counters CSV has none of the fields gpu-ledger reads: `page`'s temperature
/// and power lines, for GPUs with other UUIDs on node `node`.
fn without_read_fields(page: &str, node: &str) -> String {
    let kept = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"];
    let mut out = String::new();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if kept.contains(&name) {
            let line = line
                .replace(
                    "Hostname=\"computeinstance-e00c1p6dpy98xytphp\"",
                    &format!("Hostname=\"{node}\""),
                )
                .replace("UUID=\"GPU-", "UUID=\"GPU-c0de0000-");
            out.push_str(&line);
            out.push('\n');
        }
    }
    assert_eq!(out.lines().count(), 4, "two GPUs, two fields each:\n{out}");
    assert!(!out.contains("computeinstance-e00c1p6dpy98xytphp"), "{out}");
    out
}

/// A scrape job for `target` (`None`: no target left): as a default ServiceMonitor scrapes an
/// exporter pod (`honor_labels: false`, the pod's target labels) or, for a page that already
/// went through a scrape, keeping its labels.
fn job(name: &str, target: Option<&str>, exporter_pod: Option<&str>) -> String {
    let targets = target.map_or_else(|| "[]".to_string(), |t| format!("['{t}']"));
    match exporter_pod {
        Some(pod) => format!(
            "- job_name: {name}\n  honor_labels: false\n  static_configs:\n  - targets: {targets}\n    labels:\n      namespace: gpu-operator\n      pod: {pod}\n      container: nvidia-dcgm-exporter\n"
        ),
        None => format!(
            "- job_name: {name}\n  honor_labels: true\n  static_configs:\n  - targets: {targets}\n"
        ),
    }
}

fn config(jobs: &[String]) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n{}",
        jobs.concat()
    )
}

/// `gpu-ledger serve` as token user `gpu-ledger` on `port`, reading `prometheus`.
fn serve(cp: &ControlPlane, port: u16, prometheus: &str) -> ChildGuard {
    let mut cmd = support::gpu_ledger_command();
    cmd.env(
        "KUBECONFIG",
        cp.kubeconfig_path("gpu-ledger").expect("kubeconfig"),
    )
    .env("POD_NAME", "fields-alert")
    .env("POD_NAMESPACE", "gpu-ledger")
    .env("GPU_LEDGER_LOG", "info")
    .arg("serve")
    .args(["--listen", &format!("127.0.0.1:{port}")])
    .args(["--prometheus-url", prometheus])
    .args(["--refresh-interval", "1s", "--scrape-interval", "1s"])
    .args(["--window", "10s", "--max-staleness", "5s"])
    // The count's default minute would make each wait below up to a minute longer.
    .args(["--dcgm-fields-check-interval", "2s"]);
    ChildGuard::spawn("fields-alert", cmd, &cp.dir().join("fields-alert.log"))
        .expect("spawn gpu-ledger serve")
}

/// The value of the one sample of `promql`, if exactly one.
async fn single_value(prom: &Prometheus, promql: &str) -> Option<f64> {
    let result = prom.query(promql).await.ok()?;
    match result.as_slice() {
        [one] => one["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

/// Fails the test with gpu-ledger's log if it has exited.
fn assert_running(ledger: &mut ChildGuard) {
    if let Some(status) = ledger.try_exit_status() {
        panic!("gpu-ledger exited ({status}):\n{}", ledger.log_tail(40));
    }
}

async fn alerts(prom: &Prometheus, state: &str) -> Vec<Value> {
    prom.query(&format!(
        "ALERTS{{alertname=\"{ALERT}\",alertstate=\"{state}\"}}"
    ))
    .await
    .expect("ALERTS query")
}

#[allow(clippy::too_many_lines)] // one scenario: missing fields page, then stop paging
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_missing_alert_fires_live_and_resolves() {
    let shipped = read("alerts/gpu-ledger.rules.yaml");
    let rules = shorten_for(&shipped, ALERT, SHORT_FOR);

    let legacy_page = read("tests/fixtures/dcgm-real/01-whole-gpus-dcp/dcgm.prom");
    let canonical_page = newest_scrape(&read("tests/fixtures/dcgm-renamed/dcgm.prom"));
    assert!(
        canonical_page.contains("DCGM_FI_DEV_FB_USED_BYTES{")
            && !canonical_page.contains("DCGM_FI_DEV_FB_USED{"),
        "the canonical page holds the canonical names only"
    );
    let custom_page = without_read_fields(&legacy_page, "gpu-node-custom-csv");
    let legacy = ReplayExporter::start(legacy_page).await.expect("exporter");
    let canonical = ReplayExporter::start(canonical_page)
        .await
        .expect("exporter");
    let custom = ReplayExporter::start(custom_page).await.expect("exporter");

    let ledger_port = free_port().expect("port");
    let healthy = [
        job(
            "dcgm-legacy",
            Some(&legacy.target()),
            Some("nvidia-dcgm-exporter-h100"),
        ),
        job("dcgm-canonical", Some(&canonical.target()), None),
        format!(
            "- job_name: gpu-ledger\n  static_configs:\n  - targets: ['127.0.0.1:{ledger_port}']\n"
        ),
    ];
    let mut with_custom = healthy.to_vec();
    with_custom.push(job(
        "dcgm-custom-csv",
        Some(&custom.target()),
        Some("nvidia-dcgm-exporter-custom"),
    ));
    // The exporter pod goes away, its job stays: Prometheus marks a target's series stale when
    // the target leaves a running scrape pool (a removed job's pool stops without marking them).
    let mut without_custom = healthy.to_vec();
    without_custom.push(job(
        "dcgm-custom-csv",
        None,
        Some("nvidia-dcgm-exporter-custom"),
    ));
    let prom = Prometheus::start_with_rules(
        &config(&with_custom),
        &[("gpu-ledger.rules.yaml", rules.as_str())],
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "this test needs a real Prometheus 2.42 (`apt-get install prometheus`, or set \
             PROMETHEUS_BIN) that loads the shipped rules: {e:#}"
        )
    });
    // The shipped rules file loaded whole (every group), and the shortened alert is in it.
    let loaded: Value = reqwest::get(format!("{}/api/v1/rules", prom.url()))
        .await
        .expect("rules")
        .json()
        .await
        .expect("rules json");
    let groups = loaded["data"]["groups"].as_array().expect("groups");
    assert!(groups.len() >= 4, "{loaded}");
    assert!(loaded.to_string().contains(ALERT), "{loaded}");

    let cp = ControlPlane::shared(false).expect("shared tier A control plane");
    let admin = cp.client("admin").await.expect("admin client");
    grant_shipped_read_only(&admin).await;
    let mut ledger = serve(cp, ledger_port, prom.url());

    // An exporter with none of the read fields: exactly its two GPUs counted, the alert fires.
    let missing = "gpu_ledger_dcgm_devices_fields_missing{job=\"gpu-ledger\"}";
    let deadline = tokio::time::Instant::now() + WAIT;
    let fired = loop {
        assert_running(&mut ledger);
        let firing = alerts(&prom, "firing").await;
        if !firing.is_empty() {
            break firing;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ALERT} not firing after {WAIT:?}; count scraped: {:?}; gpu-ledger log:\n{}",
            single_value(&prom, missing).await,
            ledger.log_tail(20)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(fired.len(), 1, "one alert for the job: {fired:?}");
    assert_eq!(fired[0]["metric"]["job"], "gpu-ledger", "{fired:?}");
    assert_eq!(fired[0]["metric"]["severity"], "warning", "{fired:?}");
    assert_eq!(
        single_value(&prom, missing).await,
        Some(2.0),
        "the custom-CSV exporter's two GPUs, not the legacy or canonical ones; gpu-ledger log:\n{}",
        ledger.log_tail(20)
    );
    let text = reqwest::get(format!("http://127.0.0.1:{ledger_port}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert_eq!(
        gpu_ledger_testkit::stack::metric_value(
            &text,
            "gpu_ledger_dcgm_devices_fields_missing",
            &[]
        ),
        Some(2.0)
    );

    // The exporter goes (its target leaves, its series go stale): the count is 0, the alert resolves and stays
    // silent for the legacy and canonical devices alone.
    prom.reload(&config(&without_custom)).await.expect("reload");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert_running(&mut ledger);
        let count = single_value(&prom, missing).await;
        let firing = alerts(&prom, "firing").await;
        if count == Some(0.0) && firing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not resolved after {WAIT:?}: count {count:?}, firing {firing:?}; DCGM series by job \
             {:?}; gpu-ledger log:\n{}",
            prom.query("count by (job) ({__name__=~\"DCGM_.+\"})").await,
            ledger.log_tail(20)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Three times the shortened `for`, evaluated every second: never pending, never firing.
    let quiet = tokio::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(15) {
        for state in ["pending", "firing"] {
            let a = alerts(&prom, state).await;
            assert!(a.is_empty(), "{state} for the healthy exporters: {a:?}");
        }
        assert_eq!(single_value(&prom, missing).await, Some(0.0));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ledger.terminate(Duration::from_secs(10));
}

#[test]
fn shorten_for_changes_only_that_alerts_for() {
    let rules = "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x > 0\n    for: 15m\n  - alert: B\n    expr: y > 0\n    for: 15m\n";
    let short = shorten_for(rules, "A", "5s");
    assert_eq!(short, rules.replacen("for: 15m", "for: 5s", 1));
    let missing = std::panic::catch_unwind(|| shorten_for(rules, "C", "5s"));
    assert!(missing.is_err(), "an alert that is not there fails");
    let no_for =
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x > 0\n  - alert: B\n    for: 15m\n";
    let no_for = std::panic::catch_unwind(|| shorten_for(no_for, "A", "5s"));
    assert!(
        no_for.is_err(),
        "an alert without its own `for` fails (B's is not A's)"
    );
}
