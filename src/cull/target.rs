//! The culling target seam: what culling needs to know about one kind of object it stops.
//!
//! A Kubeflow Notebook is the first target (`cull/notebook.rs`); a KubeRay RayCluster
//! (`spec.suspend`) or a Notebooks 2.0 Workspace (`spec.paused`) would be one more file
//! implementing [`Target`], listed in the registry (`cull/registry.rs`), plus its RBAC in the
//! chart and the kustomize overlay (a test checks the Roles grant every target's
//! [`Target::rbac`]). [`Target::owner`] reads the pod row's one owner slot (`Evidence::owner`:
//! the owner's `OwnerKind`, its projection, whether the chain was verified), which only the
//! pod → StatefulSet → Notebook rule fills today: a kind the ledger does not claim yet also
//! needs a claim kind and the ledger rule that attaches its object under its own `OwnerKind`
//! (docs/architecture.md).
//! Notice annotations are gpu-ledger's own and the same on every kind. Plan, actuator, backoff, metrics, render, webhook and lease speak of a
//! target only through this trait and [`TargetInfo`]: the plan asks the registered targets which
//! one owns a pod (`registry::Targets::owner`), and every action and notice carries that target
//! to the actuator, the backoff and the webhook.

use std::fmt;

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};

use crate::ledger::PodRow;
use crate::ledger::claims::OwnerKind;

/// A target object reduced to what culling reads: identity, `resourceVersion`, whether it is
/// stopped (any value of its stop marker), deleting, and gpu-ledger's own annotations (opt-out,
/// snooze, last stop, notice). The ledger projects every owner object into this one shape
/// (`OwnerInfo`, also named `NotebookInfo` after its first kind) and keeps its `OwnerKind`
/// beside it on the row (`Evidence::owner`).
pub use crate::ledger::claims::OwnerInfo as TargetInfo;

/// Who a target kind is on the API and to its users.
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    /// The API kind, e.g. `Notebook` (names the object an Event is about).
    pub kind: &'static str,
    /// The API group, e.g. `kubeflow.org`.
    pub group: &'static str,
    /// The versions culling prefers, in order; the first names the object in an Event until the
    /// served version has been discovered.
    pub versions: &'static [&'static str],
    /// The resource (plural), as RBAC names it, e.g. `notebooks`.
    pub plural: &'static str,
    /// What users call one, in outcome details and Event notes, e.g. `notebook` (also the
    /// `kubectl` resource name).
    pub noun: &'static str,
}

/// One RBAC rule a target needs of the culling Role: `verbs` on `resource` of `api_group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RbacRule {
    pub api_group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

/// One kind of object culling stops. Implementations are stateless and `'static` (listed in
/// the registry); the API calls go through `CullApi`, which hands the target to it.
pub trait Target: Send + Sync {
    /// Kind, group, versions, plural and the users' word for it.
    fn identity(&self) -> &'static Identity;

    /// The ledger's owner kind this target stops: the rows whose owner slot
    /// (`Evidence.owner`) holds an object of it.
    fn owner_kind(&self) -> Option<OwnerKind> {
        None
    }

    /// How a ledger pod row names its owner object of this kind: the owner's projection and
    /// whether the pod → owner chain was verified; `None` when the pod is not owned by one. By
    /// default the row's owner slot when it is of [`Target::owner_kind`].
    fn owner<'r>(&self, row: &'r PodRow) -> Option<(&'r TargetInfo, bool)> {
        let kind = self.owner_kind()?;
        row.evidence
            .owner
            .as_ref()
            .filter(|o| o.kind == kind)
            .map(|o| (&o.info, o.verified))
    }

    /// How to stop it: the kind's own part of the stop's JSON merge patch (`stop_value` is the
    /// stop time, RFC 3339). The actuator adds gpu-ledger's audit annotations and the
    /// `resourceVersion` precondition; the part must only add keys, never remove any.
    fn stop_fields(&self, stop_value: &str) -> serde_json::Value;

    /// Checks of a freshly read object before any write, beyond those every kind gets (same
    /// uid, not stopped, not deleting, annotations understood, not opted out, not snoozed,
    /// restart grace). The error says which check failed.
    fn verify_fresh(&self, _fresh: &TargetInfo) -> Result<(), String> {
        Ok(())
    }

    /// How to read it: the served API resource (`Ok(None)` when the cluster serves none).
    fn discover<'a>(
        &'a self,
        client: &'a kube::Client,
    ) -> BoxFuture<'a, Result<Option<ApiResource>, kube::Error>>;

    /// How to read it: a GET's object projected into [`TargetInfo`].
    fn project(&self, object: &DynamicObject) -> TargetInfo;

    /// The RBAC rules culling needs on this kind (granted by the chart's and the kustomize
    /// overlay's culling Role).
    fn rbac(&self) -> &'static [RbacRule];

    /// How its user restarts it after a stop (ends the stop Event's note's first sentence).
    fn restart_hint(&self) -> &'static str;

    /// Where [`TargetInfo::last_activity`] was read (the activity veto's skip reason names it);
    /// only asked of a kind whose projection fills it.
    fn activity_source(&self) -> &'static str {
        "its controller's activity record"
    }
}

impl dyn Target + '_ {
    /// `(group, kind)`: what tells two targets apart (the registry lists each once).
    pub fn key(&self) -> (&'static str, &'static str) {
        let id = self.identity();
        (id.group, id.kind)
    }
}

/// Two targets are the same kind when group and kind agree (actions and notices compare by it).
impl PartialEq for dyn Target + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

/// `Notebook.kubeflow.org`, the way `kubectl` names a kind with its group.
impl fmt::Debug for dyn Target + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (group, kind) = self.key();
        write!(f, "{kind}.{group}")
    }
}

/// A target object an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}
