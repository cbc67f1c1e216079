//! Many clusters in one metrics store (telemetry round 3, case 5), on real parts: two Debian
//! Prometheus instances, each scraping its own DCGM test double (`ReplayExporter`, serving
//! dcgm-exporter's text format with the exporter's own label set) and carrying
//! `external_labels: {cluster: east|west}`, behind
//! (a) **Thanos** — a sidecar per Prometheus and `thanos query`, built from its Go module by
//!     `scripts/build-thanos.sh` — and
//! (b) **VictoriaMetrics** (Debian) receiving both instances' remote writes, queried through the
//!     `/prometheus` path prefix users put in front of it.
//! The two clusters use the same namespace, pod and node names (as Kubeflow profiles across
//! clusters do) and different GPUs: east's is idle, west's busy. gpu-ledger must refuse to join
//! without `--prometheus-selector` and see only its cluster's GPU with it; a Thanos answer that
//! misses a store is partial and proves nothing idle.
//!
//! Tests never skip: a missing Thanos or VictoriaMetrics fails them naming what to install.

use std::sync::Arc;
use std::time::Duration;

use gpu_ledger::ledger::usage::Window;
use gpu_ledger::usage::live::{LiveSettings, LiveUsage};
use gpu_ledger::usage::prom::{PromClient, PromConfig, PromError};
use gpu_ledger::usage::scheme::SchemeChoice;
use gpu_ledger_testkit::stores::{TwoClusters, wait_for_series};

const EAST_GPU: &str = "GPU-5f3a9c1e-0b7d-4e2a-9c61-3d8e2f4a7b10";
const WEST_GPU: &str = "GPU-a81c4d22-6e90-4b3f-8d15-7c2e9a0f1b64";

/// One dcgm-exporter scrape of a node with one A100 held by `research/nb-0`, as the exporter
/// writes it (workload labels `pod`/`namespace`/`container`, `Hostname`, `UUID`, `modelName`,
/// `DCGM_FI_DRIVER_VERSION`: the label set of tests/fixtures/dcgm-real/01-whole-gpus-dcp).
/// Prometheus scrapes it without honor_labels, so the workload labels arrive as `exported_*`.
fn scrape(uuid: &str, util_percent: u32) -> String {
    let labels = format!(
        "gpu=\"0\",UUID=\"{uuid}\",device=\"nvidia0\",modelName=\"NVIDIA A100 80GB PCIe\",Hostname=\"gpu-node-1\",DCGM_FI_DRIVER_VERSION=\"535.129.03\",container=\"jupyter\",namespace=\"research\",pod=\"nb-0\""
    );
    let active = f64::from(util_percent) / 100.0;
    format!(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util_percent}\n\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n\
DCGM_FI_DEV_FB_USED{{{labels}}} 1024\n\
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {active}\n"
    )
}

fn settings() -> LiveSettings {
    LiveSettings {
        scheme: SchemeChoice::Auto,
        window: Window {
            length: chrono::Duration::minutes(1),
            interval: chrono::Duration::seconds(2),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        },
        history_lookback: chrono::Duration::minutes(5),
        min_coverage: 0.9,
    }
}

fn client(url: &str, selector: Option<&str>) -> Arc<PromClient> {
    Arc::new(
        PromClient::new(PromConfig {
            selector: selector.map(|s| s.parse().expect("selector")),
            ..PromConfig::new(url.parse().expect("store url"), Duration::from_secs(30))
        })
        .expect("client"),
    )
}

async fn start() -> TwoClusters {
    let mut stores = TwoClusters::start(&[
        ("east", scrape(EAST_GPU, 0)),
        ("west", scrape(WEST_GPU, 90)),
    ])
    .await
    .unwrap_or_else(|e| {
        panic!(
            "these tests need Thanos (scripts/build-thanos.sh, or THANOS_BIN) and Debian's \
                 victoria-metrics (apt-get install victoria-metrics): {e:#}"
        )
    });
    // Both clusters' GPUs must have arrived: scraped, shipped by the sidecars / remote write.
    for url in [stores.thanos.url().to_string(), stores.vm.url().to_string()] {
        if let Err(e) =
            wait_for_series(&url, "DCGM_FI_DEV_GPU_UTIL", 2, Duration::from_secs(180)).await
        {
            panic!("{e:#}\n{}", stores.thanos.log_tail(15));
        }
    }
    stores
}

/// The store URLs gpu-ledger is pointed at: Thanos' querier, and VictoriaMetrics behind the
/// `/prometheus` path prefix (so a prefix in --prometheus-url is honoured).
fn urls(stores: &TwoClusters) -> [(&'static str, String); 2] {
    [
        ("thanos", stores.thanos.url().to_string()),
        ("victoriametrics", format!("{}/prometheus", stores.vm.url())),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_stores_are_refused_without_a_selector_and_narrowed_with_one() {
    let mut stores = start().await;
    for (store, url) in urls(&stores) {
        // No selector: both clusters' series answer; joining them would give research/nb-0 the
        // average of its own idle GPU and the other cluster's busy one. Refused.
        let mut live = LiveUsage::new(Some(client(&url, None)), settings());
        let fetched = live.fetch().await;
        match &fetched.error {
            Some(e @ PromError::SeveralClusters { clusters }) => {
                assert_eq!(
                    clusters,
                    &["cluster=\"east\"", "cluster=\"west\""],
                    "{store}: {e}"
                );
                assert!(e.to_string().contains("--prometheus-selector"), "{e}");
            }
            other => panic!("{store}: expected a refusal naming both clusters, got {other:?}"),
        }
        assert!(
            !fetched.usage.available && fetched.usage.devices.is_empty(),
            "{store}: nothing may be joined from a mixed answer"
        );

        // With this cluster's selector: its own GPU only, idle.
        for (cluster, uuid, busy) in [("east", EAST_GPU, false), ("west", WEST_GPU, true)] {
            let selector = format!("cluster=\"{cluster}\"");
            let mut live = LiveUsage::new(Some(client(&url, Some(&selector))), settings());
            let fetched = live.fetch().await;
            assert!(
                fetched.error.is_none(),
                "{store} {cluster}: {:?}",
                fetched.error
            );
            let uuids: Vec<&str> = fetched
                .usage
                .devices
                .iter()
                .map(|d| d.key.uuid.as_str())
                .collect();
            assert_eq!(uuids, [uuid], "{store} {cluster}: only this cluster's GPU");
            let device = &fetched.usage.devices[0];
            let peak = device.peak.expect("a current reading");
            assert_eq!(peak > 0.5, busy, "{store} {cluster}: peak {peak}");
            assert_eq!(
                device
                    .workloads
                    .first()
                    .map(|w| (w.namespace.as_str(), w.pod.as_str())),
                Some(("research", "nb-0")),
                "{store} {cluster}: attributed through exported_pod"
            );
        }
    }

    // West's Prometheus goes away behind its (running) sidecar: Thanos answers with east's
    // series and a warning. Only one cluster answers, so nothing is refused, but the answer is
    // partial, and a partial answer is no proof of idleness.
    stores.clusters[1].prometheus.stop(Duration::from_secs(5));
    let mut seen = None;
    for _ in 0..30 {
        let mut live = LiveUsage::new(Some(client(stores.thanos.url(), None)), settings());
        let fetched = live.fetch().await;
        if fetched.usage.partial {
            seen = Some(fetched);
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let Some(fetched) = seen else {
        panic!(
            "Thanos never answered partially with west's Prometheus down\n{}",
            stores.thanos.log_tail(15)
        );
    };
    assert!(fetched.error.is_none(), "{:?}", fetched.error);
    assert!(fetched.stats.warnings >= 1, "warnings counted");
    let uuids: Vec<&str> = fetched
        .usage
        .devices
        .iter()
        .map(|d| d.key.uuid.as_str())
        .collect();
    assert_eq!(uuids, [EAST_GPU], "east's series still answer");
}

/// A kubectl-style pods and nodes dump of "this" cluster: `research/nb-0` holding one A100 on
/// `gpu-node-1`, Running and Ready.
fn write_claims(dir: &std::path::Path) {
    let pods = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nb-0", "namespace": "research", "uid": "0b7c1f7e-1111-4a2b-9c3d-5e6f7a8b9c0d",
                     "creationTimestamp": "2026-11-01T00:00:00Z"},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "jupyter",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-11-01T00:00:00Z",
                   "conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-11-01T00:00:00Z"}]}
    }]});
    let nodes = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe"}},
        "status": {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"}}
    }]});
    std::fs::write(dir.join("pods.json"), pods.to_string()).expect("pods.json");
    std::fs::write(dir.join("nodes.json"), nodes.to_string()).expect("nodes.json");
}

fn report(dir: &std::path::Path, selector: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    cmd.args([
        "report",
        "-o",
        "json",
        "--window",
        "1m",
        "--scrape-interval",
        "2s",
        "--from",
    ])
    .arg(dir);
    if let Some(s) = selector {
        cmd.arg("--prometheus-selector").arg(s);
    }
    cmd.env_remove("GPU_LEDGER_PROMETHEUS_SELECTOR")
        .output()
        .expect("run gpu-ledger report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_of_a_shared_store_is_refused_without_a_selector_and_agrees_with_live_with_one() {
    let stores = start().await;
    // Let a minute of samples accumulate so the window is covered, then dump what the shared
    // store holds, both clusters, with VictoriaMetrics' /federate (text exposition with
    // timestamps, as `capture` writes it).
    tokio::time::sleep(Duration::from_secs(65)).await;
    let dump = reqwest::Client::new()
        .get(format!("{}/federate", stores.vm.url()))
        .query(&[("match[]", "{__name__=~\"DCGM_.*\"}")])
        .send()
        .await
        .expect("federate")
        .text()
        .await
        .expect("federate body");
    assert!(
        dump.contains("cluster=\"east\"") && dump.contains("cluster=\"west\""),
        "the dump holds both clusters:\n{dump}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    write_claims(dir.path());
    std::fs::write(dir.path().join("dcgm.prom"), &dump).expect("dcgm.prom");

    let out = report(dir.path(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "refused as bad input: {stderr}");
    assert!(
        stderr.contains("cluster=\"east\"")
            && stderr.contains("cluster=\"west\"")
            && stderr.contains("--prometheus-selector"),
        "names both clusters and the way out: {stderr}"
    );

    let out = report(dir.path(), Some("cluster=\"east\""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report json");
    let pod = &json["pods"][0];
    assert_eq!(pod["pod"], "nb-0");
    assert_eq!(pod["attribution"], "exclusive", "{pod}");
    let offline_util = pod["utilization"].as_f64().expect("utilisation known");

    // Live through the same store with the same selector: the same device, the same reading.
    let mut live = LiveUsage::new(
        Some(client(stores.vm.url(), Some("cluster=\"east\""))),
        settings(),
    );
    let fetched = live.fetch().await;
    let device = fetched.usage.devices.first().expect("east's GPU");
    assert_eq!(device.key.uuid, EAST_GPU);
    assert_eq!(
        device.utilization,
        Some(offline_util),
        "live and offline agree"
    );
    assert!(
        offline_util < 0.05,
        "east's own GPU is idle, not the average with west's busy one"
    );
    assert_eq!(
        json["unclaimed_busy"],
        serde_json::json!([]),
        "west's GPU is not this cluster's"
    );
}
