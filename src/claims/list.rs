//! One-shot claims from the live API (`report` against a cluster): one list per resource, into
//! the same projections as the watches.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, Resource};
use tracing::warn;

use super::kinds::{self, Kind, Scope, Source, Visit, Watched};
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

/// What the one-shot lists of a source's watched kinds become, typed per kind
/// ([`source_lists`]): the claims' rows, or the raw items `capture` writes.
pub trait Each {
    type Out: Send;
    /// The list of kind `K` (served as `resource`).
    fn each<K: Watched>(
        &self,
        resource: &<K::Object as Resource>::DynamicType,
        objects: Vec<K::Object>,
    ) -> Self::Out;
}

/// Which kinds [`source_lists`] lists.
pub struct Lists<'a> {
    pub source: Source,
    /// The served version of a discovered CRD (the Notebook's).
    pub discovered: Option<&'a ApiResource>,
    /// Kinds listed by the caller's own code (skipped here).
    pub explicit: &'a [&'a Kind],
    /// Bound on each list call, when there is one.
    pub timeout: Option<Duration>,
}

/// Lists every watched kind of `lists.source` ([`kinds::for_each_watched`]), except the explicit
/// ones, one kind after the other in [`kinds::KINDS`] order through [`objects`], each list
/// turned into `E::Out` by `each`. An error names the kind's resource.
pub async fn source_lists<E: Each + Sync>(
    client: &Client,
    scopes: &[Option<String>],
    lists: &Lists<'_>,
    each: &E,
) -> Result<Vec<(&'static Kind, E::Out)>, ListError> {
    type Listed<'f, O> = BoxFuture<'f, Result<(&'static Kind, O), ListError>>;
    struct Plan<'f, E: Each> {
        client: &'f Client,
        scopes: &'f [Option<String>],
        lists: &'f Lists<'f>,
        each: &'f E,
        planned: Vec<Listed<'f, E::Out>>,
    }
    impl<E: Each + Sync> Visit for Plan<'_, E> {
        fn visit<K: Watched>(&mut self) {
            let lists = self.lists;
            if K::KIND.source != lists.source || lists.explicit.contains(&K::KIND) {
                return;
            }
            let Some(resource) = K::resource(lists.discovered) else {
                return;
            };
            let (client, scopes, each, timeout) =
                (self.client, self.scopes, self.each, lists.timeout);
            self.planned.push(Box::pin(async move {
                let listed = objects::<K>(client, scopes, &resource);
                let objects = match timeout {
                    None => listed.await?,
                    Some(limit) => {
                        tokio::time::timeout(limit, listed)
                            .await
                            .map_err(|_| ListError {
                                resource: K::KIND.resource,
                                source: kube::Error::Service(
                                    format!("listing timed out after {limit:?}").into(),
                                ),
                            })??
                    }
                };
                Ok((K::KIND, each.each::<K>(&resource, objects)))
            }));
        }
    }
    let mut plan = Plan {
        client,
        scopes,
        lists,
        each,
        planned: Vec::new(),
    };
    kinds::for_each_watched(&mut plan);
    let mut out = Vec::with_capacity(plan.planned.len());
    for listed in plan.planned {
        out.push(listed.await?);
    }
    Ok(out)
}

/// Lists into the claims: each kind's objects projected as its watch projects them, stored
/// where its [`Watched`] binding puts them, its API marked served.
struct IntoClaims<'a> {
    names: &'a ResourceNames,
}

impl Each for IntoClaims<'_> {
    type Out = Box<dyn FnOnce(&mut Claims) + Send>;
    fn each<K: Watched>(
        &self,
        _: &<K::Object as Resource>::DynamicType,
        objects: Vec<K::Object>,
    ) -> Self::Out {
        let rows: Vec<K::Row> = objects
            .iter()
            .filter_map(|o| match K::project(self.names, o) {
                Ok(row) => row,
                Err(e) => {
                    if let Some(what) = K::INVALID {
                        warn!(error = &e as &dyn std::error::Error, "{what}");
                    }
                    None
                }
            })
            .collect();
        Box::new(move |claims: &mut Claims| {
            K::store(claims, rows);
            K::served(claims);
        })
    }
}

/// [`source_lists`] into `claims`.
async fn lists_into(
    client: &Client,
    scopes: &[Option<String>],
    lists: &Lists<'_>,
    names: &ResourceNames,
    claims: &mut Claims,
) -> Result<(), ListError> {
    for (_, fill) in source_lists(client, scopes, lists, &IntoClaims { names }).await? {
        fill(claims);
    }
    Ok(())
}

/// Bound on each DRA list call (`report` against a live cluster).
const DRA_LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// Lists pods, quotas, nodes (and any other core kind of the table), DRA's and Kueue's kinds
/// (when served; with Kueue's mappings when its ConfigMap is named), Notebooks (when served)
/// and the StatefulSets owning GPU pods.
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
    // Explicit: a pod may also be a DaemonSet's (no table kind), and pods and quotas are listed
    // namespace by namespace together; a quota or node that cannot be projected is skipped.
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
    if !names.dra_drivers.is_empty()
        && super::dra::available(client, &scopes, &kinds::watched_refs(Source::Dra), true).await
    {
        let dra = Lists {
            source: Source::Dra,
            discovered: None,
            explicit: &[],
            timeout: Some(DRA_LIST_TIMEOUT),
        };
        lists_into(client, &scopes, &dra, names, &mut claims)
            .await
            .map_err(|e| failed("resource.k8s.io")(e.source))?;
    }
    if super::kueue::available(client, &scopes, &kinds::watched_refs(Source::Kueue), true).await {
        let kueue = Lists {
            source: Source::Kueue,
            discovered: None,
            explicit: &[],
            timeout: None,
        };
        lists_into(client, &scopes, &kueue, names, &mut claims)
            .await
            .map_err(|e| failed("kueue.x-k8s.io")(e.source))?;
        if let Some((namespace, name)) = kueue_config_map {
            claims.kueue.device_class_mappings =
                super::kueue::read_mappings(client, namespace, name, true).await;
        }
    }
    if let Ok(Some(ar)) = k8s::raycluster::resource(client).await {
        let rayclusters = Lists {
            source: Source::KubeRay,
            discovered: Some(&ar),
            explicit: &[],
            timeout: None,
        };
        lists_into(client, &scopes, &rayclusters, names, &mut claims)
            .await
            .map_err(|e| failed("ray.io")(e.source))?;
    }
    if let Ok(Some(ar)) = k8s::workspace::workspace_resource(client).await {
        let workspaces = Lists {
            source: Source::Workspaces,
            discovered: Some(&ar),
            explicit: &[],
            timeout: None,
        };
        lists_into(client, &scopes, &workspaces, names, &mut claims)
            .await
            .map_err(|e| failed("kubeflow.org")(e.source))?;
    }
    if let Ok(Some(ar)) = k8s::notebook_resource(client).await {
        // Per namespace when --namespaces is set, as the watches do (the RBAC may be bound there
        // only).
        let notebooks = Lists {
            source: Source::Kubeflow,
            discovered: Some(&ar),
            explicit: &[],
            timeout: None,
        };
        lists_into(client, &scopes, &notebooks, names, &mut claims).await?;
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
