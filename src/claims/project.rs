//! Pure projections from Kubernetes objects to claim records (shared by watches and offline dumps).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, Pod, PodSpec, ResourceQuota, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::quantity::{MAX_GPU_UNITS, QuantityError, parse_gpu_units, parse_units};
use crate::k8s::to_chrono;
use crate::ledger::claims::{
    DaemonPod, Deletion, ExtendedMapping, ExtendedResourceClaim, GFD_LABEL_PREFIX,
    IMPLICIT_EXTENDED_PREFIX, MAX_NAME_BYTES, NodeInfo, NodeOp, NodeRequirement, NodeSelectorTerm,
    OwnerRef, PRODUCT_LABEL, Placement, PodClaim, PodPhase, QuotaInfo, REPLICAS_LABEL,
    StatefulSetInfo, Taint, Toleration, bounded_names,
};
use crate::ledger::kueue::WorkloadRefs;
use crate::ledger::quota::device_class_of_quota_key;
use crate::ledger::units::ResourceNames;

/// A quantity that cannot be a GPU count, with where it was found.
#[derive(Debug, thiserror::Error)]
#[error("{object}: resource {resource:?}")]
pub struct ProjectError {
    pub object: String,
    pub resource: String,
    #[source]
    pub source: QuantityError,
}

fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) => format!("{kind} {ns}/{}", meta.name.as_deref().unwrap_or("?")),
        None => format!("{kind} {}", meta.name.as_deref().unwrap_or("?")),
    }
}

fn time(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<DateTime<Utc>> {
    t.map(|t| to_chrono(t.0))
}

/// The controller owner reference (group without version).
pub fn controller_of(meta: &ObjectMeta) -> Option<OwnerRef> {
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(owner_ref)
}

fn owner_ref(o: &OwnerReference) -> OwnerRef {
    let group = o
        .api_version
        .rsplit_once('/')
        .map_or("", |(g, _)| g)
        .to_string();
    OwnerRef {
        group,
        kind: o.kind.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
    }
}

/// GPU units of one container's resources: limits, or requests where no limit is set.
fn container_units(
    names: &ResourceNames,
    object: &str,
    resources: Option<&ResourceRequirements>,
) -> Result<BTreeMap<String, u64>, ProjectError> {
    let mut out = BTreeMap::new();
    let Some(resources) = resources else {
        return Ok(out);
    };
    let limits = resources.limits.as_ref();
    let requests = resources.requests.as_ref();
    let keys = limits.into_iter().chain(requests).flat_map(|m| m.keys());
    for key in keys {
        // A DeviceClass's implicit name is kept too: the ledger knows the classes.
        let counted = names.classify(key).is_some() || key.starts_with(IMPLICIT_EXTENDED_PREFIX);
        if out.contains_key(key) || !counted {
            continue;
        }
        let q: Option<&Quantity> = limits
            .and_then(|l| l.get(key))
            .or_else(|| requests.and_then(|r| r.get(key)));
        if let Some(q) = q {
            let units = parse_gpu_units(&q.0).map_err(|source| ProjectError {
                object: object.to_string(),
                resource: key.clone(),
                source,
            })?;
            out.insert(key.clone(), units);
        }
    }
    Ok(out)
}

fn sum_into(total: &mut BTreeMap<String, u64>, add: &BTreeMap<String, u64>) {
    for (k, v) in add {
        let e = total.entry(k.clone()).or_default();
        *e = e.saturating_add(*v);
    }
}

fn max_into(total: &mut BTreeMap<String, u64>, other: &BTreeMap<String, u64>) {
    for (k, v) in other {
        let e = total.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

/// The pod's claim per GPU resource: max(sum over app containers, max over init containers),
/// plus pod-level resources. Returns `Ok(None)` for pods that claim no GPU.
pub fn pod(names: &ResourceNames, pod: &Pod) -> Result<Option<PodClaim>, ProjectError> {
    let meta = &pod.metadata;
    let object = object_name("pod", meta);
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let mut app = BTreeMap::new();
    for c in &spec.containers {
        sum_into(
            &mut app,
            &container_units(names, &object, c.resources.as_ref())?,
        );
    }
    let mut init = BTreeMap::new();
    for c in spec.init_containers.as_deref().unwrap_or_default() {
        // Restartable (sidecar) init containers run alongside the app containers.
        if is_sidecar(c) {
            sum_into(
                &mut app,
                &container_units(names, &object, c.resources.as_ref())?,
            );
        } else {
            max_into(
                &mut init,
                &container_units(names, &object, c.resources.as_ref())?,
            );
        }
    }
    let mut resources = app;
    max_into(&mut resources, &init);
    sum_into(
        &mut resources,
        &container_units(names, &object, spec.resources.as_ref())?,
    );
    resources.retain(|_, v| *v > 0);
    // Each container is bounded; their sum must be a count too.
    if let Some((resource, total)) = resources.iter().find(|(_, v)| **v > MAX_GPU_UNITS) {
        return Err(ProjectError {
            object,
            resource: resource.clone(),
            source: QuantityError::Impossible(total.to_string()),
        });
    }
    let status = pod.status.as_ref();
    let resource_claims = resource_claim_names(pod);
    // Extended resources the scheduler backed with DRA (DRAExtendedResource: a DeviceClass with
    // `extendedResourceName`, on a node without a device plugin for it) are held through the
    // claim it made: the mappings say which, so the ledger counts them once (`ledger/dra.rs`).
    let extended_claim = status
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(extended_claim);
    let class_requests: BTreeMap<String, u64> = resources
        .iter()
        .filter(|(k, _)| k.starts_with(IMPLICIT_EXTENDED_PREFIX))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    resources.retain(|k, _| !k.starts_with(IMPLICIT_EXTENDED_PREFIX));
    let kai = super::kai::pod(meta);
    if resources.is_empty()
        && resource_claims.is_empty()
        && class_requests.is_empty()
        && kai.is_none()
    {
        return Ok(None);
    }
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let ready_since = conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map_or(DateTime::<Utc>::MIN_UTC, |t| to_chrono(t.0))
        });
    let unschedulable_message = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            c.message
                .clone()
                .or_else(|| c.reason.clone())
                .unwrap_or_default()
        });
    let controller = controller_of(meta);
    // Only an unbound pod is placed by the planner: a bound pod's spec is not kept.
    let unbound = spec.node_name.as_deref().is_none_or(str::is_empty);
    Ok(Some(PodClaim {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        node: spec.node_name.clone().filter(|n| !n.is_empty()),
        phase: PodPhase::parse(status.and_then(|s| s.phase.as_deref())),
        created_at: time(meta.creation_timestamp.as_ref()),
        started_at: time(status.and_then(|s| s.start_time.as_ref())),
        ready_since,
        deletion: meta.deletion_timestamp.as_ref().map(|t| Deletion {
            deadline: to_chrono(t.0),
            grace_seconds: meta.deletion_grace_period_seconds.unwrap_or(0),
        }),
        labels: if controller
            .as_ref()
            .is_some_and(|c| c.kind == "StatefulSet" && c.group == "apps")
        {
            bounded_labels(meta)
        } else {
            BTreeMap::new()
        },
        // Summed by name in a map above, kept sorted in the (smaller) vector map.
        resources: resources.into_iter().collect(),
        controller,
        unschedulable_message: unschedulable_message.map(Arc::from),
        resource_claims,
        placement: if unbound {
            placement(spec)
        } else {
            Placement::default()
        },
        scheduling_gates: if unbound {
            let gates = spec.scheduling_gates.as_deref().unwrap_or_default();
            bounded_names(gates.iter().map(|g| g.name.as_str()))
        } else {
            Vec::new()
        },
        finalizers: bounded_names(
            meta.finalizers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(String::as_str),
        ),
        workload_refs: WorkloadRefs::read(meta.labels.as_ref(), meta.annotations.as_ref()),
        extended_claim,
        class_requests,
        kai,
        hami: super::hami::pod(meta.annotations.as_ref()),
        unhealthy_devices: super::health::unhealthy_resources(pod),
    }))
}

/// `status.extendedResourceClaimStatus`, bounded (a pod has at most a few containers and
/// extended resources; names longer than a qualified name are no real names).
fn extended_claim(
    ext: &k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus,
) -> ExtendedResourceClaim {
    let name = |s: &str| (s.len() <= MAX_NAME_BYTES).then(|| s.to_string());
    ExtendedResourceClaim {
        claim: name(&ext.resource_claim_name).unwrap_or_default(),
        mappings: ext
            .request_mappings
            .iter()
            .take(MAX_POD_RESOURCE_CLAIMS)
            .filter_map(|m| {
                Some(ExtendedMapping {
                    container: name(&m.container_name)?,
                    resource: name(&m.resource_name)?,
                    request: name(&m.request_name)?,
                })
            })
            .collect(),
    }
}

/// Most selector terms, requirements per term, values per requirement, selector labels and
/// tolerations a pod's placement keeps (a spec is untrusted; real pods have a handful).
const MAX_PLACEMENT_ITEMS: usize = 64;

/// The pod's node selector, required node affinity and tolerations, bounded: a spec with more
/// than [`MAX_PLACEMENT_ITEMS`] of any is marked `too_large` (placed nowhere) rather than cut,
/// as a cut selector would let the pod onto nodes the scheduler refuses.
fn placement(spec: &PodSpec) -> Placement {
    let mut too_large = false;
    let mut bounded = |n: usize| {
        too_large |= n > MAX_PLACEMENT_ITEMS;
        MAX_PLACEMENT_ITEMS
    };
    let selector = spec.node_selector.as_ref();
    let node_selector = selector
        .into_iter()
        .flatten()
        .take(bounded(selector.map_or(0, BTreeMap::len)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut requirements = |reqs: Option<&Vec<NodeSelectorRequirement>>| -> Vec<NodeRequirement> {
        let reqs = reqs.map_or(&[][..], Vec::as_slice);
        reqs.iter()
            .take(bounded(reqs.len()))
            .map(|r| {
                let values = r.values.as_deref().unwrap_or_default();
                NodeRequirement {
                    key: r.key.clone(),
                    operator: NodeOp::parse(&r.operator),
                    values: values.iter().take(bounded(values.len())).cloned().collect(),
                }
            })
            .collect()
    };
    let required_terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|sel| {
            let terms = &sel.node_selector_terms;
            let kept = terms.len().min(MAX_PLACEMENT_ITEMS);
            terms[..kept]
                .iter()
                .map(|t| NodeSelectorTerm {
                    match_expressions: requirements(t.match_expressions.as_ref()),
                    match_fields: requirements(t.match_fields.as_ref()),
                })
                .collect::<Vec<_>>()
        });
    let terms_cut = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|s| s.node_selector_terms.len() > MAX_PLACEMENT_ITEMS);
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let kept = tolerations
        .iter()
        .take(bounded(tolerations.len()))
        .map(|t| Toleration {
            key: t.key.clone().unwrap_or_default(),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone().unwrap_or_default(),
        })
        .collect();
    Placement {
        node_selector,
        required_terms,
        tolerations: kept,
        too_large: too_large || terms_cut,
    }
}

/// Most claims a pod's projection keeps (a pod spec allows 32 `resourceClaims`).
const MAX_POD_RESOURCE_CLAIMS: usize = 64;

/// Names of the ResourceClaims a pod uses (see [`PodClaim::resource_claims`]): a claim named in
/// `spec.resourceClaims`, the claim generated from a template as `status.resourceClaimStatuses`
/// records it (none yet: not generated, or not needed), and the claim the scheduler made for
/// DRA-backed extended resources.
pub fn resource_claim_names(pod: &Pod) -> Vec<String> {
    let status = pod.status.as_ref();
    let generated = status
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    let spec_claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default();
    for c in spec_claims {
        let name = match (&c.resource_claim_name, &c.resource_claim_template_name) {
            (Some(n), _) => Some(n.clone()),
            (None, Some(_)) => generated
                .iter()
                .find(|g| g.name == c.name)
                .and_then(|g| g.resource_claim_name.clone()),
            (None, None) => None,
        };
        out.extend(name.filter(|n| !n.is_empty()));
    }
    if let Some(ext) = status.and_then(|s| s.extended_resource_claim_status.as_ref())
        && !ext.resource_claim_name.is_empty()
    {
        out.push(ext.resource_claim_name.clone());
    }
    out.sort();
    out.dedup();
    out.truncate(MAX_POD_RESOURCE_CLAIMS);
    out
}

/// Labels kept on a pod (a StatefulSet's selector is checked against them), bounded: a pod's
/// labels are untrusted.
fn bounded_labels(meta: &ObjectMeta) -> BTreeMap<String, String> {
    const MAX_LABELS: usize = 64;
    meta.labels
        .iter()
        .flatten()
        .take(MAX_LABELS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// A node's GPU allocatable (falls back to capacity when allocatable is absent).
pub fn node(names: &ResourceNames, node: &Node) -> Result<NodeInfo, ProjectError> {
    let meta = &node.metadata;
    let object = object_name("node", meta);
    let status = node.status.as_ref();
    let source = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    let mut allocatable = BTreeMap::new();
    for (k, q) in source.into_iter().flatten() {
        if names.classify(k).is_some() {
            let units = parse_gpu_units(&q.0).map_err(|source| ProjectError {
                object: object.clone(),
                resource: k.clone(),
                source,
            })?;
            allocatable.insert(k.clone(), units);
        }
    }
    let labels = meta.labels.as_ref();
    let replicas = labels
        .and_then(|l| l.get(REPLICAS_LABEL))
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|r| *r >= 1)
        .unwrap_or(1);
    // GFD labels only (the GPU math reads a handful), bounded: a node's labels are untrusted.
    let gpu_labels = labels
        .into_iter()
        .flatten()
        .filter(|(k, v)| k.starts_with(GFD_LABEL_PREFIX) && v.len() <= MAX_GFD_LABEL_VALUE)
        .take(MAX_GFD_LABELS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let spec = node.spec.as_ref();
    let mut taints: Vec<Taint> = spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .take(MAX_NODE_TAINTS)
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect();
    if spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.len() > MAX_NODE_TAINTS)
    {
        taints.push(Taint {
            key: TOO_MANY_TAINTS.to_string(),
            value: String::new(),
            effect: "NoSchedule".to_string(),
        });
    }
    // A cordoned node: the scheduler's NodeUnschedulable filter reads `spec.unschedulable` as
    // this taint (the node lifecycle controller adds it too, a moment later).
    if spec.and_then(|s| s.unschedulable) == Some(true)
        && !taints.iter().any(|t| t.key == UNSCHEDULABLE_TAINT)
    {
        taints.push(Taint {
            key: UNSCHEDULABLE_TAINT.to_string(),
            value: String::new(),
            effect: "NoSchedule".to_string(),
        });
    }
    Ok(NodeInfo {
        name: meta.name.clone().unwrap_or_default(),
        allocatable,
        replicas,
        product: labels.and_then(|l| l.get(PRODUCT_LABEL)).cloned(),
        gpu_labels,
        // Bounded: a node with more labels than kept may fail a selector it meets (no option
        // offered), never pass one it does not.
        labels: labels
            .into_iter()
            .flatten()
            .take(MAX_NODE_LABELS)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        taints,
        ready: status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status == "True"),
        hami: super::hami::node(meta.annotations.as_ref()),
    })
}

/// The taint of a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// Labels kept per node for selectors (kubelet, cloud and GFD labels are about 60).
const MAX_NODE_LABELS: usize = 256;
/// Taints kept per node. Cutting taints would let a pod onto a node it cannot use, so a node with
/// more keeps these and one more, [`TOO_MANY_TAINTS`], that no pod tolerates by name.
const MAX_NODE_TAINTS: usize = 64;
/// The stand-in for taints past [`MAX_NODE_TAINTS`].
pub const TOO_MANY_TAINTS: &str = "gpu-ledger.io/taints-not-kept";

/// GFD labels kept per node (GFD publishes about 20).
const MAX_GFD_LABELS: usize = 64;
/// Longest GFD label value kept (label values are at most 63 characters in Kubernetes).
const MAX_GFD_LABEL_VALUE: usize = 63;

/// Label the DaemonSet controller puts on every pod it creates (and no other controller does).
pub const DAEMONSET_POD_LABEL: &str = "pod-template-generation";

/// A bound pod controlled by a DaemonSet (where a device's exporter runs), else `None`.
pub fn daemon_pod(pod: &Pod) -> Option<DaemonPod> {
    let meta = &pod.metadata;
    let controller = controller_of(meta)?;
    if controller.kind != "DaemonSet" || controller.group != "apps" {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    Some(DaemonPod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        node,
        ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
    })
}

/// Most DRA device-class keys kept of one ResourceQuota (an object is untrusted input).
const MAX_QUOTA_KEYS: usize = 256;

/// The GPU part of a ResourceQuota: hard limits of the keys that name a GPU resource or a DRA
/// DeviceClass, and the apiserver's `status.used` of those keys; `None` when no key does.
pub fn quota(
    names: &ResourceNames,
    quota: &ResourceQuota,
) -> Result<Option<QuotaInfo>, ProjectError> {
    let meta = &quota.metadata;
    let object = object_name("resourcequota", meta);
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    let mut gpu_hard = BTreeMap::new();
    let mut dra_hard = BTreeMap::new();
    for (k, q) in hard.into_iter().flatten() {
        let gpu = names.quota_key_resource(k).is_some();
        let dra = !gpu && device_class_of_quota_key(k).is_some();
        if !(gpu || dra) {
            continue;
        }
        let units = parse_units(&q.0).map_err(|source| ProjectError {
            object: object.clone(),
            resource: k.clone(),
            source,
        })?;
        if gpu {
            gpu_hard.insert(k.clone(), units);
        } else if dra_hard.len() < MAX_QUOTA_KEYS {
            dra_hard.insert(k.clone(), units);
        }
    }
    if gpu_hard.is_empty() && dra_hard.is_empty() {
        return Ok(None);
    }
    // `status.used` is written by the quota controller; a value that does not parse is unknown
    // (left out), not a reason to drop the limits.
    let used = quota
        .status
        .as_ref()
        .and_then(|s| s.used.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| gpu_hard.contains_key(*k) || dra_hard.contains_key(*k))
        .filter_map(|(k, q)| parse_units(&q.0).ok().map(|u| (k.clone(), u)))
        .collect();
    Ok(Some(QuotaInfo {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        names_gpu: true,
        gpu_hard,
        dra_hard,
        used,
    }))
}

/// A StatefulSet's identity and controller.
pub fn statefulset(sts: &StatefulSet) -> StatefulSetInfo {
    let meta = &sts.metadata;
    StatefulSetInfo {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: controller_of(meta),
        selector: sts
            .spec
            .as_ref()
            .map(|s| crate::k8s::label_selector(&s.selector)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_from(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("valid pod json")
    }

    #[test]
    fn claim_is_max_of_app_sum_and_init_max() {
        let p = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "nodeName": "n1",
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
                    {"name": "c", "resources": {"limits": {"cpu": "1"}}}
                ]
            },
            "status": {"phase": "Running"}
        }));
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(c.resources.get("nvidia.com/gpu"), Some(&3));
        assert_eq!(c.node.as_deref(), Some("n1"));
        assert_eq!(c.phase, PodPhase::Running);
    }

    #[test]
    fn limits_win_over_requests_and_pod_level_adds() {
        let p = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "containers": [{"name": "a", "resources": {
                    "limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}}]
            }
        }));
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(c.resources.get("nvidia.com/gpu"), Some(&3));
        assert_eq!(c.phase, PodPhase::Unknown);
    }

    /// The placement of a GPU pod as public manifests write it: required node affinity on GFD's
    /// `nvidia.com/gpu.product` (the NRP Nautilus cluster's GPU pods) plus a `nodeSelector`, and
    /// the toleration of the `nvidia.com/gpu` NoSchedule taint GKE and AKS put on GPU pools.
    #[test]
    fn an_unbound_pod_keeps_its_placement_and_a_bound_one_does_not() {
        let spec = json!({
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product",
                    "operator": "In", "values": ["NVIDIA-L4", "NVIDIA-A10"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}]}}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        });
        let p = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}));
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        let pl = &c.placement;
        assert_eq!(
            pl.node_selector
                .iter()
                .find(|(k, _)| k == "nvidia.com/gpu.present")
                .map(|(_, v)| v.as_str()),
            Some("true")
        );
        let terms = pl.required_terms.as_ref().expect("required affinity");
        assert_eq!(terms.len(), 2);
        assert_eq!(terms[0].match_expressions[0].operator, NodeOp::In);
        assert_eq!(
            terms[0].match_expressions[0].values,
            ["NVIDIA-L4", "NVIDIA-A10"]
        );
        assert_eq!(terms[1].match_fields[0].key, "metadata.name");
        assert_eq!(pl.tolerations.len(), 1);
        assert!(pl.tolerations[0].exists && pl.tolerations[0].key == "nvidia.com/gpu");
        assert!(!pl.too_large);
        let mut spec = spec;
        spec["nodeName"] = json!("gpu-7");
        let bound = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}));
        let c = pod(&ResourceNames::default(), &bound)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(
            c.placement,
            Placement::default(),
            "a bound pod's placement is not kept"
        );
        let many: Vec<serde_json::Value> = (0..100)
            .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
            .collect();
        let crowded = pod_from(
            json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": many}}),
        );
        let c = pod(&ResourceNames::default(), &crowded)
            .expect("ok")
            .expect("gpu pod");
        assert!(
            c.placement.too_large,
            "cut, it would be placed by a weaker spec"
        );
    }

    /// A pod of Kueue's pod integration as Kueue's webhook leaves it until admission
    /// (kubernetes-sigs/kueue `pkg/controller/jobs/pod`: gate `kueue.x-k8s.io/admission`, the
    /// `kueue.x-k8s.io/managed` finalizer) and the API's `SchedulingGated` condition
    /// (KEP-3521); the gates are kept while unbound, finalizers always, both bounded.
    #[test]
    fn scheduling_gates_and_finalizers_are_kept_bounded() {
        let p = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns", "finalizers": ["kueue.x-k8s.io/managed"]},
            "spec": {
                "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates"}]}
        }));
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(c.scheduling_gates, ["kueue.x-k8s.io/admission"]);
        assert_eq!(c.finalizers, ["kueue.x-k8s.io/managed"]);
        let many: Vec<serde_json::Value> =
            (0..40).map(|i| json!({"name": format!("g{i}")})).collect();
        let long = "x".repeat(4096);
        let crowded = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns", "finalizers": [long]},
            "spec": {"schedulingGates": many,
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }));
        let c = pod(&ResourceNames::default(), &crowded)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(
            c.scheduling_gates.len(),
            crate::ledger::claims::MAX_NAMES_KEPT
        );
        assert_eq!(
            c.scheduling_gates.last().map(String::as_str),
            Some("… 25 more")
        );
        assert_eq!(c.finalizers, ["(name too long)"]);
        let bound = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "schedulingGates": [{"name": "late"}],
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }));
        let c = pod(&ResourceNames::default(), &bound)
            .expect("ok")
            .expect("gpu pod");
        assert!(c.scheduling_gates.is_empty() && c.finalizers.is_empty());
    }

    #[test]
    fn node_readiness_reads_the_ready_condition() {
        let with = |conditions: serde_json::Value| -> Option<bool> {
            let n: Node = serde_json::from_value(json!({
                "metadata": {"name": "gpu-1"},
                "status": {"allocatable": {"nvidia.com/gpu": "1"}, "conditions": conditions}
            }))
            .expect("node");
            node(&ResourceNames::default(), &n).expect("ok").ready
        };
        let ready = |status: &str| {
            json!([{"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": status, "reason": "NodeStatusUnknown"}])
        };
        assert_eq!(with(ready("True")), Some(true));
        assert_eq!(with(ready("False")), Some(false));
        assert_eq!(with(ready("Unknown")), Some(false), "unreachable");
        assert_eq!(with(json!([])), None);
    }

    #[test]
    fn node_labels_taints_and_cordon_are_kept() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "labels": {"pool": "a100", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
            "spec": {"unschedulable": true,
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}
        }))
        .expect("node");
        let info = node(&ResourceNames::default(), &n).expect("ok");
        assert_eq!(info.labels.get("pool").map(String::as_str), Some("a100"));
        let keys: Vec<&str> = info.taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["nvidia.com/gpu", UNSCHEDULABLE_TAINT]);
    }

    #[test]
    fn non_gpu_pod_is_none_and_bad_quantity_names_pod() {
        let p = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "500m"}}}]}}));
        assert!(pod(&ResourceNames::default(), &p).expect("ok").is_none());
        let bad = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]}}));
        let err = format!(
            "{:#}",
            anyhow::Error::new(pod(&ResourceNames::default(), &bad).expect_err("fractional"))
        );
        assert!(err.contains("pod ns/p"), "{err}");
        assert!(err.contains("fractional"), "{err}");
    }

    /// Issue 22: no object counts more than a million units of a GPU resource, in one
    /// container or summed over its containers (live and offline alike: both project here).
    #[test]
    fn impossible_gpu_counts_name_object_and_resource() {
        let two = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "600000"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "600000"}}}]}}));
        let one = pod_from(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "18446744073709551615"}}}]}}));
        for p in [two, one] {
            let err = format!(
                "{:#}",
                anyhow::Error::new(pod(&ResourceNames::default(), &p).expect_err("impossible"))
            );
            assert!(
                err.contains("pod ns/p")
                    && err.contains("nvidia.com/gpu")
                    && err.contains("more than 1000000"),
                "{err}"
            );
        }
        let node_json = |n: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"},
                "status": {"allocatable": {"nvidia.com/gpu": n}}}))
            .expect("node")
        };
        assert!(node(&ResourceNames::default(), &node_json("1000000")).is_ok());
        let err = node(&ResourceNames::default(), &node_json("1000001")).expect_err("too many");
        assert!(
            matches!(err.source, QuantityError::Impossible(_)),
            "{err:?}"
        );
    }

    #[test]
    fn owner_group_drops_version() {
        let p = pod_from(
            json!({"metadata": {"name": "nb-0", "namespace": "ns", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nb", "uid": "s1", "controller": true}]},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        );
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        let owner = c.controller.expect("controller");
        assert_eq!(
            (owner.group.as_str(), owner.kind.as_str()),
            ("apps", "StatefulSet")
        );
    }

    #[test]
    fn resource_claims_of_a_pod_resolve_templates_and_dra_backed_extended_resources() {
        // A claim by name, one from a template (generated name in status), one template whose
        // claim was not needed (no name), and the scheduler's claim for nvidia.com/gpu served by
        // DRA (DRAExtendedResource): the request and its mapping are both kept, the ledger
        // counts the device once (through the claim when it is allocated).
        let p = pod_from(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "nodeName": "n1",
                "resourceClaims": [
                    {"name": "shared", "resourceClaimName": "team-gpu"},
                    {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                    {"name": "unused", "resourceClaimTemplateName": "maybe"}
                ],
                "containers": [{"name": "a", "resources": {
                    "claims": [{"name": "gpu"}],
                    "limits": {"nvidia.com/gpu": "1"}}}]
            },
            "status": {
                "phase": "Running",
                "resourceClaimStatuses": [
                    {"name": "gpu", "resourceClaimName": "p-gpu-7x2kq"},
                    {"name": "unused"}
                ],
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-9vq4d",
                    "requestMappings": [{"containerName": "a",
                        "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]
                }
            }
        }));
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("kept for its claims");
        assert_eq!(
            c.resource_claims,
            vec!["p-extended-resources-9vq4d", "p-gpu-7x2kq", "team-gpu"]
        );
        assert_eq!(
            c.resources.get("nvidia.com/gpu"),
            Some(&1),
            "{:?}",
            c.resources
        );
        assert_eq!(
            c.extended_claim,
            Some(ExtendedResourceClaim {
                claim: "p-extended-resources-9vq4d".into(),
                mappings: vec![ExtendedMapping {
                    container: "a".into(),
                    resource: "nvidia.com/gpu".into(),
                    request: "container-0-request-0".into(),
                }],
            })
        );
        // No GPU resource and no claim: not kept.
        let plain = pod_from(json!({"metadata": {"name": "q", "namespace": "ns"},
            "spec": {"containers": [{"name": "a"}]}}));
        assert!(
            pod(&ResourceNames::default(), &plain)
                .expect("ok")
                .is_none()
        );
    }
}

#[cfg(test)]
mod extended_tests {
    use super::*;

    #[test]
    fn a_device_class_implicit_name_is_kept_apart_from_gpu_resources() {
        // KEP-5004's implicit name: any DeviceClass serves `deviceclass.resource.kubernetes.io/
        // <class>`; whether the class is a GPU class is known only to the ledger. Init and app
        // containers add up like any extended resource.
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {
                    "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {
                        "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}}},
                    {"name": "b", "resources": {"requests": {
                        "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1",
                        "example.com/foo": "1"}}}
                ]
            }
        }))
        .expect("pod");
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("kept for its class request");
        assert!(c.resources.is_empty(), "{:?}", c.resources);
        assert_eq!(
            c.class_requests,
            BTreeMap::from([(
                "deviceclass.resource.kubernetes.io/gpu.nvidia.com".to_string(),
                3
            )])
        );
        assert_eq!(c.extended_claim, None);
    }

    #[test]
    fn the_schedulers_extended_resource_claim_status_is_read_as_written() {
        // `status.extendedResourceClaimStatus` written by kube-scheduler 1.36.3 in
        // tests/e2e_dra.rs (pod `legacy` of the dump in tests/fixtures/dra; no other real
        // example was found).
        let list: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/dra/pods.json"))
                .expect("pods.json");
        let legacy = list["items"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["metadata"]["name"] == "legacy"))
            .cloned()
            .expect("legacy in the dump");
        let p: Pod = serde_json::from_value(legacy).expect("pod");
        let c = pod(&ResourceNames::default(), &p)
            .expect("ok")
            .expect("gpu pod");
        assert_eq!(c.resources.get("nvidia.com/gpu"), Some(&1));
        assert_eq!(
            c.extended_claim,
            Some(ExtendedResourceClaim {
                claim: "legacy-extended-resources-9zg6h".into(),
                mappings: vec![ExtendedMapping {
                    container: "main".into(),
                    resource: "nvidia.com/gpu".into(),
                    request: "container-0-request-0".into(),
                }],
            })
        );
        assert_eq!(c.resource_claims, vec!["legacy-extended-resources-9zg6h"]);
    }
}

#[cfg(test)]
mod quota_tests {
    use super::*;

    #[test]
    fn a_quota_keeps_gpu_and_device_class_keys_with_their_status_used() {
        // As the apiserver returns a ResourceQuota after the quota controller synced it (the
        // Kubernetes "Resource Quotas" page: `requests.nvidia.com/gpu`, and
        // `<class>.deviceclass.resource.k8s.io/devices` for DRA).
        let q: ResourceQuota = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu", "namespace": "team-a"},
            "spec": {"hard": {
                "requests.nvidia.com/gpu": "4",
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2",
                "requests.cpu": "64"
            }},
            "status": {
                "hard": {"requests.nvidia.com/gpu": "4"},
                "used": {
                    "requests.nvidia.com/gpu": "3",
                    "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "1",
                    "requests.cpu": "12"
                }
            }
        }))
        .expect("quota");
        let info = quota(&ResourceNames::default(), &q)
            .expect("valid")
            .expect("names a GPU");
        assert_eq!(
            info.gpu_hard,
            [("requests.nvidia.com/gpu".to_string(), 4)].into()
        );
        assert_eq!(
            info.dra_hard,
            [(
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices".to_string(),
                2
            )]
            .into()
        );
        assert_eq!(info.used.len(), 2, "cpu is not kept: {:?}", info.used);
        assert_eq!(info.used.get("requests.nvidia.com/gpu"), Some(&3));
        // A device-class quota alone is a GPU-naming quota too; a used value that does not
        // parse is unknown, not an error.
        let q: ResourceQuota = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "dra", "namespace": "team-b"},
            "spec": {"hard": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2"}},
            "status": {"used": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "x"}}
        }))
        .expect("quota");
        let info = quota(&ResourceNames::default(), &q)
            .expect("valid")
            .expect("names a DRA class");
        assert!(info.gpu_hard.is_empty() && info.used.is_empty());
    }
}
