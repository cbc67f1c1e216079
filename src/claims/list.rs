//! One-shot claims from the live API (`report` against a cluster): one list per resource, into
//! the same projections as the watches.

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use tracing::warn;

use super::kinds::{self, Scope, Watched};
use super::project;
use crate::k8s;
use crate::ledger::claims::Claims;
use crate::ledger::units::ResourceNames;

/// A list call that failed.
#[derive(Debug, thiserror::Error)]
#[error("listing {resource}")]
pub struct ListError {
    pub resource: &'static str,
    #[source]
    pub source: kube::Error,
}

/// Every object of kind `K` (served as `resource`, `()` for a typed kind): one list per scope
/// for a namespaced kind, one cluster-wide list otherwise; an error names the kind's resource.
pub async fn objects<K: Watched>(
    client: &Client,
    scopes: &[Option<String>],
    resource: &<K::Object as Resource>::DynamicType,
) -> Result<Vec<K::Object>, ListError> {
    let cluster_wide = [None];
    let scopes = match K::KIND.scope {
        Scope::Namespaced => scopes,
        Scope::Cluster => &cluster_wide,
    };
    let mut out = Vec::new();
    for ns in scopes {
        let list = K::api(client, ns.as_deref(), resource)
            .list(&ListParams::default())
            .await
            .map_err(|source| ListError {
                resource: K::KIND.resource,
                source,
            })?;
        out.extend(list.items);
    }
    Ok(out)
}

/// Lists pods, quotas, nodes, Notebooks (when served) and the StatefulSets owning GPU pods.
pub async fn list_claims(
    client: &Client,
    names: &ResourceNames,
    namespaces: &[String],
    kueue_config_map: Option<&(String, String)>,
) -> Result<Claims, ListError> {
    let mut claims = Claims::default();
    let lp = ListParams::default();
    let scopes = k8s::scopes(namespaces);
    let failed = |resource| move |source| ListError { resource, source };
    for ns in &scopes {
        let pods: Api<Pod> = k8s::scoped(client, ns.as_deref());
        for p in pods.list(&lp).await.map_err(failed(kinds::PODS.resource))? {
            match project::pod(names, &p) {
                Ok(Some(c)) => {
                    // A pod kept only for its ResourceClaims may still be a DaemonSet's.
                    if c.resources.is_empty() {
                        claims.daemon_pods.extend(project::daemon_pod(&p));
                    }
                    claims.pods.push(c.into());
                }
                Ok(None) => claims.daemon_pods.extend(project::daemon_pod(&p)),
                Err(e) => warn!(error = &e as &dyn std::error::Error, "ignoring pod"),
            }
        }
        let quotas: Api<ResourceQuota> = k8s::scoped(client, ns.as_deref());
        for q in quotas
            .list(&lp)
            .await
            .map_err(failed(kinds::QUOTAS.resource))?
        {
            if let Ok(Some(info)) = project::quota(names, &q) {
                claims.quotas.push(info);
            }
        }
    }
    for n in objects::<kinds::Nodes>(client, &scopes, &()).await? {
        match project::node(names, &n) {
            Ok(info) => claims.nodes.push(info),
            Err(e) => warn!(error = &e as &dyn std::error::Error, "ignoring node"),
        }
    }
    super::dra::list_into(client, names, namespaces, &mut claims)
        .await
        .map_err(failed("resource.k8s.io"))?;
    super::kueue::list_into(client, names, namespaces, kueue_config_map, &mut claims)
        .await
        .map_err(failed("kueue.x-k8s.io"))?;
    if let Ok(Some(ar)) = k8s::notebook_resource(client).await {
        // Per namespace when --namespaces is set, as the watches do (the RBAC may be bound there
        // only).
        for ns in &scopes {
            let api = k8s::scoped_dynamic(client, ns.as_deref(), &ar);
            let list = api
                .list(&lp)
                .await
                .map_err(failed(kinds::NOTEBOOKS.resource))?;
            claims
                .notebooks
                .extend(list.items.iter().map(|o| k8s::notebook(&o.metadata)));
        }
        claims.notebooks_enabled = true;
        let mut sets = std::collections::BTreeSet::new();
        for p in &claims.pods {
            if let Some(c) = k8s::statefulset_owner(p) {
                sets.insert((p.namespace.clone(), c.name.clone()));
            }
        }
        for (ns, name) in sets {
            if let Ok(Some(sts)) = k8s::get_statefulset(client, &ns, &name).await {
                claims.statefulsets.push(project::statefulset(&sts));
            }
        }
    }
    Ok(claims)
}
