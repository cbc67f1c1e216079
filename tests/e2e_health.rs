//! Sick cards, live (issue 39 item 5): a real `gpu-ledger serve` (shipped read-only RBAC) on a
//! tier A kube-apiserver 1.36 and a real Prometheus that scrapes it and evaluates the SHIPPED
//! `alerts/gpu-ledger.rules.yaml`.
//!
//! NVIDIA's DRA driver, the kubelet and the scheduler cannot run here (no GPUs, no nodes), so
//! their writes are made as they make them:
//! * the driver's ResourceSlice for node `dra-1` (testkit's `NvidiaSlice`), then the taints its
//!   NVML health check adds (`gpu.nvidia.com/xid=79` `NoSchedule` on `gpu-0`, the non-fatal
//!   `gpu.nvidia.com/xid=43` `None` on `gpu-1`; kubernetes-sigs/dra-driver-nvidia-gpu
//!   `site/content/docs/guides/gpu-health-checking.md`), by updating the slice;
//! * the scheduler's allocation and `reservedFor` on each ResourceClaim (status subresource);
//! * the kubelet's `status.containerStatuses[].allocatedResourcesStatus` (KEP-4680) through
//!   pods/status: `Unhealthy` for the device-plugin card of `nb-0` (`nvidia.com/gpu`, resource id
//!   the GPU UUID), `Unknown` for `quiet-0`'s;
//! * dcgm-exporter's health families for `quiet-0`'s card (`tests/fixtures/health/dcgm-health.prom`:
//!   THERMAL at FAIL, a non-fatal XID 43), replayed by testkit's `ReplayExporter` and scraped as
//!   `/federate` keeps labels; serve reads them with `--dcgm-health`.
//!
//! Both fields are feature-gated (`DRADeviceTaints`, `ResourceHealthStatus`, on by default in
//! 1.36); an apiserver with a gate off drops the field silently, so the test asserts each one
//! survived the write and fails naming the gate if not.
//!
//! Expected: `trainer-0` (Job `trainer`, on the tainted `gpu-0`), `nb-0` (StatefulSet `nb`,
//! kubelet `Unhealthy`) and `quiet-0` (Job `quiet`, DCGM THERMAL FAIL; its kubelet says
//! `Unknown`) page `GpuLedgerPodOnUnhealthyGpu` naming pod, owner and reason; `fine-0` (on
//! `gpu-1`, taint effect `None`) does not.
//!
//! Tests never skip: a missing Prometheus or control plane fails them naming what to install.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::dra::{self, ClaimSource, NvidiaSlice};
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::{ControlPlane, GpuNode};
use gpu_ledger_testkit::{Prometheus, ReplayExporter};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "team-sick";
const ALERT: &str = "GpuLedgerPodOnUnhealthyGpu";
/// How long anything here may take on a busy 2-core machine (serve refreshes every second,
/// Prometheus scrapes and evaluates every second; the rest is margin).
const WAIT: Duration = Duration::from_secs(120);

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Taints as the driver's health check writes them: a fatal XID on `gpu-0`, a non-fatal one on
/// `gpu-1` (the guide's table: non-fatal XIDs get effect `None`).
fn taint_devices(slice: &mut ResourceSlice) {
    let devices = slice.spec.devices.as_mut().expect("slice devices");
    for d in devices.iter_mut() {
        let (value, effect) = match d.name.as_str() {
            "gpu-0" => ("79", "NoSchedule"),
            "gpu-1" => ("43", "None"),
            other => panic!("unexpected device {other}"),
        };
        d.taints = Some(vec![
            serde_json::from_value(json!({
                "key": "gpu.nvidia.com/xid",
                "value": value,
                "effect": effect,
                "timeAdded": "2026-07-22T02:24:46Z",
            }))
            .expect("DeviceTaint"),
        ]);
    }
}

/// A suspended Job (no controller runs here) to own a pod: the alert names the owner.
async fn owner_job(admin: &kube::Client, name: &str) -> Value {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "suspend": true,
            "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12"}]}}
        }
    }))
    .expect("Job JSON");
    let job = Api::<Job>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &job)
        .await
        .expect("Job");
    json!({"apiVersion": "batch/v1", "kind": "Job", "name": name,
        "uid": job.metadata.uid, "controller": true})
}

/// Creates `pod` bound to `node` and owned by `owner`; returns its uid.
async fn create_bound(admin: &kube::Client, mut pod: Pod, node: &str, owner: Value) -> String {
    pod.metadata.owner_references = Some(vec![serde_json::from_value(owner).expect("owner")]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.node_name = Some(node.into());
    spec.node_selector = None;
    let pod = Api::<Pod>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    pod.metadata.uid.expect("uid")
}

/// The scheduler's write: claim `claim` allocated `device` of `dra-1` and reserved for the pod.
async fn allocate(admin: &kube::Client, claim: &str, device: &str, pod: &str, uid: &str) {
    let status = json!({"status": {
        "allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-1", "device": device
        }]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]
    }});
    Api::<ResourceClaim>::namespaced(admin.clone(), NS)
        .patch_status(claim, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("claim allocation");
}

/// The kubelet's write: the pod Running, container `main` reporting `health` for resource
/// `name` / `id`. Returns the status the apiserver stored.
async fn kubelet_status(
    admin: &kube::Client,
    pod: &str,
    name: &str,
    id: &str,
    health: &str,
) -> Value {
    // The kubelet writes a message only with a verdict to explain (the apiserver refuses an
    // empty one).
    let mut resource = json!({"resourceID": id, "health": health});
    if health == "Unhealthy" {
        resource["message"] = json!("critical XID 79 reported by NVML");
    }
    let status = json!({"status": {
        "phase": "Running",
        "startTime": "2026-07-22T01:00:00Z",
        "conditions": [{"type": "Ready", "status": "True",
            "lastTransitionTime": "2026-07-22T01:00:00Z"}],
        "containerStatuses": [{
            "name": "main", "ready": true, "restartCount": 0,
            "image": "registry.invalid/cuda:12", "imageID": "",
            "state": {"running": {"startedAt": "2026-07-22T01:00:00Z"}},
            "allocatedResourcesStatus": [{"name": name, "resources": [resource]}]
        }]
    }});
    let stored = Api::<Pod>::namespaced(admin.clone(), NS)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
    serde_json::to_value(stored.status).expect("status JSON")
}

/// A device-plugin pod asking for one `nvidia.com/gpu`, its container named `main`.
fn plugin_pod(name: &str) -> Pod {
    let mut p = support::gpu_pod(name, 1, None);
    p.spec.as_mut().expect("spec").containers[0].name = "main".into();
    p
}

/// `gpu-ledger serve` as token user `gpu-ledger` on `port`, reading `prometheus` with
/// `--dcgm-health`.
fn serve(cp: &ControlPlane, port: u16, prometheus: &str) -> ChildGuard {
    let mut cmd = support::gpu_ledger_command();
    cmd.env(
        "KUBECONFIG",
        cp.kubeconfig_path("gpu-ledger").expect("kubeconfig"),
    )
    .env("POD_NAME", "health")
    .env("POD_NAMESPACE", "gpu-ledger")
    .env("GPU_LEDGER_LOG", "info")
    .arg("serve")
    .args(["--listen", &format!("127.0.0.1:{port}")])
    .args(["--prometheus-url", prometheus, "--dcgm-health"])
    .args(["--refresh-interval", "1s", "--scrape-interval", "1s"])
    .args(["--window", "10s", "--max-staleness", "5s"]);
    ChildGuard::spawn("health", cmd, &cp.dir().join("health.log")).expect("spawn gpu-ledger serve")
}

async fn firing(prom: &Prometheus) -> Vec<Value> {
    prom.query(&format!(
        "ALERTS{{alertname=\"{ALERT}\",alertstate=\"firing\"}}"
    ))
    .await
    .expect("ALERTS query")
}

#[allow(clippy::too_many_lines)] // one scenario: the writes of three components, then the page
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sick_cards_holder_pages_naming_pod_and_owner() {
    let (cp, admin) = support::tier_a_watching(NS).await;
    cp.add_node(&GpuNode::new("dra-1", 0).no_device_plugin())
        .await
        .expect("node dra-1");
    cp.add_node(&GpuNode::new("gpu-1", 2))
        .await
        .expect("node gpu-1");
    dra::install_device_classes(&admin)
        .await
        .expect("DeviceClasses");

    // The driver publishes its slice, then its health check taints the devices.
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    let mut slice = NvidiaSlice::new("dra-1")
        .gpus([0, 1])
        .create(&admin)
        .await
        .expect("ResourceSlice");
    taint_devices(&mut slice);
    let name = slice.metadata.name.clone().expect("slice name");
    let stored = slices
        .replace(&name, &PostParams::default(), &slice)
        .await
        .expect("tainted ResourceSlice");
    let kept: Vec<usize> = stored
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.taints.as_ref().map_or(0, Vec::len))
        .collect();
    assert_eq!(
        kept,
        [1, 1],
        "kube-apiserver dropped the device taints: is the DRADeviceTaints feature gate off? {stored:?}"
    );

    // Claims, pods and the scheduler's allocations.
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), NS);
    for c in ["trainer-gpu", "fine-gpu"] {
        claims
            .create(
                &PostParams::default(),
                &dra::claim(c, dra::GPU_CLASS, 1, &[]),
            )
            .await
            .expect("ResourceClaim");
    }
    let trainer = owner_job(&admin, "trainer").await;
    let fine = owner_job(&admin, "fine").await;
    let statefulset = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nb",
        "uid": "4f1c0de0-0000-4000-8000-00000000005b", "controller": true});
    let quiet = owner_job(&admin, "quiet").await;
    let uid = create_bound(
        &admin,
        dra::dra_pod(
            "trainer-0",
            ClaimSource::Claim("trainer-gpu"),
            None,
            None,
            false,
        ),
        "dra-1",
        trainer,
    )
    .await;
    allocate(&admin, "trainer-gpu", "gpu-0", "trainer-0", &uid).await;
    let uid = create_bound(
        &admin,
        dra::dra_pod("fine-0", ClaimSource::Claim("fine-gpu"), None, None, false),
        "dra-1",
        fine,
    )
    .await;
    allocate(&admin, "fine-gpu", "gpu-1", "fine-0", &uid).await;
    create_bound(&admin, plugin_pod("nb-0"), "gpu-1", statefulset).await;
    create_bound(&admin, plugin_pod("quiet-0"), "gpu-1", quiet).await;

    // The kubelet's device health (DRA form for the claim pods, device-plugin form for the rest).
    let uuid = |node: &str, minor: u32| gpu_ledger_testkit::dcgm::device_uuid(node, minor);
    for (pod, name, id, health) in [
        (
            "trainer-0",
            "claim:gpu",
            "k8s.gpu.nvidia.com/claim=trainer-gpu-gpu-0",
            "Healthy",
        ),
        (
            "fine-0",
            "claim:gpu",
            "k8s.gpu.nvidia.com/claim=fine-gpu-gpu-1",
            "Healthy",
        ),
        ("nb-0", "nvidia.com/gpu", &uuid("gpu-1", 0), "Unhealthy"),
        ("quiet-0", "nvidia.com/gpu", &uuid("gpu-1", 1), "Unknown"),
    ] {
        let stored = kubelet_status(&admin, pod, name, id, health).await;
        assert_eq!(
            stored["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["health"],
            health,
            "kube-apiserver dropped allocatedResourcesStatus of {pod}: is the ResourceHealthStatus \
             feature gate off? {stored}"
        );
    }

    // dcgm-exporter's page for quiet-0's card (gpu-1's second GPU), pod labels as mapped.
    let page = std::fs::read_to_string(root().join("tests/fixtures/health/dcgm-health.prom"))
        .expect("DCGM health page")
        .replace(
            "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
            &uuid("gpu-1", 1),
        )
        .replace("Hostname=\"gpu-node-1\"", "Hostname=\"gpu-1\"")
        .replace(
            "namespace=\"team-b\",pod=\"nb-0\"",
            &format!("namespace=\"{NS}\",pod=\"quiet-0\""),
        );
    assert!(
        page.contains("pod=\"quiet-0\"") && page.contains(&uuid("gpu-1", 1)),
        "{page}"
    );
    let exporter = ReplayExporter::start(page).await.expect("exporter");
    let port = gpu_ledger_testkit::util::free_port().expect("port");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: gpu-ledger\n  static_configs:\n  - targets: ['127.0.0.1:{port}']\n- job_name: dcgm\n  honor_labels: true\n  static_configs:\n  - targets: ['{}']\n",
        exporter.target()
    );
    let rules = std::fs::read_to_string(root().join("alerts/gpu-ledger.rules.yaml"))
        .expect("shipped rules");
    let prom = Prometheus::start_with_rules(&config, &[("gpu-ledger.rules.yaml", rules.as_str())])
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus (`apt-get install prometheus`, or set \
                 PROMETHEUS_BIN) that loads the shipped rules: {e:#}"
            )
        });
    let mut ledger = serve(&cp, port, prom.url());

    let deadline = tokio::time::Instant::now() + WAIT;
    let fired = loop {
        if let Some(status) = ledger.try_exit_status() {
            panic!("gpu-ledger exited ({status}):\n{}", ledger.log_tail(40));
        }
        let f = firing(&prom).await;
        if f.len() >= 3 {
            break f;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ALERT} not firing for both sick holders after {WAIT:?}: {f:?}; scraped: {:?}; \
             gpu-ledger log:\n{}",
            prom.query("gpu_ledger_pod_gpus_unhealthy").await,
            ledger.log_tail(30)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut named: Vec<(String, String, String, String)> = fired
        .iter()
        .map(|a| {
            let m = &a["metric"];
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            assert_eq!(m["severity"], "critical", "{a}");
            assert_eq!(m["namespace"], NS, "{a}");
            (s("pod"), s("owner_kind"), s("owner_name"), s("reason"))
        })
        .collect();
    named.sort();
    let s = |v: &str| v.to_string();
    assert_eq!(
        named,
        vec![
            (
                s("nb-0"),
                s("StatefulSet"),
                s("nb"),
                s("kubelet:critical XID 79 reported by NVML")
            ),
            (s("quiet-0"), s("Job"), s("quiet"), s("dcgm:THERMAL")),
            (s("trainer-0"), s("Job"), s("trainer"), s("xid:79")),
        ],
        "only the holders of sick cards page (not fine-0's None taint)"
    );

    // The JSON and the report's note name the reason and the device.
    let ledger_json: Value = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/ledger"))
        .await
        .expect("ledger")
        .json()
        .await
        .expect("ledger JSON");
    let pods = ledger_json["pods"].as_array().expect("pods");
    let row = |name: &str| {
        pods.iter()
            .find(|p| p["pod"] == name)
            .unwrap_or_else(|| panic!("{name} not in {ledger_json}"))
    };
    assert_eq!(row("trainer-0")["gpu_health"]["reason"], "xid:79");
    assert_eq!(
        row("trainer-0")["gpu_health"]["device"],
        json!(uuid("dra-1", 0))
    );
    assert_eq!(
        row("trainer-0")["gpu_health"]["since"],
        "2026-07-22T02:24:46Z"
    );
    assert!(
        row("fine-0").get("gpu_health").is_none(),
        "{}",
        row("fine-0")
    );
    assert_eq!(
        row("quiet-0")["gpu_health"]["device"],
        json!(uuid("gpu-1", 1))
    );
    // The hours on sick cards count as lost: the counter grows while the holders stay.
    let lost = |text: &str| {
        gpu_ledger_testkit::stack::metric_value(
            text,
            "gpu_ledger_gpu_seconds_lost_total",
            &[("namespace", NS)],
        )
    };
    let metrics = || async {
        reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    };
    let first = lost(&metrics().await).expect("lost counter for the namespace");
    let grown = support::eventually("lost GPU-seconds to grow", WAIT, || async {
        lost(&metrics().await).filter(|v| *v > first)
    })
    .await;
    assert!(grown > first, "{first} -> {grown}");
    ledger.terminate(Duration::from_secs(10));
}
