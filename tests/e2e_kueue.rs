//! Kueue, the real one: its controller manager built from its Go module at v0.17.0
//! (`scripts/build-kueue.sh`), installed with its own CRDs and webhooks
//! ([`gpu_ledger_testkit::kueue`]), running against the tier-B control plane (real
//! kube-apiserver, kube-scheduler, kube-controller-manager with its Job controller, kwok GPU
//! nodes). Jobs are plain `batch/v1` Jobs with the queue label; everything asserted about
//! queues and workloads is what Kueue itself wrote.
//!
//! 1. Kueue alone: two ClusterQueues in one cohort, one GPU of nominal quota each. A Job is
//!    admitted (its Workload gets QuotaReserved and Admitted, the Job is unsuspended, its pod
//!    is bound to a kwok node of the flavor), a second one is admitted by borrowing the other
//!    queue's GPU, and a third, which fits nowhere in the cohort, stays suspended and pending.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::kueue::{self, Kueue, QUEUE_LABEL};
use gpu_ledger_testkit::stack::{ensure_namespace, gpu_pod};
use gpu_ledger_testkit::{ControlPlane, GpuNode, Tier};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use support::eventually;

/// Generous: the machine is shared with builds; each step takes seconds when it is not. On a
/// failure the Kueue guard prints the tail of Kueue's log as it unwinds.
const WAIT: Duration = Duration::from_secs(180);
const COHORT: &str = "research";
const FLAVOR: &str = "a100";
const GPU: &str = "nvidia.com/gpu";
/// The product label testkit's GPU nodes carry, and the flavor selects.
const PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";

async fn create(admin: &kube::Client, kind: &str, namespace: Option<&str>, obj: Value) {
    let ar = kueue::resource(kind);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    let mut o: DynamicObject = serde_json::from_value(obj).expect("Kueue object JSON");
    o.types = Some(kube::core::TypeMeta {
        api_version: ar.api_version.clone(),
        kind: ar.kind.clone(),
    });
    api.create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {kind}: {e}"));
}

/// A ResourceFlavor for the A100 nodes (`nodeLabels` are what Kueue adds to an admitted
/// pod's `nodeSelector`).
fn flavor() -> Value {
    json!({"metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": PRODUCT}}})
}

/// A ClusterQueue in [`COHORT`] with `nominal` GPUs of [`FLAVOR`], for every namespace, with
/// optional borrowing and lending limits.
fn cluster_queue(name: &str, nominal: u32, borrowing: Option<u32>, lending: Option<u32>) -> Value {
    let mut quota = json!({"name": GPU, "nominalQuota": nominal.to_string()});
    if let Some(b) = borrowing {
        quota["borrowingLimit"] = json!(b.to_string());
    }
    if let Some(l) = lending {
        quota["lendingLimit"] = json!(l.to_string());
    }
    json!({"metadata": {"name": name},
        "spec": {"cohortName": COHORT, "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": [GPU],
                "flavors": [{"name": FLAVOR, "resources": [quota]}]}]}})
}

fn local_queue(name: &str, cluster_queue: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"clusterQueue": cluster_queue}})
}

/// A `batch/v1` Job queued to `queue`: one pod asking for `gpus` × `nvidia.com/gpu`, with the
/// DCGM test double's utilisation annotation, running until the test ends (kwok). Created
/// unsuspended, as a user would: Kueue's webhook suspends it.
fn job(name: &str, queue: &str, gpus: u32, utilization_percent: f64) -> Job {
    let pod = gpu_pod(name, gpus, Some(utilization_percent));
    let mut template = serde_json::to_value(&pod).expect("pod JSON");
    let mut annotations = template["metadata"]["annotations"].clone();
    annotations[kueue::LONG_RUNNING_ANNOTATION] = json!("true");
    template["metadata"] = json!({"annotations": annotations});
    template["spec"]["restartPolicy"] = json!("Never");
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"backoffLimit": 0, "template": template}
    }))
    .expect("Job JSON")
}

async fn create_job(admin: &kube::Client, namespace: &str, job: &Job) {
    Api::<Job>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), job)
        .await
        .unwrap_or_else(|e| panic!("creating job {namespace}/{:?}: {e}", job.metadata.name));
}

/// The Workload Kueue created for Job `namespace/job` (owner reference), if any.
async fn workload_of(admin: &kube::Client, namespace: &str, job: &str) -> Option<DynamicObject> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), namespace, &kueue::resource("Workload"));
    api.list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|w| {
            w.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Job" && o.name == job)
        })
}

/// Status of condition `type_` of a Kueue object (`"True"`, `"False"`), if set.
fn condition(obj: &DynamicObject, type_: &str) -> Option<String> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

async fn job_suspended(admin: &kube::Client, namespace: &str, name: &str) -> Option<bool> {
    let j = Api::<Job>::namespaced(admin.clone(), namespace)
        .get(name)
        .await
        .ok()?;
    j.spec?.suspend
}

/// The Job's pod once it runs on a node.
async fn running_pod(admin: &kube::Client, namespace: &str, job: &str) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    pods.list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .ok()?
        .items
        .into_iter()
        .find(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
        })
}

async fn cluster_queue_status(admin: &kube::Client, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &kueue::resource("ClusterQueue"));
    Some(api.get(name).await.ok()?.data["status"].clone())
}

/// `status.flavorsReservation[flavor].resources[resource].borrowed` of a ClusterQueue status.
fn borrowed(status: &Value, flavor: &str, resource: &str) -> Option<String> {
    status["flavorsReservation"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == flavor)?["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == resource)
        .and_then(|r| r["borrowed"].as_str())
        .map(str::to_string)
}

/// Creates the flavor, two ClusterQueues in [`COHORT`] and a LocalQueue in each namespace
/// (namespaces created); `queues` lists (namespace, cluster queue, nominal, borrowing, lending).
async fn queues(admin: &kube::Client, queues: &[(&str, &str, u32, Option<u32>, Option<u32>)]) {
    create(admin, "ResourceFlavor", None, flavor()).await;
    for (ns, cq, nominal, borrowing, lending) in queues {
        create(
            admin,
            "ClusterQueue",
            None,
            cluster_queue(cq, *nominal, *borrowing, *lending),
        )
        .await;
        ensure_namespace(admin, ns).await.expect("namespace");
        create(admin, "LocalQueue", Some(ns), local_queue("queue", cq)).await;
    }
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_a_job_borrows_in_its_cohort_and_holds_the_one_that_fits_nowhere() {
    let cp = ControlPlane::start(Tier::B(kueue::tier_b_options()))
        .await
        .expect("control plane (run scripts/build-test-cluster.sh if binaries are missing)");
    for n in ["gpu-1", "gpu-2"] {
        cp.add_node(&GpuNode::new(n, 1)).await.expect("node");
        cp.wait_node_ready(n, WAIT).await.expect("node Ready");
    }
    let mut kueue = Kueue::start(&cp)
        .await
        .expect("Kueue (run scripts/build-kueue.sh if the binary is missing)");
    let admin = cp.client("admin").await.expect("admin client");
    queues(
        &admin,
        &[
            ("team-a", "team-a-cq", 1, None, None),
            ("team-b", "team-b-cq", 1, None, None),
        ],
    )
    .await;

    // The ClusterQueue is read back at v1beta1 through Kueue's conversion webhook:
    // `spec.cohortName` is `spec.cohort` there.
    let v1beta1: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &kueue::resource_at("v1beta1", "ClusterQueue"),
    );
    let old = v1beta1
        .get("team-a-cq")
        .await
        .expect("ClusterQueue at v1beta1 (conversion webhook)");
    assert_eq!(old.data["spec"]["cohort"], COHORT, "{:?}", old.data["spec"]);

    // 1. Admitted within its own quota.
    create_job(&admin, "team-a", &job("train-1", "queue", 1, 90.0)).await;
    let wl = eventually("train-1's Workload admitted", WAIT, || async {
        let w = workload_of(&admin, "team-a", "train-1").await?;
        (condition(&w, "QuotaReserved").as_deref() == Some("True")
            && condition(&w, "Admitted").as_deref() == Some("True"))
        .then_some(w)
    })
    .await;
    let admission = &wl.data["status"]["admission"];
    assert_eq!(admission["clusterQueue"], "team-a-cq", "{admission}");
    assert_eq!(
        admission["podSetAssignments"][0]["flavors"][GPU], FLAVOR,
        "{admission}"
    );
    eventually("train-1 unsuspended", WAIT, || async {
        (job_suspended(&admin, "team-a", "train-1").await == Some(false)).then_some(())
    })
    .await;
    let pod = eventually("train-1's pod running on a kwok node", WAIT, || {
        running_pod(&admin, "team-a", "train-1")
    })
    .await;
    let spec = pod.spec.expect("pod spec");
    assert!(
        ["gpu-1", "gpu-2"].contains(&spec.node_name.as_deref().unwrap_or_default()),
        "{:?}",
        spec.node_name
    );
    // Kueue injected the flavor's node labels on admission.
    assert_eq!(
        spec.node_selector
            .unwrap_or_default()
            .get("nvidia.com/gpu.product")
            .map(String::as_str),
        Some(PRODUCT)
    );

    // 2. Admitted by borrowing team-b's unused GPU.
    create_job(&admin, "team-a", &job("train-2", "queue", 1, 90.0)).await;
    eventually("train-2's Workload admitted", WAIT, || async {
        let w = workload_of(&admin, "team-a", "train-2").await?;
        (condition(&w, "Admitted").as_deref() == Some("True")).then_some(())
    })
    .await;
    eventually("team-a-cq borrowing one GPU", WAIT, || async {
        let s = cluster_queue_status(&admin, "team-a-cq").await?;
        (borrowed(&s, FLAVOR, GPU).as_deref() == Some("1")).then_some(())
    })
    .await;
    eventually("train-2's pod running", WAIT, || {
        running_pod(&admin, "team-a", "train-2")
    })
    .await;

    // 3. The cohort is full: Kueue evaluates train-3, reserves nothing, keeps it suspended.
    create_job(&admin, "team-a", &job("train-3", "queue", 1, 90.0)).await;
    let pending = eventually("train-3's Workload found not to fit", WAIT, || async {
        let w = workload_of(&admin, "team-a", "train-3").await?;
        (condition(&w, "QuotaReserved").as_deref() == Some("False")).then_some(w)
    })
    .await;
    assert_ne!(
        condition(&pending, "Admitted").as_deref(),
        Some("True"),
        "{:?}",
        pending.data["status"]
    );
    eventually("team-a-cq counting one pending workload", WAIT, || async {
        let s = cluster_queue_status(&admin, "team-a-cq").await?;
        (s["pendingWorkloads"] == 1 && s["admittedWorkloads"] == 2).then_some(())
    })
    .await;
    assert_eq!(job_suspended(&admin, "team-a", "train-3").await, Some(true));
    assert!(
        running_pod(&admin, "team-a", "train-3").await.is_none(),
        "a pending Job has no pod"
    );
    assert!(kueue.try_exit_status().is_none(), "Kueue exited");
}
