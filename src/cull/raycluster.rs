//! KubeRay's RayCluster as a culling target: suspended by `spec.suspend: true`, after which the
//! operator deletes every pod of the cluster (head and workers) and keeps the object, so its
//! user resumes it with `spec.suspend: false`.
//!
//! The pod → RayCluster rule is the ledger's (`ledger/raycluster.rs`); discovery and the
//! projection (`stopped` from `spec.suspend` or the operator's `RayClusterSuspending`
//! condition, `managed_by` a RayJob or RayService parent) are shared with the claims watch in
//! `crate::k8s::raycluster`. A cluster is stopped only when every GPU pod of it is proven idle:
//! the plan's grouping by owner object, as for a notebook's pods; its head pod, without GPUs,
//! is no GPU row and neither blocks nor counts.

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::target::{Identity, RbacRule, Target, TargetInfo};
use crate::k8s::raycluster::RAY_VERSION;
use crate::ledger::claims::OwnerKind;
use crate::ledger::raycluster::RAY_GROUP;

/// The KubeRay RayCluster target.
#[derive(Debug, Clone, Copy, Default)]
pub struct RayCluster;

static IDENTITY: Identity = Identity {
    kind: "RayCluster",
    group: RAY_GROUP,
    versions: &[RAY_VERSION],
    plural: "rayclusters",
    noun: "raycluster",
};

/// Re-read right before a write (get) and suspended or noticed by one merge patch (patch).
static RBAC: [RbacRule; 1] = [RbacRule {
    api_group: RAY_GROUP,
    resource: "rayclusters",
    verbs: &["get", "patch"],
}];

impl Target for RayCluster {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }

    /// The ledger verifies pod → RayCluster (controller uid and `ray.io/cluster` label agree).
    fn owner_kind(&self) -> Option<OwnerKind> {
        Some(OwnerKind::RayCluster)
    }

    fn stop_fields(&self, _stop_value: &str) -> serde_json::Value {
        json!({"spec": {"suspend": true}})
    }

    /// A cluster its parent manages is stopped through the parent; one the operator is
    /// suspending (or has suspended) needs no write. The second is also `stopped`, checked for
    /// every kind: said here in the operator's words.
    fn verify_fresh(&self, fresh: &TargetInfo) -> Result<(), String> {
        if let Some(parent) = &fresh.managed_by {
            return Err(format!(
                "raycluster is managed by {parent}: stop it through its parent"
            ));
        }
        if let Some(why) = &fresh.stopped {
            return Err(format!("raycluster is already suspending ({why})"));
        }
        Ok(())
    }

    fn discover<'a>(
        &'a self,
        client: &'a kube::Client,
    ) -> BoxFuture<'a, Result<Option<ApiResource>, kube::Error>> {
        Box::pin(crate::k8s::raycluster::resource(client))
    }

    fn project(&self, object: &DynamicObject) -> TargetInfo {
        crate::k8s::raycluster::project(object)
    }

    fn rbac(&self) -> &'static [RbacRule] {
        &RBAC
    }

    fn restart_hint(&self) -> &'static str {
        "Resume it by setting spec.suspend to false (kubectl patch raycluster NAME --type merge -p '{\"spec\":{\"suspend\":false}}')"
    }
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;
    use crate::cull::actuator::tests::now;
    use crate::cull::actuator::{stop_patch, verify_fresh};
    use crate::cull::backoff::Backoff;
    use crate::cull::plan::{CullPolicy, SkipReason, plan_with};
    use crate::ledger::PodRow;
    use crate::ledger::{Attribution, Ledger, OwnedBy};

    fn cluster(name: &str) -> TargetInfo {
        TargetInfo::new("ray", name)
            .with_uid(format!("{name}-uid"))
            .at_version("7")
    }

    /// A GPU worker pod of `rc`, Running and Ready for 5h, idle for 3h (or busy), fully and
    /// freshly covered.
    fn worker(pod: &str, rc: TargetInfo, idle: bool) -> PodRow {
        let mut row = PodRow::new("ray", pod)
            .running_on("gpu-1")
            .holding("nvidia.com/gpu", 1)
            .attributed(Attribution::Exclusive)
            .stop_candidate(now(), Duration::hours(5), Duration::hours(3))
            .with_uid(format!("{pod}-uid"))
            .owned_by("RayCluster", &rc.name);
        if !idle {
            row.idle = Some(false);
            row.idle_seconds = Some(0.0);
        }
        row.evidence.owner = Some(OwnedBy {
            kind: OwnerKind::RayCluster,
            info: rc,
            verified: true,
        });
        row
    }

    fn plan_of(pods: Vec<PodRow>) -> crate::cull::plan::Plan {
        let mut l = Ledger::empty(now());
        l.usage_available = true;
        l.pods = pods;
        plan_with(&l, &CullPolicy::default(), &Backoff::default(), now())
    }

    fn reasons(p: &crate::cull::plan::Plan) -> Vec<(&str, SkipReason)> {
        p.skips.iter().map(|s| (s.pod.as_str(), s.reason)).collect()
    }

    #[test]
    fn an_idle_cluster_is_suspended_by_spec_suspend() {
        let p = plan_of(vec![
            worker("rc-gpu-a", cluster("rc"), true),
            worker("rc-gpu-b", cluster("rc"), true),
        ]);
        let [stop] = p.actions.as_slice() else {
            panic!("one stop for the cluster expected: {p:?}")
        };
        assert_eq!(stop.target(), &RayCluster as &dyn Target);
        assert_eq!(stop.notebook(), "rc");
        let body = stop_patch(stop, "7");
        assert_eq!(body["spec"], json!({"suspend": true}));
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert!(
            body["metadata"]["annotations"]
                .get("kubeflow-resource-stopped")
                .is_none(),
            "{body}"
        );
        // The second worker is the same stop: held back by the one-per-namespace cap.
        assert_eq!(reasons(&p), [("rc-gpu-b", SkipReason::PerNamespaceCap)]);
    }

    #[test]
    fn one_busy_gpu_worker_keeps_the_whole_cluster() {
        let p = plan_of(vec![
            worker("rc-gpu-a", cluster("rc"), true),
            worker("rc-gpu-b", cluster("rc"), false),
        ]);
        assert!(p.actions.is_empty(), "{p:?}");
        assert_eq!(
            reasons(&p),
            [
                ("rc-gpu-b", SkipReason::NotIdle),
                ("rc-gpu-a", SkipReason::NotebookPodBusy)
            ]
        );
    }

    #[test]
    fn a_cluster_of_a_rayjob_is_never_stopped_directly() {
        let managed = TargetInfo {
            managed_by: Some("RayJob train-1".into()),
            ..cluster("rc")
        };
        let p = plan_of(vec![worker("rc-gpu-a", managed.clone(), true)]);
        assert_eq!(reasons(&p), [("rc-gpu-a", SkipReason::ManagedByParent)]);
        assert_eq!(
            RayCluster.verify_fresh(&managed),
            Err("raycluster is managed by RayJob train-1: stop it through its parent".into())
        );
    }

    #[test]
    fn a_suspending_cluster_is_already_stopped_and_refused_before_a_write() {
        let suspending = TargetInfo {
            stopped: Some("RayClusterSuspending=True".into()),
            ..cluster("rc")
        };
        let p = plan_of(vec![worker("rc-gpu-a", suspending.clone(), true)]);
        assert_eq!(reasons(&p), [("rc-gpu-a", SkipReason::AlreadyStopped)]);
        let stop = plan_of(vec![worker("rc-gpu-a", cluster("rc"), true)]).actions;
        assert_eq!(
            verify_fresh(&suspending, &stop[0], Duration::hours(1), now()),
            Err("raycluster is already stopped".into())
        );
        assert_eq!(
            RayCluster.verify_fresh(&suspending),
            Err("raycluster is already suspending (RayClusterSuspending=True)".into())
        );
        assert_eq!(RayCluster.verify_fresh(&cluster("rc")), Ok(()));
    }

    #[test]
    fn only_raycluster_owners_are_its_rows() {
        let mut row = worker("rc-gpu-a", cluster("rc"), true);
        assert!(RayCluster.owner(&row).is_some());
        assert!(crate::cull::notebook::Notebook.owner(&row).is_none());
        row.evidence.owner = Some(OwnedBy::notebook(cluster("nb"), true));
        assert!(RayCluster.owner(&row).is_none());
    }
}
