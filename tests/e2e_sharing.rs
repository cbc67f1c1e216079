//! GPU sharing layers end to end (issue 39). HAMi vGPU: a node with one card split by HAMi and
//! four vGPU pods at 25 % each reads as ONE GPU with four quarter-claims; the idle sharer is proven
//! idle by its own HAMi monitor series while the card (and its other sharers) are busy.
//!
//! HAMi's scheduler, device plugin and vGPU monitor need NVIDIA GPUs and cannot run here. The
//! live test writes their objects as they write them: the node's `hami.io/node-nvidia-register`
//! and `nvidia.com/gpu` = cards × `deviceSplitCount` (device plugin), the pods'
//! `hami.io/vgpu-devices-allocated` / `-to-allocate` and `spec.nodeName` (scheduler, which binds
//! pods itself), on a real kube-apiserver 1.36 (tier A). A replay double serves the monitor's
//! page in its own shape (`cmd/vGPUmonitor/metrics.go`: `hami_*` names, labels `namespace, pod,
//! container, vdevice_index, device_uuid, zone`) and dcgm-exporter's page for the card without
//! pod labels (HAMi#112); a real Prometheus scrapes the monitor as a ServiceMonitor would
//! (`honor_labels: false`, so the workload labels arrive as `exported_*`). Sources of every
//! shape: `tests/fixtures/hami/README.md`.
//!
//! The offline test reads the fixture dump `tests/fixtures/hami` (new and legacy monitor names in
//! one file, as a node mid rolling-upgrade reports them).
//!
//! One control plane and one Prometheus per test ([`SharingStack`]); the KAI and MPS layers may
//! add their cases through the same set-up. Tests never skip: a missing Prometheus or control
//! plane fails them naming what to install.

mod support;

use std::fmt::Write as _;
use std::time::Duration;

use gpu_ledger_testkit::dcgm::ReplayExporter;
use gpu_ledger_testkit::{ControlPlane, GpuNode, Prometheus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const NS: &str = "team-a";
/// protocol.md's second card.
const CARD: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";
const NODE: &str = "hami-1";

/// A tier-A control plane (the shipped read-only RBAC, namespace [`NS`]) and a Prometheus
/// scraping the given pages every second: the set-up the sharing tests share.
struct SharingStack {
    cp: ControlPlane,
    admin: kube::Client,
    prom: Prometheus,
    _pages: Vec<ReplayExporter>,
}

/// One page to scrape: job name, target labels (scraped with `honor_labels: false` when there
/// are any, as a ServiceMonitor does; else with `honor_labels: true`), body.
struct Page {
    job: &'static str,
    target_labels: &'static [(&'static str, &'static str)],
    body: String,
}

impl SharingStack {
    async fn start(pages: Vec<Page>) -> Self {
        let (cp, admin) = support::tier_a_watching(NS).await;
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        let mut replays = Vec::new();
        for p in pages {
            let replay = ReplayExporter::start(p.body).await.expect("replay page");
            let _ = write!(
                config,
                "- job_name: {}\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  honor_labels: {}\n  static_configs:\n  - targets: ['{}']\n",
                p.job,
                p.target_labels.is_empty(),
                replay.target(),
            );
            if !p.target_labels.is_empty() {
                config.push_str("    labels:\n");
            }
            for (k, v) in p.target_labels {
                let _ = writeln!(config, "      {k}: '{v}'");
            }
            replays.push(replay);
        }
        let prom = Prometheus::start(&config).await.unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42: `apt-get install prometheus` \
                 (or set PROMETHEUS_BIN): {e:#}"
            )
        });
        SharingStack {
            cp,
            admin,
            prom,
            _pages: replays,
        }
    }
}

/// A vGPU pod as HAMi's webhook and scheduler leave it: opencost#3828's limits verbatim
/// (`nvidia.com/gpu` 1, `gpucores` 25, `gpumem-percentage` 25) and, when bound, the allocation
/// annotations (the same string under both keys, `PatchAnnotations`) and `spec.nodeName`.
fn vgpu_pod(name: &str, bound: bool) -> Pod {
    let limits = json!({
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "25",
        "nvidia.com/gpumem-percentage": "25",
    });
    let alloc = format!("{CARD},NVIDIA,8192,25:;");
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{
                "name": "cuda",
                "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {"limits": limits, "requests": limits},
            }],
        },
    });
    if bound {
        pod["metadata"]["annotations"] = json!({
            "hami.io/vgpu-devices-allocated": alloc,
            "hami.io/vgpu-devices-to-allocate": alloc,
            "hami.io/vgpu-node": NODE,
            "hami.io/bind-phase": "success",
        });
        pod["spec"]["nodeName"] = json!(NODE);
    }
    serde_json::from_value(pod).expect("pod")
}

/// HAMi's monitor page: vgpu-0 idle (util 0, last kernel three hours ago), vgpu-1..3 busy.
fn monitor_page() -> String {
    let mut page = String::from(
        "# HELP hami_container_device_utilization_ratio Container device SM utilization ratio\n\
         # TYPE hami_container_device_utilization_ratio gauge\n",
    );
    let labels = |pod: &str| {
        format!(
            "container=\"cuda\",device_uuid=\"{CARD}\",namespace=\"{NS}\",pod=\"{pod}\",vdevice_index=\"0\",zone=\"vGPU\""
        )
    };
    for (pod, util, kernel) in [
        ("vgpu-0", 0, 10800.0),
        ("vgpu-1", 48, 0.2),
        ("vgpu-2", 61, 0.2),
        ("vgpu-3", 35, 1.0),
    ] {
        let l = labels(pod);
        let _ = write!(
            page,
            "hami_container_device_utilization_ratio{{{l}}} {util}\n\
             hami_container_last_kernel_elapsed_seconds{{{l}}} {kernel}\n\
             hami_vgpu_memory_used_bytes{{{l}}} 1207959552\n"
        );
    }
    page
}

/// dcgm-exporter on a HAMi node: the card, busy, and no pod labels (HAMi#112).
fn dcgm_page() -> String {
    format!(
        "DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"{CARD}\",device=\"nvidia0\",modelName=\"Tesla V100-PCIE-32GB\",Hostname=\"{NODE}\"}} 72\n\
         DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"{CARD}\",device=\"nvidia0\",modelName=\"Tesla V100-PCIE-32GB\",Hostname=\"{NODE}\"}} 20480\n"
    )
}

fn pod_row<'a>(report: &'a Value, pod: &str) -> &'a Value {
    report["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|r| r["pod"] == pod))
        .unwrap_or_else(|| panic!("no row for {pod} in {report:#}"))
}

/// The acceptance case of issue 39 in a report's JSON: node 1 GPU, four pods at 0.25 (the card
/// in their `sharing`), vgpu-0 proven idle, the others active, the pending pod asking 1 GPU.
fn assert_one_card_four_quarters(report: &Value, what: &str) {
    let nodes = report["nodes"].as_array().expect("nodes");
    let node = nodes
        .iter()
        .find(|n| n["node"] == NODE)
        .unwrap_or_else(|| panic!("{what}: no node row: {report:#}"));
    assert_eq!(node["gpus_allocatable"], 1.0, "{what}: {node}");
    assert_eq!(node["gpus_claimed"], 1.0, "{what}: {node}");
    assert_eq!(node["gpus_free"], 0.0, "{what}: {node}");
    for i in 0..4 {
        let p = pod_row(report, &format!("vgpu-{i}"));
        assert_eq!(p["gpus"], 0.25, "{what}: {p}");
        assert_eq!(p["attribution"], "shared", "{what}: {p}");
        assert_eq!(p["sharing"]["layer"], "hami", "{what}: {p}");
        assert_eq!(p["sharing"]["devices"][0]["uuid"], CARD, "{what}: {p}");
        assert_eq!(p["sharing"]["devices"][0]["cores"], 25, "{what}: {p}");
        assert_eq!(
            p["sharing"]["devices"][0]["memory_mib"], 8192,
            "{what}: {p}"
        );
    }
    let idle = pod_row(report, "vgpu-0");
    assert_eq!(idle["idle"], true, "{what}: own series idle: {idle}");
    assert_eq!(idle["utilization"], 0.0, "{what}: {idle}");
    for busy in ["vgpu-1", "vgpu-2", "vgpu-3"] {
        let p = pod_row(report, busy);
        assert_eq!(p["idle"], false, "{what}: {p}");
        assert!(
            p["utilization"].as_f64().is_some_and(|u| u >= 0.3),
            "{what}: {p}"
        );
    }
    let pending = pod_row(report, "vgpu-pending");
    assert_eq!(pending["state"], "pending", "{what}: {pending}");
    assert_eq!(pending["gpus"], 1.0, "{what}: demand by request: {pending}");
    // The busy card is its sharers': joined by UUID, never unclaimed busy.
    assert_eq!(report["unclaimed_busy"], json!([]), "{what}");
}

#[test]
fn offline_dump_reads_one_card_as_one_gpu_with_four_quarter_claims() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hami");
    let out = support::report_json(&dir, &["--at", "2026-11-28T09:00:00Z"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_one_card_four_quarters(&report, "offline");
    // vgpu-3 reads HAMi's legacy names; vgpu-2's monitor read 104 % once (HAMi#555).
    assert_eq!(
        pod_row(&report, "vgpu-2")["sharing"]["readings_over_100"],
        true
    );
    assert_eq!(
        pod_row(&report, "vgpu-1")["sharing"]["readings_over_100"],
        false
    );
    // Idle since its last kernel, three hours before --at.
    let idle_seconds = pod_row(&report, "vgpu-0")["idle_seconds"]
        .as_f64()
        .expect("idle seconds");
    assert!((idle_seconds - 10800.0).abs() < 1.0, "{idle_seconds}");
    // The table shows the split in the pod's note.
    let table = support::gpu_ledger_command()
        .args(["report", "--from"])
        .arg(&dir)
        .args(["--at", "2026-11-28T09:00:00Z", "-o", "wide"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("HAMi vGPU 25% of GPU-0fc3eda5… (8192 MiB, 25 cores)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_hami_node_reads_as_one_gpu_with_four_quarter_claims() {
    let stack = SharingStack::start(vec![
        Page {
            job: "hami-vgpu-monitor",
            // A ServiceMonitor's target labels name the monitor pod: HAMi's labels arrive as
            // exported_namespace / exported_pod / exported_container.
            target_labels: &[
                ("namespace", "hami-system"),
                ("pod", "hami-device-plugin-8xq2v"),
                ("container", "vgpu-monitor"),
            ],
            body: monitor_page(),
        },
        Page {
            job: "dcgm-exporter",
            target_labels: &[],
            body: dcgm_page(),
        },
    ])
    .await;
    stack
        .cp
        .add_node(
            &GpuNode::new(NODE, 10)
                .product("Tesla-V100-PCIE-32GB")
                .label("nvidia.com/gpu.count", "1")
                .annotation(
                    "hami.io/node-handshake-nvidia",
                    "Reported_2026-11-28 08:59:30",
                )
                .annotation(
                    "hami.io/node-nvidia-register",
                    &format!("{CARD},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:"),
                ),
        )
        .await
        .expect("node");
    let pods: Api<Pod> = Api::namespaced(stack.admin.clone(), NS);
    for i in 0..4 {
        pods.create(
            &PostParams::default(),
            &vgpu_pod(&format!("vgpu-{i}"), true),
        )
        .await
        .expect("vgpu pod");
    }
    pods.create(&PostParams::default(), &vgpu_pod("vgpu-pending", false))
        .await
        .expect("pending pod");
    // A full 10 s window of 1 s scrapes before judging; then the live report and a capture of
    // the same instant, read offline, must both show the split (retried while the window fills
    // on a loaded machine).
    let prom = stack.prom.url().to_string();
    let cp = &stack.cp;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    tokio::time::sleep(Duration::from_secs(14)).await;
    loop {
        let (live, offline, _dir) =
            tokio::task::block_in_place(|| support::live_and_offline_from(cp, &prom));
        let idle = |r: &Value| pod_row(r, "vgpu-0")["idle"] == true;
        if (idle(&live) && idle(&offline)) || std::time::Instant::now() > deadline {
            assert_one_card_four_quarters(&live, "live");
            assert_one_card_four_quarters(&offline, "capture read offline");
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
