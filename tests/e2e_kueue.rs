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
//! 2. gpu-ledger beside it (the tier-B stack: DCGM test double scraped by a real Prometheus,
//!    the shipped read-only RBAC). First without Kueue (no CRDs): the ledger works, `queues`
//!    is empty and one log line says Kueue was not found. Then with Kueue: `team-a-cq` lends
//!    its GPU to the cohort but holds it with an admitted notebook-like Job whose GPU sits at
//!    0 %, `team-b-cq` runs a busy Job and has a second one pending, which the cohort could
//!    admit if `team-a-cq`'s idle GPU were freed. The ledger's `queues` rows show the idle
//!    quota and the starved queue, and `/metrics` the series `GpuLedgerQueueStarvedWhileLenderIdle`
//!    reads. A JobSet (the real CRD of the `sigs.k8s.io/jobset` module Kueue pins; JobSet's
//!    controller emulated, see `jobset_runs_under_its_queue`) admitted to a third ClusterQueue
//!    shows its pods, controlled by Jobs, busy under that queue, and a RayJob (the real RayJob
//!    and RayCluster CRDs of the KubeRay `ray-operator` module Kueue pins, Kueue's
//!    `ray.io/rayjob` integration; KubeRay's operator emulated, see
//!    `rayjob_runs_under_its_queue`) admitted to a fourth shows its GPU workers, controlled by
//!    a RayCluster, busy under that one (issue 37, item 4). `capture` of that cluster, reported
//!    offline, gives the live report's queue rows.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::kueue::{self, Kueue, QUEUE_LABEL};
use gpu_ledger_testkit::stack::{GpuLedgerProcess, ensure_namespace, gpu_pod, metric_value};
use gpu_ledger_testkit::{ControlPlane, GpuNode, Tier};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use support::eventually;

/// The shipped Role and RoleBinding on Kueue's manager ConfigMap, in kueue-system.
const KUEUE_CONFIG_RBAC: &str = include_str!("../deploy/kustomize/components/kueue/rbac.yaml");
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

/// A ClusterQueue in `cohort` with `nominal` GPUs of [`FLAVOR`], for every namespace, with
/// optional borrowing and lending limits.
fn cluster_queue(
    name: &str,
    cohort: Option<&str>,
    nominal: u32,
    borrowing: Option<u32>,
    lending: Option<u32>,
) -> Value {
    let mut quota = json!({"name": GPU, "nominalQuota": nominal.to_string()});
    if let Some(b) = borrowing {
        quota["borrowingLimit"] = json!(b.to_string());
    }
    if let Some(l) = lending {
        quota["lendingLimit"] = json!(l.to_string());
    }
    let mut cq = json!({"metadata": {"name": name},
        "spec": {"namespaceSelector": {},
            "resourceGroups": [{"coveredResources": [GPU],
                "flavors": [{"name": FLAVOR, "resources": [quota]}]}]}});
    if let Some(c) = cohort {
        cq["spec"]["cohortName"] = json!(c);
    }
    cq
}

fn local_queue(name: &str, cluster_queue: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"clusterQueue": cluster_queue}})
}

/// The pod template of a Job: `gpus` × `nvidia.com/gpu` at `utilization_percent` (the DCGM
/// test double's annotation), Running until the test ends on kwok.
fn pod_template(name: &str, gpus: u32, utilization_percent: f64) -> Value {
    let pod = gpu_pod(name, gpus, Some(utilization_percent));
    let mut template = serde_json::to_value(&pod).expect("pod JSON");
    let mut annotations = template["metadata"]["annotations"].clone();
    annotations[kueue::LONG_RUNNING_ANNOTATION] = json!("true");
    template["metadata"] = json!({"annotations": annotations});
    template["spec"]["restartPolicy"] = json!("Never");
    template
}

/// A JobSet (`jobset.x-k8s.io/v1alpha2`, the real CRD) queued to `queue`: one replicated job
/// `workers` of `replicas` Jobs of one pod each, one GPU per pod at `utilization_percent`.
/// Created unsuspended, as a user would: Kueue's JobSet webhook suspends it.
fn jobset(name: &str, queue: &str, replicas: u32, utilization_percent: f64) -> DynamicObject {
    let template = pod_template(name, 1, utilization_percent);
    serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", kueue::JOBSET_GROUP, kueue::JOBSET_VERSION),
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": replicas,
            "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": template}}}]}
    }))
    .expect("JobSet JSON")
}

/// A `batch/v1` Job queued to `queue`: one pod asking for `gpus` × `nvidia.com/gpu`, with the
/// DCGM test double's utilisation annotation, running until the test ends (kwok). Created
/// unsuspended, as a user would: Kueue's webhook suspends it.
fn job(name: &str, queue: &str, gpus: u32, utilization_percent: f64) -> Job {
    let template = pod_template(name, gpus, utilization_percent);
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
    workload_owned_by(admin, namespace, "Job", job).await
}

/// The Workload Kueue created for the `kind` object `namespace/name` (owner reference), if any.
async fn workload_owned_by(
    admin: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Option<DynamicObject> {
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
                .any(|o| o.kind == kind && o.name == name)
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

/// `status.<list>[flavor].resources[resource].<field>` of a ClusterQueue status, e.g. the GPUs
/// borrowed (`flavorsReservation`, `borrowed`) or admitted (`flavorsUsage`, `total`).
fn flavor_resource(
    status: &Value,
    list: &str,
    flavor: &str,
    resource: &str,
    field: &str,
) -> Option<String> {
    status[list]
        .as_array()?
        .iter()
        .find(|f| f["name"] == flavor)?["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == resource)
        .and_then(|r| r[field].as_str())
        .map(str::to_string)
}

/// A ClusterQueue `name` (in [`COHORT`] unless told otherwise) and the LocalQueue `queue` of
/// `namespace` pointing at it.
struct Queue {
    namespace: &'static str,
    name: &'static str,
    cohort: Option<&'static str>,
    nominal: u32,
    borrowing_limit: Option<u32>,
    lending_limit: Option<u32>,
}

impl Queue {
    fn new(namespace: &'static str, name: &'static str, nominal: u32) -> Self {
        Self {
            namespace,
            name,
            cohort: Some(COHORT),
            nominal,
            borrowing_limit: None,
            lending_limit: None,
        }
    }
}

/// Creates the flavor, the ClusterQueues and a LocalQueue `queue` in each namespace (namespaces
/// created).
async fn queues(admin: &kube::Client, queues: &[Queue]) {
    create(admin, "ResourceFlavor", None, flavor()).await;
    for q in queues {
        create(
            admin,
            "ClusterQueue",
            None,
            cluster_queue(
                q.name,
                q.cohort,
                q.nominal,
                q.borrowing_limit,
                q.lending_limit,
            ),
        )
        .await;
        ensure_namespace(admin, q.namespace)
            .await
            .expect("namespace");
        create(
            admin,
            "LocalQueue",
            Some(q.namespace),
            local_queue("queue", q.name),
        )
        .await;
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
            Queue::new("team-a", "team-a-cq", 1),
            Queue::new("team-b", "team-b-cq", 1),
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
        (flavor_resource(&s, "flavorsReservation", FLAVOR, GPU, "borrowed").as_deref() == Some("1"))
            .then_some(())
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

/// The `queues` row of `cluster_queue` (flavor [`FLAVOR`], resource [`GPU`]), if listed.
fn queue_row(ledger: &Value, cluster_queue: &str) -> Option<Value> {
    ledger["queues"]
        .as_array()?
        .iter()
        .find(|q| {
            q["cluster_queue"] == cluster_queue && q["flavor"] == FLAVOR && q["resource"] == GPU
        })
        .cloned()
}

/// Polls the ledger until `cluster_queue`'s row satisfies `ok`, then returns the row; on a
/// timeout the panic shows the last row and the pods of the ledger (why a pod was not
/// joined is in them).
async fn queue_row_until(
    gl: &GpuLedgerProcess,
    cluster_queue: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = Value::Null;
    loop {
        if let Ok(l) = gl.ledger_json().await {
            if let Some(row) = queue_row(&l, cluster_queue).filter(|r| ok(r)) {
                return row;
            }
            last = l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for: {what}; last row {:?}; pods {}",
            queue_row(&last, cluster_queue),
            last["pods"]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn metric(gl: &GpuLedgerProcess, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_value(&gl.metrics_text().await.ok()?, family, labels)
}

/// A JobSet queued to `team-c-cq` is admitted by the real Kueue (its Workload owned by the
/// JobSet, the JobSet unsuspended), and its two Jobs' pods run on kwok GPU nodes, placed by
/// the real scheduler.
///
/// JobSet's controller does not run here (a separate operator with its own webhooks and
/// certificates): `kueue::jobset_child_job` makes each Job as JobSet v0.11.1's
/// `constructJob` would, from the JobSet as Kueue left it, and kube-controller-manager's Job
/// controller makes the pods. The second Job's pod template goes without Kueue's
/// `kueue.x-k8s.io/workload` annotation, as Kueue v0.17 leaves it with its
/// TopologyAwareScheduling gate off: that pod joins through JobSet's own labels.
async fn jobset_runs_under_its_queue(admin: &kube::Client) {
    let ns = "team-c";
    let jobsets: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), ns, &kueue::jobset_resource());
    jobsets
        .create(
            &PostParams::default(),
            &jobset("train-js", "queue", 2, 80.0),
        )
        .await
        .unwrap_or_else(|e| panic!("creating JobSet: {e}"));
    let wl = eventually("train-js's Workload admitted", WAIT, || async {
        let w = workload_owned_by(admin, ns, "JobSet", "train-js").await?;
        (condition(&w, "Admitted").as_deref() == Some("True")).then_some(w)
    })
    .await;
    let js = eventually("Kueue unsuspending train-js", WAIT, || async {
        let js = jobsets.get("train-js").await.ok()?;
        (js.data["spec"]["suspend"] == false).then_some(js)
    })
    .await;
    let workload_name = wl.metadata.name.clone().expect("Workload name");
    let pod_meta =
        &js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"];
    assert_eq!(
        pod_meta["annotations"]["kueue.x-k8s.io/workload"], workload_name,
        "Kueue names its Workload on the template it starts: {pod_meta}"
    );
    assert_eq!(
        pod_meta["labels"]["kueue.x-k8s.io/podset"], "workers",
        "{pod_meta}"
    );
    for index in 0..2 {
        let mut job = kueue::jobset_child_job(&js, 0, index).expect("the JobSet's Job");
        if index == 1 {
            let template = job.spec.as_mut().expect("spec").template.metadata.as_mut();
            let annotations = template
                .and_then(|m| m.annotations.as_mut())
                .expect("the Job's pod template carries Kueue's annotations");
            assert!(
                annotations.remove("kueue.x-k8s.io/workload").is_some(),
                "the Job's pod template carried Kueue's workload annotation"
            );
        }
        create_job(admin, ns, &job).await;
    }
    for index in 0..2 {
        let job = format!("train-js-workers-{index}");
        let pod = eventually(&format!("{job}'s pod running"), WAIT, || {
            running_pod(admin, ns, &job)
        })
        .await;
        let labels = pod.metadata.labels.unwrap_or_default();
        assert_eq!(labels["jobset.sigs.k8s.io/jobset-name"], "train-js");
    }
}

/// A RayJob (`ray.io/v1`, the real CRD) queued to `queue`: a head without GPUs and one worker
/// group `gpu-workers` of `workers` pods, one GPU each at `utilization_percent`. `HTTPMode`: the
/// operator submits the job itself, so Kueue adds no submitter pod set (its CPU and memory
/// would need quota the GPU-only ClusterQueues do not cover). Created unsuspended, as a user
/// would: Kueue's RayJob webhook suspends it.
fn rayjob(name: &str, queue: &str, workers: u32, utilization_percent: f64) -> DynamicObject {
    let head = json!({"spec": {"containers": [{"name": "ray-head",
        "image": "registry.invalid/ray:2.52.0"}]}});
    serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", kueue::RAY_GROUP, kueue::RAY_VERSION),
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"entrypoint": "python train.py", "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": true,
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": head},
                "workerGroupSpecs": [{"groupName": "gpu-workers", "replicas": workers,
                    "minReplicas": workers, "maxReplicas": workers, "rayStartParams": {},
                    "template": pod_template(name, 1, utilization_percent)}]}}
    }))
    .expect("RayJob JSON")
}

/// Pod `namespace/name` once it runs on a node.
async fn pod_running(admin: &kube::Client, namespace: &str, name: &str) -> Option<Pod> {
    let p = Api::<Pod>::namespaced(admin.clone(), namespace)
        .get(name)
        .await
        .ok()?;
    (p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
    .then_some(p)
}

/// A RayJob queued to `team-d-cq` is admitted by the real Kueue (its Workload owned by the
/// RayJob, the RayJob unsuspended), and its RayCluster's head and two GPU workers run on kwok
/// nodes, placed by the real scheduler.
///
/// KubeRay's operator does not run here (a separate Go build with its own webhooks):
/// `kueue::rayjob_cluster` makes the RayCluster (`<rayjob>-<5 random characters>`, controlled
/// by the RayJob) and `kueue::raycluster_pod` its pods (controlled by the RayCluster, with
/// KubeRay's `ray.io/*` labels) as KubeRay v1.6.0 would, from the RayJob as Kueue left it. The
/// second worker goes without Kueue's `kueue.x-k8s.io/workload` annotation, as Kueue v0.17
/// leaves it with its TopologyAwareScheduling gate off: that pod joins through KubeRay's
/// `ray.io/cluster` label alone.
async fn rayjob_runs_under_its_queue(admin: &kube::Client) {
    let ns = "team-d";
    let rayjobs: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), ns, &kueue::rayjob_resource());
    let created = rayjobs
        .create(
            &PostParams::default(),
            &rayjob("train-ray", "queue", 2, 70.0),
        )
        .await
        .unwrap_or_else(|e| panic!("creating RayJob: {e}"));
    assert_eq!(
        created.data["spec"]["suspend"], true,
        "Kueue's RayJob webhook suspends a queued RayJob"
    );
    let wl = eventually("train-ray's Workload admitted", WAIT, || async {
        let w = workload_owned_by(admin, ns, "RayJob", "train-ray").await?;
        (condition(&w, "Admitted").as_deref() == Some("True")).then_some(w)
    })
    .await;
    let rj = eventually("Kueue unsuspending train-ray", WAIT, || async {
        let rj = rayjobs.get("train-ray").await.ok()?;
        // KubeRay's Go type drops a false `suspend` (`omitempty`); Kueue's webhook set it true.
        (!rj.data["spec"]["suspend"].as_bool().unwrap_or(false)).then_some(rj)
    })
    .await;
    let workload_name = wl.metadata.name.clone().expect("Workload name");
    let pod_meta =
        &rj.data["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["metadata"];
    assert_eq!(
        pod_meta["annotations"]["kueue.x-k8s.io/workload"], workload_name,
        "Kueue names its Workload on the template it starts: {pod_meta}"
    );
    assert_eq!(
        pod_meta["labels"]["kueue.x-k8s.io/podset"], "gpu-workers",
        "{pod_meta}"
    );
    // KubeRay names the cluster in the RayJob's status first (`initRayJobStatusIfNeed`).
    let cluster_name = "train-ray-x7k2p";
    rayjobs
        .patch_status(
            "train-ray",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"rayClusterName": cluster_name,
                "jobDeploymentStatus": "Initializing", "jobStatus": ""}})),
        )
        .await
        .unwrap_or_else(|e| panic!("RayJob status: {e}"));
    let cluster = kueue::rayjob_cluster(&rj, "x7k2p").expect("the RayJob's RayCluster");
    let cluster =
        Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &kueue::raycluster_resource())
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap_or_else(|e| panic!("creating RayCluster: {e}"));
    assert_eq!(cluster.metadata.name.as_deref(), Some(cluster_name));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let mut names = Vec::new();
    // The head, then the two workers of group 0; the last one without Kueue's annotation.
    for (index, group) in [None, Some(0), Some(0)].into_iter().enumerate() {
        let mut pod = kueue::raycluster_pod(&cluster, group).expect("a RayCluster pod");
        if index == 2 {
            let annotations = pod
                .metadata
                .annotations
                .as_mut()
                .expect("the RayCluster pod carries Kueue's annotations");
            assert!(
                annotations.remove("kueue.x-k8s.io/workload").is_some(),
                "the RayCluster pod carried Kueue's workload annotation"
            );
        }
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating a pod of {cluster_name}: {e}"));
        names.push(pod.metadata.name.expect("generated pod name"));
    }
    for name in &names {
        let pod = eventually(&format!("{name} running"), WAIT, || {
            pod_running(admin, ns, name)
        })
        .await;
        let labels = pod.metadata.labels.unwrap_or_default();
        assert_eq!(labels["ray.io/cluster"], cluster_name, "{name}");
    }
}

/// Lines of the process's log that say Kueue was not found.
fn kueue_not_found_lines(gl: &GpuLedgerProcess) -> usize {
    std::fs::read_to_string(gl.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Kueue not found"))
        .count()
}

/// Waits until Job `namespace/name`'s Workload is admitted and its pod runs.
async fn admitted_and_running(admin: &kube::Client, namespace: &str, name: &str) {
    eventually(&format!("{name}'s Workload admitted"), WAIT, || async {
        let w = workload_of(admin, namespace, name).await?;
        (condition(&w, "Admitted").as_deref() == Some("True")).then_some(())
    })
    .await;
    eventually(&format!("{name}'s pod running"), WAIT, || {
        running_pod(admin, namespace, name)
    })
    .await;
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_names_the_idle_lender_and_the_queue_it_starves() {
    // Seven GPUs: the plain pod, the notebook, the busy Job, the JobSet's two pods and the
    // RayJob's two workers.
    let nodes = [
        GpuNode::new("gpu-1", 2),
        GpuNode::new("gpu-2", 3),
        GpuNode::new("gpu-3", 2),
    ];
    let stack =
        support::tier_b_with(&nodes, kueue::tier_b_options(), support::Grants::ReadOnly).await;
    let admin = stack.admin();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));

    // 1. No Kueue: no CRDs of kueue.x-k8s.io. A GPU pod outside any queue.
    stack.ensure_namespace("plain").await.expect("namespace");
    stack
        .create_gpu_pod("plain", "solo", 1, Some(50.0))
        .await
        .expect("pod");
    stack
        .wait_pod_running("plain", "solo")
        .await
        .expect("pod Running");
    let mut gl = stack
        .start_gpu_ledger(bin, "gpu-ledger", &[])
        .await
        .expect("gpu-ledger without Kueue");
    let ledger = eventually(
        "the plain pod's utilisation in the ledger",
        WAIT,
        || async {
            let l = gl.ledger_json().await.ok()?;
            let row = l["pods"]
                .as_array()?
                .iter()
                .find(|p| p["namespace"] == "plain" && p["pod"] == "solo")?
                .clone();
            row["utilization"].as_f64().map(|_| l)
        },
    )
    .await;
    assert_eq!(ledger["kueue_available"], false, "{ledger}");
    assert_eq!(ledger["queues"], json!([]), "{ledger}");
    assert_eq!(
        kueue_not_found_lines(&gl),
        1,
        "one line says Kueue was not found:\n{}",
        gl.log_tail(40)
    );
    gl.terminate(Duration::from_secs(5));

    // 2. Kueue, and two ClusterQueues in one cohort.
    let mut kueue = Kueue::start(&stack.cp)
        .await
        .expect("Kueue (run scripts/build-kueue.sh if the binary is missing)");
    queues(
        &admin,
        &[
            // The lender: its one GPU may all be lent to the cohort when unused.
            Queue {
                lending_limit: Some(1),
                ..Queue::new("team-a", "team-a-cq", 1)
            },
            // May borrow one more GPU from the cohort.
            Queue {
                borrowing_limit: Some(1),
                ..Queue::new("team-b", "team-b-cq", 1)
            },
            // Outside the cohort: its JobSet changes nothing of the starvation above.
            Queue {
                cohort: None,
                ..Queue::new("team-c", "team-c-cq", 2)
            },
            // Outside the cohort too: the RayJob's.
            Queue {
                cohort: None,
                ..Queue::new("team-d", "team-d-cq", 2)
            },
        ],
    )
    .await;
    // A notebook-like workload holds team-a-cq's GPU and does nothing with it.
    create_job(&admin, "team-a", &job("notebook", "queue", 1, 0.0)).await;
    admitted_and_running(&admin, "team-a", "notebook").await;
    create_job(&admin, "team-b", &job("train", "queue", 1, 90.0)).await;
    admitted_and_running(&admin, "team-b", "train").await;
    // The cohort has no GPU left to lend: Kueue keeps the next one pending.
    create_job(&admin, "team-b", &job("train-2", "queue", 1, 90.0)).await;
    eventually("train-2's Workload found not to fit", WAIT, || async {
        let w = workload_of(&admin, "team-b", "train-2").await?;
        (condition(&w, "QuotaReserved").as_deref() == Some("False")).then_some(())
    })
    .await;
    jobset_runs_under_its_queue(&admin).await;
    rayjob_runs_under_its_queue(&admin).await;

    // Kueue writes a ClusterQueue's `flavorsUsage` after it admits, on its own schedule: once
    // in CI the ledger read team-b-cq's as 0 while the Job's pod ran. `admitted` is that field
    // as written, so wait for Kueue to write it, then for the ledger to show it.
    for (cq, gpus) in [
        ("team-a-cq", "1"),
        ("team-b-cq", "1"),
        ("team-c-cq", "2"),
        ("team-d-cq", "2"),
    ] {
        eventually(
            &format!("{cq}'s status.flavorsUsage at {gpus} GPU"),
            WAIT,
            || async {
                let s = cluster_queue_status(&admin, cq).await?;
                let total = flavor_resource(&s, "flavorsUsage", FLAVOR, GPU, "total");
                (total.as_deref() == Some(gpus)).then_some(())
            },
        )
        .await;
    }

    // The shipped grant on Kueue's ConfigMap (deploy/kustomize/components/kueue; the chart
    // renders the same where Kueue is served).
    gpu_ledger_testkit::stack::apply_rbac(
        &admin,
        KUEUE_CONFIG_RBAC,
        "gpu-ledger",
        gpu_ledger_testkit::stack::LEDGER_NAMESPACE,
    )
    .await
    .expect("Kueue ConfigMap RBAC");
    let gl = stack
        .start_gpu_ledger(bin, "gpu-ledger", &[])
        .await
        .expect("gpu-ledger with Kueue");
    let (lender, starved) = eventually(
        "team-a-cq's GPU proven idle and team-b-cq starved by it",
        WAIT,
        || async {
            let l = gl.ledger_json().await.ok()?;
            let a = queue_row(&l, "team-a-cq")?;
            let b = queue_row(&l, "team-b-cq")?;
            // Both usages as the watch last saw them: the apiserver already holds 1 each.
            (a["idle"].as_f64() == Some(1.0)
                && b["starved_while_lender_idle"] == true
                && a["admitted"] == 1
                && b["admitted"] == 1)
                .then_some((a, b))
        },
    )
    .await;
    // The lender: its whole nominal quota admitted, and held idle.
    assert_eq!(lender["cohort"], COHORT, "{lender}");
    assert_eq!(lender["nominal"], 1, "{lender}");
    assert_eq!(lender["lending_limit"], 1, "{lender}");
    assert_eq!(lender["borrowing_limit"], Value::Null, "{lender}");
    assert_eq!(lender["admitted"], 1, "{lender}");
    assert_eq!(lender["busy"].as_f64(), Some(0.0), "{lender}");
    assert_eq!(lender["pending_workloads"], 0, "{lender}");
    assert_eq!(lender["starved_while_lender_idle"], false, "{lender}");
    // The starved queue: its own GPU busy, one workload waiting on the lender's idle GPU.
    assert_eq!(starved["cohort"], COHORT, "{starved}");
    assert_eq!(starved["nominal"], 1, "{starved}");
    assert_eq!(starved["borrowing_limit"], 1, "{starved}");
    assert_eq!(starved["admitted"], 1, "{starved}");
    assert_eq!(starved["busy"].as_f64(), Some(1.0), "{starved}");
    assert_eq!(starved["idle"].as_f64(), Some(0.0), "{starved}");
    assert_eq!(starved["pending_workloads"], 1, "{starved}");
    assert!(
        starved["oldest_pending_seconds"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "{starved}"
    );
    assert_eq!(starved["idle_lenders"], json!(["team-a-cq"]), "{starved}");

    // The alert's input: GpuLedgerQueueStarvedWhileLenderIdle reads these two series.
    let b = [("cluster_queue", "team-b-cq")];
    assert_eq!(
        metric(&gl, "gpu_ledger_queue_starved_while_lender_idle", &b).await,
        Some(1.0)
    );
    assert_eq!(
        metric(&gl, "gpu_ledger_queue_pending_workloads", &b).await,
        Some(1.0)
    );
    assert_eq!(
        metric(
            &gl,
            "gpu_ledger_queue_starved_while_lender_idle",
            &[("cluster_queue", "team-a-cq")]
        )
        .await,
        Some(0.0)
    );
    assert_eq!(
        metric(
            &gl,
            "gpu_ledger_queue_gpus",
            &[("cluster_queue", "team-a-cq"), ("kind", "idle")]
        )
        .await,
        Some(1.0)
    );
    // Issue 37, item 4: the JobSet's pods (controlled by Jobs, not by the Workload's owner)
    // are its queue's: busy, both of them.
    let team_c = queue_row_until(&gl, "team-c-cq", "the JobSet's pods busy under it", |c| {
        c["busy"].as_f64() == Some(2.0) && c["admitted"] == 2
    })
    .await;
    assert_eq!(team_c["idle"].as_f64(), Some(0.0), "{team_c}");
    assert_eq!(team_c["nominal"], 2, "{team_c}");
    assert_eq!(
        metric(
            &gl,
            "gpu_ledger_queue_gpus",
            &[("cluster_queue", "team-c-cq"), ("kind", "busy")]
        )
        .await,
        Some(2.0)
    );
    // The RayJob's workers (controlled by a RayCluster, not by the Workload's owner; one
    // without Kueue's annotation) are its queue's: busy, both of them; the head holds no GPU.
    let team_d = queue_row_until(
        &gl,
        "team-d-cq",
        "the RayJob's workers busy under it",
        |d| d["busy"].as_f64() == Some(2.0) && d["admitted"] == 2,
    )
    .await;
    assert_eq!(team_d["idle"].as_f64(), Some(0.0), "{team_d}");
    assert_eq!(
        metric(
            &gl,
            "gpu_ledger_queue_gpus",
            &[("cluster_queue", "team-d-cq"), ("kind", "busy")]
        )
        .await,
        Some(2.0)
    );
    // Kueue's ConfigMap, read through the shipped RBAC (get on that one object): the test's
    // Configuration maps DeviceClass gpu.nvidia.com to `example.com/gpu`.
    let log = std::fs::read_to_string(gl.log_path()).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("read Kueue's deviceClassMappings")
                && l.contains(kueue::DEVICE_CLASS_MAPPING)),
        "{}",
        gl.log_tail(40)
    );
    assert!(
        !log.contains("cannot read Kueue's ConfigMap"),
        "{}",
        gl.log_tail(40)
    );
    let ledger = gl.ledger_json().await.expect("ledger");
    assert_eq!(ledger["kueue_available"], true, "{ledger}");
    assert_eq!(kueue_not_found_lines(&gl), 0, "{}", gl.log_tail(40));

    // 3. Offline: `capture` writes what Kueue wrote; `report --from` gives the live rows. The
    // reports look 3 s back (complete samples), where the notebook must already be proven idle
    // for a whole 10 s window: wait until it has been idle for 16 s.
    eventually("the notebook's pod idle for 16 s", WAIT, || async {
        let l = gl.ledger_json().await.ok()?;
        let idle_for = l["pods"]
            .as_array()?
            .iter()
            .find(|p| p["namespace"] == "team-a" && p["owner"]["name"] == "notebook")?["idle_seconds"]
            .as_f64()?;
        (idle_for >= 16.0).then_some(())
    })
    .await;
    let (live, offline, _capture) = support::live_and_offline(&stack);
    assert_eq!(offline["kueue_available"], true, "{offline}");
    assert_eq!(offline["queues"], live["queues"], "offline vs live");
    let team_d = queue_row(&offline, "team-d-cq").expect("team-d-cq offline");
    assert_eq!(team_d["busy"].as_f64(), Some(2.0), "{team_d}");
    let starved = queue_row(&offline, "team-b-cq").expect("team-b-cq offline");
    assert_eq!(starved["idle_lenders"], json!(["team-a-cq"]), "{starved}");
    assert!(kueue.try_exit_status().is_none(), "Kueue exited");
}
