//! One-shot claims from the live API (`report` against a cluster): one list per resource, into
//! the same projections as the watches.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use tracing::warn;

use super::project;
use crate::ledger::claims::{Claims, ResourceNames};

/// A list call that failed.
#[derive(Debug, thiserror::Error)]
#[error("listing {resource}")]
pub struct ListError {
    pub resource: &'static str,
    #[source]
    pub source: kube::Error,
}

fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    ns.map_or_else(
        || Api::all(client.clone()),
        |n| Api::namespaced(client.clone(), n),
    )
}

/// Lists pods, quotas, nodes, Notebooks (when served) and the StatefulSets owning GPU pods.
pub async fn list_claims(
    client: &Client,
    names: &ResourceNames,
    namespaces: &[String],
) -> Result<Claims, ListError> {
    let mut claims = Claims::default();
    let lp = ListParams::default();
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let failed = |resource| move |source| ListError { resource, source };
    for ns in &scopes {
        let pods: Api<Pod> = scoped(client, *ns);
        for p in pods.list(&lp).await.map_err(failed("pods"))? {
            match project::pod(names, &p) {
                Ok(Some(c)) => {
                    // A pod kept only for its ResourceClaims may still be a DaemonSet's.
                    if c.resources.is_empty() {
                        claims.daemon_pods.extend(project::daemon_pod(&p));
                    }
                    claims.pods.push(c);
                }
                Ok(None) => claims.daemon_pods.extend(project::daemon_pod(&p)),
                Err(e) => warn!(error = &e as &dyn std::error::Error, "ignoring pod"),
            }
        }
        let quotas: Api<ResourceQuota> = scoped(client, *ns);
        for q in quotas.list(&lp).await.map_err(failed("resourcequotas"))? {
            if let Ok(Some(info)) = project::quota(names, &q) {
                claims.quotas.push(info);
            }
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes.list(&lp).await.map_err(failed("nodes"))? {
        match project::node(names, &n) {
            Ok(info) => claims.nodes.push(info),
            Err(e) => warn!(error = &e as &dyn std::error::Error, "ignoring node"),
        }
    }
    super::dra::list_into(client, names, namespaces, &mut claims)
        .await
        .map_err(failed("resource.k8s.io"))?;
    if let Ok(group) = kube::discovery::group(client, "kubeflow.org").await
        && let Some((ar, _)) = group.recommended_kind("Notebook")
    {
        // Per namespace when --namespaces is set, as the watches do (the RBAC may be bound there
        // only).
        for ns in &scopes {
            let api: Api<DynamicObject> = match ns {
                Some(n) => Api::namespaced_with(client.clone(), n, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            let list = api.list(&lp).await.map_err(failed("notebooks"))?;
            claims
                .notebooks
                .extend(list.items.iter().map(|o| project::notebook(&o.metadata)));
        }
        claims.notebooks_enabled = true;
        let mut sets = std::collections::BTreeSet::new();
        for p in &claims.pods {
            if let Some(c) = p
                .controller
                .as_ref()
                .filter(|c| c.kind == "StatefulSet" && c.group == "apps")
            {
                sets.insert((p.namespace.clone(), c.name.clone()));
            }
        }
        for (ns, name) in sets {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            if let Ok(Some(sts)) = api.get_opt(&name).await {
                claims.statefulsets.push(project::statefulset(&sts));
            }
        }
    }
    Ok(claims)
}
