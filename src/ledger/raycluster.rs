//! The RayCluster rule: which KubeRay RayCluster owns a pod row.
//!
//! KubeRay's operator (`ray-operator` v1.5.0, `controllers/ray/raycluster_controller.go`,
//! `buildHeadPod`/`buildWorkerPod`) gives every head and worker pod a controller
//! ownerReference to its RayCluster and the label `ray.io/cluster: <name>`
//! (`controllers/ray/common/pod.go`, `labelPod`). Both agreeing is proof; the label alone (or
//! an ownerReference the label contradicts) names the cluster without proof, so the owner is
//! shown but never stopped.

use super::claims::{Claims, OwnerInfo, OwnerKind, PodClaim};
use super::model::OwnedBy;

/// The API group of KubeRay's kinds.
pub const RAY_GROUP: &str = "ray.io";
/// The pod label naming its RayCluster.
pub const RAY_CLUSTER_LABEL: &str = "ray.io/cluster";

/// The RayCluster that owns `p`, and whether the ownership is verified: the pod's controller is
/// `ray.io/RayCluster` with the cluster's uid and name, and its `ray.io/cluster` label names the
/// same cluster. `None` when RayClusters are not served or no cluster of the pod's namespace is
/// named by either.
pub(super) fn owner_of(claims: &Claims, p: &PodClaim) -> Option<OwnedBy> {
    if !claims.rayclusters_enabled {
        return None;
    }
    let label = p.workload_refs.owner_labels.get(RAY_CLUSTER_LABEL);
    let in_namespace = |rc: &&OwnerInfo| rc.namespace == p.namespace;
    let controller = p
        .controller
        .as_ref()
        .filter(|c| c.group == RAY_GROUP && c.kind == "RayCluster");
    let by_ref = controller.and_then(|c| {
        claims
            .rayclusters
            .iter()
            .filter(in_namespace)
            .find(|rc| rc.uid == c.uid && rc.name == c.name)
    });
    let (cluster, verified) = if let Some(rc) = by_ref {
        (rc, label == Some(&rc.name))
    } else {
        let name = label?;
        let rc = claims
            .rayclusters
            .iter()
            .filter(in_namespace)
            .find(|rc| &rc.name == name)?;
        (rc, false)
    };
    Some(OwnedBy {
        kind: OwnerKind::RayCluster,
        info: cluster.clone(),
        verified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::claims::OwnerRef;

    fn cluster(name: &str) -> OwnerInfo {
        OwnerInfo {
            namespace: "ray".into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            ..OwnerInfo::default()
        }
    }

    fn claims() -> Claims {
        Claims {
            rayclusters: vec![cluster("rc"), cluster("other")],
            rayclusters_enabled: true,
            ..Claims::default()
        }
    }

    /// A worker pod of `ray/<cluster>`: controller `owner` (kind, name, uid), label `label`.
    fn worker(owner: Option<(&str, &str, &str)>, label: Option<&str>) -> PodClaim {
        let mut p = PodClaim::new("ray", "rc-gpu-worker-abcde");
        p.controller = owner.map(|(kind, name, uid)| OwnerRef {
            group: RAY_GROUP.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
        });
        if let Some(label) = label {
            p.workload_refs
                .owner_labels
                .insert(RAY_CLUSTER_LABEL.into(), label.into());
        }
        p
    }

    fn verdict(p: &PodClaim) -> Option<(String, bool)> {
        owner_of(&claims(), p).map(|o| {
            assert_eq!(o.kind, OwnerKind::RayCluster);
            (o.info.name, o.verified)
        })
    }

    #[test]
    fn owner_reference_and_label_agreeing_verify_the_cluster() {
        let p = worker(Some(("RayCluster", "rc", "rc-uid")), Some("rc"));
        assert_eq!(verdict(&p), Some(("rc".into(), true)));
    }

    #[test]
    fn a_label_alone_or_contradicting_names_the_cluster_without_proof() {
        let label_only = worker(None, Some("rc"));
        assert_eq!(verdict(&label_only), Some(("rc".into(), false)));
        // The ownerReference is the stronger claim: the cluster it names, unverified.
        let disagree = worker(Some(("RayCluster", "rc", "rc-uid")), Some("other"));
        assert_eq!(verdict(&disagree), Some(("rc".into(), false)));
        let no_label = worker(Some(("RayCluster", "rc", "rc-uid")), None);
        assert_eq!(verdict(&no_label), Some(("rc".into(), false)));
        // An ownerReference to a replaced cluster (old uid) is no proof either.
        let stale = worker(Some(("RayCluster", "rc", "old-uid")), Some("rc"));
        assert_eq!(verdict(&stale), Some(("rc".into(), false)));
    }

    #[test]
    fn no_cluster_named_or_not_served_means_no_owner() {
        assert_eq!(verdict(&worker(None, None)), None);
        assert_eq!(verdict(&worker(None, Some("gone"))), None);
        let job = worker(Some(("RayJob", "rc", "rc-uid")), None);
        assert_eq!(verdict(&job), None, "only a RayCluster controller counts");
        let mut other_ns = worker(Some(("RayCluster", "rc", "rc-uid")), Some("rc"));
        other_ns.namespace = "elsewhere".into();
        assert_eq!(verdict(&other_ns), None);
        let off = Claims {
            rayclusters_enabled: false,
            ..claims()
        };
        let p = worker(Some(("RayCluster", "rc", "rc-uid")), Some("rc"));
        assert!(owner_of(&off, &p).is_none());
    }
}
