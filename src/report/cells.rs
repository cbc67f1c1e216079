//! The cell texts of a ledger shared by the table, the page, the advice and the showback table
//! (`gpus`, `percent`, `idle_for`, `note`, the quota and queue cells, the summary line); the
//! page's script (`page/page.js`) formats the same way, which the Chromium test checks.

use crate::ledger::claims::OwnerKind;
use crate::ledger::model::{Attribution, Ledger, PodRow, PodState, QueueRow, QuotaRow, Sharing};

/// The cells of a quota row (`quotas` of the JSON): namespace, resource, hard, used, busy,
/// idle; unknown is `?` (the page's script renders the same).
pub fn quota_cells(q: &QuotaRow) -> [String; 6] {
    let known = |v: Option<f64>| v.map_or_else(|| "?".into(), gpus);
    [
        q.namespace.clone(),
        q.resource.clone(),
        q.hard.to_string(),
        q.used.map_or_else(|| "?".into(), |u| u.to_string()),
        known(q.busy),
        known(q.idle),
    ]
}

/// The cells of a queue row (`queues` of the JSON): cluster queue, cohort, flavor, resource,
/// nominal, borrowing and lending limits (`-`: none), admitted, busy, idle (`?`: unknown),
/// pending workloads, oldest pending wait, and who it starves behind.
pub fn queue_cells(r: &QueueRow) -> [String; 13] {
    let units = |v: Option<u64>, none: &str| v.map_or_else(|| none.to_string(), |u| u.to_string());
    let known = |v: Option<f64>| v.map_or_else(|| "?".into(), gpus);
    [
        r.cluster_queue.clone(),
        r.cohort.clone().unwrap_or_else(|| "-".into()),
        r.flavor.clone(),
        r.resource.clone(),
        units(r.nominal, "?"),
        units(r.borrowing_limit, "-"),
        units(r.lending_limit, "-"),
        units(r.admitted, "?"),
        known(r.busy),
        known(r.idle),
        r.pending_workloads.to_string(),
        // Truncated to whole seconds, as the page's script does (`Math.trunc`).
        r.oldest_pending_seconds
            .map_or_else(|| "-".into(), |s| humanise_seconds(s as i64)),
        if r.starved_while_lender_idle {
            format!("starved: {} idle", r.idle_lenders.join(", "))
        } else {
            "-".into()
        },
    ]
}

/// Whether the ledger has anything for the "Quotas and queues" section.
pub fn has_quotas(l: &Ledger) -> bool {
    !l.quotas.is_empty() || !l.queues.is_empty() || !l.dra_claims_unquotaed.is_empty()
}

/// "2d3h", "3h12m", "45m", "30s" — the two most significant units.
pub fn humanise_seconds(secs: i64) -> String {
    let secs = secs.max(0);
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m")
    } else {
        format!("{s}s")
    }
}

/// 2^53: hundredths up to here are exact integers in an `f64` (and in the page's script).
const EXACT_HUNDREDTHS: f64 = 9_007_199_254_740_992.0;

/// GPU equivalents with up to two decimals, trailing zeros trimmed ("1", "0.43", "0.5").
///
/// Numbers past 2^53 hundredths (no cluster has 90 trillion GPUs, but a quota may say
/// `u64::MAX`) print as the `f64` they are, whole, as the page's script prints them: before,
/// a saturating cast and `abs` wrote `92233720368547758.07` and `--92233720368547758.-8`.
pub fn gpus(x: f64) -> String {
    // Halves away from zero, as the page's script rounds.
    let h = (x * 100.0).round();
    if h.abs() >= EXACT_HUNDREDTHS {
        return format!("{}", x.round());
    }
    // In range (NaN is 0): the cast is exact.
    let h = h as i64;
    let sign = if h < 0 { "-" } else { "" };
    let (whole, frac) = (h.unsigned_abs() / 100, h.unsigned_abs() % 100);
    match frac {
        0 => format!("{sign}{whole}"),
        f if f % 10 == 0 => format!("{sign}{whole}.{}", f / 10),
        f => format!("{sign}{whole}.{f:02}"),
    }
}

/// "1 GPU", "2 GPUs", "0.5 GPUs".
pub fn gpu_count(x: f64) -> String {
    let n = gpus(x);
    if n == "1" {
        "1 GPU".into()
    } else {
        format!("{n} GPUs")
    }
}

/// A 0..1 ratio as a whole percentage ("98%", "0%"), halves away from zero.
pub fn percent(ratio: f64) -> String {
    format!("{}%", (ratio * 100.0).round() as i64)
}

/// The IDLE FOR cell: `active`, a duration, `≥` a duration when the idleness reaches back to the
/// start of the history shown (it may be longer), or `-` when unknown.
pub fn idle_for(p: &PodRow) -> String {
    match (p.idle, p.idle_seconds) {
        (Some(false), _) => "active".into(),
        (_, Some(s)) if s <= 0.0 => "active".into(),
        (_, Some(s)) if p.evidence.idle_bounded_by_history => {
            format!("≥{}", humanise_seconds(s as i64))
        }
        (_, Some(s)) => humanise_seconds(s as i64),
        (_, None) => "-".into(),
    }
}

/// What the ledger noticed about a pod ("stuck terminating 3d", "pending 40m: …"), or empty.
pub fn note(p: &PodRow, usage_available: bool) -> String {
    let mut parts: Vec<String> = Vec::new();
    match p.state {
        PodState::Pending => {
            let mut s = match p.pending_seconds {
                Some(secs) => format!("pending {}", humanise_seconds(secs as i64)),
                None => "pending".into(),
            };
            if let Some(reason) = p.pending_reason.as_deref().filter(|r| !r.is_empty()) {
                s.push_str(": ");
                s.push_str(reason);
            }
            parts.push(s);
        }
        PodState::Terminating => {
            let age = p
                .terminating_seconds
                .map(|s| format!(" {}", humanise_seconds(s as i64)))
                .unwrap_or_default();
            parts.push(if p.stuck {
                format!("stuck terminating{age}")
            } else {
                format!("terminating{age}")
            });
        }
        PodState::Running => {}
    }
    match &p.sharing {
        Sharing::Hami {
            devices,
            readings_over_100,
            ..
        } => {
            let cards: Vec<String> = devices
                .iter()
                .map(|d| {
                    format!(
                        "{:.0}% of {} ({} MiB, {} cores)",
                        d.share * 100.0,
                        short_uuid(&d.uuid),
                        d.memory_mib,
                        d.cores
                    )
                })
                .collect();
            parts.push(format!("HAMi vGPU {}", cards.join(", ")));
            if *readings_over_100 {
                parts.push("HAMi utilisation read above 100% (clamped)".into());
            }
        }
        Sharing::HamiUnreadable { reason } => {
            parts.push(format!("HAMi split not read, counted by request: {reason}"));
        }
        _ => {}
    }
    // Health layer: a sick card first, it outranks what the readings say.
    if let Some(h) = &p.gpu_health {
        let device = h
            .device
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        parts.push(format!("unhealthy GPU: {}{device}", h.reason));
    }
    if notebook_stopped(p) {
        parts.push("notebook stopped, pod still holds its GPU".into());
    }
    // KAI fractions and MPS: the pod's share of its card, and why it is never culled.
    if let Some(s) = kai_mps_note(&p.sharing) {
        parts.push(s);
    }
    if usage_available {
        match p.attribution {
            Attribution::Unattributed => {
                parts.push("unattributed: no DCGM series names this pod".into());
            }
            Attribution::Shared if p.utilization.is_none() => {
                parts.push("shared device: own utilisation unknown".into());
            }
            Attribution::Exclusive | Attribution::Mig
                if p.idle.is_none() && p.utilization.is_some() =>
            {
                parts.push("idle unproven: samples missing or stale".into());
            }
            _ => {}
        }
    }
    parts.join("; ")
}

/// The note of a KAI fraction user, a KAI reservation pod or an MPS client.
fn kai_mps_note(s: &Sharing) -> Option<String> {
    use std::fmt::Write as _;
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    Some(match s {
        Sharing::Mps {
            replicas,
            memory_cap_bytes,
            compute_cap_percent,
        } => format!(
            "MPS client, 1/{replicas} of a card: memory cap {}, compute cap {}%; never proven idle \
             (no per-client readings), never culled",
            memory_cap_bytes.map_or_else(
                || "unknown".to_string(),
                |b| format!("{:.1}Gi", b as f64 / GIB)
            ),
            gpus(*compute_cap_percent),
        ),
        Sharing::KaiFraction {
            share,
            devices,
            gpu_memory_mib,
            unknown,
            ..
        } => {
            let mut t = match share {
                Some(f) => format!("KAI fraction {} of a card", gpus(*f)),
                None => "KAI fraction".to_string(),
            };
            if *devices > 1 {
                let _ = write!(t, " on each of {devices} cards");
            }
            if let Some(m) = gpu_memory_mib {
                let _ = write!(t, " ({m} MiB asked)");
            }
            if let Some(why) = unknown {
                t.push_str(": ");
                t.push_str(why);
            }
            t
        }
        Sharing::KaiReservation {
            users, unassigned, ..
        } => format!(
            "KAI reservation pod for {users} fraction user(s): holds only the unassigned {}, \
             never culled",
            gpus(*unassigned)
        ),
        _ => return None,
    })
}

/// A GPU UUID cut to its first group (`GPU-0fc3eda5…`): enough to tell a node's cards apart.
fn short_uuid(uuid: &str) -> String {
    match uuid.get(..12) {
        Some(head) if uuid.len() > 13 => format!("{head}…"),
        _ => uuid.to_string(),
    }
}

/// Whether the pod's Kubeflow notebook carries `kubeflow-resource-stopped`.
pub fn notebook_stopped(p: &PodRow) -> bool {
    p.evidence
        .owner
        .as_ref()
        .is_some_and(|o| o.kind == OwnerKind::Notebook && o.info.stopped.is_some())
}

/// The cluster in five numbers (GPU equivalents).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Node allocatable.
    pub allocatable: f64,
    /// Held by running and terminating pods.
    pub claimed: f64,
    /// Held by pods proven idle.
    pub idle: f64,
    /// Asked for by pending pods.
    pub pending: f64,
    /// Allocatable minus claimed, summed over nodes (negative when over-committed); `None`
    /// when a node's free count is unknown (claims of only some namespaces).
    pub free: Option<f64>,
}

impl Summary {
    pub fn of(ledger: &Ledger) -> Self {
        let mut s = Summary {
            allocatable: 0.0,
            claimed: 0.0,
            idle: 0.0,
            pending: 0.0,
            free: Some(0.0),
        };
        for n in &ledger.nodes {
            s.allocatable += n.gpus_allocatable;
            s.claimed += n.gpus_claimed;
            s.free = s.free.zip(n.gpus_free).map(|(a, b)| a + b);
        }
        for n in &ledger.namespaces {
            s.idle += n.gpus_idle;
            s.pending += n.gpus_pending;
        }
        s
    }

    /// The pairs of the summary line, in order: (number, label).
    pub fn parts(&self) -> [(String, &'static str); 5] {
        [
            (gpus(self.allocatable), "allocatable"),
            (gpus(self.claimed), "claimed"),
            (gpus(self.idle), "proven idle"),
            (gpus(self.pending), "pending"),
            (self.free.map_or_else(|| "?".into(), gpus), "free"),
        ]
    }

    /// The summary line of `report -n NAMESPACE` over a ledger already cut to that namespace:
    /// the namespace's own claimed, proven idle and pending GPUs (its namespace row), then the
    /// cluster's allocatable and free, labelled as the cluster's (nodes belong to no namespace).
    /// "GPUs in namespace team-ml: 2 claimed, 2 proven idle, 0 pending (cluster: 3 allocatable,
    /// 0 free)".
    pub fn namespace_line(ledger: &Ledger, namespace: &str) -> String {
        let cluster = Summary::of(ledger);
        let (mut claimed, mut idle, mut pending) = (0.0, 0.0, 0.0);
        for n in ledger
            .namespaces
            .iter()
            .filter(|n| n.namespace == namespace)
        {
            claimed += n.gpus_claimed;
            idle += n.gpus_idle;
            pending += n.gpus_pending;
        }
        format!(
            "GPUs in namespace {namespace}: {} claimed, {} proven idle, {} pending (cluster: {} \
             allocatable, {} free)",
            gpus(claimed),
            gpus(idle),
            gpus(pending),
            gpus(cluster.allocatable),
            cluster.free.map_or_else(|| "?".into(), gpus),
        )
    }

    /// "GPUs: 3 allocatable, 3 claimed, 2 proven idle, 1 pending, 0 free".
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .parts()
            .iter()
            .map(|(n, label)| format!("{n} {label}"))
            .collect();
        format!("GPUs: {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humanises_two_units() {
        assert_eq!(humanise_seconds(0), "0s");
        assert_eq!(humanise_seconds(45 * 60 + 10), "45m");
        assert_eq!(humanise_seconds(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(humanise_seconds(2 * 86_400 + 3 * 3600 + 59), "2d3h");
        assert_eq!(humanise_seconds(-5), "0s");
    }

    #[test]
    fn gpu_numbers_are_trimmed_and_round_halves_away_from_zero() {
        assert_eq!(gpus(1.0), "1");
        assert_eq!(gpus(0.428_571), "0.43");
        assert_eq!(gpus(0.5), "0.5");
        assert_eq!(gpus(0.0), "0");
        assert_eq!(gpus(-0.001), "0");
        assert_eq!(gpus(-1.0), "-1");
        assert_eq!(gpus(10.0), "10");
        assert_eq!(gpus(0.125), "0.13", "a time-slice share of 1/8");
        assert_eq!(gpus(-0.125), "-0.13");
        assert_eq!(gpus(1.0 / 7.0), "0.14");
        // Absurd values (issue 22): whole numbers, one sign, no saturated i64.
        assert_eq!(gpus(1.844_674_407_370_955_2e19), "18446744073709552000");
        assert_eq!(gpus(-1.844_674_407_370_955_2e19), "-18446744073709552000");
        assert_eq!(gpus(-9.3e16), "-93000000000000000");
        assert_eq!(gpus(1e13), "10000000000000");
        assert_eq!(gpus(-123_456_789.125), "-123456789.13");
        assert_eq!(percent(0.125), "13%");
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(0.98), "98%");
    }

    #[test]
    fn a_sick_card_is_named_in_the_note() {
        let mut p = PodRow::new("team-a", "trainer-0");
        p.state = PodState::Running;
        assert_eq!(note(&p, true), "");
        p.gpu_health = Some(crate::ledger::GpuHealth {
            reason: "xid:79".into(),
            device: Some("GPU-4cf8".into()),
            since: None,
        });
        assert_eq!(note(&p, true), "unhealthy GPU: xid:79 (GPU-4cf8)");
    }
}
