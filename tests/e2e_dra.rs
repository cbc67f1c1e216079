//! GPUs handed out through Dynamic Resource Allocation, end to end: the real `gpu-ledger serve`
//! against a tier B control plane whose real kube-scheduler allocates ResourceClaims from the
//! ResourceSlices the NVIDIA driver would publish for kwok GPU nodes (the driver itself cannot
//! run without GPUs; [`gpu_ledger_testkit::dra`] publishes its slices and DeviceClasses), the
//! real resourceclaim controller making claims from templates, the fake dcgm-exporter test
//! double labelling DRA devices as `--kubernetes-enable-dra` does, scraped by a real Prometheus
//! without honor_labels, as token user `gpu-ledger` with the shipped RBAC only.
//!
//! One stack, steps in order: exclusive GPU from a template (with and without pod labels on
//! its series), MIG device, shared claim, pending (no device free), an `nvidia.com/gpu` request
//! the scheduler backs with DRA, DRA and extended resources on one node, the reclaim planner
//! placing pending `nvidia.com/gpu` pods on a full DRA-only node whose only device an idle
//! notebook holds (KEP-5004: the notebook's own `nvidia.com/gpu` is served by DRA too), culling
//! a Notebook whose GPU comes from a template, a terminating holder. A second test runs serve on a tier A
//! apiserver that does not serve `resource.k8s.io/v1`.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::dcgm::device_uuid;
use gpu_ledger_testkit::dra::{self, ClaimSource, NvidiaSlice};
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::stack::{
    Notebook, STOP_ANNOTATION, gpu_pod, metric_value, spawn_notebook_stop_rule,
};
use gpu_ledger_testkit::{ControlPlane, GpuNode, TierBOptions};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Grants, READ_ONLY_RBAC, eventually, pinned, tier_b_with};

const NS: &str = "team-dra";
const NB_NS: &str = "team-nb";
const WAIT: Duration = Duration::from_secs(90);
const FINALIZER: &str = "gpu-ledger.test/hold";

fn node_row(ledger: &Value, node: &str) -> Option<Value> {
    ledger["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["node"] == node)
        .cloned()
}

/// The DRA pods and nodes of an offline report (`report --from DIR`) equal the live ledger's:
/// state, GPUs, resources and attribution per pod, allocatable per node.
fn assert_same_dra_rows(offline: &Value, live: &Value, source: &str) {
    for pod in [
        "train", "quiet", "mig-pod", "share-a", "waiting", "legacy", "ext",
    ] {
        let row = |l: &Value| {
            l["pods"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["namespace"] == NS && p["pod"] == pod))
                .map(|p| {
                    (
                        p["state"].clone(),
                        p["gpus"].clone(),
                        p["resources"].clone(),
                        p["attribution"].clone(),
                    )
                })
        };
        assert!(
            row(offline).is_some(),
            "{pod} listed in the report from {source}"
        );
        assert_eq!(row(offline), row(live), "{pod}: {source} vs live");
    }
    for node in ["dra-1", "dra-mig", "mixed"] {
        assert_eq!(
            node_row(offline, node).map(|n| n["gpus_allocatable"].clone()),
            node_row(live, node).map(|n| n["gpus_allocatable"].clone()),
            "{node}: {source} vs live"
        );
    }
}

/// The implicit extended resource name of NVIDIA's whole-GPU DeviceClass (KEP-5004).
const IMPLICIT_GPU: &str = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";

/// [`gpu_pod`] asking [`IMPLICIT_GPU`] instead of `nvidia.com/gpu`.
fn implicit_class_pod(name: &str, gpus: u32, utilization: Option<f64>) -> Pod {
    let mut p = gpu_pod(name, gpus, utilization);
    for c in p.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
        if let Some(limits) = c.resources.as_mut().and_then(|r| r.limits.as_mut())
            && let Some(q) = limits.remove("nvidia.com/gpu")
        {
            limits.insert(IMPLICIT_GPU.to_string(), q);
        }
    }
    p
}

async fn create_pod(admin: &kube::Client, ns: &str, pod: &Pod) {
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {:?}: {e}", pod.metadata.name));
}

/// A pod with `finalizer` set (it stays Terminating once deleted).
fn with_finalizer(mut p: Pod, finalizer: &str) -> Pod {
    p.metadata.finalizers = Some(vec![finalizer.to_string()]);
    p
}

fn float(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

// One scenario on one stack: the steps share nodes and a stack costs ~10 s and most of the CPU.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_end_to_end() {
    let nodes = [
        GpuNode::new("dra-1", 0).no_device_plugin(),
        GpuNode::new("dra-2", 0).no_device_plugin(),
        GpuNode::new("dra-3", 0).no_device_plugin(),
        GpuNode::new("dra-mig", 0).no_device_plugin(),
        GpuNode::new("dra-nb", 0).no_device_plugin(),
        // One card, DRA only: an idle notebook holds it, pending pods wait for it.
        GpuNode::new("dra-full", 0).no_device_plugin(),
        // One card for a pod asking the class's implicit name.
        GpuNode::new("dra-imp", 0).no_device_plugin(),
        // Device plugin advertises both cards; the DRA driver publishes card 1 as well.
        GpuNode::new("mixed", 2),
    ];
    let stack = tier_b_with(
        &nodes,
        TierBOptions {
            extra_controllers: vec!["resourceclaim-controller".into()],
            ..TierBOptions::default()
        },
        Grants::Culling,
    )
    .await;
    let admin = stack.admin();
    dra::install_device_classes(&admin)
        .await
        .expect("DeviceClasses");
    let slices = [
        NvidiaSlice::new("dra-1").gpus([0, 1]),
        NvidiaSlice::new("dra-2").gpus([0]),
        NvidiaSlice::new("dra-3").gpus([0]),
        NvidiaSlice::new("dra-nb").gpus([0]),
        NvidiaSlice::new("dra-full").gpus([0]),
        NvidiaSlice::new("dra-imp").gpus([0]),
        // An A100-80GB cut into a 3g.40gb and a 1g.10gb (GI profile ids 9 and 19).
        NvidiaSlice::new("dra-mig")
            .mig(0, "3g.40gb", 9, 4)
            .mig(0, "1g.10gb", 19, 0),
        NvidiaSlice::new("mixed").gpus([1]),
    ];
    for s in &slices {
        s.create(&admin).await.expect("ResourceSlice");
    }
    for ns in [NS, NB_NS] {
        stack.ensure_namespace(ns).await.expect("namespace");
    }
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(admin.clone(), NS);
    for t in [
        dra::claim_template("one-gpu", dra::GPU_CLASS, 1, &[]),
        dra::claim_template(
            "mig-3g",
            dra::MIG_CLASS,
            1,
            &["device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"],
        ),
    ] {
        templates
            .create(&PostParams::default(), &t)
            .await
            .expect("ResourceClaimTemplate");
    }
    Api::<ResourceClaimTemplate>::namespaced(admin.clone(), NB_NS)
        .create(
            &PostParams::default(),
            &dra::claim_template("nb-gpu", dra::GPU_CLASS, 1, &[]),
        )
        .await
        .expect("notebook ResourceClaimTemplate");
    Api::<ResourceClaim>::namespaced(admin.clone(), NS)
        .create(
            &PostParams::default(),
            &dra::claim("team-gpu", dra::GPU_CLASS, 1, &[]),
        )
        .await
        .expect("shared ResourceClaim");

    let one_gpu = ClaimSource::Template("one-gpu");
    // Running pods are mostly busy so that culling's circuit breaker (idle share) stays shut.
    let create = |p: Pod| {
        let admin = admin.clone();
        async move { create_pod(&admin, NS, &p).await }
    };
    create(dra::dra_pod(
        "train",
        one_gpu,
        Some(80.0),
        Some("dra-1"),
        false,
    ))
    .await;
    // Hidden from the exporter: its series name no pod, the UUID still joins.
    create(dra::dra_pod(
        "quiet",
        one_gpu,
        Some(0.0),
        Some("dra-1"),
        true,
    ))
    .await;
    let mig_3g = ClaimSource::Template("mig-3g");
    create(dra::dra_pod(
        "mig-pod",
        mig_3g,
        Some(30.0),
        Some("dra-mig"),
        false,
    ))
    .await;
    let team = ClaimSource::Claim("team-gpu");
    create(dra::dra_pod(
        "share-a",
        team,
        Some(50.0),
        Some("dra-2"),
        false,
    ))
    .await;
    create(dra::dra_pod(
        "share-b",
        team,
        Some(50.0),
        Some("dra-2"),
        false,
    ))
    .await;
    let sticky = dra::dra_pod("sticky", one_gpu, Some(40.0), Some("mixed"), false);
    create(with_finalizer(sticky, FINALIZER)).await;
    create(pinned(gpu_pod("ext", 1, Some(70.0)), "mixed")).await;
    // `nvidia.com/gpu` on a node without a device plugin: the scheduler backs it with a claim
    // of the DeviceClass naming it (`extendedResourceName`, DRAExtendedResource).
    create(pinned(gpu_pod("legacy", 1, Some(60.0)), "dra-3")).await;
    // The class's implicit name (KEP-5004): served the same way, listed in no device plugin.
    create(pinned(
        implicit_class_pod("implicit", 1, Some(20.0)),
        "dra-imp",
    ))
    .await;
    for p in [
        "train", "quiet", "mig-pod", "share-a", "share-b", "sticky", "ext", "legacy", "implicit",
    ] {
        stack
            .wait_pod_running(NS, p)
            .await
            .unwrap_or_else(|e| panic!("{p} Running: {e:#}"));
    }
    // dra-1's two cards are taken: this one waits.
    create_pod(
        &admin,
        NS,
        &dra::dra_pod("waiting", one_gpu, None, Some("dra-1"), false),
    )
    .await;
    // An idle notebook asking plain nvidia.com/gpu on the DRA-only node: the scheduler makes
    // and allocates its extended-resource claim. Not in the culled namespace: it stays, the
    // planner offers stopping it.
    stack
        .create_notebook(&Notebook::new(NS, "ext-nb").node("dra-full"))
        .await
        .expect("extended-resource notebook");
    stack
        .wait_pod_running(NS, "ext-nb-0")
        .await
        .expect("ext-nb-0 Running");
    for (pod, gpus) in [("ext-wait", 1), ("ext-wait-2", 2)] {
        create_pod(&admin, NS, &pinned(gpu_pod(pod, gpus, None), "dra-full")).await;
    }
    create_pod(
        &admin,
        NS,
        &pinned(implicit_class_pod("implicit-wait", 1, None), "dra-full"),
    )
    .await;
    stack
        .create_notebook(
            &Notebook::new(NB_NS, "dra-nb")
                .node("dra-nb")
                .dra_template("nb-gpu"),
        )
        .await
        .expect("DRA notebook");
    stack
        .wait_pod_running(NB_NS, "dra-nb-0")
        .await
        .expect("notebook pod Running");
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));

    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &[
                "--cull=on",
                "--cull-namespaces",
                NB_NS,
                "--cull-idle-after",
                "15s",
                "--cull-min-runtime",
                "5s",
            ],
        )
        .await
        .expect("gpu-ledger serve ready");
    assert_eq!(
        metric_value(
            &gl.metrics_text().await.expect("metrics"),
            "gpu_ledger_dra_enabled",
            &[]
        ),
        Some(1.0)
    );

    // Exclusive, from a template: one GPU, utilisation from its device.
    let train = eventually("train attributed with utilisation", WAIT, || async {
        gl.pod_row(NS, "train")
            .await
            .filter(|r| r["attribution"] == "exclusive" && r["utilization"].is_number())
    })
    .await;
    assert!((float(&train["utilization"]) - 0.8).abs() < 0.01, "{train}");
    assert_eq!(train["gpus"], json!(1.0), "{train}");
    assert_eq!(train["state"], "running", "{train}");
    assert_eq!(
        train["resources"],
        json!({"dra:gpu.nvidia.com": 1}),
        "{train}"
    );
    // No pod labels on its series: joined by UUID, still exclusive, proven idle.
    let quiet = eventually("quiet proven idle through its UUID", WAIT, || async {
        gl.pod_row(NS, "quiet").await.filter(|r| r["idle"] == true)
    })
    .await;
    assert_eq!(quiet["attribution"], "exclusive", "{quiet}");

    // MIG: 3g.40gb of a 7-slice A100 is 3/7, its GPU instance found by dra_mig_device_uuid.
    let mig = eventually("mig-pod attributed", WAIT, || async {
        gl.pod_row(NS, "mig-pod")
            .await
            .filter(|r| r["attribution"] == "mig" && r["utilization"].is_number())
    })
    .await;
    assert!((float(&mig["gpus"]) - 3.0 / 7.0).abs() < 1e-9, "{mig}");
    assert!((float(&mig["utilization"]) - 0.3).abs() < 0.01, "{mig}");
    assert_eq!(
        mig["resources"],
        json!({"dra:gpu.nvidia.com/mig-3g.40gb": 1}),
        "{mig}"
    );

    // One claim, two pods: half a GPU each, shared.
    for p in ["share-a", "share-b"] {
        let r = eventually(&format!("{p} shared"), WAIT, || async {
            gl.pod_row(NS, p)
                .await
                .filter(|r| r["attribution"] == "shared")
        })
        .await;
        assert_eq!(r["gpus"], json!(0.5), "{r}");
    }

    // Pending: no device free on dra-1; demand of one GPU.
    let waiting = eventually("waiting listed as pending", WAIT, || async {
        gl.pod_row(NS, "waiting")
            .await
            .filter(|r| r["state"] == "pending" && r["gpus"] == json!(1.0))
    })
    .await;
    assert_eq!(waiting["attribution"], "none", "{waiting}");
    assert_eq!(
        waiting["resources"],
        json!({"dra:gpu.nvidia.com": 1}),
        "{waiting}"
    );

    // nvidia.com/gpu backed by DRA: counted once, through its claim.
    let legacy = eventually("legacy attributed", WAIT, || async {
        gl.pod_row(NS, "legacy")
            .await
            .filter(|r| r["attribution"] == "exclusive")
    })
    .await;
    assert_eq!(legacy["gpus"], json!(1.0), "{legacy}");
    assert_eq!(
        legacy["resources"],
        json!({"dra:gpu.nvidia.com": 1}),
        "{legacy}"
    );
    // The row shows the claim's device, joined to DCGM by its UUID.
    assert_eq!(
        legacy["devices"],
        json!([{"uuid": device_uuid("dra-3", 0), "gpu_instance": null}]),
        "{legacy}"
    );

    // Reclaim on a DRA-only node (no nvidia.com/gpu allocatable at all): its one card is held
    // by the idle notebook, counted once through the claim the scheduler made for it.
    let ext_nb = eventually("ext-nb-0 proven idle", WAIT, || async {
        gl.pod_row(NS, "ext-nb-0")
            .await
            .filter(|r| r["idle"] == true && r["notebook"] == "ext-nb")
    })
    .await;
    assert_eq!(ext_nb["gpus"], json!(1.0), "{ext_nb}");
    assert_eq!(
        ext_nb["resources"],
        json!({"dra:gpu.nvidia.com": 1}),
        "{ext_nb}"
    );
    assert_eq!(
        ext_nb["devices"],
        json!([{"uuid": device_uuid("dra-full", 0), "gpu_instance": null}]),
        "{ext_nb}"
    );
    let plan_of = |l: &Value, pod: &str| {
        l["reclaim"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["pending"]["pod"] == pod))
            .cloned()
    };
    let ledger = eventually("ext-wait planned onto dra-full", WAIT, || async {
        let l = gl.ledger_json().await.ok()?;
        plan_of(&l, "ext-wait")?["options"]
            .as_array()
            .is_some_and(|o| !o.is_empty())
            .then_some(l)
    })
    .await;
    let one = plan_of(&ledger, "ext-wait").expect("ext-wait planned");
    assert_eq!(one["gpus"], json!(1.0), "{one}");
    assert_eq!(one["fits_nowhere"], Value::Null, "{one}");
    let options = one["options"].as_array().expect("options");
    assert_eq!(options.len(), 1, "{one}");
    assert_eq!(options[0]["node"], "dra-full", "{one}");
    assert_eq!(options[0]["stuck_holders"], json!([]), "{one}");
    let stops = options[0]["by_stopping"].as_array().expect("by_stopping");
    assert_eq!(stops.len(), 1, "{one}");
    assert_eq!(
        (
            &stops[0]["namespace"],
            &stops[0]["pod"],
            &stops[0]["notebook"]
        ),
        (&json!(NS), &json!("ext-nb-0"), &json!("ext-nb")),
        "{one}"
    );
    // Two GPUs: the node has one card, stopping the notebook is not enough.
    let two = plan_of(&ledger, "ext-wait-2").expect("ext-wait-2 planned");
    assert_eq!(two["options"], json!([]), "{two}");
    assert!(
        two["fits_nowhere"]
            .as_str()
            .is_some_and(|w| w.contains("1 too small for 2 nvidia.com/gpu")),
        "{two}"
    );
    for (pod, gpus) in [("ext-wait", 1), ("ext-wait-2", 2)] {
        let r = gl.pod_row(NS, pod).await.expect("pending row");
        assert_eq!(r["state"], "pending", "{r}");
        assert_eq!(r["resources"], json!({"nvidia.com/gpu": gpus}), "{r}");
    }
    // The implicit name: one GPU of demand, planned like nvidia.com/gpu.
    let r = gl.pod_row(NS, "implicit-wait").await.expect("pending row");
    assert_eq!(r["state"], "pending", "{r}");
    assert_eq!(r["gpus"], json!(1.0), "{r}");
    assert_eq!(r["resources"], json!({IMPLICIT_GPU: 1}), "{r}");
    let imp = plan_of(&ledger, "implicit-wait").expect("implicit-wait planned");
    assert_eq!(imp["options"], one["options"], "{imp}");
    // Running, through the implicit name: counted once, through its claim's device.
    let implicit = eventually("implicit attributed", WAIT, || async {
        gl.pod_row(NS, "implicit")
            .await
            .filter(|r| r["attribution"] == "exclusive")
    })
    .await;
    assert_eq!(implicit["gpus"], json!(1.0), "{implicit}");
    assert_eq!(
        implicit["resources"],
        json!({"dra:gpu.nvidia.com": 1}),
        "{implicit}"
    );
    assert_eq!(
        implicit["devices"],
        json!([{"uuid": device_uuid("dra-imp", 0), "gpu_instance": null}]),
        "{implicit}"
    );

    // DRA and the device plugin on one node: card 1 is in both, counted once.
    let ext = eventually("ext attributed", WAIT, || async {
        gl.pod_row(NS, "ext")
            .await
            .filter(|r| r["attribution"] == "exclusive")
    })
    .await;
    assert_eq!(ext["resources"], json!({"nvidia.com/gpu": 1}), "{ext}");
    let ledger = gl.ledger_json().await.expect("ledger");
    for (node, alloc, claimed) in [
        ("dra-1", 2.0, 2.0),
        ("dra-2", 1.0, 1.0),
        ("dra-3", 1.0, 1.0),
        ("dra-mig", 1.0, 3.0 / 7.0),
        ("dra-nb", 1.0, 1.0),
        ("dra-full", 1.0, 1.0),
        ("dra-imp", 1.0, 1.0),
        ("mixed", 2.0, 2.0),
    ] {
        let row = node_row(&ledger, node).unwrap_or_else(|| panic!("{node} listed: {ledger}"));
        assert!(
            (float(&row["gpus_allocatable"]) - alloc).abs() < 1e-9
                && (float(&row["gpus_claimed"]) - claimed).abs() < 1e-9,
            "{node}: want allocatable {alloc}, claimed {claimed}: {row}"
        );
        assert_eq!(row["gpus_unschedulable"], json!(0.0), "{row}");
    }
    assert_eq!(ledger["unclaimed_busy"], json!([]), "{ledger}");

    let text = gl.metrics_text().await.expect("metrics");
    for (pod, resource, attribution, gpus) in [
        ("train", "dra:gpu.nvidia.com", "exclusive", 1.0),
        (
            "mig-pod",
            "dra:gpu.nvidia.com/mig-3g.40gb",
            "mig",
            3.0 / 7.0,
        ),
        ("share-a", "dra:gpu.nvidia.com", "shared", 0.5),
        ("ext", "nvidia.com/gpu", "exclusive", 1.0),
    ] {
        let v = metric_value(
            &text,
            "gpu_ledger_pod_gpus",
            &[
                ("namespace", NS),
                ("pod", pod),
                ("resource", resource),
                ("attribution", attribution),
            ],
        )
        .unwrap_or_else(|| panic!("gpu_ledger_pod_gpus of {pod} in:\n{text}"));
        assert!((v - gpus).abs() < 1e-9, "{pod}: {v}");
    }

    // Offline: `report --from DIR` over `kubectl get … -A -o json` dumps of the same cluster and
    // a Prometheus /federate dump gives the same DRA accounting.
    let dir = stack.cp.dir().join("dump");
    std::fs::create_dir_all(&dir).expect("dump dir");
    for kind in [
        "pods",
        "nodes",
        "resourceclaims",
        "resourceslices",
        "deviceclasses",
    ] {
        let out = stack
            .cp
            .kubectl("admin")
            .expect("kubectl")
            .args(["get", kind, "-A", "-o", "json"])
            .output()
            .expect("run kubectl");
        assert!(out.status.success(), "kubectl get {kind}: {out:?}");
        std::fs::write(dir.join(format!("{kind}.json")), &out.stdout).expect("write dump");
    }
    let federate = reqwest::Client::new()
        .get(format!("{}/federate", stack.prometheus.url()))
        .query(&[("match[]", "{__name__=~\"DCGM_.*\"}")])
        .send()
        .await
        .expect("federate")
        .text()
        .await
        .expect("federate body");
    std::fs::write(dir.join("dcgm.prom"), federate).expect("write dcgm.prom");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "-o", "json", "--from"])
        .arg(&dir)
        .env_remove("GPU_LEDGER_FROM")
        .output()
        .expect("run report");
    assert!(out.status.success(), "report --from: {out:?}");
    let offline: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let live = gl.ledger_json().await.expect("ledger");
    assert_same_dra_rows(&offline, &live, "kubectl dumps");

    // `gpu-ledger capture` as the shipped read-only RBAC writes the DRA objects too, and the
    // report over the capture holds the same DRA rows.
    let captured = stack.cp.dir().join("capture");
    let reader = stack.cp.kubeconfig_path("gpu-ledger").expect("kubeconfig");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .arg("capture")
        .arg("--out")
        .arg(&captured)
        .arg("--kubeconfig")
        .arg(&reader)
        .args([
            "--prometheus-url",
            stack.prometheus.url(),
            "--history-lookback",
            "1h",
        ])
        .output()
        .expect("run capture");
    assert!(out.status.success(), "capture: {out:?}");
    for f in [
        "resourceclaims.json",
        "resourceslices.json",
        "deviceclasses.json",
    ] {
        assert!(captured.join(f).is_file(), "capture wrote no {f}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "-o", "json", "--from"])
        .arg(&captured)
        .env_remove("GPU_LEDGER_FROM")
        .output()
        .expect("run report");
    assert!(out.status.success(), "report --from capture: {out:?}");
    let from_capture: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    assert_same_dra_rows(&from_capture, &live, "capture");

    // Culling: the notebook whose GPU comes from a template is stopped like any other.
    let nb = eventually("dra-nb-0 is the notebook's, exclusive", WAIT, || async {
        gl.pod_row(NB_NS, "dra-nb-0")
            .await
            .filter(|r| r["notebook"] == "dra-nb" && r["attribution"] == "exclusive")
    })
    .await;
    assert_eq!(nb["resources"], json!({"dra:gpu.nvidia.com": 1}), "{nb}");
    eventually("dra-nb stopped", WAIT, || async {
        support::try_notebook_annotations(&admin, NB_NS, "dra-nb")
            .await
            .ok()?
            .contains_key(STOP_ANNOTATION)
            .then_some(())
    })
    .await;
    let nb_pods: Api<Pod> = Api::namespaced(admin.clone(), NB_NS);
    eventually("dra-nb-0 gone", WAIT, || async {
        nb_pods
            .get_opt("dra-nb-0")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    eventually("dra-nb's card free", WAIT, || async {
        let l = gl.ledger_json().await.ok()?;
        (node_row(&l, "dra-nb")?["gpus_free"] == json!(1.0)).then_some(())
    })
    .await;

    // A terminating holder still holds its device until the pod object is gone.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    pods.delete("sticky", &DeleteParams::default())
        .await
        .expect("delete sticky");
    let sticky = eventually("sticky terminating", WAIT, || async {
        gl.pod_row(NS, "sticky")
            .await
            .filter(|r| r["state"] == "terminating")
    })
    .await;
    assert_eq!(sticky["gpus"], json!(1.0), "{sticky}");
    let l = gl.ledger_json().await.expect("ledger");
    assert_eq!(
        node_row(&l, "mixed").expect("mixed")["gpus_claimed"],
        json!(2.0),
        "{l}"
    );
    pods.patch(
        "sticky",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    eventually("sticky gone and mixed's DRA card free", WAIT, || async {
        let l = gl.ledger_json().await.ok()?;
        let gone = !l["pods"]
            .as_array()?
            .iter()
            .any(|p| p["namespace"] == NS && p["pod"] == "sticky");
        (gone && node_row(&l, "mixed")?["gpus_claimed"] == json!(1.0)).then_some(())
    })
    .await;
    drop(gl);
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `resource.k8s.io/v1` not served (`--runtime-config=resource.k8s.io/v1=false`): serve starts,
/// logs that DRA accounting is off, exports `gpu_ledger_dra_enabled 0` and accounts the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_group_not_served() {
    let (cp, admin) = support::tier_a_watching(NS).await;
    cp.add_node(&GpuNode::new("gpu-1", 1)).await.expect("node");
    Api::<Pod>::namespaced(admin.clone(), NS)
        .create(
            &PostParams::default(),
            &support::gpu_pod("bound", 1, Some("gpu-1")),
        )
        .await
        .expect("pod");

    // Served (the default of kube-apiserver 1.36): the shipped RBAC is enough to watch it.
    let (mut served, url) = spawn_serve(&cp, "served").await;
    let text = metrics(&url).await;
    assert_eq!(
        metric_value(&text, "gpu_ledger_dra_enabled", &[]),
        Some(1.0),
        "{}",
        served.log_tail(40)
    );
    served.terminate(Duration::from_secs(5));

    // Served but not readable (RBAC without the resource.k8s.io rule): a probe list fails before
    // any watch starts, so DRA is off and serve still becomes ready.
    let no_dra_rbac = READ_ONLY_RBAC
        .replace("name: gpu-ledger\n", "name: gpu-ledger-no-dra\n")
        .replace("name: gpu-ledger-nodes\n", "name: gpu-ledger-no-dra-nodes\n")
        .replace(
            "  - apiGroups: [\"resource.k8s.io\"]\n    resources: [\"resourceclaims\"]\n    verbs: [\"list\", \"watch\"]\n",
            "",
        )
        .replace(
            "  - apiGroups: [\"resource.k8s.io\"]\n    resources: [\"resourceslices\", \"deviceclasses\"]\n    verbs: [\"list\", \"watch\"]\n",
            "",
        );
    assert!(!no_dra_rbac.contains("resource.k8s.io\"]"), "{no_dra_rbac}");
    gpu_ledger_testkit::stack::apply_rbac(&admin, &no_dra_rbac, "intruder", "gpu-ledger")
        .await
        .expect("RBAC without DRA");
    let (mut blind, url) = spawn_serve_as(&cp, "no-dra-rbac", "intruder").await;
    let text = metrics(&url).await;
    assert_eq!(
        metric_value(&text, "gpu_ledger_dra_enabled", &[]),
        Some(0.0),
        "{}",
        blind.log_tail(40)
    );
    let log = std::fs::read_to_string(blind.log_path()).expect("log");
    assert!(log.contains("cannot list"), "{log}");
    blind.terminate(Duration::from_secs(5));

    cp.restart_apiserver_with(&["--runtime-config=resource.k8s.io/v1=false"])
        .await
        .expect("apiserver without resource.k8s.io/v1");
    let (mut off, url) = spawn_serve(&cp, "not-served").await;
    let text = metrics(&url).await;
    assert_eq!(
        metric_value(&text, "gpu_ledger_dra_enabled", &[]),
        Some(0.0),
        "{text}"
    );
    let log = std::fs::read_to_string(off.log_path()).expect("log");
    assert!(
        log.contains("resource.k8s.io") && log.contains("DRA accounting is off"),
        "{log}"
    );
    let row = eventually("bound pod in the ledger", WAIT, || async {
        let l: Value = reqwest::get(format!("{url}/api/v1/ledger"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        l["pods"]
            .as_array()?
            .iter()
            .find(|p| p["pod"] == "bound")
            .cloned()
    })
    .await;
    assert_eq!(row["state"], "running", "{row}");
    assert_eq!(row["gpus"], json!(1.0), "{row}");
    off.terminate(Duration::from_secs(5));
}

/// `gpu-ledger serve` as user `gpu-ledger` without Prometheus; waits for `/readyz`.
async fn spawn_serve(cp: &ControlPlane, name: &str) -> (ChildGuard, String) {
    spawn_serve_as(cp, name, "gpu-ledger").await
}

/// [`spawn_serve`] as token user `user`.
async fn spawn_serve_as(cp: &ControlPlane, name: &str, user: &str) -> (ChildGuard, String) {
    let port = gpu_ledger_testkit::util::free_port().expect("port");
    let mut cmd = support::gpu_ledger_command();
    cmd.arg("serve")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg("--refresh-interval=1s")
        .env("KUBECONFIG", cp.kubeconfig_path(user).expect("kubeconfig"))
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", "gpu-ledger")
        .env("GPU_LEDGER_LOG", "info");
    let mut guard = ChildGuard::spawn(name, cmd, &cp.dir().join(format!("{name}.log")))
        .expect("spawn gpu-ledger serve");
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = guard.try_exit_status() {
            panic!("serve exited ({status}):\n{}", guard.log_tail(40));
        }
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve not ready:\n{}",
            guard.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (guard, url)
}

async fn metrics(url: &str) -> String {
    reqwest::get(format!("{url}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

/// The dump of one run of [`dra_claims_end_to_end`] (`tests/fixtures/dra`, see its README),
/// reported offline without a cluster.
#[test]
fn dra_dumps_report_offline() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dra");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "-o", "json", "--from"])
        .arg(&dir)
        .env_remove("GPU_LEDGER_FROM")
        .output()
        .expect("run report");
    assert!(out.status.success(), "report --from: {out:?}");
    let l: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let row = |pod: &str| {
        l["pods"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pod"] == pod))
            .cloned()
            .unwrap_or_else(|| panic!("{pod} listed: {l}"))
    };
    for (pod, state, gpus, resource, attribution) in [
        ("train", "running", 1.0, "dra:gpu.nvidia.com", "exclusive"),
        ("quiet", "running", 1.0, "dra:gpu.nvidia.com", "exclusive"),
        (
            "mig-pod",
            "running",
            3.0 / 7.0,
            "dra:gpu.nvidia.com/mig-3g.40gb",
            "mig",
        ),
        ("share-a", "running", 0.5, "dra:gpu.nvidia.com", "shared"),
        ("share-b", "running", 0.5, "dra:gpu.nvidia.com", "shared"),
        ("waiting", "pending", 1.0, "dra:gpu.nvidia.com", "none"),
        ("legacy", "running", 1.0, "dra:gpu.nvidia.com", "exclusive"),
        ("ext", "running", 1.0, "nvidia.com/gpu", "exclusive"),
        (
            "dra-nb-0",
            "running",
            1.0,
            "dra:gpu.nvidia.com",
            "exclusive",
        ),
    ] {
        let r = row(pod);
        assert_eq!(r["state"], state, "{r}");
        assert!((float(&r["gpus"]) - gpus).abs() < 1e-9, "{r}");
        assert_eq!(r["resources"], json!({resource: 1}), "{r}");
        assert_eq!(r["attribution"], attribution, "{r}");
    }
    assert_eq!(
        row("dra-nb-0")["notebook"],
        json!(null),
        "no notebooks.json: ownership off"
    );
    for (node, alloc, claimed) in [
        ("dra-1", 2.0, 2.0),
        ("dra-mig", 1.0, 3.0 / 7.0),
        ("mixed", 2.0, 2.0),
    ] {
        let n = node_row(&l, node).unwrap_or_else(|| panic!("{node} listed: {l}"));
        assert!((float(&n["gpus_allocatable"]) - alloc).abs() < 1e-9, "{n}");
        assert!((float(&n["gpus_claimed"]) - claimed).abs() < 1e-9, "{n}");
    }
}
