//! The live claims as the dump files `report --from DIR` reads ([`super::files`]): one
//! `kind: List` per resource, items as `kubectl get … -A -o json` prints them (`apiVersion` and
//! `kind` on each item, no `managedFields`).
//!
//! The same objects [`super::list::list_claims`] reads: pods and ResourceQuotas of the given
//! namespaces, every node, Notebooks when the CRD is served, the StatefulSets that own GPU pods
//! (a `get` each, as the shipped RBAC allows), the DaemonSet pods that place each GPU on its node
//! (dcgm-exporter's), and the DRA ResourceClaims, ResourceSlices and DeviceClasses when
//! `resource.k8s.io/v1` is served. Only pods that claim a GPU resource (or run a DaemonSet) are
//! kept: no other pod changes the report, and fewer objects leave the cluster.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::TypeMeta;
use serde_json::{Value, json};
use tracing::warn;

use super::kinds::{self, Kind, Live, Source};
use super::list::{ListError, objects};
use super::project;
use crate::k8s;
use crate::ledger::units::ResourceNames;

/// The lists, ready to be written as `<stem>.json`: by claim kind, in [`kinds::KINDS`] order.
/// A kind is absent when its API is not served or readable (no Notebook CRD: the offline
/// report then reads no notebooks, like the live one; no `resource.k8s.io/v1`: DRA accounting
/// off; no Kueue, or no ConfigMap named or readable: Kueue's mappings unknown).
#[derive(Debug, Clone, Default)]
pub struct RawLists {
    lists: Vec<(&'static Kind, Value)>,
}

impl RawLists {
    /// (file stem, list) for every list present, in [`kinds::KINDS`] order.
    pub fn files(&self) -> Vec<(&'static str, &Value)> {
        kinds::KINDS
            .iter()
            .filter_map(|k| self.get(k).map(|l| (k.stem, l)))
            .collect()
    }

    /// The list of `kind`, when captured.
    pub fn get(&self, kind: &Kind) -> Option<&Value> {
        self.lists
            .iter()
            .find(|(k, _)| k.stem == kind.stem)
            .map(|(_, l)| l)
    }

    /// These lists with `kind`'s (`None`: not captured).
    fn with(mut self, kind: &'static Kind, list: Option<Value>) -> Self {
        self.lists.extend(list.map(|l| (kind, l)));
        self
    }

    /// Items in a list.
    pub fn count(list: &Value) -> usize {
        list["items"].as_array().map_or(0, Vec::len)
    }
}

fn list_of(items: Vec<Value>) -> Value {
    let mut list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}});
    list["items"] = Value::Array(items);
    list
}

/// An object as kubectl prints it: `managedFields` dropped (kubectl ≥ 1.21 hides them).
fn item<K: serde::Serialize>(obj: &K) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    v
}

/// Lists everything the offline report reads, as raw objects.
pub async fn list_raw(
    client: &Client,
    names: &ResourceNames,
    namespaces: &[String],
    kueue_config_map: Option<&(String, String)>,
) -> Result<RawLists, ListError> {
    let lp = ListParams::default();
    let failed = |resource| move |source| ListError { resource, source };
    let scopes = k8s::scopes(namespaces);
    let (mut pods, mut quotas) = (Vec::new(), Vec::new());
    let mut owners: BTreeSet<(String, String)> = BTreeSet::new();
    let mut pod_namespaces: BTreeSet<String> = BTreeSet::new();
    for ns in &scopes {
        let api: Api<Pod> = k8s::scoped(client, ns.as_deref());
        for p in api.list(&lp).await.map_err(failed(kinds::PODS.resource))? {
            match project::pod(names, &p) {
                Ok(Some(claim)) => {
                    if let Some(c) = k8s::statefulset_owner(&claim) {
                        owners.insert((claim.namespace.clone(), c.name.clone()));
                    }
                    pod_namespaces.insert(claim.namespace.clone());
                    pods.push(item(&p));
                }
                Ok(None) => {}
                // The offline report would refuse the whole file for it; the live one skips it.
                Err(e) => warn!(
                    error = &e as &dyn std::error::Error,
                    "not capturing pod (the live report ignores it too)"
                ),
            }
        }
        let api: Api<ResourceQuota> = k8s::scoped(client, ns.as_deref());
        for q in api
            .list(&lp)
            .await
            .map_err(failed(kinds::QUOTAS.resource))?
        {
            quotas.push(item(&q));
        }
    }
    push_daemon_pods(client, &mut pods).await;
    let nodes: Vec<Value> = objects::<kinds::Nodes>(client, &scopes, &())
        .await?
        .iter()
        .map(item)
        .collect();

    let (notebooks, statefulsets) = list_notebooks(client, &pod_namespaces, owners).await?;
    let (resource_claims, resource_slices, device_classes) =
        list_dra(client, names, &scopes).await?;
    let kueue = list_kueue(client, &scopes).await?;
    let kueue_config = match (&kueue, kueue_config_map) {
        (Some(_), Some((namespace, name))) => {
            match super::kueue::get_config_map(client, namespace, name).await {
                Ok(cm) => Some(list_of(cm.iter().map(item).collect())),
                Err(e) => {
                    warn!(
                        config_map = format!("{namespace}/{name}"),
                        error = &e as &dyn std::error::Error,
                        "not capturing Kueue's ConfigMap (RBAC?): the report reads its \
                         deviceClassMappings as unknown"
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let mut lists = RawLists::default()
        .with(&kinds::PODS, Some(list_of(pods)))
        .with(&kinds::NODES, Some(list_of(nodes)))
        .with(&kinds::QUOTAS, Some(list_of(quotas)))
        .with(&kinds::NOTEBOOKS, notebooks)
        .with(&kinds::STATEFULSETS, statefulsets)
        .with(&kinds::RESOURCE_CLAIMS, resource_claims)
        .with(&kinds::RESOURCE_SLICES, resource_slices)
        .with(&kinds::DEVICE_CLASSES, device_classes)
        .with(&kinds::KUEUE_CONFIG, kueue_config);
    for (kind, list) in kueue.into_iter().flatten() {
        lists = lists.with(kind, Some(list));
    }
    Ok(lists)
}

/// Kueue's watched kinds, when served and readable (cluster-scoped ones whole, LocalQueues and
/// Workloads in the captured namespaces), each item with its `apiVersion` and `kind`.
async fn list_kueue(
    client: &Client,
    scopes: &[Option<String>],
) -> Result<Option<Vec<(&'static Kind, Value)>>, ListError> {
    let lists = super::kueue::list_objects(client, scopes)
        .await
        .map_err(|(resource, source)| ListError { resource, source })?;
    Ok(lists.map(|lists| {
        kinds::KINDS
            .iter()
            .filter(|k| k.source == Source::Kueue && k.live == Live::Watched)
            .map(|kind| {
                let types = TypeMeta {
                    api_version: format!("{}/{}", super::kueue::GROUP, super::kueue::VERSION),
                    kind: kind.object.to_string(),
                };
                let items = lists
                    .get(kind.resource)
                    .into_iter()
                    .flatten()
                    .map(|o| {
                        let mut o = o.clone();
                        o.types = Some(types.clone());
                        item(&o)
                    })
                    .collect();
                (*kind, list_of(items))
            })
            .collect()
    }))
}

/// DaemonSet pods anywhere (dcgm-exporter usually runs outside the captured namespaces):
/// through them the report places a GPU on its node when the exporter's Hostname is its own
/// pod name. Best effort: a user who may not list them gets the Hostname-only placement.
async fn push_daemon_pods(client: &Client, pods: &mut Vec<Value>) {
    let daemons = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(project::DAEMONSET_POD_LABEL))
        .await;
    match daemons {
        Ok(list) => {
            let captured: BTreeSet<(String, String)> = pods
                .iter()
                .map(|p| {
                    let m = &p["metadata"];
                    (
                        m["namespace"].as_str().unwrap_or_default().to_string(),
                        m["name"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            for p in list.iter().filter(|p| project::daemon_pod(p).is_some()) {
                let key = (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                );
                if !captured.contains(&key) {
                    pods.push(item(p));
                }
            }
        }
        Err(e) => warn!(
            error = &e as &dyn std::error::Error,
            "cannot list DaemonSet pods: GPUs are placed by their Hostname label only"
        ),
    }
}

/// Notebooks in the namespaces with GPU pods, and the StatefulSets owning GPU pods; both `None`
/// when the Kubeflow CRD is not served.
async fn list_notebooks(
    client: &Client,
    pod_namespaces: &BTreeSet<String>,
    owners: BTreeSet<(String, String)>,
) -> Result<(Option<Value>, Option<Value>), ListError> {
    let lp = ListParams::default();
    let failed = |resource| move |source| ListError { resource, source };
    let (mut notebooks, mut statefulsets) = (None, None);
    if let Ok(Some(ar)) = k8s::notebook_resource(client).await {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = api
            .list(&lp)
            .await
            .map_err(failed(kinds::NOTEBOOKS.resource))?;
        let types = TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        };
        // Only the namespaces with GPU pods: a notebook elsewhere owns no GPU pod.
        let items = list
            .items
            .into_iter()
            .filter(|nb| {
                nb.metadata
                    .namespace
                    .as_ref()
                    .is_some_and(|n| pod_namespaces.contains(n))
            })
            .map(|mut nb| {
                nb.types = Some(types.clone());
                item(&nb)
            })
            .collect();
        notebooks = Some(list_of(items));
        let mut sets = Vec::new();
        for (ns, name) in owners {
            // As the live lists: a StatefulSet that cannot be read leaves its notebook unverified.
            match k8s::get_statefulset(client, &ns, &name).await {
                Ok(Some(sts)) => sets.push(item(&sts)),
                Ok(None) => {}
                Err(e) => warn!(
                    error = &e as &dyn std::error::Error,
                    namespace = %ns,
                    statefulset = %name,
                    "cannot read statefulset"
                ),
            }
        }
        statefulsets = Some(list_of(sets));
    }
    Ok((notebooks, statefulsets))
}

/// ResourceClaims, ResourceSlices and DeviceClasses, when DRA is served and readable.
async fn list_dra(
    client: &Client,
    names: &ResourceNames,
    scopes: &[Option<String>],
) -> Result<(Option<Value>, Option<Value>, Option<Value>), ListError> {
    if names.dra_drivers.is_empty() || !super::dra::available(client, scopes, true).await {
        return Ok((None, None, None));
    }
    let claims = objects::<kinds::ResourceClaims>(client, scopes, &()).await?;
    let slices = objects::<kinds::ResourceSlices>(client, scopes, &()).await?;
    let classes = objects::<kinds::DeviceClasses>(client, scopes, &()).await?;
    let raw = |items: Vec<Value>| Some(list_of(items));
    Ok((
        raw(claims.iter().map(item).collect()),
        raw(slices.iter().map(item).collect()),
        raw(classes.iter().map(item).collect()),
    ))
}
