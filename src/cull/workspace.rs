//! Kubeflow Notebooks 2.0's Workspace as a culling target: paused with `spec.paused: true`, the
//! same merge patch the Workspace controller's own culler writes (`kubeflow.org/v1beta1`).
//!
//! The ledger attaches a Workspace to its pod through pod → StatefulSet → Workspace, cross-checked
//! with the `notebooks.kubeflow.org/workspace-name` label, and marks one its WorkspaceKind's
//! `activityRules` exempt as opted out (`ledger/workspace.rs`). Its `status.activity.lastActivity`
//! feeds the activity veto.

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::target::{Identity, RbacRule, Target, TargetInfo};
use crate::k8s::workspace::{WORKSPACE_GROUP, workspace, workspace_resource};
use crate::ledger::claims::OwnerKind;

/// The Workspace target.
#[derive(Debug, Clone, Copy, Default)]
pub struct Workspace;

static IDENTITY: Identity = Identity {
    kind: "Workspace",
    group: WORKSPACE_GROUP,
    versions: &["v1beta1"],
    plural: "workspaces",
    noun: "workspace",
};

/// Re-read right before a write (get) and paused or noticed by one merge patch (patch).
static RBAC: [RbacRule; 1] = [RbacRule {
    api_group: WORKSPACE_GROUP,
    resource: "workspaces",
    verbs: &["get", "patch"],
}];

impl Target for Workspace {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }

    fn owner_kind(&self) -> Option<OwnerKind> {
        Some(OwnerKind::Workspace)
    }

    fn stop_fields(&self, _stop_value: &str) -> serde_json::Value {
        json!({"spec": {"paused": true}})
    }

    fn discover<'a>(
        &'a self,
        client: &'a kube::Client,
    ) -> BoxFuture<'a, Result<Option<ApiResource>, kube::Error>> {
        Box::pin(workspace_resource(client))
    }

    /// Metadata, `spec.paused` and `status.activity.lastActivity`. The WorkspaceKind's
    /// exemption is not re-read here: the pre-stop re-check rebuilds the pod's row from fresh
    /// claims, WorkspaceKinds included.
    fn project(&self, object: &DynamicObject) -> TargetInfo {
        workspace(object).owner
    }

    fn rbac(&self) -> &'static [RbacRule] {
        &RBAC
    }

    fn restart_hint(&self) -> &'static str {
        "Resume it from the Workspaces UI (or set spec.paused to false)"
    }

    fn activity_source(&self) -> &'static str {
        "status.activity.lastActivity"
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cull::actuator::stop_patch;
    use crate::cull::plan::Action;
    use crate::ledger::OwnedBy;
    use crate::ledger::PodRow;
    use crate::ledger::claims::OwnerInfo;

    #[test]
    fn claims_only_workspace_owners_and_pauses_by_spec() {
        let ws = OwnerInfo::new("team-a", "ws");
        let mut row = PodRow::new("team-a", "ws-abcde-0");
        row.evidence.owner = Some(OwnedBy {
            kind: OwnerKind::Workspace,
            info: ws.clone(),
            verified: true,
        });
        assert_eq!(
            Workspace.owner(&row).map(|(o, v)| (o.name.as_str(), v)),
            Some(("ws", true))
        );
        row.evidence.owner = Some(OwnedBy::notebook(ws, true));
        assert!(Workspace.owner(&row).is_none());
        let action = Action::notebook_stop("team-a", "ws")
            .of_object(&Workspace, &OwnerInfo::new("team-a", "ws"))
            .stopping_at("2026-01-31T12:00:00Z");
        let patch = stop_patch(&action, "42");
        assert_eq!(patch["spec"], json!({"paused": true}), "{patch}");
        assert_eq!(patch["metadata"]["resourceVersion"], "42", "{patch}");
        // Kubeflow's v1 stop annotation is no part of a Workspace's stop.
        assert!(
            patch["metadata"]["annotations"]
                .get("kubeflow-resource-stopped")
                .is_none()
        );
    }
}
