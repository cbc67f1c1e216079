//! Watches against a real control plane (testkit tiers A and B): gpu-ledger's own projections,
//! with the shipped read-only RBAC, see pods, nodes, quotas and notebooks come and go.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use gpu_ledger::claims::kinds;
use gpu_ledger::claims::watch::{self, Stores, WatchConfig};
use gpu_ledger::ledger::usage::Usage;
use gpu_ledger::ledger::{self, Attribution, PodState, Policy};
use gpu_ledger_testkit::{ControlPlane, GpuNode, Tier, TierBOptions};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::{eventually, gpu_pod, grant_shipped_read_only, namespace};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WAIT: Duration = Duration::from_secs(60);

async fn start_watches(cp: &ControlPlane) -> (Stores, CancellationToken, TaskTracker) {
    let client = cp.client("gpu-ledger").await.expect("gpu-ledger client");
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let stores = watch::start(
        client,
        WatchConfig::default(),
        &tracker,
        cancel.clone(),
        Arc::new(|_| {}),
    )
    .await;
    let s = stores.clone();
    eventually("watches synced", WAIT, || {
        let s = s.clone();
        async move { s.synced().then_some(()) }
    })
    .await;
    (stores, cancel, tracker)
}

fn notebook_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    )
}

// One scenario on one control plane: starting a cluster per step would cost more than it reads.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_a_watches_follow_objects_with_least_privilege() {
    let (cp, admin) = support::tier_a_watching("team-ml").await;
    cp.install_notebook_crd().await.expect("notebook CRD");
    cp.add_node(&GpuNode::new("gpu-1", 2)).await.expect("node");

    let (stores, cancel, tracker) = start_watches(&cp).await;
    assert!(
        stores
            .notebooks_enabled
            .load(std::sync::atomic::Ordering::Relaxed),
        "CRD is served"
    );
    eventually("node gpu-1 in the store", WAIT, || async {
        stores
            .of::<kinds::Nodes>()
            .get("gpu-1")
            .map(|n| n.allocatable.clone())
    })
    .await;

    // A GPU pod bound directly (tier A has no scheduler) and a quota naming the GPU.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-ml");
    pods.create(
        &PostParams::default(),
        &gpu_pod("trainer", 1, Some("gpu-1")),
    )
    .await
    .expect("pod");
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-ml");
    let quota: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "4", "cpu": "64"}}}))
    .expect("quota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
    // A non-GPU pod is never stored.
    let plain: Pod = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &plain)
        .await
        .expect("plain pod");

    eventually("pod and quota stored", WAIT, || async {
        (stores.of::<kinds::Pods>().contains_key("team-ml/trainer")
            && stores.of::<kinds::Quotas>().contains_key("team-ml/gpus"))
        .then_some(())
    })
    .await;
    assert!(
        !stores.of::<kinds::Pods>().contains_key("team-ml/web"),
        "non-GPU pods are not stored"
    );

    // Notebook → StatefulSet → pod ownership, verified by uid.
    let notebooks: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "team-ml", &notebook_ar());
    let mut nb = DynamicObject::new("alice-nb", &notebook_ar());
    nb.data = json!({"spec": {"template": {"spec": {"containers": [{"name": "alice-nb", "image": "jupyter"}]}}}});
    let nb = notebooks
        .create(&PostParams::default(), &nb)
        .await
        .expect("notebook");
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), "team-ml");
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "alice-nb", "ownerReferences": [{"apiVersion": "kubeflow.org/v1beta1", "kind": "Notebook",
            "name": "alice-nb", "uid": nb.metadata.uid, "controller": true}]},
        "spec": {"selector": {"matchLabels": {"statefulset": "alice-nb"}}, "serviceName": "",
            "template": {"metadata": {"labels": {"statefulset": "alice-nb"}},
                "spec": {"containers": [{"name": "alice-nb", "image": "jupyter"}]}}}
    }))
    .expect("sts");
    let sts = sets
        .create(&PostParams::default(), &sts)
        .await
        .expect("statefulset");
    let mut nb_pod = gpu_pod("alice-nb-0", 1, Some("gpu-1"));
    // The labels the StatefulSet controller gives its pods (the selector's), as on a real cluster.
    nb_pod.metadata.labels = Some(
        [
            ("notebook-name".to_string(), "alice-nb".to_string()),
            ("statefulset".to_string(), "alice-nb".to_string()),
        ]
        .into(),
    );
    nb_pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "apps/v1",
        "kind": "StatefulSet", "name": "alice-nb", "uid": sts.metadata.uid, "controller": true}))
        .expect("owner"),
    ]);
    pods.create(&PostParams::default(), &nb_pod)
        .await
        .expect("notebook pod");
    eventually("notebook and its pod stored", WAIT, || async {
        (stores
            .of::<kinds::Pods>()
            .contains_key("team-ml/alice-nb-0")
            && stores
                .of::<kinds::Notebooks>()
                .contains_key("team-ml/alice-nb"))
        .then_some(())
    })
    .await;
    let gpu_ledger_client = cp.client("gpu-ledger").await.expect("client");
    stores
        .resolve_statefulsets(&gpu_ledger_client)
        .await
        .expect("statefulset get is allowed");

    let l = ledger::build(
        &stores.claims(),
        &Usage::default(),
        Utc::now(),
        &Policy::default(),
    );
    let nb_row = l
        .pods
        .iter()
        .find(|p| p.pod == "alice-nb-0")
        .expect("notebook pod row");
    assert_eq!(nb_row.notebook.as_deref(), Some("alice-nb"));
    assert_eq!(
        nb_row.evidence.owner.as_ref().map(|o| o.verified),
        Some(true),
        "uid chain verified"
    );
    assert_eq!(
        nb_row.attribution,
        Attribution::Unattributed,
        "no telemetry source: unknown, never idle"
    );
    assert_eq!(l.nodes[0].gpus_claimed, 2.0);
    assert_eq!(l.nodes[0].gpus_free, Some(0.0));
    let ns = l
        .namespaces
        .iter()
        .find(|n| n.namespace == "team-ml")
        .expect("namespace row");
    assert_eq!(ns.gpu_quota, Some(4.0));

    // Deleting a bound pod without a kubelet leaves it Terminating: it still holds its GPU.
    pods.delete("trainer", &DeleteParams::default().grace_period(1))
        .await
        .expect("delete");
    eventually("trainer terminating in the store", WAIT, || async {
        stores
            .of::<kinds::Pods>()
            .get("team-ml/trainer")
            .and_then(|p| p.deletion.map(|_| ()))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let policy = Policy {
        stuck_after: chrono::Duration::zero(),
        ..Policy::default()
    };
    let l = ledger::build(&stores.claims(), &Usage::default(), Utc::now(), &policy);
    let t = l
        .pods
        .iter()
        .find(|p| p.pod == "trainer")
        .expect("trainer row");
    assert_eq!(t.state, PodState::Terminating);
    assert!(t.stuck, "past its deadline");
    assert_eq!(
        l.nodes[0].gpus_free,
        Some(0.0),
        "a terminating pod still holds its GPU"
    );

    // Objects that go away leave the stores.
    quotas
        .delete("gpus", &DeleteParams::default())
        .await
        .expect("delete quota");
    notebooks
        .delete("alice-nb", &DeleteParams::default())
        .await
        .expect("delete notebook");
    pods.delete("alice-nb-0", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    eventually("quota, notebook gone", WAIT, || async {
        (!stores.of::<kinds::Quotas>().contains_key("team-ml/gpus")
            && !stores
                .of::<kinds::Notebooks>()
                .contains_key("team-ml/alice-nb"))
        .then_some(())
    })
    .await;

    // gpu-ledger's read-only identity cannot write.
    let denied: Api<ConfigMap> = Api::namespaced(gpu_ledger_client.clone(), "team-ml");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("cm");
    match denied.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("write outside gpu-ledger's rights was not refused: {other:?}"),
    }
    let nb_api: Api<DynamicObject> =
        Api::namespaced_with(gpu_ledger_client, "team-ml", &notebook_ar());
    match nb_api
        .patch(
            "whatever",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"kubeflow-resource-stopped": "x"}}})),
        )
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(
            e.code, 403,
            "read-only role must not patch notebooks: {e:?}"
        ),
        other => panic!("notebook patch without the culling role was not refused: {other:?}"),
    }

    kai_fractions_and_mps_clients_through_the_watches(&cp, &admin, &stores).await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

/// KAI-Scheduler fractions and MPS clients, read by the watches from the objects as KAI's binder
/// and GPU Feature Discovery write them (both need GPUs and cannot run here; fixtures and sources:
/// `tests/fixtures/kai`, `tests/fixtures/mps`): the reservation pod's card goes to its users in
/// their own namespace (a fraction pod asks for no `nvidia.com/gpu`, yet is stored), and a pod on
/// a node labelled `nvidia.com/gpu.sharing-strategy=mps` is an MPS client with its caps.
async fn kai_fractions_and_mps_clients_through_the_watches(
    cp: &ControlPlane,
    admin: &kube::Client,
    stores: &Stores,
) {
    const RES_NS: &str = "kai-resource-reservation";
    const GROUP: &str = "5e2c1b7a-0d4e-4b8f-9a3c-7f1e2d3c4b5a";
    const UUID: &str = "GPU-3b8f9e2d-6a41-4c7e-9f0b-2d5e8a1c4f63";
    cp.add_node(&GpuNode::new("kai-1", 1).label("nvidia.com/gpu.memory", "24564"))
        .await
        .expect("KAI node");
    // The real RTX 4090 MPS form: no -SHARED product, strategy and replicas labels, 1 × 2 advertised.
    cp.add_node(
        &GpuNode::new("mps-1", 1)
            .product("NVIDIA-GeForce-RTX-4090")
            .time_slicing(2)
            .label("nvidia.com/gpu.sharing-strategy", "mps")
            .label("nvidia.com/gpu.memory", "24564"),
    )
    .await
    .expect("MPS node");
    namespace(admin, RES_NS, &[]).await;
    // As KAI's binder creates it (createResourceReservationPod), the UUID written back.
    let reservation: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gpu-reservation-3f9a1c2e",
            "labels": {"app": RES_NS, "runai-gpu-group": GROUP},
            "annotations": {"karpenter.sh/do-not-disrupt": "true",
                "run.ai/reserve_for_gpu_index": UUID}},
        "spec": {"nodeName": "kai-1", "schedulerName": "kai-scheduler",
            "containers": [{"name": "resource-reservation", "image": "reservation",
                "resources": {"limits": {"nvidia.com/gpu": "1"},
                    "requests": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("reservation pod");
    Api::<Pod>::namespaced(admin.clone(), RES_NS)
        .create(&PostParams::default(), &reservation)
        .await
        .expect("reservation pod");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-ml");
    for (name, annotation, value) in [
        ("frac-half", "gpu-fraction", "0.5"),
        ("frac-mem", "gpu-memory", "6141"),
    ] {
        let user: Pod = serde_json::from_value(json!({
            "metadata": {"name": name,
                "labels": {"kai.scheduler/queue": "default-queue", "runai-gpu-group": GROUP},
                "annotations": {annotation: value}},
            "spec": {"nodeName": "kai-1", "schedulerName": "kai-scheduler",
                "containers": [{"name": "gpu-workload", "image": "nvidia/cuda:13.0.2-base-ubi8",
                    "resources": {"limits": {"memory": "1Gi"}}}]}
        }))
        .expect("fraction pod");
        pods.create(&PostParams::default(), &user)
            .await
            .expect("fraction pod");
    }
    pods.create(
        &PostParams::default(),
        &gpu_pod("mps-client", 1, Some("mps-1")),
    )
    .await
    .expect("MPS client");
    eventually("KAI, MPS pods and nodes stored", WAIT, || async {
        let p = stores.of::<kinds::Pods>();
        let n = stores.of::<kinds::Nodes>();
        (p.contains_key(&format!("{RES_NS}/gpu-reservation-3f9a1c2e"))
            && p.contains_key("team-ml/frac-half")
            && p.contains_key("team-ml/frac-mem")
            && p.contains_key("team-ml/mps-client")
            && n.contains_key("kai-1")
            && n.contains_key("mps-1"))
        .then_some(())
    })
    .await;
    let l = ledger::build(
        &stores.claims(),
        &Usage::default(),
        Utc::now(),
        &Policy::default(),
    );
    let row = |name: &str| {
        l.pods
            .iter()
            .find(|p| p.pod == name)
            .unwrap_or_else(|| panic!("{name} listed: {:?}", l.pods))
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(row("frac-half").gpus, 0.5), "{:?}", row("frac-half"));
    assert!(close(row("frac-mem").gpus, 0.25), "{:?}", row("frac-mem"));
    let r = row("gpu-reservation-3f9a1c2e");
    assert!(close(r.gpus, 0.25), "the unassigned rest: {r:?}");
    assert_eq!(r.sharing.as_str(), "kai-reservation");
    assert_eq!(row("frac-half").sharing.as_str(), "kai-fraction");
    let node = |name: &str| {
        l.nodes
            .iter()
            .find(|n| n.node == name)
            .unwrap_or_else(|| panic!("{name}: {:?}", l.nodes))
    };
    assert!(
        close(node("kai-1").gpus_claimed, 1.0),
        "{:?}",
        node("kai-1")
    );
    let m = row("mps-client");
    assert_eq!(
        serde_json::to_value(m).expect("row JSON")["sharing"],
        json!({"layer": "mps", "replicas": 2, "memory_cap_bytes": 24564_u64 * 1024 * 1024 / 2,
            "compute_cap_percent": 50.0})
    );
    assert!(close(m.gpus, 0.5), "{m:?}");
    assert!(close(node("mps-1").gpus_allocatable, 1.0));
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_b_scheduler_statefulsets_and_finalizers() {
    let cp = ControlPlane::start(Tier::B(TierBOptions::default()))
        .await
        .expect("tier B control plane");
    let admin = cp.client("admin").await.expect("admin");
    cp.install_notebook_crd().await.expect("notebook CRD");
    grant_shipped_read_only(&admin).await;
    namespace(&admin, "lab", &[]).await;
    for n in ["lab-1", "lab-2"] {
        cp.add_node(&GpuNode::new(n, 1).product("NVIDIA-RTX-A1000"))
            .await
            .expect("node");
        cp.wait_node_ready(n, WAIT).await.expect("node ready");
    }
    let (stores, cancel, tracker) = start_watches(&cp).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "lab");

    // Too big for any node: the real scheduler leaves it Pending with its reason.
    pods.create(&PostParams::default(), &gpu_pod("too-big", 2, None))
        .await
        .expect("pod");
    let reason = eventually("too-big unschedulable", WAIT, || async {
        stores
            .of::<kinds::Pods>()
            .get("lab/too-big")
            .and_then(|p| p.unschedulable_message.clone())
    })
    .await;
    assert!(reason.contains("Insufficient nvidia.com/gpu"), "{reason}");

    // A pod held by a finalizer stays Terminating, holding its GPU, until the finalizer goes.
    let mut held = gpu_pod("held", 1, None);
    held.metadata.finalizers = Some(vec!["gpu-ledger.test/hold".into()]);
    pods.create(&PostParams::default(), &held)
        .await
        .expect("pod");
    let node = eventually("held running", WAIT, || async {
        stores
            .of::<kinds::Pods>()
            .get("lab/held")
            .filter(|p| p.phase == gpu_ledger::ledger::claims::PodPhase::Running)
            .and_then(|p| p.node.clone())
    })
    .await;
    pods.delete("held", &DeleteParams::default().grace_period(1))
        .await
        .expect("delete");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let policy = Policy {
        stuck_after: chrono::Duration::seconds(1),
        ..Policy::default()
    };
    let l = ledger::build(&stores.claims(), &Usage::default(), Utc::now(), &policy);
    let row = l.pods.iter().find(|p| p.pod == "held").expect("held row");
    assert_eq!((row.state, row.stuck), (PodState::Terminating, true));
    let node_row = l.nodes.iter().find(|n| n.node == node).expect("node row");
    assert_eq!(
        node_row.gpus_free,
        Some(0.0),
        "the card stays held while Terminating"
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("drop finalizer");
    eventually("held gone", WAIT, || async {
        (!stores.of::<kinds::Pods>().contains_key("lab/held")).then_some(())
    })
    .await;
    let l = ledger::build(&stores.claims(), &Usage::default(), Utc::now(), &policy);
    assert_eq!(
        l.nodes
            .iter()
            .find(|n| n.node == node)
            .and_then(|n| n.gpus_free),
        Some(1.0),
        "card free again"
    );

    // A Notebook owning a real StatefulSet: the StatefulSet controller makes nb-0, the scheduler
    // places it, and the ledger recognises the notebook's pod.
    let notebooks: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "lab", &notebook_ar());
    let mut nb = DynamicObject::new("nb", &notebook_ar());
    nb.data = json!({"spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "jupyter"}]}}}});
    let nb = notebooks
        .create(&PostParams::default(), &nb)
        .await
        .expect("notebook");
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), "lab");
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "nb", "ownerReferences": [{"apiVersion": "kubeflow.org/v1beta1", "kind": "Notebook",
            "name": "nb", "uid": nb.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"statefulset": "nb"}}, "serviceName": "",
            "template": {"metadata": {"labels": {"statefulset": "nb", "notebook-name": "nb"}},
                "spec": {"containers": [{"name": "nb", "image": "jupyter",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .expect("sts");
    sets.create(&PostParams::default(), &sts)
        .await
        .expect("statefulset");
    eventually("nb-0 scheduled", WAIT, || async {
        stores
            .of::<kinds::Pods>()
            .get("lab/nb-0")
            .and_then(|p| p.node.clone())
    })
    .await;
    let client = cp.client("gpu-ledger").await.expect("client");
    stores.resolve_statefulsets(&client).await.expect("resolve");
    let l = ledger::build(
        &stores.claims(),
        &Usage::default(),
        Utc::now(),
        &Policy::default(),
    );
    let row = l.pods.iter().find(|p| p.pod == "nb-0").expect("nb-0 row");
    assert_eq!(row.notebook.as_deref(), Some("nb"));
    assert_eq!(row.evidence.owner.as_ref().map(|o| o.verified), Some(true));
    let pending = l
        .pods
        .iter()
        .find(|p| p.pod == "too-big")
        .expect("pending row");
    assert_eq!(pending.state, PodState::Pending);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

/// Issue 36 item 14: Kubeflow installed after gpu-ledger started. `serve` starts on a cluster
/// without the Notebook CRD (tier A, no Prometheus): it is ready, and `/readyz` and the page say
/// that notebook ownership is off and looked for again. Then the CRD, a Notebook, its
/// StatefulSet and its GPU pod are created: without a restart the pod's ledger row names the
/// notebook (discovery ran once at start-up before: it never did), and the note is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_a_serve_finds_kubeflow_installed_after_start_up() {
    let (cp, admin) = support::tier_a().await;
    cp.add_gpu_node("gpu-1", 1, &[]).await.expect("node");
    let port = gpu_ledger_testkit::util::free_port().expect("port");
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = support::gpu_ledger_command();
    cmd.env(
        "KUBECONFIG",
        cp.kubeconfig_path("admin").expect("kubeconfig"),
    )
    .env("POD_NAMESPACE", "gpu-ledger")
    .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
    .args(["--refresh-interval", "1s"]);
    let log = cp.dir().join("gpu-ledger-late-kubeflow.log");
    let serve = gpu_ledger_testkit::process::ChildGuard::spawn("gpu-ledger", cmd, &log)
        .expect("gpu-ledger serve");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http");
    let get = |path: &'static str| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.get(format!("{url}{path}")).send().await.ok()?;
            let status = r.status().as_u16();
            Some((status, r.text().await.ok()?))
        }
    };
    let readyz = eventually("serve ready", WAIT, || async {
        get("/readyz").await.filter(|(status, _)| *status == 200)
    })
    .await
    .1;
    assert!(
        readyz.contains("note: kubeflow.org Notebook: not served")
            && readyz.contains("notebook ownership and culling are off")
            && readyz.contains("looking again in"),
        "{readyz}\n{}",
        serve.log_tail(20)
    );
    let (_, page) = get("/").await.expect("page");
    assert!(
        page.contains("kubeflow.org Notebook: not served"),
        "the page says so too"
    );

    // Kubeflow arrives: the CRD, a notebook, its StatefulSet and its GPU pod.
    cp.install_notebook_crd().await.expect("notebook CRD");
    namespace(&admin, "team-ml", &[]).await;
    let notebooks: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "team-ml", &notebook_ar());
    let mut nb = DynamicObject::new("late-nb", &notebook_ar());
    nb.data = json!({"spec": {"template": {"spec": {"containers": [{"name": "late-nb", "image": "jupyter"}]}}}});
    let nb = notebooks
        .create(&PostParams::default(), &nb)
        .await
        .expect("notebook");
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "late-nb", "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "name": "late-nb", "uid": nb.metadata.uid, "controller": true}]},
        "spec": {"selector": {"matchLabels": {"statefulset": "late-nb"}}, "serviceName": "",
            "template": {"metadata": {"labels": {"statefulset": "late-nb"}},
                "spec": {"containers": [{"name": "late-nb", "image": "jupyter"}]}}}
    }))
    .expect("sts");
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), "team-ml")
        .create(&PostParams::default(), &sts)
        .await
        .expect("statefulset");
    let mut pod = gpu_pod("late-nb-0", 1, Some("gpu-1"));
    pod.metadata.labels = Some(
        [
            ("notebook-name".to_string(), "late-nb".to_string()),
            ("statefulset".to_string(), "late-nb".to_string()),
        ]
        .into(),
    );
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "apps/v1",
        "kind": "StatefulSet", "name": "late-nb", "uid": sts.metadata.uid, "controller": true}))
        .expect("owner"),
    ]);
    Api::<Pod>::namespaced(admin.clone(), "team-ml")
        .create(&PostParams::default(), &pod)
        .await
        .expect("notebook pod");

    // Looked for again within 10 s, then 20 s, 40 s …: generous for a busy machine.
    eventually(
        "the ledger names the notebook that owns the pod",
        Duration::from_secs(150),
        || async {
            let (_, body) = get("/api/v1/ledger").await?;
            let ledger: serde_json::Value = serde_json::from_str(&body).ok()?;
            ledger["pods"]
                .as_array()?
                .iter()
                .any(|p| p["pod"] == "late-nb-0" && p["notebook"] == "late-nb")
                .then_some(())
        },
    )
    .await;
    let (status, readyz) = get("/readyz").await.expect("readyz");
    assert_eq!(status, 200, "{readyz}");
    assert!(!readyz.contains("Notebook"), "the note is gone: {readyz}");
    drop(serve);
}
