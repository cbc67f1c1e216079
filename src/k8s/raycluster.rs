//! KubeRay's RayCluster (`ray.io/v1`), shared by the claims watch and the culling target:
//! its discovery and its projection into an owner object.
//!
//! What is read, from `github.com/ray-project/kuberay/ray-operator` v1.5.0
//! (`apis/ray/v1/raycluster_types.go`, `controllers/ray/raycluster_controller.go`,
//! `controllers/ray/utils/constant.go`):
//! * `spec.suspend: true` makes the operator delete every pod of the cluster (head and workers,
//!   by the `ray.io/cluster` label) and keep the object; it sets the condition
//!   `RayClusterSuspending=True` at once and `RayClusterSuspended=True` (with `status.state:
//!   suspended`) once no pod is left. Once Suspending, the operator finishes the suspension even
//!   if `spec.suspend` is set back to false (the suspension is atomic).
//! * A RayCluster a RayJob or RayService made carries `ray.io/originated-from-crd: RayJob|
//!   RayService` and `ray.io/originated-from-cr-name` (and, from v1.x, a controller
//!   ownerReference to it): its parent suspends or deletes it, so it is never stopped directly
//!   (KubeRay's own idle-termination work skips such clusters, kuberay#4400; Kueue does not
//!   suspend them by default either, Kueue commit 2d0c2ba).
//! * `spec.managedBy` other than the operator (`kueue.x-k8s.io/multikueue`): another controller
//!   reconciles the cluster; likewise never stopped directly.

use kube::Client;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::Value;

use crate::ledger::claims::OwnerInfo;
use crate::ledger::raycluster::RAY_GROUP;

/// The RayCluster version read and patched.
pub const RAY_VERSION: &str = "v1";
/// The condition the operator sets when `spec.suspend` turns true, until every pod is gone.
pub const SUSPENDING: &str = "RayClusterSuspending";
/// The condition the operator sets once a suspending cluster has no pod left.
pub const SUSPENDED: &str = "RayClusterSuspended";
/// The label naming the kind of a RayCluster's parent (`RayJob`, `RayService`).
pub const ORIGINATED_FROM_CRD_LABEL: &str = "ray.io/originated-from-crd";
/// The label naming a RayCluster's parent object.
pub const ORIGINATED_FROM_NAME_LABEL: &str = "ray.io/originated-from-cr-name";
/// `spec.managedBy` of a cluster the operator itself reconciles.
const OPERATOR_MANAGER: &str = "ray.io/kuberay-operator";
/// Longest name or value kept from an object's fields (they are untrusted in a dump).
const MAX_VALUE_BYTES: usize = 253;

/// The `ray.io/v1` RayCluster resource.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: RAY_GROUP.into(),
        version: RAY_VERSION.into(),
        api_version: format!("{RAY_GROUP}/{RAY_VERSION}"),
        kind: "RayCluster".into(),
        plural: "rayclusters".into(),
    }
}

/// The served RayCluster resource: `ray.io/v1`; `Ok(None)` when the group does not serve it.
/// Discovery errors (a group that is not served answers 404) are the caller's to judge.
pub async fn resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = kube::discovery::group(client, RAY_GROUP).await?;
    Ok(group
        .versioned_resources(RAY_VERSION)
        .into_iter()
        .find(|(r, _)| r.kind == "RayCluster")
        .map(|(r, _)| r))
}

/// A RayCluster as an owner object: identity and gpu-ledger's annotations from its metadata
/// (`crate::k8s::notebook`, the same keys as on a Notebook), `stopped` from `spec.suspend` or
/// the operator's suspending condition, `managed_by` from its parent labels, controller or
/// `spec.managedBy`. Kubeflow's stop annotation means nothing on a RayCluster and is not read.
pub fn project(object: &DynamicObject) -> OwnerInfo {
    let mut info = super::notebook(&object.metadata);
    info.stopped = stopped(&object.data);
    info.managed_by = managed_by(object);
    info
}

/// Why the cluster is stopped or being stopped, if it is: `spec.suspend: true`, or the
/// operator's `RayClusterSuspending=True` (atomic: it deletes the pods even when the spec was
/// set back). `RayClusterSuspended=True` with `spec.suspend` false is a cluster being resumed.
fn stopped(data: &Value) -> Option<String> {
    if data["spec"]["suspend"] == Value::Bool(true) {
        return Some("spec.suspend: true".into());
    }
    condition_true(data, SUSPENDING).then(|| format!("{SUSPENDING}=True"))
}

/// Whether `status.conditions` holds `type` with status `"True"`.
fn condition_true(data: &Value, kind: &str) -> bool {
    data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"].as_str() == Some(kind) && c["status"].as_str() == Some("True"))
    })
}

/// The parent that manages the cluster's lifecycle, as users name it (`RayJob train-1`).
fn managed_by(object: &DynamicObject) -> Option<String> {
    let meta = &object.metadata;
    let parent = meta
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind != "RayCluster")
        .map(|o| format!("{} {}", bounded(&o.kind), bounded(&o.name)));
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(|v| bounded(v));
    let origin =
        label(ORIGINATED_FROM_CRD_LABEL).map(|crd| match label(ORIGINATED_FROM_NAME_LABEL) {
            Some(name) => format!("{crd} {name}"),
            None => crd,
        });
    let manager = object.data["spec"]["managedBy"]
        .as_str()
        .filter(|m| *m != OPERATOR_MANAGER)
        .map(|m| format!("spec.managedBy {}", bounded(m)));
    parent.or(origin).or(manager)
}

/// `value`, cut to [`MAX_VALUE_BYTES`] on a character boundary.
fn bounded(value: &str) -> String {
    let mut end = value.len().min(MAX_VALUE_BYTES);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cluster(extra: Value) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": "rc", "namespace": "ray", "uid": "rc-uid", "resourceVersion": "9"},
            "spec": {"rayVersion": "2.46.0"},
        });
        merge(&mut object, extra);
        serde_json::from_value(object).expect("a RayCluster")
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn conditions(suspending: &str, suspended: &str) -> Value {
        json!({"status": {"conditions": [
            {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodRunningAndReadyFirstTime"},
            {"type": SUSPENDING, "status": suspending, "reason": SUSPENDING},
            {"type": SUSPENDED, "status": suspended, "reason": SUSPENDED},
        ]}})
    }

    #[test]
    fn a_running_cluster_is_neither_stopped_nor_managed() {
        let info = project(&cluster(conditions("False", "False")));
        assert_eq!((info.name.as_str(), info.uid.as_str()), ("rc", "rc-uid"));
        assert_eq!(info.resource_version, "9");
        assert_eq!(info.stopped, None);
        assert_eq!(info.managed_by, None);
    }

    #[test]
    fn suspend_and_the_suspending_condition_stop_it_a_resume_does_not() {
        let asked = project(&cluster(json!({"spec": {"suspend": true}})));
        assert_eq!(asked.stopped.as_deref(), Some("spec.suspend: true"));
        // Suspending is atomic: set back to false, the operator still deletes every pod.
        let mut suspending = conditions("True", "False");
        merge(&mut suspending, json!({"spec": {"suspend": false}}));
        let info = project(&cluster(suspending));
        assert_eq!(info.stopped.as_deref(), Some("RayClusterSuspending=True"));
        // Suspended and set back to false: being resumed, its pods come back.
        let mut resuming = conditions("False", "True");
        merge(
            &mut resuming,
            json!({"spec": {"suspend": false}, "status": {"state": "suspended"}}),
        );
        assert_eq!(project(&cluster(resuming)).stopped, None);
        // Kubeflow's stop annotation is no RayCluster's stop.
        let annotated = json!({"metadata": {"annotations": {"kubeflow-resource-stopped": "x"}}});
        assert_eq!(project(&cluster(annotated)).stopped, None);
    }

    #[test]
    fn gpu_ledgers_annotations_are_read_as_on_a_notebook() {
        let info = project(&cluster(json!({"metadata": {"annotations": {
            "gpu-ledger.io/cull": "false",
            "gpu-ledger.io/snooze-until": "tomorrow",
        }}})));
        assert!(info.cull_opt_out);
        assert_eq!(info.invalid_annotations, ["gpu-ledger.io/snooze-until"]);
    }

    #[test]
    fn clusters_of_a_rayjob_or_rayservice_or_another_manager_are_managed() {
        // As KubeRay v1.5.0's RayJob controller labels the cluster it makes.
        let of_job = cluster(json!({"metadata": {"labels": {
            ORIGINATED_FROM_CRD_LABEL: "RayJob",
            ORIGINATED_FROM_NAME_LABEL: "train-1",
            "ray.io/job-submission-mode": "K8sJobMode",
        }}}));
        assert_eq!(
            project(&of_job).managed_by.as_deref(),
            Some("RayJob train-1")
        );
        let owned = cluster(json!({"metadata": {"ownerReferences": [{
            "apiVersion": "ray.io/v1", "kind": "RayService", "name": "serve", "uid": "s-uid",
            "controller": true,
        }]}}));
        assert_eq!(
            project(&owned).managed_by.as_deref(),
            Some("RayService serve")
        );
        let multikueue = cluster(json!({"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}));
        assert_eq!(
            project(&multikueue).managed_by.as_deref(),
            Some("spec.managedBy kueue.x-k8s.io/multikueue")
        );
        let operator = cluster(json!({"spec": {"managedBy": OPERATOR_MANAGER}}));
        assert_eq!(project(&operator).managed_by, None);
        let long = "x".repeat(1000);
        let bounded_name =
            cluster(json!({"metadata": {"labels": {ORIGINATED_FROM_CRD_LABEL: long}}}));
        assert_eq!(
            project(&bounded_name).managed_by.map(|m| m.len()),
            Some(MAX_VALUE_BYTES)
        );
    }
}
