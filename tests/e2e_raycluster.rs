//! RayCluster culling end to end with the real KubeRay operator (v1.5.0, built from its Go
//! module by `scripts/build-kuberay.sh`; `testkit/src/kuberay.rs`) on a tier B control plane
//! (real scheduler, kwok GPU nodes), the fake dcgm-exporter scraped by a real Prometheus, and
//! `gpu-ledger serve --cull=on` as token user `gpu-ledger` bound to the shipped read-only and
//! culling RBAC.
//!
//! What runs real: the operator creates the head and GPU worker pods from the RayCluster (its
//! controller ownerReference and `ray.io/cluster` label are the operator's own), the scheduler
//! binds them, kwok runs them; gpu-ledger suspends the cluster with `spec.suspend: true`; the
//! operator deletes every pod of it and reports `RayClusterSuspended`; the scheduler then binds
//! a GPU pod that was pending for the freed cards. The Ray processes never start (kwok runs no
//! containers): the GPUs read 0 % from the DCGM double, which is what "idle" means here.
//!
//! A second RayCluster, labelled as KubeRay's RayJob controller labels the cluster it makes
//! (`ray.io/originated-from-crd: RayJob`), holds an idle GPU too and is never suspended: its
//! parent owns its lifecycle. (No RayJob object exists: the label is what gpu-ledger reads.)
//!
//! The operator is required: without `KUBERAY_BIN` or the script's cache entry the test fails
//! with the command that builds it, it never skips.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::kuberay::{self, KubeRay};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use support::{Grants, eventually};

const NS: &str = "team-ray";
const WAIT: Duration = Duration::from_secs(120);

/// A RayCluster as a user writes it: a GPU-less head and `workers` GPU workers of one GPU each,
/// pinned to `node` (so the freed cards are known), with `labels` on the cluster.
fn raycluster(name: &str, workers: u32, node: &str, labels: &Value) -> DynamicObject {
    let pin = json!({"kubernetes.io/hostname": node});
    serde_json::from_value(json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {
                    "nodeSelector": pin,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0",
                        "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}],
                }},
            },
            "workerGroupSpecs": [{
                "groupName": "gpu",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": {"spec": {
                    "nodeSelector": pin,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu",
                        "resources": {"limits": {"cpu": "1", "memory": "2Gi",
                            "nvidia.com/gpu": "1"}}}],
                }},
            }],
        },
    }))
    .expect("a RayCluster")
}

/// The pods of RayCluster `name` that are Running (the operator's label).
async fn running_pods(admin: &kube::Client, name: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let lp = ListParams::default().labels(&format!("ray.io/cluster={name}"));
    pods.list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

fn condition(rc: &DynamicObject, kind: &str) -> Option<String> {
    rc.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(String::from))
}

#[allow(clippy::too_many_lines)] // one scenario: operator, owner, offer, suspension, card freed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_raycluster_is_suspended_and_its_cards_go_to_a_pending_pod() {
    let stack = support::tier_b(
        &[GpuNode::new("gpu-1", 2), GpuNode::new("gpu-2", 1)],
        Grants::Culling,
    )
    .await;
    let admin = stack.admin();
    kuberay::install_crds(&stack.cp)
        .await
        .expect("KubeRay CRDs");
    let operator = KubeRay::start(&stack.cp)
        .await
        .expect("the KubeRay operator (scripts/build-kuberay.sh builds it)");
    stack.ensure_namespace(NS).await.expect("namespace");

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), NS, &kuberay::raycluster_resource());
    clusters
        .create(
            &PostParams::default(),
            &raycluster("idle", 2, "gpu-1", &json!({})),
        )
        .await
        .expect("RayCluster idle");
    let of_job = json!({
        "ray.io/originated-from-crd": "RayJob",
        "ray.io/originated-from-cr-name": "train",
    });
    clusters
        .create(
            &PostParams::default(),
            &raycluster("of-job", 1, "gpu-2", &of_job),
        )
        .await
        .expect("RayCluster of-job");
    // Head + 2 workers and head + 1 worker, made by the operator and run by kwok.
    for (name, pods) in [("idle", 3), ("of-job", 2)] {
        eventually(
            &format!("the operator's {pods} pods of RayCluster {name} Running"),
            WAIT,
            || async { (running_pods(&admin, name).await.len() == pods).then_some(()) },
        )
        .await;
    }
    let workers = running_pods(&admin, "idle").await;
    let worker = workers
        .iter()
        .find(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("ray.io/node-type"))
                .map(String::as_str)
                == Some("worker")
        })
        .expect("a worker pod");
    let owner = &worker
        .metadata
        .owner_references
        .as_ref()
        .expect("owner refs")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("RayCluster", Some(true))
    );

    // Waiting for both of gpu-1's cards: fits only once the idle cluster is suspended.
    let waiting = stack
        .create_gpu_pod(NS, "waiting", 2, Some(80.0))
        .await
        .expect("pending pod");
    assert!(waiting.spec.and_then(|s| s.node_name).is_none());

    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    let gl = stack
        .start_gpu_ledger(
            bin,
            "gpu-ledger",
            &[
                "--cull=on",
                "--lease-name",
                "gpu-ledger",
                "--cull-idle-after",
                "15s",
                "--cull-min-runtime",
                "5s",
            ],
        )
        .await
        .expect("gpu-ledger");

    // The report names the RayCluster as the owner of its GPU workers.
    let worker_name = worker.metadata.name.clone().expect("name");
    let row = eventually("the worker's ledger row", WAIT, || async {
        gl.pod_row(NS, &worker_name).await
    })
    .await;
    assert_eq!(row["owner"]["kind"], "RayCluster", "{row}");
    assert_eq!(row["owner"]["name"], "idle", "{row}");

    // The reclaim planner offers the cluster to the waiting pod (before the idle period ends).
    let offer = eventually(
        "the reclaim planner offering RayCluster idle",
        WAIT,
        || async {
            let l = gl.ledger_json().await.ok()?;
            let r = l["reclaim"]
                .as_array()?
                .iter()
                .find(|r| r["pending"]["pod"] == "waiting")?
                .clone();
            r["options"]
                .as_array()?
                .iter()
                .find(|o| o["by_stopping"].as_array().is_some_and(|b| !b.is_empty()))
                .cloned()
        },
    )
    .await;
    assert_eq!(offer["node"], "gpu-1", "{offer}");
    for stop in offer["by_stopping"].as_array().expect("stops") {
        assert_eq!(
            (&stop["owner_kind"], &stop["notebook"]),
            (&json!("RayCluster"), &json!("idle")),
            "{offer}"
        );
    }

    // Suspended by gpu-ledger; the operator deletes every pod and says so.
    let suspended = eventually(
        "RayCluster idle suspended by the operator",
        WAIT,
        || async {
            let rc = clusters.get("idle").await.ok()?;
            (rc.data["spec"]["suspend"] == json!(true)
                && condition(&rc, "RayClusterSuspended").as_deref() == Some("True"))
            .then_some(rc)
        },
    )
    .await;
    let annotations = suspended.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("gpu-ledger.io/stopped-by")
            .map(String::as_str),
        Some("gpu-ledger"),
        "{annotations:?}"
    );
    assert!(
        !annotations.contains_key("kubeflow-resource-stopped"),
        "a RayCluster is stopped by spec.suspend, not Kubeflow's annotation"
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    eventually("every pod of RayCluster idle deleted", WAIT, || async {
        let lp = ListParams::default().labels("ray.io/cluster=idle");
        pods.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;

    // The cards are free: the real scheduler binds the waiting pod to gpu-1.
    let bound = eventually("the waiting pod bound and Running", WAIT, || async {
        let p = pods.get("waiting").await.ok()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        running.then(|| p.spec?.node_name).flatten()
    })
    .await;
    assert_eq!(bound, "gpu-1");

    // The Event is about the RayCluster, with the way back.
    let events: Api<Event> = Api::namespaced(admin.clone(), NS);
    let stop_events: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("IdleGPUStopped")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("RayCluster")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("idle")
        })
        .collect();
    assert_eq!(stop_events.len(), 1, "one stop Event: {stop_events:?}");
    let note = stop_events
        .iter()
        .find_map(|e| e.note.clone())
        .unwrap_or_default();
    assert!(note.contains("spec.suspend to false"), "{stop_events:?}");

    // The RayJob's cluster, as idle, was never touched, and its skip says why.
    let of_job = clusters.get("of-job").await.expect("of-job");
    assert_ne!(
        of_job.data["spec"]["suspend"],
        json!(true),
        "{:?}",
        of_job.data
    );
    assert_eq!(running_pods(&admin, "of-job").await.len(), 2);
    let metrics = gl.metrics_text().await.expect("metrics");
    assert!(
        metrics.lines().any(|l| l
            .starts_with("gpu_ledger_cull_skips_total{reason=\"managed_by_parent\"}")
            && !l.ends_with(" 0")),
        "no managed_by_parent skip counted:\n{}\noperator log:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("cull_skips"))
            .collect::<Vec<_>>()
            .join("\n"),
        operator.log_tail(20)
    );
}
