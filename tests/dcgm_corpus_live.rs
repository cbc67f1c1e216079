//! The corpus of real dcgm-exporter output through the LIVE path: every case's scrape is served
//! by a replay test double (`testkit::dcgm::ReplayExporter`, the exporter's lines verbatim) and
//! scraped every second by a real Prometheus 2.42, then read back with the live usage source
//! (`usage::live::fetch_window`: raw samples, the one reduction) and joined with the case's claims.
//! Each case must yield exactly the ledger its `expected.json` states — the same check the offline
//! corpus test makes, so live and offline agree on every case.
//!
//! Scrapes are as a cluster makes them: where the case has the exporter's DaemonSet pod, the job
//! scrapes without `honor_labels` and with the pod's target labels (`namespace`, `pod`,
//! `container`, `instance` = pod IP:9400), so Prometheus renames the workload labels to
//! `exported_*` exactly as a default ServiceMonitor does; otherwise (or when the recorded lines
//! already went through such a scrape) with `honor_labels: true`.

mod corpus;

use std::fmt::Write as _;
use std::time::Duration;

use chrono::Utc;
use gpu_ledger::app::offline::{self, OfflineInput};
use gpu_ledger::claims::files::{self, DumpPaths};
use gpu_ledger::ledger::usage::{Usage, Window};
use gpu_ledger::ledger::{self, Policy};
use gpu_ledger::usage::fields;
use gpu_ledger::usage::history;
use gpu_ledger::usage::live::{self, LiveSettings};
use gpu_ledger::usage::prom::{PromClient, PromConfig};
use gpu_ledger::usage::scheme::SchemeChoice;
use gpu_ledger::usage::series::Series;
use gpu_ledger_testkit::Prometheus;
use gpu_ledger_testkit::dcgm::ReplayExporter;
use serde_json::Value;

/// An exporter pod of a case (a pod of its pods.json controlled by a DaemonSet).
#[derive(Debug, Clone)]
struct ExporterPod {
    namespace: String,
    name: String,
    node: String,
    ip: Option<String>,
}

fn exporter_pods(case: &corpus::Case) -> Vec<ExporterPod> {
    let text = std::fs::read_to_string(case.dir.join("pods.json")).expect("pods.json");
    let pods: Value = serde_json::from_str(&text).expect("pods.json is JSON");
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_string();
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| {
                    o.iter()
                        .any(|o| o["kind"] == "DaemonSet" && o["controller"] == true)
                })
        })
        .map(|p| ExporterPod {
            namespace: str_of(&p["metadata"]["namespace"]),
            name: str_of(&p["metadata"]["name"]),
            node: str_of(&p["spec"]["nodeName"]),
            ip: p["status"]["podIP"].as_str().map(str::to_string),
        })
        .collect()
}

/// The value of the host label of a sample line, if any.
fn host_of(line: &str) -> Option<&str> {
    ["Hostname=\"", "hostname=\""].iter().find_map(|key| {
        let start = line.find(key)? + key.len();
        line[start..].split('"').next()
    })
}

/// The scrape split per exporter pod (a recorded file may hold several nodes' exporters): lines
/// go to the exporter whose node or pod name their host label names, the rest to the first.
fn split_scrape(scrape: &str, exporters: &[ExporterPod]) -> Vec<String> {
    let mut parts = vec![String::new(); exporters.len().max(1)];
    for line in corpus::sample_lines(scrape) {
        let i = host_of(line)
            .and_then(|h| exporters.iter().position(|e| e.node == h || e.name == h))
            .unwrap_or(0);
        parts[i].push_str(line);
        parts[i].push('\n');
    }
    parts
}

fn scrape_job(
    case: &corpus::Case,
    index: usize,
    exporter: Option<&ExporterPod>,
    target: &str,
) -> String {
    let mut job = format!(
        "- job_name: '{name}-{index}'\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n",
        name = case.name
    );
    match exporter {
        Some(e) => {
            let _ = write!(
                job,
                "  honor_labels: false\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      case: '{name}'\n      namespace: '{ns}'\n      pod: '{pod}'\n      container: nvidia-dcgm-exporter\n",
                name = case.name,
                ns = e.namespace,
                pod = e.name,
            );
            if let Some(ip) = &e.ip {
                let _ = writeln!(job, "      instance: '{ip}:9400'");
            }
        }
        None => {
            let _ = write!(
                job,
                "  honor_labels: true\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      case: '{name}'\n",
                name = case.name
            );
        }
    }
    job
}

/// Series in the Prometheus text format with millisecond timestamps (label values escaped).
fn exposition_text(series: &[Series]) -> String {
    let mut out = String::new();
    for s in series {
        let labels: Vec<String> = s
            .labels
            .iter()
            .map(|(k, v)| {
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{k}=\"{v}\"")
            })
            .collect();
        for (t, v) in &s.samples {
            let _ = writeln!(out, "{}{{{}}} {v} {t}", s.name, labels.join(","));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_yields_its_expected_ledger_live() {
    let cases = corpus::cases();
    let mut exporters = Vec::new();
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
    );
    for case in &cases {
        // Lines that already went through a scrape (`exported_*`) are replayed as they are.
        let pods = if case.scrape.contains("exported_pod=") {
            Vec::new()
        } else {
            exporter_pods(case)
        };
        for (i, part) in split_scrape(&case.scrape, &pods).into_iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let exporter = ReplayExporter::start(part).await.expect("replay exporter");
            config.push_str(&scrape_job(case, i, pods.get(i), &exporter.target()));
            exporters.push(exporter);
        }
    }
    let prom = Prometheus::start(&config).await.unwrap_or_else(|e| {
        panic!(
            "this test needs a real Prometheus 2.42: `apt-get install prometheus` \
             (or set PROMETHEUS_BIN): {e:#}"
        )
    });
    let window = Window {
        length: chrono::Duration::seconds(20),
        interval: chrono::Duration::seconds(1),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    };
    let settings = LiveSettings {
        scheme: SchemeChoice::Auto,
        window,
        history_lookback: history::DEFAULT_LOOKBACK,
        min_coverage: 0.9,
    };
    let policy = Policy::default();
    // A full window of scrapes first, then every case must match (retrying a few times: a
    // scrape can land a moment late on a loaded machine).
    tokio::time::sleep(Duration::from_secs(23)).await;
    let mut failures = Vec::new();
    for attempt in 0..10 {
        failures.clear();
        for case in &cases {
            let client = PromClient::new(PromConfig {
                selector: Some(format!("case=\"{}\"", case.name).parse().expect("selector")),
                ..PromConfig::new(
                    prom.url().parse().expect("prometheus url"),
                    Duration::from_secs(30),
                )
            })
            .expect("client");
            let now = Utc::now();
            let devices = live::fetch_window(&client, &settings, None, now)
                .await
                .unwrap_or_else(|e| panic!("{}: live fetch: {e}", case.name));
            assert!(!devices.is_empty(), "{}: nothing scraped", case.name);
            let claims = files::load(&DumpPaths::from_dir(&case.dir), &policy.names)
                .unwrap_or_else(|e| panic!("{}: claims: {e}", case.name));
            let ledger = ledger::build(
                &claims,
                &Usage {
                    hami: Vec::new(),
                    devices,
                    available: true,
                    partial: false,
                    ..Usage::default()
                },
                now,
                &policy,
            );
            let json = serde_json::to_value(&ledger).expect("serialises");
            failures.extend(case.check(&json, "live"));
            // The same samples as a dump (what `capture` writes), read by the offline report:
            // exactly the same ledger, field for field.
            let raw = client
                .range_series(
                    &fields::all_spellings().collect::<Vec<_>>(),
                    window.length,
                    now,
                )
                .await
                .expect("raw samples");
            let dir = tempfile::tempdir().expect("tempdir");
            for f in ["pods.json", "nodes.json"] {
                std::fs::copy(case.dir.join(f), dir.path().join(f)).expect("copy claims");
            }
            std::fs::write(dir.path().join("dcgm.prom"), exposition_text(&raw)).expect("dump");
            let mut input = OfflineInput::from_dir(dir.path());
            input.at = Some(now);
            input.window = window.length;
            input.scrape_interval = Some(window.interval);
            let offline = offline::load(&input, now).expect("offline load of the dump");
            let offline_json = serde_json::to_value(&offline.ledger).expect("serialises");
            if offline_json != json {
                failures.push(format!(
                    "{}: live and offline-of-the-same-samples differ:\nlive    {json}\noffline {offline_json}",
                    case.name
                ));
            }
        }
        if failures.is_empty() {
            break;
        }
        eprintln!(
            "attempt {attempt}: {} differences; retrying",
            failures.len()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        failures.is_empty(),
        "\n{}\nprometheus log:\n{}",
        failures.join("\n"),
        prom.log_tail(20)
    );
    drop(exporters);
}
