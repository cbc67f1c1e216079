//! The one table of claim kinds: every object kind the claims sources read, with its dump file
//! stem, how kubectl and the API name it, its scope, the optional API it belongs to and how the
//! live service keeps it current ([`KINDS`]); and, for each watched kind, the binding of the
//! API object to its projection into the ledger's input ([`Watched`]).
//!
//! The watches, the one-shot lists, the dump loader, `capture`, its stems and the fuzzer read
//! this table instead of listing kinds themselves. Adding a claim kind is one [`Kind`] entry in
//! [`KINDS`] (and a [`Watched`] impl when it is watched), its projection, and its ledger rule.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::project::{self, ProjectError};
use super::{dra, kueue};
use crate::k8s;
use crate::ledger::claims::{
    DeviceClassInfo, DraDevice, NodeInfo, NotebookInfo, PodClaim, QuotaInfo, ResourceClaimInfo,
};
use crate::ledger::kueue::{ClusterQueueInfo, LocalQueueInfo, ResourceFlavorInfo, WorkloadInfo};
use crate::ledger::units::ResourceNames;

/// The API that serves a kind, and so whether the cluster may lack it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Core Kubernetes: always served.
    Core,
    /// Kubeflow's Notebook CRD (`kubeflow.org`, discovered).
    Kubeflow,
    /// `resource.k8s.io/v1` (DRA), read with `--dra-gpu-drivers`.
    Dra,
    /// `kueue.x-k8s.io/v1beta2`.
    Kueue,
}

/// Where a kind's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In a namespace: listed and watched per `--namespaces` scope, keyed `namespace/name`.
    Namespaced,
    /// Cluster-wide: one list or watch, keyed by name.
    Cluster,
}

/// How the live service keeps a kind current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// A watch per scope ([`Watched`]).
    Watched,
    /// Read on demand (the StatefulSets that own GPU pods, a GET each).
    Fetched,
    /// Re-read now and then (Kueue's manager ConfigMap).
    Polled,
}

/// One claim kind.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// The dump file stem: `<stem>.json|yaml|yml` in a `report --from` directory, as `capture`
    /// writes it.
    pub stem: &'static str,
    /// Other stems read for it (`resourcequotas.json` for `quotas`); `capture` clears them too.
    pub alias_stems: &'static [&'static str],
    /// The `kind` of its items (`Pod`).
    pub object: &'static str,
    /// How `kubectl get` names it, for messages (`notebooks.kubeflow.org`).
    pub kubectl: &'static str,
    /// The API resource (plural): the watch's label and its `resource` log field.
    pub resource: &'static str,
    pub source: Source,
    pub scope: Scope,
    /// Whether a dump directory must hold it (pods and nodes); the others may be absent.
    pub required: bool,
    pub live: Live,
}

/// A core kind.
const fn core(stem: &'static str, object: &'static str, scope: Scope) -> Kind {
    Kind {
        stem,
        alias_stems: &[],
        object,
        kubectl: stem,
        resource: stem,
        source: Source::Core,
        scope,
        required: false,
        live: Live::Watched,
    }
}

/// A kind of an optional API, watched, named alike by its stem, kubectl and the API.
const fn optional(stem: &'static str, object: &'static str, source: Source, scope: Scope) -> Kind {
    Kind {
        source,
        ..core(stem, object, scope)
    }
}

pub const PODS: Kind = Kind {
    required: true,
    ..core("pods", "Pod", Scope::Namespaced)
};
pub const NODES: Kind = Kind {
    required: true,
    ..core("nodes", "Node", Scope::Cluster)
};
pub const QUOTAS: Kind = Kind {
    alias_stems: &["resourcequotas"],
    kubectl: "resourcequotas",
    resource: "resourcequotas",
    ..core("quotas", "ResourceQuota", Scope::Namespaced)
};
pub const NOTEBOOKS: Kind = Kind {
    kubectl: "notebooks.kubeflow.org",
    ..optional("notebooks", "Notebook", Source::Kubeflow, Scope::Namespaced)
};
/// Read only while Notebooks are (they verify a Notebook owns its pods).
pub const STATEFULSETS: Kind = Kind {
    live: Live::Fetched,
    ..optional(
        "statefulsets",
        "StatefulSet",
        Source::Kubeflow,
        Scope::Namespaced,
    )
};
pub const RESOURCE_CLAIMS: Kind = optional(
    "resourceclaims",
    "ResourceClaim",
    Source::Dra,
    Scope::Namespaced,
);
pub const RESOURCE_SLICES: Kind = optional(
    "resourceslices",
    "ResourceSlice",
    Source::Dra,
    Scope::Cluster,
);
pub const DEVICE_CLASSES: Kind =
    optional("deviceclasses", "DeviceClass", Source::Dra, Scope::Cluster);
pub const RESOURCE_FLAVORS: Kind = optional(
    "resourceflavors",
    "ResourceFlavor",
    Source::Kueue,
    Scope::Cluster,
);
pub const CLUSTER_QUEUES: Kind = optional(
    "clusterqueues",
    "ClusterQueue",
    Source::Kueue,
    Scope::Cluster,
);
pub const LOCAL_QUEUES: Kind = optional(
    "localqueues",
    "LocalQueue",
    Source::Kueue,
    Scope::Namespaced,
);
pub const WORKLOADS: Kind = optional("workloads", "Workload", Source::Kueue, Scope::Namespaced);
/// Kueue's manager ConfigMap, for its `deviceClassMappings` (a list of one, or empty when it
/// does not exist).
pub const KUEUE_CONFIG: Kind = Kind {
    kubectl: "configmaps",
    resource: "configmaps",
    live: Live::Polled,
    ..optional(
        kueue::CONFIG_STEM,
        "ConfigMap",
        Source::Kueue,
        Scope::Namespaced,
    )
};

/// Every claim kind, in the order dumps are loaded and captured.
pub const KINDS: [&Kind; 13] = [
    &PODS,
    &NODES,
    &QUOTAS,
    &NOTEBOOKS,
    &STATEFULSETS,
    &RESOURCE_CLAIMS,
    &RESOURCE_SLICES,
    &DEVICE_CLASSES,
    &RESOURCE_FLAVORS,
    &CLUSTER_QUEUES,
    &LOCAL_QUEUES,
    &WORKLOADS,
    &KUEUE_CONFIG,
];

impl Kind {
    /// The stems its dump may have, the main one first.
    pub fn stems(&self) -> impl Iterator<Item = &'static str> + use<> {
        std::iter::once(self.stem).chain(self.alias_stems.iter().copied())
    }

    /// The store key of an object of this kind: `namespace/name`, or the name.
    pub fn key(&self, o: &impl Resource) -> String {
        match self.scope {
            Scope::Namespaced => format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
            Scope::Cluster => o.name_any(),
        }
    }

    /// The [`ApiResource`] of a Kueue kind.
    pub fn kueue_resource(&self) -> ApiResource {
        kueue::api_resource(self.object, self.resource)
    }
}

/// A watched kind: its table entry, the API object it is read as, and its projection into the
/// ledger's input (`Row`, what the store keeps of each object).
pub trait Watched {
    const KIND: &'static Kind;
    type Object: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static;
    type Row: PartialEq + Send + Sync + 'static;
    /// What the watch logs (with the error) when an object cannot be projected; `None`: it is
    /// dropped without a word.
    const INVALID: Option<&'static str> = None;

    /// The API of one scope (`None`: cluster-wide); `resource` is the discovered or fixed
    /// resource of a dynamic kind.
    fn api(
        client: &Client,
        ns: Option<&str>,
        resource: &<Self::Object as Resource>::DynamicType,
    ) -> Api<Self::Object>;

    /// The object's projection; `Ok(None)` when it claims nothing the ledger reads (a pod
    /// without GPUs).
    fn project(names: &ResourceNames, o: &Self::Object) -> Result<Option<Self::Row>, ProjectError>;
}

/// A dynamic kind's API in one scope.
fn dynamic(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
    k8s::scoped_dynamic(client, ns, ar)
}

pub struct Pods;
impl Watched for Pods {
    const KIND: &'static Kind = &PODS;
    type Object = Pod;
    /// Shared with every build's copy of the claims.
    type Row = Arc<PodClaim>;
    const INVALID: Option<&'static str> = Some("ignoring pod with an invalid GPU quantity");
    fn api(client: &Client, ns: Option<&str>, (): &()) -> Api<Pod> {
        k8s::scoped(client, ns)
    }
    fn project(names: &ResourceNames, o: &Pod) -> Result<Option<Arc<PodClaim>>, ProjectError> {
        project::pod(names, o).map(|c| c.map(Arc::new))
    }
}

pub struct Nodes;
impl Watched for Nodes {
    const KIND: &'static Kind = &NODES;
    type Object = Node;
    type Row = NodeInfo;
    fn api(client: &Client, _: Option<&str>, (): &()) -> Api<Node> {
        Api::all(client.clone())
    }
    fn project(names: &ResourceNames, o: &Node) -> Result<Option<NodeInfo>, ProjectError> {
        project::node(names, o).map(Some)
    }
}

pub struct Quotas;
impl Watched for Quotas {
    const KIND: &'static Kind = &QUOTAS;
    type Object = ResourceQuota;
    type Row = QuotaInfo;
    fn api(client: &Client, ns: Option<&str>, (): &()) -> Api<ResourceQuota> {
        k8s::scoped(client, ns)
    }
    fn project(
        names: &ResourceNames,
        o: &ResourceQuota,
    ) -> Result<Option<QuotaInfo>, ProjectError> {
        project::quota(names, o)
    }
}

pub struct Notebooks;
impl Watched for Notebooks {
    const KIND: &'static Kind = &NOTEBOOKS;
    type Object = DynamicObject;
    type Row = NotebookInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    fn project(_: &ResourceNames, o: &DynamicObject) -> Result<Option<NotebookInfo>, ProjectError> {
        Ok(Some(k8s::notebook(&o.metadata)))
    }
}

pub struct ResourceClaims;
impl Watched for ResourceClaims {
    const KIND: &'static Kind = &RESOURCE_CLAIMS;
    type Object = ResourceClaim;
    type Row = ResourceClaimInfo;
    fn api(client: &Client, ns: Option<&str>, (): &()) -> Api<ResourceClaim> {
        k8s::scoped(client, ns)
    }
    fn project(
        names: &ResourceNames,
        o: &ResourceClaim,
    ) -> Result<Option<ResourceClaimInfo>, ProjectError> {
        Ok(dra::resource_claim(names, o))
    }
}

pub struct ResourceSlices;
impl Watched for ResourceSlices {
    const KIND: &'static Kind = &RESOURCE_SLICES;
    type Object = ResourceSlice;
    /// The slice's GPU devices.
    type Row = Vec<DraDevice>;
    fn api(client: &Client, _: Option<&str>, (): &()) -> Api<ResourceSlice> {
        Api::all(client.clone())
    }
    fn project(
        names: &ResourceNames,
        o: &ResourceSlice,
    ) -> Result<Option<Vec<DraDevice>>, ProjectError> {
        Ok(dra::slice_devices(names, o))
    }
}

pub struct DeviceClasses;
impl Watched for DeviceClasses {
    const KIND: &'static Kind = &DEVICE_CLASSES;
    type Object = DeviceClass;
    type Row = DeviceClassInfo;
    fn api(client: &Client, _: Option<&str>, (): &()) -> Api<DeviceClass> {
        Api::all(client.clone())
    }
    fn project(
        _: &ResourceNames,
        o: &DeviceClass,
    ) -> Result<Option<DeviceClassInfo>, ProjectError> {
        Ok(Some(dra::device_class(o)))
    }
}

pub struct ResourceFlavors;
impl Watched for ResourceFlavors {
    const KIND: &'static Kind = &RESOURCE_FLAVORS;
    type Object = DynamicObject;
    type Row = ResourceFlavorInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    fn project(
        _: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<ResourceFlavorInfo>, ProjectError> {
        Ok(Some(kueue::resource_flavor(o)))
    }
}

pub struct ClusterQueues;
impl Watched for ClusterQueues {
    const KIND: &'static Kind = &CLUSTER_QUEUES;
    type Object = DynamicObject;
    type Row = ClusterQueueInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    fn project(
        _: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<ClusterQueueInfo>, ProjectError> {
        Ok(Some(kueue::cluster_queue(o)))
    }
}

pub struct LocalQueues;
impl Watched for LocalQueues {
    const KIND: &'static Kind = &LOCAL_QUEUES;
    type Object = DynamicObject;
    type Row = LocalQueueInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    fn project(
        _: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<LocalQueueInfo>, ProjectError> {
        Ok(Some(kueue::local_queue(o)))
    }
}

pub struct Workloads;
impl Watched for Workloads {
    const KIND: &'static Kind = &WORKLOADS;
    type Object = DynamicObject;
    type Row = WorkloadInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    fn project(
        names: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<WorkloadInfo>, ProjectError> {
        Ok(Some(kueue::workload(names, o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stems name one file each: no two kinds read the same file.
    #[test]
    fn stems_are_unique() {
        let mut stems: Vec<&str> = KINDS.iter().flat_map(|k| k.stems()).collect();
        let all = stems.len();
        stems.sort_unstable();
        stems.dedup();
        assert_eq!(stems.len(), all, "{stems:?}");
    }

    #[test]
    fn keys_follow_the_scope() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("a".into());
        pod.metadata.namespace = Some("ns".into());
        assert_eq!(PODS.key(&pod), "ns/a");
        assert_eq!(NODES.key(&pod), "a");
    }
}
