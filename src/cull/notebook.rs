//! Kubeflow's Notebook as a culling target: stopped the way the Kubeflow UI does, with the
//! `kubeflow-resource-stopped` annotation (`kubeflow.org` v1, else v1beta1).
//!
//! Everything culling knows of Kubeflow Notebooks is here; discovery and the metadata
//! projection are shared with the claims sources in `crate::k8s`.

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::target::{Identity, RbacRule, Target, TargetInfo};
use crate::k8s::NOTEBOOK_GROUP;
use crate::ledger::claims::{LAST_ACTIVITY_ANNOTATION, OwnerKind, STOP_ANNOTATION};

/// The Kubeflow Notebook target.
#[derive(Debug, Clone, Copy, Default)]
pub struct Notebook;

static IDENTITY: Identity = Identity {
    kind: "Notebook",
    group: NOTEBOOK_GROUP,
    versions: &["v1", "v1beta1"],
    plural: "notebooks",
    noun: "notebook",
};

/// Re-read right before a write (get) and stopped or noticed by one merge patch (patch).
static RBAC: [RbacRule; 1] = [RbacRule {
    api_group: NOTEBOOK_GROUP,
    resource: "notebooks",
    verbs: &["get", "patch"],
}];

impl Target for Notebook {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }

    /// The ledger verifies pod → StatefulSet → Notebook and keeps the Notebook on the row.
    fn owner_kind(&self) -> Option<OwnerKind> {
        Some(OwnerKind::Notebook)
    }

    fn stop_fields(&self, stop_value: &str) -> serde_json::Value {
        json!({"metadata": {"annotations": {STOP_ANNOTATION: stop_value}}})
    }

    fn discover<'a>(
        &'a self,
        client: &'a kube::Client,
    ) -> BoxFuture<'a, Result<Option<ApiResource>, kube::Error>> {
        Box::pin(crate::k8s::notebook_resource(client))
    }

    /// From metadata alone (spec and status are never read).
    fn project(&self, object: &DynamicObject) -> TargetInfo {
        crate::k8s::notebook(&object.metadata)
    }

    fn rbac(&self) -> &'static [RbacRule] {
        &RBAC
    }

    fn restart_hint(&self) -> &'static str {
        "Restart from the notebooks UI"
    }

    /// Kubeflow's culler writes it from the Jupyter kernels' `last_activity` and busy state.
    fn activity_source(&self) -> &'static str {
        LAST_ACTIVITY_ANNOTATION
    }
}
