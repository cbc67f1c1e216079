//! A custom Collector that renders ledger families from the latest snapshot at scrape time.
//!
//! Nothing is cached in metric vectors: a pod that leaves the snapshot leaves `/metrics` with it,
//! and a half-built refresh is never visible (the snapshot is swapped whole).

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::ledger::accounting::Snapshot;
use crate::ledger::{Ledger, PodState};

/// Label every series of a sharded replica carries: its shard's index (docs/metrics.md).
pub const SHARD_LABEL: &str = "shard";

/// Shared handle to the published snapshot.
pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    counter: bool,
}

const POD_LABELS: &[&str] = &["namespace", "pod", "node"];

const FAMILIES: &[Family] = &[
    Family {
        name: "gpu_ledger_pod_gpus",
        help: "GPU equivalents claimed by the pod per resource (from the last refresh).",
        labels: &[
            "namespace",
            "pod",
            "node",
            "state",
            "resource",
            "attribution",
        ],
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_gpu_utilization_ratio",
        help: "Mean utilisation 0..1 of the pod's GPUs (from the last refresh); absent when unknown.",
        labels: POD_LABELS,
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_gpu_memory_used_bytes",
        help: "Framebuffer bytes used on the pod's GPUs (from the last refresh); absent when unknown.",
        labels: POD_LABELS,
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_gpu_idle_seconds",
        help: "Seconds the pod's GPUs have been proven idle, 0 when active (from the last refresh); absent when unknown.",
        labels: POD_LABELS,
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_terminating_seconds",
        help: "Seconds since deletion of the GPU pod was requested (from the last refresh).",
        labels: POD_LABELS,
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_stuck_terminating",
        help: "1 when a terminating GPU pod is past its deletion deadline by more than --stuck-after.",
        labels: POD_LABELS,
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_pending_seconds",
        help: "Seconds since a pending GPU pod was created (from the last refresh).",
        labels: &["namespace", "pod"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_pod_owner_info",
        help: "Controller and Kubeflow notebook of a GPU pod; always 1.",
        labels: &["namespace", "pod", "owner_kind", "owner_name", "notebook"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_node_gpus_allocatable",
        help: "Allocatable GPU equivalents of the node (from the last refresh).",
        labels: &["node"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_node_gpus_claimed",
        help: "GPU equivalents claimed by running and terminating pods on the node (from the last refresh).",
        labels: &["node"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_node_gpus_free",
        help: "Allocatable minus claimed GPU equivalents on the node (from the last refresh).",
        labels: &["node"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_namespace_gpus_claimed",
        help: "GPU equivalents held by running and terminating pods of the namespace (from the last refresh).",
        labels: &["namespace"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_namespace_gpus_idle",
        help: "GPU equivalents held by pods proven idle (from the last refresh).",
        labels: &["namespace"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_namespace_gpus_pending",
        help: "GPU equivalents requested by pending pods of the namespace (from the last refresh).",
        labels: &["namespace"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_namespace_gpu_quota",
        help: "Hard limit of a ResourceQuota key that names a GPU resource.",
        labels: &["namespace", "resource"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_namespace_gpu_quota_missing",
        help: "1 when the namespace claims GPUs and no ResourceQuota names a GPU resource.",
        labels: &["namespace"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_gpu_seconds_claimed_total",
        help: "GPU-seconds held by the namespace, accumulated across refreshes.",
        labels: &["namespace"],
        counter: true,
    },
    Family {
        name: "gpu_ledger_gpu_seconds_idle_total",
        help: "GPU-seconds held while proven idle, accumulated across refreshes.",
        labels: &["namespace"],
        counter: true,
    },
    Family {
        name: "gpu_ledger_unclaimed_busy_gpu_utilization_ratio",
        help: "Utilisation of a GPU above the idle threshold that no claim on its node could own (from the last refresh).",
        labels: &["node", "uuid", "gpu_instance"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_node_gpus_unschedulable",
        help: "GPU equivalents the node's hardware has (GFD labels, or DCGM where it advertises none) that its allocatable does not offer (from the last refresh).",
        labels: &["node"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_gpu_seconds_by_model_total",
        help: "GPU-seconds held by the namespace per GPU model of the pod's node and activity (busy, idle, unknown), accumulated across refreshes.",
        labels: &["namespace", "model", "activity"],
        counter: true,
    },
    Family {
        name: "gpu_ledger_pending_reclaimable_gpus",
        help: "GPU equivalents of pending pods that fit on no node as things are but would once stuck Terminating holders are cleared (finalizer finished, or force-deleted where the node is gone) or proven-idle notebooks stopped (from the last refresh).",
        labels: &["namespace"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_quota_gpus",
        help: "A ResourceQuota's GPU resource in the namespace: kind hard and used (the apiserver's status.used) in the resource's units; busy and idle in GPU equivalents held by pods proven busy / proven idle (from the last refresh).",
        labels: &["namespace", "resource", "kind"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_queue_gpus",
        help: "A Kueue ClusterQueue's GPU resource per flavor: kind nominal and admitted (its status usage) in the resource's units; busy and idle in GPU equivalents held by its admitted workloads' pods (from the last refresh).",
        labels: &["cluster_queue", "flavor", "resource", "kind"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_queue_pending_workloads",
        help: "Workloads of a Kueue ClusterQueue asking for a GPU, neither admitted nor finished (from the last refresh).",
        labels: &["cluster_queue"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_queue_starved_while_lender_idle",
        help: "1 when a Kueue ClusterQueue has pending GPU workloads while another ClusterQueue of its cohort holds admitted GPUs proven idle (from the last refresh).",
        labels: &["cluster_queue"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_dra_claims_unquotaed",
        help: "DRA ResourceClaims for a GPU in the namespace that no device-class ResourceQuota key and no Kueue workload covers (from the last refresh).",
        labels: &["namespace"],
        counter: false,
    },
    // Health layer (issue 39, sick cards).
    Family {
        name: "gpu_ledger_pod_gpus_unhealthy",
        help: "GPU equivalents a running or terminating pod holds on a sick card: tainted NoSchedule/NoExecute by its DRA driver, Unhealthy in the pod's allocatedResourcesStatus, a DCGM health watch failing or a fatal XID in the window (from the last refresh).",
        labels: &["namespace", "pod", "reason", "owner_kind", "owner_name"],
        counter: false,
    },
    Family {
        name: "gpu_ledger_gpu_seconds_lost_total",
        help: "GPU-seconds held by the namespace on sick cards (inside claimed), accumulated across refreshes.",
        labels: &["namespace"],
        counter: true,
    },
];

/// Renders ledger families from a [`SharedSnapshot`].
pub struct LedgerCollector {
    snapshot: SharedSnapshot,
    descs: Vec<Desc>,
}

impl LedgerCollector {
    pub fn new(snapshot: SharedSnapshot) -> Result<Self, prometheus::Error> {
        let descs = FAMILIES
            .iter()
            .map(|f| {
                Desc::new(
                    f.name.into(),
                    f.help.into(),
                    f.labels.iter().map(|l| (*l).to_string()).collect(),
                    std::collections::HashMap::new(),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(LedgerCollector { snapshot, descs })
    }
}

/// Where [`emit`] writes samples: proto families (the `Collector` path) or text (the fast path).
trait Sink {
    fn push(&mut self, family: usize, labels: &[&str], value: f64);
}

struct Out {
    families: Vec<MetricFamily>,
}

impl Sink for Out {
    fn push(&mut self, family: usize, labels: &[&str], value: f64) {
        let f = &FAMILIES[family];
        let pairs = f
            .labels
            .iter()
            .zip(labels)
            .map(|(n, v)| {
                let mut p = LabelPair::default();
                p.set_name((*n).to_string());
                p.set_value((*v).to_string());
                p
            })
            .collect();
        let mut m = Metric::default();
        m.set_label(pairs);
        if f.counter {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.families[family].mut_metric().push(m);
    }
}

/// Text exposition written directly, one buffer per family (no per-label allocation, no proto).
struct Text {
    bufs: Vec<String>,
    /// `name="value"` pairs, already escaped, put after each series' own labels: the registry's
    /// const labels (the shard), in the place `Registry::gather` puts them.
    constant: String,
}

impl Sink for Text {
    fn push(&mut self, family: usize, labels: &[&str], value: f64) {
        use std::fmt::Write as _;
        let f = &FAMILIES[family];
        let b = &mut self.bufs[family];
        b.push_str(f.name);
        let mut sep = '{';
        for (n, v) in f.labels.iter().zip(labels) {
            b.push(sep);
            b.push_str(n);
            b.push_str("=\"");
            escape_label_value(b, v);
            b.push('"');
            sep = ',';
        }
        if !self.constant.is_empty() {
            b.push(sep);
            b.push_str(&self.constant);
            sep = ',';
        }
        if sep == ',' {
            b.push('}');
        }
        b.push(' ');
        // `Display` for f64, exactly what prometheus' TextEncoder prints.
        let _ = write!(b, "{value}");
        b.push('\n');
    }
}

/// Appends `v` with the text format's label-value escaping: `\\`, `\"` and `\n`
/// (prometheus' `escape_string(v, true)`).
fn escape_label_value(out: &mut String, v: &str) {
    let mut rest = v;
    while let Some(i) = rest.find(['\\', '"', '\n']) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

/// Family indices, in `FAMILIES` order.
mod idx {
    pub const POD_GPUS: usize = 0;
    pub const POD_UTIL: usize = 1;
    pub const POD_MEM: usize = 2;
    pub const POD_IDLE: usize = 3;
    pub const POD_TERM: usize = 4;
    pub const POD_STUCK: usize = 5;
    pub const POD_PENDING: usize = 6;
    pub const POD_OWNER: usize = 7;
    pub const NODE_ALLOC: usize = 8;
    pub const NODE_CLAIMED: usize = 9;
    pub const NODE_FREE: usize = 10;
    pub const NS_CLAIMED: usize = 11;
    pub const NS_IDLE: usize = 12;
    pub const NS_PENDING: usize = 13;
    pub const NS_QUOTA: usize = 14;
    pub const NS_QUOTA_MISSING: usize = 15;
    pub const SECONDS_CLAIMED: usize = 16;
    pub const SECONDS_IDLE: usize = 17;
    pub const UNCLAIMED_BUSY: usize = 18;
    pub const NODE_UNSCHEDULABLE: usize = 19;
    pub const SECONDS_BY_MODEL: usize = 20;
    pub const PENDING_RECLAIMABLE: usize = 21;
    pub const QUOTA_GPUS: usize = 22;
    pub const QUEUE_GPUS: usize = 23;
    pub const QUEUE_PENDING: usize = 24;
    pub const QUEUE_STARVED: usize = 25;
    pub const DRA_UNQUOTAED: usize = 26;
    // Health layer.
    pub const POD_UNHEALTHY: usize = 27;
    pub const SECONDS_LOST: usize = 28;
}

/// Builds every ledger family from one snapshot as proto families (the `Collector` path).
pub fn families(snapshot: &Snapshot) -> Vec<MetricFamily> {
    let mut out = Out {
        families: FAMILIES
            .iter()
            .map(|f| {
                let mut mf = MetricFamily::default();
                mf.set_name(f.name.to_string());
                mf.set_help(f.help.to_string());
                mf.set_field_type(if f.counter {
                    MetricType::COUNTER
                } else {
                    MetricType::GAUGE
                });
                mf
            })
            .collect(),
    };
    emit(snapshot, &mut out);
    out.families.retain(|f| !f.get_metric().is_empty());
    out.families
}

/// The ledger families of one snapshot as text exposition blocks `(family name, text)`, in
/// `FAMILIES` order, empty families left out. Byte-identical to prometheus' `TextEncoder` over
/// [`families`] (and, because the ledger's rows are already sorted, to `Registry::gather`'s
/// order within each family), at a fraction of the cost: no proto, no per-label `String`.
pub fn text_blocks(snapshot: &Snapshot) -> Vec<(&'static str, String)> {
    let l = &snapshot.ledger;
    // Rough per-family sizes so the big buffers are allocated once.
    let pods = l.pods.len();
    let mut out = Text {
        bufs: FAMILIES
            .iter()
            .enumerate()
            .map(|(i, _)| {
                String::with_capacity(match i {
                    idx::POD_GPUS => pods * 170,
                    idx::POD_UTIL | idx::POD_MEM | idx::POD_IDLE | idx::POD_OWNER => pods * 110,
                    idx::NODE_ALLOC
                    | idx::NODE_CLAIMED
                    | idx::NODE_FREE
                    | idx::NODE_UNSCHEDULABLE => l.nodes.len() * 60,
                    _ => 256,
                })
            })
            .collect(),
        constant: snapshot
            .shard
            .map(|s| format!("{SHARD_LABEL}=\"{s}\""))
            .unwrap_or_default(),
    };
    emit(snapshot, &mut out);
    FAMILIES
        .iter()
        .zip(out.bufs)
        .filter(|(_, body)| !body.is_empty())
        .map(|(f, body)| {
            let mut text = String::with_capacity(body.len() + f.help.len() + 2 * f.name.len() + 32);
            text.push_str("# HELP ");
            text.push_str(f.name);
            text.push(' ');
            // HELP escaping: backslash and newline only (prometheus' `escape_string(help, false)`).
            text.push_str(&f.help.replace('\\', "\\\\").replace('\n', "\\n"));
            text.push_str("\n# TYPE ");
            text.push_str(f.name);
            text.push_str(if f.counter { " counter\n" } else { " gauge\n" });
            text.push_str(&body);
            (f.name, text)
        })
        .collect()
}

/// The ledger families of one snapshot in the text exposition format (`report -o metrics`).
pub fn text(snapshot: &Snapshot) -> String {
    let blocks = text_blocks(snapshot);
    let mut out = String::with_capacity(blocks.iter().map(|(_, t)| t.len()).sum());
    for (_, t) in &blocks {
        out.push_str(t);
    }
    out
}

fn emit(snapshot: &Snapshot, out: &mut impl Sink) {
    let l = &snapshot.ledger;
    for p in &l.pods {
        let node = p.node.as_deref().unwrap_or("");
        let ident = [p.namespace.as_str(), p.pod.as_str(), node];
        for (resource, value) in &p.gpus_by_resource {
            let value = *value;
            out.push(
                idx::POD_GPUS,
                &[
                    &p.namespace,
                    &p.pod,
                    node,
                    p.state.as_str(),
                    resource,
                    p.attribution.as_str(),
                ],
                value,
            );
        }
        if let Some(u) = p.utilization {
            out.push(idx::POD_UTIL, &ident, u);
        }
        if let Some(m) = p.memory_used_bytes {
            out.push(idx::POD_MEM, &ident, m);
        }
        if let Some(s) = p.idle_seconds {
            out.push(idx::POD_IDLE, &ident, s);
        }
        if p.state == PodState::Terminating {
            if let Some(s) = p.terminating_seconds {
                out.push(idx::POD_TERM, &ident, s);
            }
            out.push(idx::POD_STUCK, &ident, if p.stuck { 1.0 } else { 0.0 });
        }
        if let Some(s) = p.pending_seconds {
            out.push(idx::POD_PENDING, &[&p.namespace, &p.pod], s);
        }
        let (kind, name) = p
            .owner
            .as_ref()
            .map_or(("", ""), |o| (o.kind.as_str(), o.name.as_str()));
        out.push(
            idx::POD_OWNER,
            &[
                &p.namespace,
                &p.pod,
                kind,
                name,
                p.notebook.as_deref().unwrap_or(""),
            ],
            1.0,
        );
        if let Some(h) = p.gpu_health.as_ref().filter(|_| p.state.holds()) {
            out.push(
                idx::POD_UNHEALTHY,
                &[&p.namespace, &p.pod, &h.reason, kind, name],
                p.gpus,
            );
        }
    }
    for n in &l.nodes {
        out.push(idx::NODE_ALLOC, &[&n.node], n.gpus_allocatable);
        out.push(idx::NODE_CLAIMED, &[&n.node], n.gpus_claimed);
        if let Some(free) = n.gpus_free {
            out.push(idx::NODE_FREE, &[&n.node], free);
        }
        out.push(idx::NODE_UNSCHEDULABLE, &[&n.node], n.gpus_unschedulable);
    }
    for ns in &l.namespaces {
        let name = [ns.namespace.as_str()];
        out.push(idx::NS_CLAIMED, &name, ns.gpus_claimed);
        out.push(idx::NS_IDLE, &name, ns.gpus_idle);
        out.push(idx::NS_PENDING, &name, ns.gpus_pending);
        for (key, hard) in &ns.gpu_quota_keys {
            out.push(idx::NS_QUOTA, &[&ns.namespace, key], *hard as f64);
        }
        if ns.gpu_quota.is_none()
            && ns.gpu_quota_keys.is_empty()
            && ns.gpus_claimed + ns.gpus_pending > 0.0
        {
            out.push(idx::NS_QUOTA_MISSING, &name, 1.0);
        }
    }
    for (ns, v) in &snapshot.gpu_seconds_claimed {
        out.push(idx::SECONDS_CLAIMED, &[ns], *v);
    }
    for (ns, v) in &snapshot.gpu_seconds_idle {
        out.push(idx::SECONDS_IDLE, &[ns], *v);
    }
    for ((ns, model, activity), v) in &snapshot.gpu_seconds_by_model {
        out.push(idx::SECONDS_BY_MODEL, &[ns, model, activity], *v);
    }
    for (ns, v) in &snapshot.gpu_seconds_lost {
        out.push(idx::SECONDS_LOST, &[ns], *v);
    }
    // Every namespace with a planned pending pod (0 when none of its pods needs a reclaim);
    // absent when the planner did not run (claims of some namespaces, sharding).
    let mut reclaimable: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for r in &l.reclaim {
        let v = reclaimable.entry(r.pending.namespace.as_str()).or_default();
        if r.reclaimable() {
            *v += r.gpus;
        }
    }
    for (ns, v) in reclaimable {
        out.push(idx::PENDING_RECLAIMABLE, &[ns], v);
    }
    for d in &l.unclaimed_busy {
        out.push(
            idx::UNCLAIMED_BUSY,
            &[
                d.node.as_deref().unwrap_or(""),
                &d.uuid,
                d.gpu_instance.as_deref().unwrap_or(""),
            ],
            d.utilization,
        );
    }
    emit_quotas(l, out);
}

/// The quota and queue families: unknown values (`null` in the JSON) have no series.
fn emit_quotas(l: &Ledger, out: &mut impl Sink) {
    for q in &l.quotas {
        let kinds = [
            ("hard", Some(q.hard as f64)),
            ("used", q.used.map(|u| u as f64)),
            ("busy", q.busy),
            ("idle", q.idle),
        ];
        for (kind, v) in kinds {
            if let Some(v) = v {
                out.push(idx::QUOTA_GPUS, &[&q.namespace, &q.resource, kind], v);
            }
        }
    }
    // Pending and starvation are per ClusterQueue: once each, starved when any of its rows is.
    let mut per_queue: BTreeMap<&str, (u64, bool)> = BTreeMap::new();
    for r in &l.queues {
        let kinds = [
            ("nominal", r.nominal.map(|n| n as f64)),
            ("admitted", r.admitted.map(|a| a as f64)),
            ("busy", r.busy),
            ("idle", r.idle),
        ];
        for (kind, v) in kinds {
            if let Some(v) = v {
                out.push(
                    idx::QUEUE_GPUS,
                    &[&r.cluster_queue, &r.flavor, &r.resource, kind],
                    v,
                );
            }
        }
        let e = per_queue.entry(r.cluster_queue.as_str()).or_default();
        e.0 = r.pending_workloads;
        e.1 |= r.starved_while_lender_idle;
    }
    for (cq, (pending, starved)) in per_queue {
        out.push(idx::QUEUE_PENDING, &[cq], pending as f64);
        out.push(idx::QUEUE_STARVED, &[cq], if starved { 1.0 } else { 0.0 });
    }
    let mut unquotaed: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &l.dra_claims_unquotaed {
        let n = unquotaed.entry(c.namespace.as_str()).or_default();
        *n = n.saturating_add(1);
    }
    for (ns, n) in unquotaed {
        out.push(idx::DRA_UNQUOTAED, &[ns], n as f64);
    }
}

impl Collector for LedgerCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = self.snapshot.load();
        families(&snapshot)
    }
}
