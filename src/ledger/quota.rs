//! Quota held versus used (DESIGN.md, "Quota held versus used"): ResourceQuota GPU keys and
//! Kueue ClusterQueues, each joined with the ledger's evidence — how much of a promised quota
//! is held by pods proven busy, how much by pods proven idle.
//!
//! Rules (docs/report-json.md, "quotas", "queues", "dra_claims_unquotaed"):
//! - One quota row per namespace and GPU resource a ResourceQuota names (`requests.<name>`,
//!   `limits.<name>` or the bare name, and DRA's `<class>.deviceclass.resource.k8s.io/devices`
//!   for a class of a counted driver): the tightest hard limit, the apiserver's `status.used`
//!   of that key, and the GPU equivalents of the namespace's holding pods on that resource
//!   proven busy / proven idle (`null` when no utilisation source works).
//! - One queue row per ClusterQueue, flavor and GPU resource of its `resourceGroups`: nominal
//!   quota, borrowing and lending limits, admitted usage from its status, and busy / idle GPU
//!   equivalents of the pods of its admitted, unfinished workloads. A pod belongs to a Workload
//!   of its namespace when its controller (or the pod itself) is one of the Workload's owners,
//!   else when Kueue's workload annotation names it, else when the labels of
//!   `kueue::OWNER_LABELS` name its owner (JobSet, TrainJob, RayJob: `WorkloadIndex`). A pod
//!   counts under the flavor assigned to its pod set (Kueue's pod-set label), else the first.
//! - Kueue's `deviceClassMappings`: a ClusterQueue quota of a resource name that Kueue maps to
//!   a GPU DeviceClass (one of a counted driver) is GPU quota, and the DRA GPUs of an admitted
//!   workload's pods count under the name their claims' class maps to.
//! - A queue is "starved while a lender is idle" when it has pending GPU workloads (not
//!   deactivated) and may borrow (`borrowingLimit` not 0) while another ClusterQueue of its cohort
//!   that may lend (`lendingLimit` not 0) holds admitted GPUs of the same flavor and resource
//!   proven idle: only then would freeing that quota let Kueue admit the waiting work.
//! - A DRA claim asking for or holding a GPU is unquotaed when its namespace has no device-class
//!   quota key for one of its GPU classes and no pod using it belongs to a Kueue workload — or
//!   one does, but Kueue's `deviceClassMappings` (when read) map none of its GPU classes: Kueue
//!   counts a DRA device against a queue only through a mapping of its class.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use foldhash::{HashMap, HashMapExt};

use super::claims::{Claims, DRA_RESOURCE_PREFIX, PodClaim, ResourceClaimInfo};
use super::kueue::{OWNER_LABELS, WorkloadInfo};
use super::model::{Ledger, PodRow};
pub use super::model::{QueueRow, QuotaRow, UnquotaedClaim};
use super::units::ResourceNames;

/// Suffix of a ResourceQuota key that limits the devices of one DRA DeviceClass
/// (`<class>.deviceclass.resource.k8s.io/devices`, Kubernetes "Resource Quotas", DRA).
pub const DEVICE_CLASS_QUOTA_SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";

/// The DeviceClass a ResourceQuota key limits, with or without a `requests.` prefix.
pub fn device_class_of_quota_key(key: &str) -> Option<&str> {
    let k = key.strip_prefix("requests.").unwrap_or(key);
    k.strip_suffix(DEVICE_CLASS_QUOTA_SUFFIX)
        .filter(|class| !class.is_empty())
}

/// What the quota rows are built from.
pub(super) struct Inputs<'a> {
    pub claims: &'a Claims,
    pub pods: &'a [PodRow],
    pub names: &'a ResourceNames,
    pub usage_available: bool,
    pub now: DateTime<Utc>,
}

impl Ledger {
    /// The ledger with its quota rows, queue rows, unquotaed DRA claims and `kueue_available`
    /// set, from its pod rows.
    pub(super) fn with_quotas(mut self, claims: &Claims, names: &ResourceNames) -> Self {
        let i = Inputs {
            claims,
            pods: &self.pods,
            names,
            usage_available: self.usage_available,
            now: self.generated_at,
        };
        let (quotas, queues, unquotaed) = (quota_rows(&i), queue_rows(&i), unquotaed_claims(&i));
        self.quotas = quotas;
        self.queues = queues;
        self.dra_claims_unquotaed = unquotaed;
        self.kueue_available = claims.kueue.enabled;
        self
    }
}

/// Busy and idle GPU equivalents.
#[derive(Debug, Clone, Copy, Default)]
struct Evidence {
    busy: f64,
    idle: f64,
}

impl Evidence {
    fn add(&mut self, row: &PodRow, gpus: f64) {
        match row.idle {
            Some(true) => self.idle += gpus,
            Some(false) => self.busy += gpus,
            None => {}
        }
    }
}

/// The GPU DeviceClasses of a claim's requests (a class of a counted driver, or a request whose
/// own selectors name one).
fn gpu_classes<'c>(
    rc: &'c ResourceClaimInfo,
    claims: &Claims,
    names: &ResourceNames,
) -> BTreeSet<&'c str> {
    rc.requests
        .iter()
        .filter(|r| {
            r.drivers.iter().any(|d| names.is_gpu_driver(d))
                || claims
                    .device_classes
                    .iter()
                    .find(|c| c.name == r.device_class)
                    .is_some_and(|c| c.drivers.iter().any(|d| names.is_gpu_driver(d)))
        })
        .map(|r| r.device_class.as_str())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Whether a claim asks for or holds a GPU of a counted driver.
fn is_gpu_claim(rc: &ResourceClaimInfo, claims: &Claims, names: &ResourceNames) -> bool {
    rc.allocated.as_ref().is_some_and(|a| !a.is_empty())
        || !gpu_classes(rc, claims, names).is_empty()
}

/// A pod's DRA GPU equivalents (`dra_gpus`), shared among the GPU DeviceClasses its claims
/// request, by device count.
fn dra_class_shares<'c>(
    i: &Inputs<'c>,
    claims_by_name: &HashMap<(&str, &str), &'c ResourceClaimInfo>,
    p: &PodClaim,
    dra_gpus: f64,
) -> Vec<(&'c str, f64)> {
    let mut weights: BTreeMap<&str, u64> = BTreeMap::new();
    for name in &p.resource_claims {
        let Some(rc) = claims_by_name.get(&(p.namespace.as_str(), name.as_str())) else {
            continue;
        };
        let classes = gpu_classes(rc, i.claims, i.names);
        for r in rc
            .requests
            .iter()
            .filter(|r| classes.contains(r.device_class.as_str()))
        {
            let w = weights.entry(r.device_class.as_str()).or_insert(0);
            *w = w.saturating_add(r.count.max(1));
        }
    }
    let total: u64 = weights.values().fold(0u64, |a, w| a.saturating_add(*w));
    weights
        .into_iter()
        .map(|(class, w)| (class, dra_gpus * w as f64 / total.max(1) as f64))
        .collect()
}

fn claims_by_name(claims: &Claims) -> HashMap<(&str, &str), &ResourceClaimInfo> {
    claims
        .resource_claims
        .iter()
        .map(|rc| ((rc.namespace.as_str(), rc.name.as_str()), rc))
        .collect()
}

/// Kueue's resource name for each DeviceClass its `deviceClassMappings` name (the first
/// mapping naming a class wins, as Kueue's validation allows a class in one mapping only).
fn mapped_names(claims: &Claims) -> HashMap<&str, &str> {
    let mut out = HashMap::new();
    for m in claims.kueue.device_class_mappings.iter().flatten() {
        for class in &m.device_classes {
            out.entry(class.as_str()).or_insert(m.name.as_str());
        }
    }
    out
}

/// Resource names Kueue maps to a GPU DeviceClass (of a counted driver): quota of these is
/// GPU quota.
fn mapped_gpu_resources<'c>(claims: &'c Claims, names: &ResourceNames) -> BTreeSet<&'c str> {
    claims
        .kueue
        .device_class_mappings
        .iter()
        .flatten()
        .filter(|m| {
            m.device_classes.iter().any(|class| {
                claims
                    .device_classes
                    .iter()
                    .find(|c| &c.name == class)
                    .is_some_and(|c| c.drivers.iter().any(|d| names.is_gpu_driver(d)))
            })
        })
        .map(|m| m.name.as_str())
        .collect()
}

/// Per namespace and GPU resource of a ResourceQuota.
pub(super) fn quota_rows(i: &Inputs<'_>) -> Vec<QuotaRow> {
    // (namespace, resource) → (hard, used of the key with that hard).
    let mut limits: BTreeMap<(&str, String), (u64, Option<u64>)> = BTreeMap::new();
    for q in &i.claims.quotas {
        let keys = q.gpu_hard.iter().filter_map(|(key, hard)| {
            i.names
                .quota_key_resource(key)
                .map(|r| (key, r.to_string(), *hard))
        });
        let dra = q.dra_hard.iter().filter_map(|(key, hard)| {
            let class = device_class_of_quota_key(key)?;
            let gpu = i
                .claims
                .device_classes
                .iter()
                .find(|c| c.name == class)
                .is_some_and(|c| c.drivers.iter().any(|d| i.names.is_gpu_driver(d)));
            gpu.then(|| (key, format!("{class}{DEVICE_CLASS_QUOTA_SUFFIX}"), *hard))
        });
        for (key, resource, hard) in keys.chain(dra) {
            let used = q.used.get(key).copied();
            limits
                .entry((q.namespace.as_str(), resource))
                .and_modify(|e| {
                    if hard < e.0 {
                        *e = (hard, used);
                    }
                })
                .or_insert((hard, used));
        }
    }
    if limits.is_empty() {
        return Vec::new();
    }
    let claims_by_name = claims_by_name(i.claims);
    let pod_claims: HashMap<(&str, &str), &PodClaim> = i
        .claims
        .pods
        .iter()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), &**p))
        .collect();
    let mut evidence: HashMap<(&str, String), Evidence> = HashMap::new();
    for row in i.pods.iter().filter(|p| p.state.holds()) {
        let mut dra_gpus = 0.0;
        for (resource, gpus) in &row.gpus_by_resource {
            if resource.starts_with(DRA_RESOURCE_PREFIX) {
                dra_gpus += gpus;
            } else {
                evidence
                    .entry((row.namespace.as_str(), resource.clone()))
                    .or_default()
                    .add(row, *gpus);
            }
        }
        if dra_gpus <= 0.0 {
            continue;
        }
        // The pod's DRA GPUs, shared among the GPU classes its claims request by device count.
        let Some(p) = pod_claims.get(&(row.namespace.as_str(), row.pod.as_str())) else {
            continue;
        };
        for (class, share) in dra_class_shares(i, &claims_by_name, p, dra_gpus) {
            evidence
                .entry((
                    row.namespace.as_str(),
                    format!("{class}{DEVICE_CLASS_QUOTA_SUFFIX}"),
                ))
                .or_default()
                .add(row, share);
        }
    }
    limits
        .into_iter()
        .map(|((ns, resource), (hard, used))| {
            let e = evidence
                .get(&(ns, resource.clone()))
                .copied()
                .unwrap_or_default();
            QuotaRow {
                namespace: ns.to_string(),
                resource,
                hard,
                used,
                busy: i.usage_available.then_some(e.busy),
                idle: i.usage_available.then_some(e.idle),
            }
        })
        .collect()
}

/// (namespace, owner group, owner kind, owner name) of a Workload's owner.
type OwnerKey<'w> = (&'w str, &'w str, &'w str, &'w str);
/// The Workload of such an owner and the owner's uid; `None` when two Workloads have one.
type OwnerMatch<'w> = Option<(&'w WorkloadInfo, &'w str)>;

/// The Workloads of one refresh, indexed for the pod join.
struct WorkloadIndex<'w> {
    /// (namespace, owner uid) → Workload. A uid owned by two Workloads is dropped (ambiguous).
    owners_by_uid: HashMap<(&'w str, &'w str), &'w WorkloadInfo>,
    /// (namespace, Workload name) → Workload.
    workloads: HashMap<(&'w str, &'w str), &'w WorkloadInfo>,
    /// Owners of a kind of [`OWNER_LABELS`] by group, kind and name (ambiguous ones `None`).
    owners_by_name: HashMap<OwnerKey<'w>, OwnerMatch<'w>>,
}

impl<'w> WorkloadIndex<'w> {
    fn new(all: &'w [WorkloadInfo]) -> Self {
        let mut owners_by_uid: HashMap<(&str, &str), &WorkloadInfo> = HashMap::new();
        let mut twice: Vec<(&str, &str)> = Vec::new();
        let mut workloads_by_name = HashMap::new();
        let mut owners_by_name = HashMap::new();
        for w in all {
            workloads_by_name.insert((w.namespace.as_str(), w.name.as_str()), w);
            for o in &w.owners {
                if !o.uid.is_empty() {
                    let key = (w.namespace.as_str(), o.uid.as_str());
                    if owners_by_uid.insert(key, w).is_some() {
                        twice.push(key);
                    }
                }
                if OWNER_LABELS
                    .iter()
                    .any(|r| r.group == o.group && r.kind == o.kind)
                {
                    let key = (
                        w.namespace.as_str(),
                        o.group.as_str(),
                        o.kind.as_str(),
                        o.name.as_str(),
                    );
                    owners_by_name
                        .entry(key)
                        .and_modify(|e| *e = None)
                        .or_insert(Some((w, o.uid.as_str())));
                }
            }
        }
        for k in twice {
            owners_by_uid.remove(&k);
        }
        WorkloadIndex {
            owners_by_uid,
            workloads: workloads_by_name,
            owners_by_name,
        }
    }

    /// The Workload a GPU pod runs for, in the pod's namespace (docs/report-json.md, "queues"):
    /// 1. its controller (or the pod itself) is one of the Workload's owners (Job, Pod,
    ///    RayCluster, …);
    /// 2. else Kueue's own annotation on the pod names the Workload;
    /// 3. else the labels of [`OWNER_LABELS`] name exactly one Workload's owner (JobSet,
    ///    TrainJob, RayJob), with the owner's uid where the label carries one.
    fn workload_of(&self, p: &PodClaim) -> Option<&'w WorkloadInfo> {
        let ns = p.namespace.as_str();
        let by_uid = |uid: &str| self.owners_by_uid.get(&(ns, uid)).copied();
        if let Some(w) = p
            .controller
            .as_ref()
            .and_then(|c| by_uid(&c.uid))
            .or_else(|| by_uid(&p.uid))
        {
            return Some(w);
        }
        let refs = &p.workload_refs;
        if let Some(w) = refs
            .workload
            .as_deref()
            .and_then(|name| self.workloads.get(&(ns, name)))
        {
            return Some(w);
        }
        let mut found: Option<&WorkloadInfo> = None;
        for rule in &OWNER_LABELS {
            let Some(name) = refs
                .owner_labels
                .get(rule.name_label)
                .and_then(|v| rule.owner_name(v))
            else {
                continue;
            };
            let Some(entry) = self.owners_by_name.get(&(ns, rule.group, rule.kind, name)) else {
                continue;
            };
            // Two Workloads with such an owner: neither can be told to be the pod's.
            let (w, owner_uid) = (*entry)?;
            let pod_uid = rule.uid_label.and_then(|l| refs.owner_labels.get(l));
            if pod_uid.is_some_and(|u| !owner_uid.is_empty() && u != owner_uid) {
                continue;
            }
            match found {
                Some(f) if f.uid != w.uid || f.name != w.name => return None,
                _ => found = Some(w),
            }
        }
        found
    }
}

/// (cluster queue, flavor, resource) → busy and idle GPU equivalents of the pods of admitted,
/// unfinished Workloads.
fn queue_evidence<'i>(i: &Inputs<'i>) -> HashMap<(&'i str, &'i str, &'i str), Evidence> {
    let k = &i.claims.kueue;
    let index = WorkloadIndex::new(&k.workloads);
    let claims_by_name = claims_by_name(i.claims);
    let mapped_names = mapped_names(i.claims);
    let pod_claims: HashMap<(&str, &str), &PodClaim> = i
        .claims
        .pods
        .iter()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), &**p))
        .collect();
    // (cluster queue, flavor, resource) → evidence of admitted workloads' pods.
    let mut evidence: HashMap<(&str, &str, &str), Evidence> = HashMap::new();
    for row in i.pods.iter().filter(|p| p.state.holds()) {
        let Some(p) = pod_claims.get(&(row.namespace.as_str(), row.pod.as_str())) else {
            continue;
        };
        let Some(w) = index.workload_of(p).filter(|w| w.holds_quota()) else {
            continue;
        };
        let Some(adm) = &w.admission else { continue };
        // DRA GPUs count under the resource Kueue maps their DeviceClass to.
        let dra_gpus: f64 = row
            .gpus_by_resource
            .iter()
            .filter(|(r, _)| r.starts_with(DRA_RESOURCE_PREFIX))
            .map(|(_, g)| g)
            .sum();
        let mapped: Vec<(&str, f64)> = if dra_gpus > 0.0 {
            dra_class_shares(i, &claims_by_name, p, dra_gpus)
                .into_iter()
                .filter_map(|(class, share)| mapped_names.get(class).map(|name| (*name, share)))
                .collect()
        } else {
            Vec::new()
        };
        let held = row
            .gpus_by_resource
            .iter()
            .filter(|(r, _)| !r.starts_with(DRA_RESOURCE_PREFIX))
            .map(|(r, g)| (r.as_str(), *g))
            .chain(mapped);
        for (resource, gpus) in held {
            // The flavor Kueue assigned for the resource to the pod's pod set (Kueue's pod-set
            // label), else to the first pod set naming it.
            let of_pod_set = p.workload_refs.pod_set.as_deref().and_then(|set| {
                adm.assignments
                    .iter()
                    .find(|a| a.name == set)
                    .and_then(|a| a.flavors.get(resource))
            });
            let Some(flavor) =
                of_pod_set.or_else(|| adm.assignments.iter().find_map(|a| a.flavors.get(resource)))
            else {
                continue;
            };
            evidence
                .entry((adm.cluster_queue.as_str(), flavor.as_str(), resource))
                .or_default()
                .add(row, gpus);
        }
    }
    evidence
}

/// Per ClusterQueue, flavor and GPU resource.
pub(super) fn queue_rows(i: &Inputs<'_>) -> Vec<QueueRow> {
    let k = &i.claims.kueue;
    if !k.enabled || k.cluster_queues.is_empty() {
        return Vec::new();
    }
    let gpu_mapped = mapped_gpu_resources(i.claims, i.names);
    let evidence = queue_evidence(i);
    // Pending GPU workloads per ClusterQueue (through the LocalQueue of their namespace).
    let local: HashMap<(&str, &str), &str> = k
        .local_queues
        .iter()
        .map(|q| {
            (
                (q.namespace.as_str(), q.name.as_str()),
                q.cluster_queue.as_str(),
            )
        })
        .collect();
    let mut pending: HashMap<&str, (u64, Option<f64>)> = HashMap::new();
    for w in k.workloads.iter().filter(|w| w.pending() && w.needs_gpus()) {
        let Some(cq) = w
            .queue_name
            .as_deref()
            .and_then(|q| local.get(&(w.namespace.as_str(), q)))
        else {
            continue;
        };
        let age = w
            .created_at
            .map(|c| (i.now - c).num_milliseconds().max(0) as f64 / 1000.0);
        let e = pending.entry(cq).or_insert((0, None));
        e.0 = e.0.saturating_add(1);
        if let Some(age) = age {
            e.1 = Some(e.1.map_or(age, |a: f64| a.max(age)));
        }
    }
    let mut rows = Vec::new();
    for cq in &k.cluster_queues {
        let (pending_workloads, oldest) =
            pending.get(cq.name.as_str()).copied().unwrap_or((0, None));
        for q in cq.quotas.iter().filter(|q| {
            i.names.classify(&q.resource).is_some() || gpu_mapped.contains(q.resource.as_str())
        }) {
            let e = evidence
                .get(&(cq.name.as_str(), q.flavor.as_str(), q.resource.as_str()))
                .copied()
                .unwrap_or_default();
            let admitted = cq
                .usage
                .iter()
                .find(|u| u.flavor == q.flavor && u.resource == q.resource)
                .map_or(cq.usage_reported.then_some(0), |u| u.total);
            rows.push(QueueRow {
                cluster_queue: cq.name.clone(),
                cohort: cq.cohort.clone(),
                flavor: q.flavor.clone(),
                resource: q.resource.clone(),
                nominal: q.nominal,
                borrowing_limit: q.borrowing_limit,
                lending_limit: q.lending_limit,
                admitted,
                busy: i.usage_available.then_some(e.busy),
                idle: i.usage_available.then_some(e.idle),
                pending_workloads,
                oldest_pending_seconds: oldest,
                starved_while_lender_idle: false,
                idle_lenders: Vec::new(),
            });
        }
    }
    // Cohort view: per cohort, flavor and resource, the ClusterQueues holding idle admitted
    // GPUs that they may lend (`lendingLimit: 0` lends nothing: freeing its quota helps nobody
    // else). Kueue lends and borrows quota per flavor and resource.
    let mut idle_by: BTreeMap<(&str, &str, &str), BTreeSet<&str>> = BTreeMap::new();
    for r in &rows {
        if let (Some(cohort), Some(idle)) = (&r.cohort, r.idle)
            && idle > 0.0
            && r.lending_limit != Some(0)
        {
            idle_by
                .entry((cohort.as_str(), r.flavor.as_str(), r.resource.as_str()))
                .or_default()
                .insert(r.cluster_queue.as_str());
        }
    }
    let lenders: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            // Nothing waits, or the queue may not borrow (`borrowingLimit: 0`).
            if r.pending_workloads == 0 || r.borrowing_limit == Some(0) {
                return Vec::new();
            }
            r.cohort
                .as_deref()
                .and_then(|c| idle_by.get(&(c, r.flavor.as_str(), r.resource.as_str())))
                .map(|set| {
                    set.iter()
                        .filter(|q| **q != r.cluster_queue)
                        .map(|q| (*q).to_string())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    for (r, l) in rows.iter_mut().zip(lenders) {
        r.starved_while_lender_idle = !l.is_empty();
        r.idle_lenders = l;
    }
    rows.sort_by(|a, b| {
        (&a.cluster_queue, &a.flavor, &a.resource).cmp(&(&b.cluster_queue, &b.flavor, &b.resource))
    });
    rows
}

/// DRA GPU claims outside every quota.
pub(super) fn unquotaed_claims(i: &Inputs<'_>) -> Vec<UnquotaedClaim> {
    let c = i.claims;
    if !c.dra_enabled || c.resource_claims.is_empty() {
        return Vec::new();
    }
    let mut quota_classes: BTreeSet<(&str, &str)> = BTreeSet::new();
    for q in &c.quotas {
        for key in q.dra_hard.keys() {
            if let Some(class) = device_class_of_quota_key(key) {
                quota_classes.insert((q.namespace.as_str(), class));
            }
        }
    }
    let mapped = mapped_names(c);
    // Claims used by a pod of a Kueue workload.
    let mut queued: BTreeSet<(&str, &str)> = BTreeSet::new();
    if c.kueue.enabled {
        let index = WorkloadIndex::new(&c.kueue.workloads);
        for p in &c.pods {
            if index.workload_of(p).is_some() {
                for name in &p.resource_claims {
                    queued.insert((p.namespace.as_str(), name.as_str()));
                }
            }
        }
    }
    let mut out: Vec<UnquotaedClaim> = c
        .resource_claims
        .iter()
        .filter(|rc| is_gpu_claim(rc, c, i.names))
        .filter_map(|rc| {
            let classes = gpu_classes(rc, c, i.names);
            // Kueue counts a pod's DRA devices against its queue only through a mapping of
            // their class; with the mappings unknown the queue is trusted.
            let in_queue = queued.contains(&(rc.namespace.as_str(), rc.name.as_str()))
                && (c.kueue.device_class_mappings.is_none()
                    || (!classes.is_empty() && classes.iter().all(|k| mapped.contains_key(k))));
            if in_queue {
                return None;
            }
            let covered = !classes.is_empty()
                && classes
                    .iter()
                    .all(|class| quota_classes.contains(&(rc.namespace.as_str(), *class)));
            (!covered).then(|| UnquotaedClaim {
                namespace: rc.namespace.clone(),
                claim: rc.name.clone(),
                device_classes: classes.iter().map(|s| (*s).to_string()).collect(),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.claim).cmp(&(&b.namespace, &b.claim)));
    out
}

#[cfg(test)]
mod tests;
