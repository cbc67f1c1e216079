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
            url: url.parse().expect("store url"),
            bearer_token_file: None,
            ca_file: None,
            insecure_skip_verify: false,
            timeout: Duration::from_secs(30),
            selector: selector.map(|s| s.parse().expect("selector")),
            headers: Vec::new(),
        })
        .expect("client"),
    )
}

async fn start() -> TwoClusters {
    let stores = TwoClusters::start(&[
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
    for url in [stores.thanos.url(), stores.vm.url()] {
        wait_for_series(url, "DCGM_FI_DEV_GPU_UTIL", 2, Duration::from_secs(180))
            .await
            .unwrap_or_else(|e| panic!("{e:#}\nthanos query log:\n{}", stores.thanos.log_tail(30)));
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
    let stores = start().await;
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
}
