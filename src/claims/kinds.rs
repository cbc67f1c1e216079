//! The one table of claim kinds: every object kind the claims sources read, with its dump file
//! stem, how kubectl and the API name it, its scope, the optional API it belongs to and how the
//! live service keeps it current ([`KINDS`]); and, for each watched kind, the binding of the
//! API object to its projection into the ledger's input ([`Watched`]).
//!
//! The watches, the one-shot lists, the dump loader, `capture`, its stems and the fuzzer read
//! this table instead of listing kinds themselves: the data through [`KINDS`], the typed
//! bindings through [`for_each_watched`] (the one list of the [`Watched`] impls) and
//! [`visit_kind`]. Adding a watched claim kind is one [`Kind`] entry in [`KINDS`], its
//! [`Watched`] impl (object, row, API, projection, where the rows go in [`Claims`]) listed in
//! [`for_each_watched`], and its ledger rule; see docs/architecture.md for the whole list.

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
    Claims, DeviceClassInfo, DraDevice, NodeInfo, NotebookInfo, OwnerInfo, PodClaim, QuotaInfo,
    ResourceClaimInfo, WorkspaceInfo, WorkspaceKindInfo, node_in_shard, pod_in_shard,
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
    /// Kubeflow Notebooks 2.0 Workspaces (`kubeflow.org/v1beta1` Workspace, discovered).
    Workspaces,
    /// KubeRay's RayCluster CRD (`ray.io/v1`, discovered).
    KubeRay,
}

impl Source {
    /// Marks the source's API as served in `claims` (Core always is: nothing to mark).
    pub fn mark_served(self, claims: &mut Claims) {
        match self {
            Source::Core => {}
            Source::Kubeflow => claims.notebooks_enabled = true,
            Source::Dra => claims.dra_enabled = true,
            Source::Kueue => claims.kueue.enabled = true,
            Source::Workspaces => claims.workspaces_enabled = true,
            Source::KubeRay => claims.rayclusters_enabled = true,
        }
    }
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

pub const WORKSPACES: Kind = Kind {
    kubectl: "workspaces.kubeflow.org",
    ..optional(
        "workspaces",
        "Workspace",
        Source::Workspaces,
        Scope::Namespaced,
    )
};
/// Read with Workspaces: their `activityRules` may exempt a Workspace from pausing.
pub const WORKSPACE_KINDS: Kind = Kind {
    kubectl: "workspacekinds.kubeflow.org",
    ..optional(
        "workspacekinds",
        "WorkspaceKind",
        Source::Workspaces,
        Scope::Cluster,
    )
};

/// KubeRay's clusters: the owner objects of Ray head and worker pods (culled by `spec.suspend`).
pub const RAYCLUSTERS: Kind = Kind {
    kubectl: "rayclusters.ray.io",
    ..optional(
        "rayclusters",
        "RayCluster",
        Source::KubeRay,
        Scope::Namespaced,
    )
};

/// Every claim kind, in the order dumps are loaded and captured.
pub const KINDS: [&Kind; 16] = [
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
    &WORKSPACES,
    &WORKSPACE_KINDS,
    &RAYCLUSTERS,
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
///
/// Every impl is listed once, in [`for_each_watched`]; the watches, the stores, the dump loader
/// and the copies of the claims reach it only through that list.
pub trait Watched: 'static {
    const KIND: &'static Kind;
    type Object: Resource<DynamicType: Send + Sync>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static;
    type Row: Clone + PartialEq + Send + Sync + 'static;
    /// What the watch logs (with the error) when an object cannot be projected; `None`: it is
    /// dropped without a word.
    const INVALID: Option<&'static str> = None;
    /// Whether the namespaces of its objects in a dump count as the dump's namespaces (what
    /// `report --namespace` is checked against).
    const COUNTS_NAMESPACES: bool = false;

    /// The resource its API is served as (`()` for a typed kind), from what discovery found
    /// (`discovered`: the served version of a discovered CRD); `None` when it is not served.
    fn resource(
        discovered: Option<&ApiResource>,
    ) -> Option<<Self::Object as Resource>::DynamicType>;

    /// Puts `rows` where the ledger reads them in `claims` (replacing what was there).
    fn store(claims: &mut Claims, rows: Vec<Self::Row>);

    /// Whether a row belongs to shard `shard` of `total`; every row by default (the other
    /// shards' rows are read for context).
    fn in_shard(_row: &Self::Row, _shard: u32, _total: u32) -> bool {
        true
    }

    /// Marks its API served in `claims` once its objects were read (a dump of it exists, its
    /// API was found).
    fn served(claims: &mut Claims) {
        Self::KIND.source.mark_served(claims);
    }

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
    const COUNTS_NAMESPACES: bool = true;
    fn api(client: &Client, ns: Option<&str>, (): &()) -> Api<Pod> {
        k8s::scoped(client, ns)
    }
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    fn store(claims: &mut Claims, rows: Vec<Arc<PodClaim>>) {
        claims.pods = rows;
    }
    fn in_shard(row: &Arc<PodClaim>, shard: u32, total: u32) -> bool {
        pod_in_shard(row, shard, total)
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
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    fn store(claims: &mut Claims, rows: Vec<NodeInfo>) {
        claims.nodes = rows;
    }
    fn in_shard(row: &NodeInfo, shard: u32, total: u32) -> bool {
        node_in_shard(&row.name, shard, total)
    }
    fn project(names: &ResourceNames, o: &Node) -> Result<Option<NodeInfo>, ProjectError> {
        project::node(names, o).map(Some)
    }
}

pub struct Quotas;
impl Watched for Quotas {
    const KIND: &'static Kind = &QUOTAS;
    const COUNTS_NAMESPACES: bool = true;
    type Object = ResourceQuota;
    type Row = QuotaInfo;
    fn api(client: &Client, ns: Option<&str>, (): &()) -> Api<ResourceQuota> {
        k8s::scoped(client, ns)
    }
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    fn store(claims: &mut Claims, rows: Vec<QuotaInfo>) {
        claims.quotas = rows;
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
    const COUNTS_NAMESPACES: bool = true;
    type Object = DynamicObject;
    type Row = NotebookInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    /// The served version, as discovered.
    fn resource(discovered: Option<&ApiResource>) -> Option<ApiResource> {
        discovered.cloned()
    }
    fn store(claims: &mut Claims, rows: Vec<NotebookInfo>) {
        claims.notebooks = rows;
    }
    fn project(_: &ResourceNames, o: &DynamicObject) -> Result<Option<NotebookInfo>, ProjectError> {
        Ok(Some(k8s::notebook(&o.metadata)))
    }
}

pub struct Workspaces;
impl Watched for Workspaces {
    const KIND: &'static Kind = &WORKSPACES;
    type Object = DynamicObject;
    type Row = WorkspaceInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    /// The served Workspace resource, as discovered.
    fn resource(discovered: Option<&ApiResource>) -> Option<ApiResource> {
        discovered.cloned()
    }
    fn store(claims: &mut Claims, rows: Vec<WorkspaceInfo>) {
        claims.workspaces = rows;
    }
    fn project(
        _: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<WorkspaceInfo>, ProjectError> {
        Ok(Some(k8s::workspace::workspace(o)))
    }
}

pub struct WorkspaceKinds;
impl Watched for WorkspaceKinds {
    const KIND: &'static Kind = &WORKSPACE_KINDS;
    type Object = DynamicObject;
    type Row = WorkspaceKindInfo;
    fn api(client: &Client, _: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        Api::all_with(client.clone(), ar)
    }
    /// Beside the discovered Workspace resource (same group and version).
    fn resource(discovered: Option<&ApiResource>) -> Option<ApiResource> {
        discovered.map(k8s::workspace::workspace_kind_resource)
    }
    fn store(claims: &mut Claims, rows: Vec<WorkspaceKindInfo>) {
        claims.workspace_kinds = rows;
    }
    fn project(
        _: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<WorkspaceKindInfo>, ProjectError> {
        Ok(Some(k8s::workspace::workspace_kind(o)))
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
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    fn store(claims: &mut Claims, rows: Vec<ResourceClaimInfo>) {
        claims.resource_claims = rows;
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
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    /// The devices of every slice.
    fn store(claims: &mut Claims, rows: Vec<Vec<DraDevice>>) {
        claims.dra_devices = rows.into_iter().flatten().collect();
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
    fn resource(_: Option<&ApiResource>) -> Option<()> {
        Some(())
    }
    fn store(claims: &mut Claims, rows: Vec<DeviceClassInfo>) {
        claims.device_classes = rows;
    }
    /// Classes alone do not make DRA served: a dump of DeviceClasses without ResourceClaims
    /// or ResourceSlices leaves DRA accounting off (the watches turn it on through those).
    fn served(_: &mut Claims) {}
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
    fn resource(_: Option<&ApiResource>) -> Option<ApiResource> {
        Some(Self::KIND.kueue_resource())
    }
    fn store(claims: &mut Claims, rows: Vec<ResourceFlavorInfo>) {
        claims.kueue.flavors = rows;
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
    fn resource(_: Option<&ApiResource>) -> Option<ApiResource> {
        Some(Self::KIND.kueue_resource())
    }
    fn store(claims: &mut Claims, rows: Vec<ClusterQueueInfo>) {
        claims.kueue.cluster_queues = rows;
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
    fn resource(_: Option<&ApiResource>) -> Option<ApiResource> {
        Some(Self::KIND.kueue_resource())
    }
    fn store(claims: &mut Claims, rows: Vec<LocalQueueInfo>) {
        claims.kueue.local_queues = rows;
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
    fn resource(_: Option<&ApiResource>) -> Option<ApiResource> {
        Some(Self::KIND.kueue_resource())
    }
    fn store(claims: &mut Claims, rows: Vec<WorkloadInfo>) {
        claims.kueue.workloads = rows;
    }
    fn project(
        names: &ResourceNames,
        o: &DynamicObject,
    ) -> Result<Option<WorkloadInfo>, ProjectError> {
        Ok(Some(kueue::workload(names, o)))
    }
}

pub struct RayClusters;
impl Watched for RayClusters {
    const KIND: &'static Kind = &RAYCLUSTERS;
    const COUNTS_NAMESPACES: bool = true;
    type Object = DynamicObject;
    type Row = OwnerInfo;
    fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        dynamic(client, ns, ar)
    }
    /// The served version, as discovered.
    fn resource(discovered: Option<&ApiResource>) -> Option<ApiResource> {
        discovered.cloned()
    }
    fn store(claims: &mut Claims, rows: Vec<OwnerInfo>) {
        claims.rayclusters = rows;
    }
    fn project(_: &ResourceNames, o: &DynamicObject) -> Result<Option<OwnerInfo>, ProjectError> {
        Ok(Some(k8s::raycluster::project(o)))
    }
}

/// Something done for each watched kind, typed ([`for_each_watched`]).
pub trait Visit {
    fn visit<K: Watched>(&mut self);
}

/// Calls `v` for every [`Watched`] impl, once each, in [`KINDS`] order: the one list of them.
pub fn for_each_watched(v: &mut impl Visit) {
    v.visit::<Pods>();
    v.visit::<Nodes>();
    v.visit::<Quotas>();
    v.visit::<Notebooks>();
    v.visit::<ResourceClaims>();
    v.visit::<ResourceSlices>();
    v.visit::<DeviceClasses>();
    v.visit::<ResourceFlavors>();
    v.visit::<ClusterQueues>();
    v.visit::<LocalQueues>();
    v.visit::<Workloads>();
    v.visit::<Workspaces>();
    v.visit::<WorkspaceKinds>();
    v.visit::<RayClusters>();
}

/// Calls `v` for the [`Watched`] impl of `kind`; false when `kind` is not watched.
pub fn visit_kind(kind: &Kind, v: &mut impl Visit) -> bool {
    struct One<'a, V> {
        kind: &'a Kind,
        v: &'a mut V,
        found: bool,
    }
    impl<V: Visit> Visit for One<'_, V> {
        fn visit<K: Watched>(&mut self) {
            if K::KIND == self.kind {
                self.found = true;
                self.v.visit::<K>();
            }
        }
    }
    let mut one = One {
        kind,
        v,
        found: false,
    };
    for_each_watched(&mut one);
    one.found
}

/// The watched kinds of `source`, in [`KINDS`] order.
pub fn watched_of(source: Source) -> impl Iterator<Item = &'static Kind> {
    KINDS
        .into_iter()
        .filter(move |k| k.source == source && k.live == Live::Watched)
}

/// `(kind, plural, namespaced)` of each watched kind of `source`: what `kueue::available`
/// probes.
pub fn watched_refs(source: Source) -> Vec<(&'static str, &'static str, bool)> {
    watched_of(source)
        .map(|k| (k.object, k.resource, k.scope == Scope::Namespaced))
        .collect()
}

/// Their API resources, for a log line (`resourceclaims, resourceslices, deviceclasses`).
pub fn watched_resources(source: Source) -> String {
    watched_of(source)
        .map(|k| k.resource)
        .collect::<Vec<_>>()
        .join(", ")
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

    /// [`for_each_watched`] lists exactly the watched kinds of [`KINDS`], once each, in its
    /// order: a kind added to one and not the other fails here.
    #[test]
    fn the_watched_impls_are_the_tables_watched_kinds() {
        struct Stems(Vec<&'static str>);
        impl Visit for Stems {
            fn visit<K: Watched>(&mut self) {
                self.0.push(K::KIND.stem);
            }
        }
        let mut visited = Stems(Vec::new());
        for_each_watched(&mut visited);
        let watched: Vec<&str> = KINDS
            .iter()
            .filter(|k| k.live == Live::Watched)
            .map(|k| k.stem)
            .collect();
        assert_eq!(visited.0, watched);
        for kind in KINDS {
            let mut one = Stems(Vec::new());
            let found = visit_kind(kind, &mut one);
            assert_eq!(found, kind.live == Live::Watched, "{}", kind.stem);
            assert_eq!(one.0, if found { vec![kind.stem] } else { vec![] });
        }
        assert_eq!(
            watched_resources(Source::Kueue),
            "resourceflavors, clusterqueues, localqueues, workloads"
        );
        assert_eq!(
            kueue::not_all_served(&watched_refs(Source::Kueue)),
            "v1beta2 does not serve ResourceFlavor, ClusterQueue, LocalQueue and Workload"
        );
        assert_eq!(
            watched_resources(Source::Dra),
            "resourceclaims, resourceslices, deviceclasses"
        );
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
