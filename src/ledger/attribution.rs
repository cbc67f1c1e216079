//! Attribution of DCGM devices to GPU pods, and the idle rules that depend on it.

use chrono::{DateTime, Utc};
// Seeded per process (pod names come from the cluster: no crafted collisions), and several times
// faster than SipHash on short keys; maps here are rebuilt on every ledger build.
use foldhash::HashMap;
use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::claims::{Claims, PodClaim, PodPhase};
use super::dra::{DraJoin, Held};
use super::model::{Attribution, PodRow, Policy, UnclaimedBusy, seconds};
use super::units::GpuResourceKind;
use super::usage::{DeviceUsage, OwnWindow, Usage, Workload};

/// Where pods and devices are: real node names, and the DaemonSet pods (dcgm-exporter runs as
/// one) by name and by IP, to resolve a device's node from the exporter that reported it.
pub(super) struct Locator<'a> {
    nodes: foldhash::HashSet<&'a str>,
    by_pod: HashMap<(&'a str, &'a str), &'a str>,
    /// Daemon pod name → node, for names that are unique across namespaces (`None` otherwise).
    by_name: HashMap<&'a str, Option<&'a str>>,
    by_ip: HashMap<&'a str, &'a str>,
}

impl<'a> Locator<'a> {
    pub(super) fn new(claims: &'a Claims) -> Self {
        // Another shard's node is a node too: a device there is placed on it (and left to that
        // shard), not taken for one on no node.
        let nodes = claims
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .chain(claims.other_shards_nodes.iter().map(String::as_str))
            .collect();
        let mut by_pod = HashMap::default();
        let mut by_name: HashMap<&str, Option<&str>> = HashMap::default();
        let mut by_ip = HashMap::default();
        for d in &claims.daemon_pods {
            by_pod.insert((d.namespace.as_str(), d.name.as_str()), d.node.as_str());
            by_name
                .entry(d.name.as_str())
                .and_modify(|n| {
                    if *n != Some(d.node.as_str()) {
                        *n = None;
                    }
                })
                .or_insert(Some(d.node.as_str()));
            if let Some(ip) = d.ip.as_deref() {
                by_ip.insert(ip, d.node.as_str());
            }
        }
        Locator {
            nodes,
            by_pod,
            by_name,
            by_ip,
        }
    }

    /// Whether a workload label names a DaemonSet pod — the exporter itself, e.g. its target
    /// labels kept under `honor_labels` on a device no pod holds: never a GPU holder.
    fn is_daemon(&self, w: &Workload) -> bool {
        self.by_pod
            .contains_key(&(w.namespace.as_str(), w.pod.as_str()))
    }

    /// The node of a device, from what is reliable first: the exporter pod (target labels, or a
    /// workload label naming it), the scrape address (`instance` → pod IP), then `Hostname` when
    /// it names a real node or a DaemonSet pod (dcgm-exporter without `NODE_NAME` reports its
    /// own pod name, dcgm-exporter#188). `None` rather than a name that is no node.
    pub(super) fn node_of(&self, d: &DeviceUsage) -> Option<&'a str> {
        let exporter = d.exporter.iter().chain(&d.workloads).find_map(|w| {
            self.by_pod
                .get(&(w.namespace.as_str(), w.pod.as_str()))
                .copied()
        });
        let by_address = || {
            let instance = d.instance.as_deref()?;
            let host = instance
                .rsplit_once(':')
                .map_or(instance, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            self.by_ip.get(host).copied()
        };
        let by_hostname = || {
            let h = d.hostname.as_deref()?;
            self.nodes
                .get(h)
                .copied()
                .or_else(|| self.by_name.get(h).copied().flatten())
        };
        exporter
            .or_else(by_address)
            .or_else(by_hostname)
            .filter(|n| self.nodes.contains(n))
    }
}

/// Device ids of one workload or pod: nearly always one or two, kept inline (a heap `Vec` per
/// entry was one allocation per pod in every `ledger::build`, docs/benchmarks.md).
type DeviceIds = SmallVec<[usize; 2]>;

/// Devices by the workloads they name and by the node they are on.
pub(super) struct DeviceIndex<'a> {
    by_workload: HashMap<(&'a str, &'a str), DeviceIds>,
    by_node: HashMap<&'a str, Vec<usize>>,
    /// The resolved node of each device.
    node_of: Vec<Option<&'a str>>,
    /// Pods each device names (DaemonSet pods left out).
    holders: Vec<usize>,
    /// Whole-GPU series of a MIG-enabled GPU (no `GPU_I_ID`) whose instances are reported too:
    /// the parent and its instances are one piece of work, never counted twice.
    mig_parent: Vec<bool>,
    /// Whole GPUs by UUID and MIG instances by MIG UUID (`dra_mig_device_uuid`), for devices
    /// handed out through DRA; empty unless a claim can hold one.
    by_uuid: HashMap<&'a str, usize>,
    by_mig_uuid: HashMap<&'a str, usize>,
}

impl<'a> DeviceIndex<'a> {
    pub(super) fn new(usage: &'a Usage, locator: &Locator<'a>, by_uuid: bool) -> Self {
        let n = usage.devices.len();
        let mut by_workload: HashMap<(&str, &str), DeviceIds> =
            HashMap::with_capacity_and_hasher(n, RandomState::default());
        let mut by_node: HashMap<&str, Vec<usize>> = HashMap::default();
        let mut node_of = Vec::with_capacity(n);
        let mut holders = Vec::with_capacity(n);
        for (i, d) in usage.devices.iter().enumerate() {
            let per_pod = d.per_pod_utilization.iter().map(|(w, _)| w);
            let mut seen: SmallVec<[&Workload; 4]> = SmallVec::new();
            for w in d.workloads.iter().chain(per_pod) {
                if !seen.contains(&w) && !locator.is_daemon(w) {
                    seen.push(w);
                    by_workload
                        .entry((w.namespace.as_str(), w.pod.as_str()))
                        .or_default()
                        .push(i);
                }
            }
            holders.push(d.workloads.iter().filter(|w| !locator.is_daemon(w)).count());
            let node = locator.node_of(d);
            if let Some(n) = node {
                by_node.entry(n).or_default().push(i);
            }
            node_of.push(node);
        }
        let with_instances: foldhash::HashSet<&str> = usage
            .devices
            .iter()
            .filter(|d| d.key.gpu_instance.is_some())
            .map(|d| d.key.uuid.as_str())
            .collect();
        let mig_parent = usage
            .devices
            .iter()
            .map(|d| d.key.gpu_instance.is_none() && with_instances.contains(d.key.uuid.as_str()))
            .collect();
        let mut uuids = HashMap::default();
        let mut mig_uuids = HashMap::default();
        if by_uuid {
            for (i, d) in usage.devices.iter().enumerate() {
                match (&d.key.gpu_instance, &d.mig_uuid) {
                    (None, _) => {
                        uuids.insert(d.key.uuid.as_str(), i);
                    }
                    (Some(_), Some(m)) => {
                        mig_uuids.insert(m.as_str(), i);
                    }
                    (Some(_), None) => {}
                }
            }
        }
        DeviceIndex {
            by_workload,
            by_node,
            node_of,
            holders,
            mig_parent,
            by_uuid: uuids,
            by_mig_uuid: mig_uuids,
        }
    }

    /// The whole-GPU DCGM device of `uuid` (indexed only when built with `by_uuid`).
    pub(super) fn whole_gpu(&self, uuid: &str) -> Option<usize> {
        self.by_uuid.get(uuid).copied()
    }

    /// The DCGM device of a DRA device, if DCGM reports it.
    fn find(&self, join: &DraJoin) -> Option<usize> {
        match join {
            DraJoin::Whole(u) => self.by_uuid.get(u.as_str()).copied(),
            DraJoin::Mig(m) => self.by_mig_uuid.get(m.as_str()).copied(),
            DraJoin::None => None,
        }
    }
}

impl DeviceIndex<'_> {
    /// Physical GPUs (distinct UUIDs, MIG instances folded) DCGM reports on `node`.
    pub(super) fn physical_gpus_on(&self, node: &str, usage: &Usage) -> usize {
        let mut uuids: Vec<&str> = self
            .by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|&i| usage.devices[i].key.uuid.as_str())
            .collect();
        uuids.sort_unstable();
        uuids.dedup();
        uuids.len()
    }

    /// The GPU model DCGM's `modelName` names on `node`, for MIG slice counts where no GFD label
    /// names one: the model of the node's MIG instances when they agree, else the one model of
    /// all its GPUs; `None` when DCGM names none or several.
    pub(super) fn dcgm_model_on<'u>(&self, node: &str, usage: &'u Usage) -> Option<&'u str> {
        let ids = self.by_node.get(node)?;
        let one = |mig: bool| {
            let mut models = ids
                .iter()
                .map(|&i| &usage.devices[i])
                .filter(|d| !mig || d.key.gpu_instance.is_some())
                .map(|d| d.model.as_deref());
            let first = models.next()??;
            models.all(|m| m == Some(first)).then_some(first)
        };
        one(true).or_else(|| one(false))
    }

    /// The GPU slices of every MIG instance DCGM reports on `node`, when every device it reports
    /// there is a MIG instance (or the whole-GPU series of one) and all instances have one
    /// profile: what each `nvidia.com/gpu` unit is under the MIG *single* strategy on a node
    /// whose strategy no GFD label names. `None` otherwise (a whole GPU among them: not single).
    pub(super) fn dcgm_single_mig_slices_on(&self, node: &str, usage: &Usage) -> Option<u8> {
        let ids = self.by_node.get(node)?;
        let mut slices = None;
        for &i in ids {
            let d = &usage.devices[i];
            if self.mig_parent[i] {
                continue;
            }
            d.key.gpu_instance.as_ref()?;
            let g = super::units::profile_slices(d.mig_profile.as_deref()?)?;
            if *slices.get_or_insert(g) != g {
                return None;
            }
        }
        slices
    }

    /// UUIDs of the physical GPUs DCGM reports on `node` (with repeats).
    pub(super) fn uuids_on<'u>(&self, node: &str, usage: &'u Usage) -> Vec<&'u str> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|&i| usage.devices[i].key.uuid.as_str())
            .collect()
    }
}

/// Devices a pod's claim implies: whole units for whole GPUs, one per MIG unit; 0 when unknown.
fn expected_devices(p: &PodClaim, policy: &Policy) -> usize {
    p.resources
        .iter()
        .filter_map(|(name, units)| match policy.names.classify(name) {
            Some(GpuResourceKind::Whole | GpuResourceKind::Extra | GpuResourceKind::Mig { .. }) => {
                Some(*units as usize)
            }
            Some(GpuResourceKind::Shared) => Some(1),
            None => None,
        })
        .sum()
}

/// Idle verdict over a set of devices: `Some(true)` only with full, fresh coverage below threshold.
pub(super) fn verdict(devs: &[&DeviceUsage], policy: &Policy, now: DateTime<Utc>) -> Option<bool> {
    if devs.is_empty() {
        return None;
    }
    if devs
        .iter()
        .any(|d| d.peak.is_some_and(|p| p >= policy.idle_threshold))
    {
        return Some(false);
    }
    let proven = devs.iter().all(|d| {
        d.peak.is_some_and(|p| p < policy.idle_threshold)
            && d.coverage >= policy.min_coverage
            && d.last_sample_at
                .is_some_and(|t| now - t <= policy.max_staleness)
    });
    proven.then_some(true)
}

/// Idle verdict of one sharer from its own per-process readings (`own[k]` on `devs[k]`):
/// `Some(false)` when its own processes were busy; `Some(true)` only with full, fresh own
/// coverage below the threshold on every device, and where a device was busy, a neighbour's own
/// readings busy too (the device's activity is theirs). Busy device-wide signals are then not
/// this pod's: the two measuring different things is no conflict. Busy with no sharer's own
/// reading busy is activity nobody's processes account for (a process outside the pods, or NVML
/// sampling nothing): unknown, never idle.
fn own_verdict(
    devs: &[&DeviceUsage],
    own: &[&OwnWindow],
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<bool> {
    if own
        .iter()
        .any(|o| o.peak.is_some_and(|p| p >= policy.idle_threshold))
    {
        return Some(false);
    }
    let covered = own.iter().all(|o| {
        o.peak.is_some_and(|p| p < policy.idle_threshold)
            && o.coverage >= policy.min_coverage
            && o.last_sample_at
                .is_some_and(|t| now - t <= policy.max_staleness)
    });
    let explained = devs.iter().zip(own).all(|(d, me)| {
        d.peak.is_some_and(|p| p < policy.idle_threshold)
            || d.per_pod_windows.iter().any(|o| {
                o.workload != me.workload && o.peak.is_some_and(|p| p >= policy.idle_threshold)
            })
    });
    (covered && explained).then_some(true)
}

/// Fills attribution, utilisation, memory, idle and evidence of a pod that holds GPUs (through
/// its resources and the DRA devices it `held`).
#[allow(clippy::too_many_arguments)]
pub(super) fn attribute(
    row: &mut PodRow,
    p: &PodClaim,
    held: &[Held],
    index: &DeviceIndex<'_>,
    usage: &Usage,
    now: DateTime<Utc>,
    policy: &Policy,
    claimed: &mut [bool],
) {
    attribute_devices(row, p, held, index, usage, now, policy, claimed);
    // A pod whose node stopped reporting (phase Unknown) may be gone or running anything: its
    // GPUs are unknown, never idle. A partial answer may lack the busy samples: the same.
    if (p.phase == PodPhase::Unknown || usage.partial) && row.idle == Some(true) {
        row.idle = None;
        row.idle_seconds = None;
        row.evidence.idle_since = None;
    }
}

#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
fn attribute_devices(
    row: &mut PodRow,
    p: &PodClaim,
    held: &[Held],
    index: &DeviceIndex<'_>,
    usage: &Usage,
    now: DateTime<Utc>,
    policy: &Policy,
    claimed: &mut [bool],
) {
    let time_sliced = row.evidence.time_sliced;
    row.evidence.devices_expected = expected_devices(p, policy).saturating_add(held.len());
    if !usage.available {
        row.attribution = Attribution::Unattributed;
        return;
    }
    let named: &[usize] = index
        .by_workload
        .get(&(p.namespace.as_str(), p.name.as_str()))
        .map_or(&[], SmallVec::as_slice);
    // DRA devices join by UUID as well: the exporter names the pod only with
    // `--kubernetes-enable-dra`, and a device shared by a claim's pods names all of them.
    let owned;
    let ids: &[usize] = if held.is_empty() {
        named
    } else {
        let mut all = named.to_vec();
        for i in held.iter().filter_map(|h| index.find(&h.join)) {
            if !all.contains(&i) {
                all.push(i);
            }
        }
        owned = all;
        &owned
    };
    let dra_shared = held.iter().any(|h| h.shared);
    for &i in ids {
        claimed[i] = true;
    }
    // A MIG GPU's whole-GPU series next to one of its instances' is the same work: count the
    // instance only.
    let instance_of = |i: usize| {
        ids.iter().any(|&j| {
            usage.devices[j].key.gpu_instance.is_some()
                && usage.devices[j].key.uuid == usage.devices[i].key.uuid
        })
    };
    let devs: SmallVec<[&DeviceUsage; 8]> = ids
        .iter()
        .filter(|&&i| !(index.mig_parent[i] && instance_of(i)))
        .map(|&i| &usage.devices[i])
        .collect();
    row.devices = devs.iter().map(|d| d.key.clone()).collect();
    row.evidence.devices_found = devs.len();

    if devs.is_empty() {
        // A time-sliced sharer that no series pins (the exporter's default labels one pod per
        // GPU, or none): it may be on any GPU of its node, so those GPUs are claimed, and it is
        // idle only when every one of them is idle.
        let host_ids: &[usize] = p
            .node
            .as_deref()
            .and_then(|n| index.by_node.get(n))
            .map_or(&[], Vec::as_slice);
        let host_devs: SmallVec<[&DeviceUsage; 8]> =
            host_ids.iter().map(|&i| &usage.devices[i]).collect();
        if time_sliced && !host_devs.is_empty() {
            for &i in host_ids {
                claimed[i] = true;
            }
            row.attribution = Attribution::Shared;
            if verdict(&host_devs, policy, now) == Some(true) {
                row.idle = Some(true);
                set_idle_since(row, &host_devs, now);
            }
        } else {
            row.attribution = Attribution::Unattributed;
        }
        return;
    }

    let mig = devs.iter().any(|d| d.key.gpu_instance.is_some());
    let crowded = ids.iter().any(|&i| index.holders[i] > 1);
    row.attribution = if mig {
        Attribution::Mig
    } else if time_sliced
        || crowded
        || dra_shared
        || devs.iter().any(|d| !d.per_pod_utilization.is_empty())
    {
        Attribution::Shared
    } else {
        Attribution::Exclusive
    };
    set_window_evidence(
        row,
        devs.iter().map(|d| (d.coverage, d.last_sample_at, d.peak)),
    );

    match row.attribution {
        Attribution::Exclusive | Attribution::Mig => {
            let utils: Option<Vec<f64>> = devs.iter().map(|d| d.utilization).collect();
            row.utilization = utils
                .filter(|u| !u.is_empty())
                .map(|u| u.iter().sum::<f64>() / u.len() as f64);
            let mem: Option<Vec<f64>> = devs.iter().map(|d| d.memory_used_bytes).collect();
            row.memory_used_bytes = mem.map(|m| m.iter().sum());
            let complete = devs.len() >= row.evidence.devices_expected;
            row.idle = if complete {
                verdict(&devs, policy, now)
            } else {
                verdict(&devs, policy, now).filter(|v| !v)
            };
        }
        Attribution::Shared => {
            let me = |w: &Workload| w.namespace == p.namespace && w.pod == p.name;
            let own: Vec<f64> = devs
                .iter()
                .filter_map(|d| {
                    d.per_pod_utilization
                        .iter()
                        .find(|(w, _)| me(w))
                        .map(|(_, v)| *v)
                })
                .collect();
            row.utilization = (!own.is_empty() && own.len() == devs.len())
                .then(|| own.iter().sum::<f64>() / own.len() as f64);
            // Memory: the pod's own per-process framebuffer, never the device's.
            let own_mem: Vec<f64> = devs
                .iter()
                .filter_map(|d| {
                    d.per_pod_memory_bytes
                        .iter()
                        .find(|(w, _)| me(w))
                        .map(|(_, v)| *v)
                })
                .collect();
            row.memory_used_bytes =
                (!own_mem.is_empty() && own_mem.len() == devs.len()).then(|| own_mem.iter().sum());
            // With per-process readings on every device, the sharer is judged by its own
            // processes. Otherwise an idle device proves every sharer idle, and a busy one proves
            // nothing about this pod unless its own current reading is busy.
            let own: Option<SmallVec<[&OwnWindow; 8]>> = devs
                .iter()
                .map(|d| d.per_pod_windows.iter().find(|o| me(&o.workload)))
                .collect();
            if let Some(own) = own {
                row.idle = own_verdict(&devs, &own, policy, now);
                match row.idle {
                    Some(true) => set_idle_since_from(
                        row,
                        own.iter().map(|o| (o.last_active_at, o.covered_since)),
                        now,
                    ),
                    Some(false) => row.idle_seconds = Some(0.0),
                    None => {}
                }
                return;
            }
            row.idle = match verdict(&devs, policy, now) {
                Some(true) => Some(true),
                _ if row.utilization.is_some_and(|u| u >= policy.idle_threshold) => Some(false),
                _ => None,
            };
        }
        Attribution::Unattributed | Attribution::None => {}
    }
    match row.idle {
        Some(true) => set_idle_since(row, &devs, now),
        Some(false) => row.idle_seconds = Some(0.0),
        None => {}
    }
}

/// A row's window evidence from its readings (coverage, newest sample, peak per device or
/// container): the lowest coverage (`None` without readings), the oldest of the newest samples
/// and the highest peak (each `None` as soon as one reading's is unknown; no readings: no newest
/// sample, peak 0).
pub(super) fn set_window_evidence(
    row: &mut PodRow,
    readings: impl IntoIterator<Item = (f64, Option<DateTime<Utc>>, Option<f64>)>,
) {
    let mut coverage: Option<f64> = None;
    let mut newest: Option<Option<DateTime<Utc>>> = None;
    let mut peak = Some(0.0_f64);
    for (c, last, p) in readings {
        coverage = Some(coverage.map_or(c, |m| m.min(c)));
        newest = Some(match newest {
            None => last,
            Some(n) => n.zip(last).map(|(a, b)| a.min(b)),
        });
        peak = peak.zip(p).map(|(m, p)| m.max(p));
    }
    row.evidence.coverage = coverage;
    row.evidence.newest_sample_at = newest.flatten();
    row.evidence.peak = peak;
}

/// Idle since the latest of: pod start, last activity, start of unbroken coverage. When the
/// coverage start wins, the idleness may reach further back than the history shows.
pub(super) fn set_idle_since(row: &mut PodRow, devs: &[&DeviceUsage], now: DateTime<Utc>) {
    set_idle_since_from(
        row,
        devs.iter().map(|d| (d.last_active_at, d.covered_since)),
        now,
    );
}

/// [`set_idle_since`] over `(last active, covered since)` pairs: the devices' or a sharer's own.
fn set_idle_since_from(
    row: &mut PodRow,
    evidence: impl Iterator<Item = (Option<DateTime<Utc>>, Option<DateTime<Utc>>)>,
    now: DateTime<Utc>,
) {
    let latest = |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| a.max(b);
    let mut known = row.evidence.started_at;
    let mut covered = None;
    for (active, since) in evidence {
        known = latest(known, active);
        covered = latest(covered, since);
    }
    let since = latest(known, covered);
    row.evidence.idle_bounded_by_history = covered.is_some_and(|c| known.is_none_or(|k| c > k));
    row.evidence.idle_since = since;
    row.idle_seconds = since.map(|s| seconds(now - s).max(0.0));
}

/// Busy devices that no claim on their node could own: not named by a holder, not pinned to
/// time-sliced sharers by node, and on a node (or, unresolved, in a cluster) where every holder's
/// devices are accounted for. Such a GPU is working outside the scheduler's books.
pub(super) fn unclaimed_busy(
    usage: &Usage,
    index: &DeviceIndex<'_>,
    claimed: &[bool],
    pods: &[PodRow],
    policy: &Policy,
) -> Vec<UnclaimedBusy> {
    // Nodes with a holder whose claim names more devices than were found for it: an unlabelled
    // busy device there may well be that holder's.
    let mut open_claims: foldhash::HashSet<&str> = foldhash::HashSet::default();
    for p in pods.iter().filter(|p| p.state.holds()) {
        if p.evidence.devices_found < p.evidence.devices_expected
            || p.attribution == Attribution::Unattributed
        {
            open_claims.insert(p.node.as_deref().unwrap_or(""));
        }
    }
    // A MIG GPU's whole-GPU series and its instances' are one piece of work: the instances are
    // listed; the parent only when none of its instances is claimed or has a reading.
    let instances_speak = |parent: &DeviceUsage| {
        usage.devices.iter().enumerate().any(|(j, d)| {
            d.key.gpu_instance.is_some()
                && d.key.uuid == parent.key.uuid
                && (claimed[j] || d.utilization.is_some())
        })
    };
    let mut out: Vec<UnclaimedBusy> = usage
        .devices
        .iter()
        .enumerate()
        .filter(|(i, d)| !claimed[*i] && d.utilization.is_some_and(|u| u >= policy.idle_threshold))
        .filter(|(i, d)| !(index.mig_parent[*i] && instances_speak(d)))
        .filter(|(i, _)| match index.node_of[*i] {
            Some(node) => !open_claims.contains(node),
            None => open_claims.is_empty(),
        })
        .map(|(i, d)| UnclaimedBusy {
            node: index.node_of[i].map(str::to_string),
            uuid: d.key.uuid.clone(),
            gpu_instance: d.key.gpu_instance.clone(),
            utilization: d.utilization.unwrap_or_default(),
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.node, &a.uuid, &a.gpu_instance).cmp(&(&b.node, &b.uuid, &b.gpu_instance))
    });
    out
}
