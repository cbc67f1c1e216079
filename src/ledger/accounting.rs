//! The ledger's GPU-second accounting: counters of GPU-seconds held, idle and per GPU model,
//! advanced from one ledger to the next by what the previous one held over the elapsed time.
//!
//! Pure like `build`: the caller supplies both ledgers (and so the clock); sinks render a
//! [`Snapshot`], the culler reads its ledger.

use std::collections::BTreeMap;

use super::model::Ledger;

/// The ledger plus the accounting counters accumulated so far: what `/metrics` renders and the
/// culler reads.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub ledger: Ledger,
    /// GPU-seconds claimed per namespace since start (monotonic).
    pub gpu_seconds_claimed: BTreeMap<String, f64>,
    /// GPU-seconds held while proven idle per namespace since start (monotonic).
    pub gpu_seconds_idle: BTreeMap<String, f64>,
    /// GPU-seconds held per (namespace, GPU model, activity) since start (monotonic): the
    /// model dimension `showback` prices, and busy apart from unknown (docs/metrics.md).
    pub gpu_seconds_by_model: BTreeMap<(String, String, &'static str), f64>,
    /// GPU-seconds held on a sick card per namespace since start (monotonic; health layer,
    /// `ledger::health`): hours a pod held a card that could do no work. Inside claimed, as idle
    /// is.
    pub gpu_seconds_lost: BTreeMap<String, f64>,
    /// This replica's shard when sharded (`--total-shards` > 1): every series of the text path
    /// carries `shard="<i>"`, as the registry's own families do through its const label
    /// (export's `registry`), so PromQL adds shards and de-duplicates HA replicas apart.
    /// `None` unsharded: no label, the series of a single or HA deployment unchanged.
    pub shard: Option<u32>,
}

/// `model` label value of a pod whose node has no GPU product label.
pub const UNKNOWN_MODEL: &str = "unknown";

/// `activity` label value of a pod's GPU-seconds: proven idle, proven busy, or neither.
fn activity(idle: Option<bool>) -> &'static str {
    match idle {
        Some(true) => "idle",
        Some(false) => "busy",
        None => "unknown",
    }
}

/// (namespace, model, activity) of every pod that holds GPUs in `ledger`, with its GPUs.
fn held_by_model(ledger: &Ledger) -> impl Iterator<Item = ((String, String, &'static str), f64)> {
    let models: BTreeMap<&str, &str> = ledger
        .nodes
        .iter()
        .filter_map(|n| n.model.as_deref().map(|m| (n.node.as_str(), m)))
        .collect();
    ledger
        .pods
        .iter()
        .filter(|p| p.state.holds())
        .map(move |p| {
            let model = p
                .node
                .as_deref()
                .and_then(|n| models.get(n).copied())
                .unwrap_or(UNKNOWN_MODEL);
            (
                (p.namespace.clone(), model.to_string(), activity(p.idle)),
                p.gpus,
            )
        })
}

impl Snapshot {
    pub fn new(ledger: Ledger) -> Self {
        Snapshot {
            ledger,
            gpu_seconds_claimed: BTreeMap::new(),
            gpu_seconds_idle: BTreeMap::new(),
            gpu_seconds_by_model: BTreeMap::new(),
            gpu_seconds_lost: BTreeMap::new(),
            shard: None,
        }
    }

    /// The same snapshot labelled as `shard`'s (see [`Snapshot::shard`]).
    #[must_use]
    pub fn with_shard(mut self, shard: Option<u32>) -> Self {
        self.shard = shard;
        self
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
        let mut by_model = self.gpu_seconds_by_model.clone();
        for (key, _) in held_by_model(&ledger) {
            by_model.entry(key).or_insert(0.0);
        }
        let mut lost = self.gpu_seconds_lost.clone();
        for ns in &ledger.namespaces {
            lost.entry(ns.namespace.clone()).or_insert(0.0);
        }
        if elapsed > 0.0 {
            for p in self.ledger.pods.iter().filter(|p| p.state.holds()) {
                if p.gpu_health.is_some() {
                    *lost.entry(p.namespace.clone()).or_insert(0.0) += p.gpus * elapsed;
                }
            }
            for ns in &self.ledger.namespaces {
                *claimed.entry(ns.namespace.clone()).or_insert(0.0) += ns.gpus_claimed * elapsed;
                *idle.entry(ns.namespace.clone()).or_insert(0.0) += ns.gpus_idle * elapsed;
            }
            for (key, gpus) in held_by_model(&self.ledger) {
                *by_model.entry(key).or_insert(0.0) += gpus * elapsed;
            }
        }
        Snapshot {
            ledger,
            gpu_seconds_claimed: claimed,
            gpu_seconds_idle: idle,
            gpu_seconds_by_model: by_model,
            gpu_seconds_lost: lost,
            shard: self.shard,
        }
    }
}
