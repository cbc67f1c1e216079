//! A custom Collector that renders ledger families from the latest snapshot at scrape time.
//!
//! Nothing is cached in metric vectors: a pod that leaves the snapshot leaves `/metrics` with it,
//! and a half-built refresh is never visible (the snapshot is swapped whole).

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::ledger::{Ledger, PodState};

/// What `/metrics` renders: the ledger plus the accounting counters accumulated so far.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub ledger: Ledger,
    /// GPU-seconds claimed per namespace since start (monotonic).
    pub gpu_seconds_claimed: BTreeMap<String, f64>,
    /// GPU-seconds held while proven idle per namespace since start (monotonic).
    pub gpu_seconds_idle: BTreeMap<String, f64>,
}

impl Snapshot {
    pub fn new(ledger: Ledger) -> Self {
        Snapshot {
            ledger,
            gpu_seconds_claimed: BTreeMap::new(),
            gpu_seconds_idle: BTreeMap::new(),
        }
    }

    /// The next snapshot: counters advance by what the previous ledger held over the elapsed time.
    #[must_use]
    pub fn advance(&self, ledger: Ledger) -> Self {
        let elapsed =
            (ledger.generated_at - self.ledger.generated_at).num_milliseconds() as f64 / 1000.0;
        let mut claimed = self.gpu_seconds_claimed.clone();
        let mut idle = self.gpu_seconds_idle.clone();
        for ns in &ledger.namespaces {
            claimed.entry(ns.namespace.clone()).or_insert(0.0);
            idle.entry(ns.namespace.clone()).or_insert(0.0);
        }
        if elapsed > 0.0 {
            for ns in &self.ledger.namespaces {
                *claimed.entry(ns.namespace.clone()).or_insert(0.0) += ns.gpus_claimed * elapsed;
                *idle.entry(ns.namespace.clone()).or_insert(0.0) += ns.gpus_idle * elapsed;
            }
        }
        Snapshot {
            ledger,
            gpu_seconds_claimed: claimed,
            gpu_seconds_idle: idle,
        }
    }
}

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
        help: "Utilisation of a GPU above the idle threshold that no GPU pod claims (from the last refresh).",
        labels: &["node", "uuid", "gpu_instance"],
        counter: false,
    },
];

/// Renders ledger families from a [`SharedSnapshot`].
pub struct LedgerCollector {
    snapshot: SharedSnapshot,
    names: crate::claims::ResourceNames,
    descs: Vec<Desc>,
}

impl LedgerCollector {
    pub fn new(
        snapshot: SharedSnapshot,
        names: crate::claims::ResourceNames,
    ) -> Result<Self, prometheus::Error> {
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
        Ok(LedgerCollector {
            snapshot,
            names,
            descs,
        })
    }
}

struct Out {
    families: Vec<MetricFamily>,
}

impl Out {
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
}

/// Builds every ledger family from one snapshot (also used by `report -o metrics`).
pub fn families(snapshot: &Snapshot, names: &crate::claims::ResourceNames) -> Vec<MetricFamily> {
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
    let l = &snapshot.ledger;
    for p in &l.pods {
        let node = p.node.as_deref().unwrap_or("");
        let ident = [p.namespace.as_str(), p.pod.as_str(), node];
        for (resource, units) in &p.resources {
            let unit_gpus = names
                .classify(resource)
                .map_or(0.0, |k| k.gpus_per_unit(p.evidence.replicas));
            let value = unit_gpus * *units as f64;
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
    }
    for n in &l.nodes {
        out.push(idx::NODE_ALLOC, &[&n.node], n.gpus_allocatable);
        out.push(idx::NODE_CLAIMED, &[&n.node], n.gpus_claimed);
        out.push(idx::NODE_FREE, &[&n.node], n.gpus_free);
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
    for d in &l.unclaimed_busy {
        out.push(
            idx::UNCLAIMED_BUSY,
            &[&d.node, &d.uuid, d.gpu_instance.as_deref().unwrap_or("")],
            d.utilization,
        );
    }
    out.families.retain(|f| !f.get_metric().is_empty());
    out.families
}

impl Collector for LedgerCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = self.snapshot.load();
        families(&snapshot, &self.names)
    }
}
