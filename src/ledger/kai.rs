//! KAI-Scheduler GPU fractions: the card a reservation pod holds, handed to the pods that share it.
//!
//! KAI's binder places a fractional pod (annotation `gpu-fraction` or `gpu-memory`, no
//! `nvidia.com/gpu`) on a card by running a reservation pod in its own namespace that asks the
//! device plugin for one whole `nvidia.com/gpu`; the reservation pod and its users carry the same
//! `runai-gpu-group` label, and the reservation pod records the card's UUID in
//! `run.ai/reserve_for_gpu_index` (a UUID despite the name). Sources: kai-scheduler/KAI-Scheduler
//! `pkg/binder/binding/resourcereservation/resource_reservation.go`, `docs/gpu-sharing/README.md`.
//!
//! Rule: each user holds its share of the card (`gpu-fraction`, or `gpu-memory` ÷ the node's
//! `nvidia.com/gpu.memory`; unknown when neither gives one, never guessed), scaled down together
//! when the shares add up to more than the card; the reservation pod keeps only what no user holds.
//! A user is proven idle only when the whole card is (its readings are the card's, never the
//! user's own); a busy card proves nothing about any one user.

use smallvec::SmallVec;

use super::attribution::DeviceIndex;
use super::claims::{Claims, GPU_MEMORY_LABEL, PodClaim, PodPhase};
use super::kai_pod::{FRACTION_ANNOTATION, FRACTION_RESOURCE, KaiPod, MEMORY_ANNOTATION};
use super::model::{Attribution, PodRow, Policy, Sharing};
use super::usage::{DeviceUsage, Usage};
use chrono::{DateTime, Utc};

/// The card memory of `node` in MiB from GFD's label, when it is a plausible number.
fn card_mib(claims: &Claims, node: Option<&str>) -> Option<u64> {
    let node = node?;
    claims
        .nodes
        .iter()
        .find(|n| n.name == node)?
        .gpu_labels
        .get(GPU_MEMORY_LABEL)?
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|m| *m > 0)
}

/// The share of one card a user asks for, or why it is unknown.
fn requested_share(k: &KaiPod, card_mib: Option<u64>) -> Result<f64, String> {
    if !k.invalid.is_empty() {
        return Err(format!(
            "annotation not understood: {}",
            k.invalid.join(", ")
        ));
    }
    if let Some(f) = k.fraction {
        return Ok(f);
    }
    match (k.memory_mib, card_mib) {
        (Some(m), Some(card)) => Ok((m as f64 / card as f64).min(1.0)),
        (Some(_), None) => Err(format!(
            "share unknown: {MEMORY_ANNOTATION} without the node's {GPU_MEMORY_LABEL} label"
        )),
        (None, _) => Err(format!(
            "share unknown: no {FRACTION_ANNOTATION} or {MEMORY_ANNOTATION} annotation"
        )),
    }
}

/// A user's row, the reservation of each of its groups, and the share it asks per card.
type Ask = (usize, SmallVec<[Option<usize>; 2]>, Result<f64, String>);

/// One reservation pod: its row, group, card and what its users were handed.
struct Reservation<'a> {
    row: usize,
    group: &'a str,
    uuid: Option<&'a str>,
    node: Option<&'a str>,
    /// Sum of the users' requested shares, and how many users.
    requested: f64,
    users: usize,
}

/// Whether `ns` holds KAI's reservation pods under `policy`.
pub fn is_reservation_namespace(policy: &Policy, ns: &str) -> bool {
    policy.kai_reservation_namespaces.iter().any(|n| n == ns)
}

/// Whether any pod carries KAI fraction data (the rule costs nothing otherwise).
pub(super) fn active(claims: &Claims) -> bool {
    claims.pods.iter().any(|p| p.kai.is_some())
}

/// What the KAI rule reads besides the claims: DCGM's devices (indexed by UUID), at `now`.
pub(super) struct Reads<'r, 'a> {
    pub index: &'r DeviceIndex<'a>,
    pub usage: &'r Usage,
    pub now: DateTime<Utc>,
    pub policy: &'r Policy,
}

impl<'r, 'a> Reads<'r, 'a> {
    pub(super) fn new(
        index: &'r DeviceIndex<'a>,
        usage: &'r Usage,
        now: DateTime<Utc>,
        policy: &'r Policy,
    ) -> Self {
        Reads {
            index,
            usage,
            now,
            policy,
        }
    }
}

/// Hands each reservation pod's card to its users in `pods` (the ledger's rows, with `claim_of`
/// their claims in the same order), and judges the users' idleness by the card; the cards found
/// are marked in `claimed` (no card of a reservation is unclaimed busy).
pub(super) fn distribute(
    claims: &Claims,
    pods: &mut [PodRow],
    claim_of: &[&PodClaim],
    reads: &Reads<'_, '_>,
    claimed: &mut [bool],
) {
    let Reads {
        index,
        usage,
        now,
        policy,
    } = *reads;
    let mut reservations: Vec<Reservation<'_>> = Vec::new();
    for (i, (row, p)) in pods.iter().zip(claim_of).enumerate() {
        let Some(k) = &p.kai else { continue };
        if !row.state.holds() || !is_reservation_namespace(policy, &row.namespace) {
            continue;
        }
        for g in &k.groups {
            reservations.push(Reservation {
                row: i,
                group: g,
                uuid: k.reserved_uuid.as_deref(),
                node: p.node.as_deref(),
                requested: 0.0,
                users: 0,
            });
        }
    }
    let find = |group: &str, node: Option<&str>, rs: &[Reservation<'_>]| {
        rs.iter()
            .position(|r| r.group == group && node.is_some() && r.node == node)
    };
    // First pass: what each user (row) asks of each card (its reservations, `None` where none).
    let mut asks: Vec<Ask> = Vec::new();
    for (i, (row, p)) in pods.iter().zip(claim_of).enumerate() {
        let Some(k) = &p.kai else { continue };
        // A fraction user asks for no GPU resource of its own (KAI refuses one that does); a pod
        // that holds one outside the reservation namespaces keeps it as any holder does.
        if is_reservation_namespace(policy, &row.namespace) || !p.resources.is_empty() {
            continue;
        }
        let share = requested_share(k, card_mib(claims, p.node.as_deref()));
        let cards: SmallVec<[Option<usize>; 2]> = if row.state.holds() {
            k.groups
                .iter()
                .map(|g| find(g, p.node.as_deref(), &reservations))
                .collect()
        } else {
            SmallVec::new()
        };
        for r in cards.iter().flatten() {
            reservations[*r].users += 1;
            if let Ok(s) = share {
                reservations[*r].requested += s;
            }
        }
        asks.push((i, cards, share));
    }
    // Shares that add up to more than a card (KAI does not enforce memory isolation, and an
    // annotation is anyone's to write) are scaled down together, so a card is never held twice.
    let scale = |r: &Reservation<'_>| {
        if r.requested > 1.0 {
            1.0 / r.requested
        } else {
            1.0
        }
    };
    let card_dev = |r: &Reservation<'_>| card_device(r, &pods[r.row], index, usage);
    let cards: Vec<Option<usize>> = reservations.iter().map(card_dev).collect();
    for (i, groups, share) in asks {
        let p = claim_of[i];
        let Some(k) = &p.kai else { continue };
        let row = &mut pods[i];
        let devices = u32::try_from(k.groups.len())
            .ok()
            .filter(|n| *n > 0)
            .or(k.num_devices)
            .unwrap_or(1);
        let mut unknown = share.clone().err();
        let per_device = share.as_ref().ok().copied();
        let (gpus, held) = if row.state.holds() {
            if groups.is_empty() || groups.iter().any(Option::is_none) {
                unknown.get_or_insert_with(|| "no reservation pod holds its card".to_string());
            }
            let held: Vec<usize> = groups.iter().flatten().copied().collect();
            let gpus = per_device.map_or(0.0, |s| {
                held.iter().map(|r| s * scale(&reservations[*r])).sum()
            });
            (gpus, held)
        } else {
            // Pending: demand of its share on as many cards as it asks for.
            (
                per_device.map_or(0.0, |s| s * f64::from(devices)),
                Vec::new(),
            )
        };
        row.gpus = gpus;
        row.gpus_by_resource = vec![(FRACTION_RESOURCE.to_string(), gpus)];
        row.sharing = Sharing::KaiFraction {
            share: per_device.map(|s| held.first().map_or(s, |r| s * scale(&reservations[*r]))),
            devices,
            gpu_memory_mib: k.memory_mib,
            uuids: held
                .iter()
                .filter_map(|r| reservations[*r].uuid.map(str::to_string))
                .collect(),
            unknown,
        };
        if row.state.holds() {
            judge_user(row, p, &held, &cards, usage, now, policy, claimed);
        }
    }
    for (r, dev) in reservations.iter().zip(&cards) {
        let row = &mut pods[r.row];
        let held = r.requested.min(1.0);
        let before = row.gpus;
        row.gpus = (before - held).max(0.0);
        let ratio = if before > 0.0 { row.gpus / before } else { 0.0 };
        for (_, g) in &mut row.gpus_by_resource {
            *g *= ratio;
        }
        row.sharing = Sharing::KaiReservation {
            group: r.group.to_string(),
            uuid: r.uuid.map(str::to_string),
            users: r.users,
            unassigned: row.gpus,
        };
        if let Some(i) = *dev {
            claimed[i] = true;
            // No series names the reservation pod (the exporter without pod labels): its card
            // is known by the UUID it recorded, and it is the device plugin's holder of it.
            if row.devices.is_empty() && usage.available {
                let d = &usage.devices[i];
                row.attribution = Attribution::Exclusive;
                row.utilization = d.utilization;
                row.memory_used_bytes = d.memory_used_bytes;
                row.evidence.devices_expected = 1;
                card_evidence(row, &[d], claim_of[r.row].phase, usage, now, policy);
                if super::attribution::verdict(&[d], policy, now) == Some(false) {
                    row.idle = Some(false);
                }
            }
        }
    }
}

/// The DCGM device of a reservation's card: by the UUID it recorded, else the one device that
/// names the reservation pod.
fn card_device(
    r: &Reservation<'_>,
    row: &PodRow,
    index: &DeviceIndex<'_>,
    usage: &Usage,
) -> Option<usize> {
    r.uuid.and_then(|u| index.whole_gpu(u)).or_else(|| {
        let [key] = row.devices.as_slice() else {
            return None;
        };
        usage.devices.iter().position(|d| d.key == *key)
    })
}

/// A user's attribution and idleness: its cards' readings, shared with every other user (an
/// idle card proves each user idle, a busy one proves nothing about this one).
#[allow(clippy::too_many_arguments)]
fn judge_user(
    row: &mut PodRow,
    p: &PodClaim,
    held: &[usize],
    cards: &[Option<usize>],
    usage: &Usage,
    now: DateTime<Utc>,
    policy: &Policy,
    claimed: &mut [bool],
) {
    if !usage.available {
        row.attribution = Attribution::Unattributed;
        return;
    }
    let ids: Option<SmallVec<[usize; 2]>> = held.iter().map(|r| cards[*r]).collect();
    let Some(ids) = ids.filter(|ids| !ids.is_empty()) else {
        row.attribution = Attribution::Unattributed;
        return;
    };
    let devs: SmallVec<[&DeviceUsage; 2]> = ids.iter().map(|&i| &usage.devices[i]).collect();
    for &i in &ids {
        claimed[i] = true;
    }
    row.attribution = Attribution::Shared;
    row.evidence.devices_expected = held.len();
    card_evidence(row, &devs, p.phase, usage, now, policy);
}

/// A row's devices, coverage, freshness and peak from its cards, and idle when they were idle
/// (never busy: the card's activity may be any holder's). A node that stopped reporting, or a
/// partial answer, proves nothing.
fn card_evidence(
    row: &mut PodRow,
    devs: &[&DeviceUsage],
    phase: PodPhase,
    usage: &Usage,
    now: DateTime<Utc>,
    policy: &Policy,
) {
    row.devices = devs.iter().map(|d| d.key.clone()).collect();
    row.evidence.devices_found = devs.len();
    super::attribution::set_window_evidence(
        row,
        devs.iter().map(|d| (d.coverage, d.last_sample_at, d.peak)),
    );
    let trusted = phase != PodPhase::Unknown && !usage.partial;
    if trusted && super::attribution::verdict(devs, policy, now) == Some(true) {
        row.idle = Some(true);
        super::attribution::set_idle_since(row, devs, now);
    }
}
