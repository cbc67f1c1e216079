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
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::TypeMeta;
use kube::{Client, Resource};
use serde_json::{Value, json};
use tracing::warn;

use super::kinds::{self, Kind, Source, Watched};
use super::list::{Each, ListError, Lists, source_lists};
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
    // Every other core kind (nodes) through the table.
    let core = Lists {
        source: Source::Core,
        discovered: None,
        explicit: &[&kinds::PODS, &kinds::QUOTAS],
        timeout: None,
    };
    let core = source_lists(client, &scopes, &core, &AsItems).await?;

    let (notebooks, statefulsets) = list_notebooks(client, &pod_namespaces, owners).await?;
    let dra = if names.dra_drivers.is_empty()
        || !super::dra::available(client, &scopes, &kinds::watched_refs(Source::Dra), true).await
    {
        Vec::new()
    } else {
        let dra = Lists {
            source: Source::Dra,
            discovered: None,
            explicit: &[],
            timeout: None,
        };
        source_lists(client, &scopes, &dra, &AsItems).await?
    };
    let kueue_served =
        super::kueue::available(client, &scopes, &kinds::watched_refs(Source::Kueue), true).await;
    let kueue = if kueue_served {
        let kueue = Lists {
            source: Source::Kueue,
            discovered: None,
            explicit: &[],
            timeout: None,
        };
        source_lists(client, &scopes, &kueue, &AsItems).await?
    } else {
        Vec::new()
    };
    let kueue_config = match kueue_config_map.filter(|_| kueue_served) {
        Some((namespace, name)) => {
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
        None => None,
    };
    // KubeRay's clusters when the cluster serves them (their absence is no error: no Ray).
    let rayclusters = match k8s::raycluster::resource(client).await {
        Ok(Some(ar)) => {
            let ray = Lists {
                source: Source::KubeRay,
                discovered: Some(&ar),
                explicit: &[],
                timeout: None,
            };
            source_lists(client, &scopes, &ray, &AsItems).await?
        }
        _ => Vec::new(),
    };
    // Notebooks 2.0's Workspaces and WorkspaceKinds when served (their absence is no error).
    let workspaces = match k8s::workspace::workspace_resource(client).await {
        Ok(Some(ar)) => {
            let ws = Lists {
                source: Source::Workspaces,
                discovered: Some(&ar),
                explicit: &[],
                timeout: None,
            };
            source_lists(client, &scopes, &ws, &AsItems).await?
        }
        _ => Vec::new(),
    };
    let mut lists = RawLists::default()
        .with(&kinds::PODS, Some(list_of(pods)))
        .with(&kinds::QUOTAS, Some(list_of(quotas)))
        .with(&kinds::NOTEBOOKS, notebooks)
        .with(&kinds::STATEFULSETS, statefulsets)
        .with(&kinds::KUEUE_CONFIG, kueue_config);
    for (kind, list) in core
        .into_iter()
        .chain(dra)
        .chain(kueue)
        .chain(rayclusters)
        .chain(workspaces)
    {
        lists = lists.with(kind, Some(list));
    }
    Ok(lists)
}

/// A kind's objects as the items of its `<stem>.json`, each with its `apiVersion` and `kind`
/// (a dynamic object's list items carry none).
struct AsItems;

impl Each for AsItems {
    type Out = Value;
    fn each<K: Watched>(
        &self,
        resource: &<K::Object as Resource>::DynamicType,
        objects: Vec<K::Object>,
    ) -> Value {
        let api_version = K::Object::api_version(resource).into_owned();
        let kind = K::Object::kind(resource).into_owned();
        let items = objects
            .iter()
            .map(|o| {
                let mut v = item(o);
                if let Some(m) = v.as_object_mut() {
                    m.insert("apiVersion".into(), Value::String(api_version.clone()));
                    m.insert("kind".into(), Value::String(kind.clone()));
                }
                v
            })
            .collect();
        list_of(items)
    }
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
