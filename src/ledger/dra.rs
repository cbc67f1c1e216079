//! GPUs held through Dynamic Resource Allocation (`resource.k8s.io/v1`): which devices each
//! pod's ResourceClaims give it, what they weigh in GPU equivalents, and how they join DCGM.
//!
//! Rules (docs/metrics.md, "DRA"):
//! - A pod holds the devices of every claim it uses once the claim is allocated AND reserved
//!   for it (`status.reservedFor`); a pending pod's claims are demand.
//! - A whole GPU is 1; a MIG device `<g>g.*` is g / S, S the parent's compute slices from its
//!   product (`SliceTable`); a device a claim shares among N reserved pods is 1/N per pod, and a
//!   device allocated to K claims (consumable capacity) is 1/K per claim.
//! - A device's identity comes from the claim's own `status.devices[].data` when the driver
//!   wrote it, else from the current generation of the ResourceSlice that published it. A
//!   device of a counted driver that neither describes counts as one whole GPU and joins no
//!   DCGM series (unattributed: never guessed).
//! - Only devices of the counted drivers (`--dra-gpu-drivers`) are read.
//! - Extended resources DRA backs (KEP-5004: a DeviceClass's `extendedResourceName`, or its
//!   implicit `deviceclass.resource.kubernetes.io/<class>`): the scheduler's claim holds the
//!   device and `status.extendedResourceClaimStatus.requestMappings` names the resources it
//!   serves. Once that claim is allocated the pod counts the device through it and the mapped
//!   resources not again; before, the mapped resources are counted by request (pending demand in
//!   GPU units), never lost.

use std::borrow::Cow;

use foldhash::{HashMap, HashMapExt, HashSet};

use super::claims::{
    Claims, DRA_RESOURCE_PREFIX, DeviceClassInfo, DraDevice, DraDeviceKind, DraDeviceStatus,
    IMPLICIT_EXTENDED_PREFIX, PodClaim, ResourceClaimInfo,
};
use super::units::{ResourceNames, SliceTable, profile_slices, unplaced_parent_slices};

/// How a held device is found among DCGM's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DraJoin {
    /// A whole GPU: DCGM's device with this `UUID` and no GPU instance.
    Whole(String),
    /// A MIG device: DCGM's GPU instance whose `dra_mig_device_uuid` is this MIG UUID.
    Mig(String),
    /// Nothing identifies the device (no UUID published): it stays unattributed.
    None,
}

/// One device a pod holds through a claim: its share of it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Held {
    /// Pseudo resource name (`dra:<driver>`, `dra:<driver>/mig-<profile>`).
    pub resource: String,
    /// The pod's share in GPU equivalents.
    pub gpus: f64,
    pub join: DraJoin,
    /// Shared with other pods (reservedFor) or other claims (consumable capacity).
    pub shared: bool,
    /// Its slice puts it on another node than the pod's, or on none (network-attached): it is
    /// in no node's allocatable, so it is not in the pod's node's claimed either.
    pub off_node: bool,
}

/// The DRA part of one pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct PodDra {
    /// Devices held (running and terminating pods).
    pub held: Vec<Held>,
    /// Demand of a pending pod: (pseudo resource, devices, GPU equivalents).
    pub demand: Vec<(String, u64, f64)>,
    /// The pod uses a claim that holds, or asks for, a device of a counted driver.
    pub gpu: bool,
    /// Devices asked through a GPU class's implicit extended resource name that no allocated
    /// claim serves yet, counted by request: (name, devices, GPU equivalents).
    pub by_request: Vec<(String, u64, f64)>,
}

impl PodDra {
    /// Units (devices) and GPU equivalents per pseudo resource: held when `holds`, else demand.
    pub(super) fn by_resource(&self, holds: bool) -> Vec<(String, u64, f64)> {
        let mut out: Vec<(String, u64, f64)> = Vec::new();
        let mut add = |r: &str, units: u64, gpus: f64| match out.iter_mut().find(|e| e.0 == r) {
            Some(e) => {
                e.1 = e.1.saturating_add(units);
                e.2 += gpus;
            }
            None => out.push((r.to_string(), units, gpus)),
        };
        if holds {
            for h in &self.held {
                add(&h.resource, 1, h.gpus);
            }
        } else {
            for (r, units, gpus) in &self.demand {
                add(r, *units, *gpus);
            }
        }
        for (r, units, gpus) in &self.by_request {
            add(r, *units, *gpus);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

type DeviceRef<'a> = (&'a str, &'a str, &'a str);

/// Claims, slices and classes indexed for one ledger build.
pub(super) struct DraIndex<'a> {
    names: &'a ResourceNames,
    slices: &'a SliceTable,
    /// Current-generation devices of counted drivers by (driver, pool, device).
    devices: HashMap<DeviceRef<'a>, &'a DraDevice>,
    claims: HashMap<(&'a str, &'a str), &'a ResourceClaimInfo>,
    classes: HashMap<&'a str, &'a DeviceClassInfo>,
    /// Allocated claims per device (several only with consumable capacity).
    claims_per_device: HashMap<DeviceRef<'a>, usize>,
}

/// The devices of the current generation of each pool (a pool's older generations are being
/// replaced by its driver), by (driver, pool, device).
fn current_devices(c: &Claims) -> impl Iterator<Item = (DeviceRef<'_>, &DraDevice)> {
    let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
    for d in &c.dra_devices {
        let g = newest
            .entry((d.driver.as_str(), d.pool.as_str()))
            .or_insert(d.pool_generation);
        *g = (*g).max(d.pool_generation);
    }
    c.dra_devices
        .iter()
        .filter(move |d| {
            newest.get(&(d.driver.as_str(), d.pool.as_str())) == Some(&d.pool_generation)
        })
        .map(|d| ((d.driver.as_str(), d.pool.as_str(), d.name.as_str()), d))
}

impl<'a> DraIndex<'a> {
    pub(super) fn new(c: &'a Claims, names: &'a ResourceNames, slices: &'a SliceTable) -> Self {
        let devices = current_devices(c)
            .filter(|(_, d)| names.is_gpu_driver(&d.driver))
            .collect();
        let claims = c
            .resource_claims
            .iter()
            .map(|rc| ((rc.namespace.as_str(), rc.name.as_str()), rc))
            .collect();
        let classes = c
            .device_classes
            .iter()
            .map(|dc| (dc.name.as_str(), dc))
            .collect();
        let mut claims_per_device: HashMap<DeviceRef<'_>, usize> = HashMap::new();
        for rc in &c.resource_claims {
            // A device twice in one claim (two requests) is still one claim's.
            let mut seen: HashSet<DeviceRef<'_>> = HashSet::default();
            for a in rc.allocated.iter().flatten() {
                let key = (a.driver.as_str(), a.pool.as_str(), a.device.as_str());
                if names.is_gpu_driver(&a.driver) && seen.insert(key) {
                    *claims_per_device.entry(key).or_insert(0) += 1;
                }
            }
        }
        DraIndex {
            names,
            slices,
            devices,
            claims,
            classes,
            claims_per_device,
        }
    }

    /// Whether the claim the scheduler made for `p`'s DRA-backed extended resources is allocated
    /// (the pod then holds, or is about to hold, its devices through it).
    fn extended_claim_allocated(&self, p: &PodClaim) -> bool {
        p.extended_claim.as_ref().is_some_and(|ext| {
            self.claims
                .get(&(p.namespace.as_str(), ext.claim.as_str()))
                .is_some_and(|rc| rc.allocated.is_some())
        })
    }

    /// Whether an allocated extended-resource claim of `p` serves its extended resource `name`.
    fn served_by_claim(&self, p: &PodClaim, name: &str) -> bool {
        p.extended_claim
            .as_ref()
            .is_some_and(|ext| ext.mappings.iter().any(|m| m.resource == name))
            && self.extended_claim_allocated(p)
    }

    /// `p` as the ledger counts it: the extended resources its allocated extended-resource claim
    /// serves (`requestMappings`) are taken out of `resources`, as that claim's device counts
    /// for them; otherwise `p` itself. A pod is so counted once, whichever way it asked.
    pub(super) fn counted_once<'p>(&self, p: &'p PodClaim) -> Cow<'p, PodClaim> {
        let Some(ext) = &p.extended_claim else {
            return Cow::Borrowed(p);
        };
        let mapped = |r: &String| ext.mappings.iter().any(|m| &m.resource == r);
        if !p.resources.keys().any(mapped) || !self.extended_claim_allocated(p) {
            return Cow::Borrowed(p);
        }
        let mut own = p.clone();
        own.resources.retain(|r, _| !mapped(r));
        Cow::Owned(own)
    }

    /// GPU equivalents of one device of the class an implicit extended resource name
    /// (`deviceclass.resource.kubernetes.io/<class>`) names, when it is a class of a counted
    /// driver: 1 for a whole GPU, 0 for a MIG device (its profile is not known: never guessed).
    fn implicit_class_gpus(&self, resource: &str) -> Option<f64> {
        let class = self
            .classes
            .get(resource.strip_prefix(IMPLICIT_EXTENDED_PREFIX)?)?;
        class
            .drivers
            .iter()
            .any(|d| self.names.is_gpu_driver(d))
            .then_some(if class.mig { 0.0 } else { 1.0 })
    }

    /// The DRA part of pod `p`; `holds` when the pod is bound (running or terminating).
    pub(super) fn pod(&self, p: &PodClaim, holds: bool) -> PodDra {
        let mut out = PodDra::default();
        for (name, units) in &p.class_requests {
            if self.served_by_claim(p, name) {
                continue;
            }
            if let Some(per_device) = self.implicit_class_gpus(name) {
                out.gpu = true;
                out.by_request
                    .push((name.clone(), *units, per_device * *units as f64));
            }
        }
        let extended_claim = p.extended_claim.as_ref().map(|e| e.claim.as_str());
        for name in &p.resource_claims {
            let Some(rc) = self.claims.get(&(p.namespace.as_str(), name.as_str())) else {
                continue;
            };
            // The scheduler creates the extended-resource claim, then allocates it: until the
            // allocation is seen, the pod's requests stand for it (counted by request, not twice).
            if rc.allocated.is_none() && extended_claim == Some(name.as_str()) {
                continue;
            }
            match &rc.allocated {
                Some(results) => {
                    let gpu_results: Vec<_> = results
                        .iter()
                        .filter(|a| self.names.is_gpu_driver(&a.driver))
                        .collect();
                    if gpu_results.is_empty() {
                        continue;
                    }
                    out.gpu = true;
                    let reserved = rc.reserved_for.contains(&p.uid);
                    // A pod bound without the reservation holds nothing of this claim.
                    if holds && !reserved {
                        continue;
                    }
                    let pods = rc.reserved_for.len() + usize::from(!reserved);
                    for a in gpu_results {
                        let key = (a.driver.as_str(), a.pool.as_str(), a.device.as_str());
                        let claims = self.claims_per_device.get(&key).copied().unwrap_or(1);
                        let dev = self.describe(rc, key, p.node.as_deref());
                        let share = (pods.max(1) * claims.max(1)) as f64;
                        let held = Held {
                            resource: dev.resource,
                            gpus: dev.gpus / share,
                            join: dev.join,
                            shared: pods > 1 || claims > 1,
                            off_node: dev.off_node,
                        };
                        if holds {
                            out.held.push(held);
                        } else {
                            out.demand.push((held.resource, 1, held.gpus));
                        }
                    }
                }
                None if !holds => {
                    for (resource, units, gpus) in self.requested(rc) {
                        out.gpu = true;
                        out.demand.push((resource, units, gpus));
                    }
                }
                // Bound to a node with an unallocated claim: it holds nothing of it (yet); it is
                // listed when the claim asks for a GPU.
                None => out.gpu |= !self.requested(rc).is_empty(),
            }
        }
        out
    }

    /// Identity and size of an allocated device: the claim's own status data first, then the
    /// current ResourceSlice.
    fn describe(
        &self,
        rc: &ResourceClaimInfo,
        key: DeviceRef<'_>,
        pod_node: Option<&str>,
    ) -> Described {
        let (driver, pool, device) = key;
        let status: Option<&DraDeviceStatus> = rc
            .device_status
            .iter()
            .find(|s| s.driver == driver && s.pool == pool && s.device == device);
        let slice: Option<&DraDevice> = self.devices.get(&key).copied();
        let pick = |from_status: Option<&String>, from_slice: Option<&String>| {
            from_status.or(from_slice).cloned()
        };
        let kind = status
            .and_then(|s| s.kind)
            .or(slice.map(|d| d.kind))
            .unwrap_or(DraDeviceKind::Gpu);
        let uuid = pick(
            status.and_then(|s| s.uuid.as_ref()),
            slice.and_then(|d| d.uuid.as_ref()),
        );
        let profile = pick(
            status.and_then(|s| s.profile.as_ref()),
            slice.and_then(|d| d.profile.as_ref()),
        );
        let product = pick(
            status.and_then(|s| s.product.as_ref()),
            slice.and_then(|d| d.product.as_ref()),
        );
        let off_node = slice.is_some_and(|d| d.node.is_none() || d.node.as_deref() != pod_node);
        match kind {
            DraDeviceKind::Gpu => Described {
                resource: format!("{DRA_RESOURCE_PREFIX}{driver}"),
                gpus: 1.0,
                join: uuid.map_or(DraJoin::None, DraJoin::Whole),
                off_node,
            },
            DraDeviceKind::Mig => {
                let parent = self.slices.slices_of(product.as_deref());
                Described {
                    resource: mig_resource(driver, profile.as_deref()),
                    gpus: mig_gpus(profile.as_deref(), parent),
                    join: uuid.map_or(DraJoin::None, DraJoin::Mig),
                    off_node,
                }
            }
        }
    }

    /// Devices an unallocated claim asks for, of GPU device classes (or with selectors that
    /// name a counted driver): (pseudo resource, devices, GPU equivalents).
    fn requested(&self, rc: &ResourceClaimInfo) -> Vec<(String, u64, f64)> {
        let mut out = Vec::new();
        for r in &rc.requests {
            let class = self.classes.get(r.device_class.as_str()).copied();
            let Some(driver) = class
                .into_iter()
                .flat_map(|c| c.drivers.iter())
                .chain(&r.drivers)
                .find(|d| self.names.is_gpu_driver(d))
            else {
                continue;
            };
            let mig = r.mig || class.is_some_and(|c| c.mig);
            let (resource, per_device) = if mig {
                let parent = r.profile.as_deref().map_or(7, unplaced_parent_slices);
                (
                    mig_resource(driver, r.profile.as_deref()),
                    mig_gpus(r.profile.as_deref(), parent),
                )
            } else {
                (format!("{DRA_RESOURCE_PREFIX}{driver}"), 1.0)
            };
            out.push((resource, r.count, per_device * r.count as f64));
        }
        out
    }

    /// Physical GPUs the counted drivers publish on `node`, and their UUIDs: each distinct GPU
    /// once (a MIG device is part of its parent, which the driver may publish as well).
    pub(super) fn node_gpus(&self, node: &str) -> (usize, Vec<&'a str>) {
        let mut uuids: Vec<&str> = Vec::new();
        let mut anonymous = 0usize;
        for d in self.devices.values() {
            if d.node.as_deref() != Some(node) {
                continue;
            }
            let physical = match d.kind {
                DraDeviceKind::Gpu => d.uuid.as_deref(),
                DraDeviceKind::Mig => d.parent_uuid.as_deref(),
            };
            match (physical, d.kind) {
                (Some(u), _) => uuids.push(u),
                (None, DraDeviceKind::Gpu) => anonymous += 1,
                // A MIG device without its parent's UUID: its GPU cannot be told apart.
                (None, DraDeviceKind::Mig) => {}
            }
        }
        uuids.sort_unstable();
        uuids.dedup();
        (uuids.len() + anonymous, uuids)
    }
}

/// What DRA offers pending pods' extended resources (KEP-5004) on each node, for the reclaim
/// planner: on a node that does not advertise an extended resource itself (no device plugin for
/// it), the scheduler serves it with devices of the DeviceClass naming it.
///
/// A class naming the resource in `extendedResourceName` serves it (of two, the newer; the
/// name breaks a tie, as the scheduler's extended-resource cache picks); any class serves its
/// implicit `deviceclass.resource.kubernetes.io/<class>`. A device belongs to a class when its
/// driver is one the class's selectors name and its kind (whole GPU or MIG) is the class's:
/// CEL selectors are not evaluated beyond that. Only whole-GPU classes are planned (a MIG
/// class's profile is not known from the resource name).
pub(super) struct ExtendedDevices<'a> {
    classes: &'a [DeviceClassInfo],
    /// Whole-GPU devices of the current generation per (node, driver): published, held by an
    /// allocated claim.
    per_node: HashMap<(&'a str, &'a str), (u64, u64)>,
}

/// DRA devices that can serve one extended resource on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExtendedSupply {
    /// The pseudo resource holders hold them under (`dra:<driver>`).
    pub held_as: String,
    /// Devices published on the node.
    pub devices: u64,
    /// Of those, devices an allocated claim holds.
    pub allocated: u64,
}

impl<'a> ExtendedDevices<'a> {
    /// From the claims' slices, claims and classes (their devices are of the counted drivers
    /// already: the projections keep no other).
    pub(super) fn new(c: &'a Claims) -> Self {
        let mut per_node: HashMap<(&str, &str), (u64, u64)> = HashMap::new();
        let mut whole: HashMap<DeviceRef<'a>, &'a str> = HashMap::new();
        for (key, d) in current_devices(c) {
            if let (DraDeviceKind::Gpu, Some(node)) = (d.kind, d.node.as_deref()) {
                whole.insert(key, node);
                let e = per_node.entry((node, d.driver.as_str())).or_default();
                e.0 = e.0.saturating_add(1);
            }
        }
        let mut held: HashSet<DeviceRef<'_>> = HashSet::default();
        for a in c
            .resource_claims
            .iter()
            .flat_map(|rc| rc.allocated.iter().flatten())
        {
            let key = (a.driver.as_str(), a.pool.as_str(), a.device.as_str());
            if let (Some(node), true) = (whole.get(&key), held.insert(key)) {
                let e = per_node.entry((node, a.driver.as_str())).or_default();
                e.1 = e.1.saturating_add(1);
            }
        }
        ExtendedDevices {
            classes: &c.device_classes,
            per_node,
        }
    }

    /// The class that serves extended resource `resource`, if any.
    fn class_of(&self, resource: &str) -> Option<&'a DeviceClassInfo> {
        if let Some(name) = resource.strip_prefix(IMPLICIT_EXTENDED_PREFIX) {
            return self.classes.iter().find(|c| c.name == name);
        }
        self.classes
            .iter()
            .filter(|c| c.extended_resource_name.as_deref() == Some(resource))
            // Newest first; of two made at once, the lower name (`max_by` keeps the last max).
            .max_by(|a, b| {
                a.created_at
                    .cmp(&b.created_at)
                    .then_with(|| b.name.cmp(&a.name))
            })
    }

    /// What DRA offers `resource` on `node`: `None` when no whole-GPU class serves it or none
    /// of the class's devices is published there.
    pub(super) fn on_node(&self, node: &str, resource: &str) -> Option<ExtendedSupply> {
        let class = self.class_of(resource).filter(|c| !c.mig)?;
        class.drivers.iter().find_map(|driver| {
            let (devices, allocated) = *self.per_node.get(&(node, driver.as_str()))?;
            Some(ExtendedSupply {
                held_as: format!("{DRA_RESOURCE_PREFIX}{driver}"),
                devices,
                allocated,
            })
        })
    }
}

struct Described {
    resource: String,
    gpus: f64,
    join: DraJoin,
    off_node: bool,
}

fn mig_resource(driver: &str, profile: Option<&str>) -> String {
    match profile {
        Some(p) => format!("{DRA_RESOURCE_PREFIX}{driver}/mig-{p}"),
        None => format!("{DRA_RESOURCE_PREFIX}{driver}/mig"),
    }
}

/// g / S of a MIG profile; 0 when the profile is unknown (its size is never guessed).
fn mig_gpus(profile: Option<&str>, parent: u8) -> f64 {
    profile.and_then(profile_slices).map_or(0.0, |g| {
        f64::from(g.min(parent.max(1))) / f64::from(parent.max(1))
    })
}
