//! Export: the `/metrics` Collector over the latest snapshot, self-metrics, and the admin server.

pub mod auth;
pub mod collector;
pub mod history;
pub mod server;
pub mod tls;

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry,
};

pub use collector::{LedgerCollector, SHARD_LABEL, SharedSnapshot};

use crate::ledger::accounting::Snapshot;

/// The shard a replica labels its series with: `Some(shard)` when `--total-shards` > 1, `None`
/// for a single shard (no label: unsharded series and dashboards stay as they were).
pub fn shard_label(shard: u32, total_shards: u32) -> Option<u32> {
    (total_shards > 1).then_some(shard)
}

/// The registry of a replica: with the const label `shard="<i>"` on every family when
/// `shard` is set ([`shard_label`]). Shards count different pods, so their series must stay
/// apart from each other while HA replicas of one shard stay identical: PromQL then takes
/// `max` over a shard's replicas and adds the shards (`sum by (namespace) (max by (namespace,
/// shard) (…))`).
pub fn registry(shard: Option<u32>) -> Result<Registry, prometheus::Error> {
    let labels =
        shard.map(|s| std::collections::HashMap::from([(SHARD_LABEL.to_string(), s.to_string())]));
    Registry::new_custom(None, labels)
}

/// gpu-ledger's own health metrics (bounded labels only).
#[derive(Clone)]
pub struct SelfMetrics {
    pub source_up: GaugeVec,
    pub last_refresh: Gauge,
    pub refresh_duration: Histogram,
    pub prometheus_queries: IntCounter,
    pub prometheus_query_errors: IntCounter,
    pub prometheus_several_clusters: Gauge,
    pub prometheus_warnings: IntCounter,
    pub watch_restarts: IntCounterVec,
    /// Samples of Prometheus answers dropped before the sample window, by `reason`.
    pub prometheus_samples_rejected: IntCounterVec,
    /// Devices with DCGM series but none of the fields gpu-ledger reads.
    pub dcgm_devices_fields_missing: Gauge,
}

impl SelfMetrics {
    /// Creates and registers the self-metrics.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = SelfMetrics {
            source_up: GaugeVec::new(
                Opts::new(
                    "gpu_ledger_source_up",
                    "1 when the source is usable: prometheus answered the last refresh; every kubernetes watch works (0 once one has been failing for over 60 s).",
                ),
                &["source"],
            )?,
            last_refresh: Gauge::new(
                "gpu_ledger_last_refresh_timestamp_seconds",
                "Unix time of the last completed refresh; every ledger value is as of this time.",
            )?,
            refresh_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "gpu_ledger_refresh_duration_seconds",
                    "Time of one refresh: notebook ownership, Prometheus queries, idle history.",
                )
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            )?,
            prometheus_queries: IntCounter::new(
                "gpu_ledger_prometheus_queries_total",
                "PromQL queries sent.",
            )?,
            prometheus_query_errors: IntCounter::new(
                "gpu_ledger_prometheus_query_errors_total",
                "PromQL queries that failed.",
            )?,
            prometheus_several_clusters: Gauge::new(
                "gpu_ledger_prometheus_several_clusters",
                "1 when the last refresh found DCGM series of several clusters (a `cluster` or `cluster_id` label with more than one value) and no --prometheus-selector narrowing them: nothing is joined, /readyz fails until the selector is set.",
            )?,
            prometheus_warnings: IntCounter::new(
                "gpu_ledger_prometheus_warnings_total",
                "Warnings in Prometheus answers (partial responses: a Thanos or Mimir store did not answer); a partial answer proves nothing idle.",
            )?,
            watch_restarts: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_watch_restarts_total",
                    "Watch streams restarted after an error.",
                ),
                &["resource"],
            )?,
            prometheus_samples_rejected: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_prometheus_samples_rejected_total",
                    "DCGM samples of Prometheus answers dropped before the idle window: future (stamped after the query time), impossible (before 2000 or after 9999).",
                ),
                &["reason"],
            )?,
            dcgm_devices_fields_missing: Gauge::new(
                "gpu_ledger_dcgm_devices_fields_missing",
                "GPU devices (UUID and MIG instance) with DCGM series in Prometheus but none of the fields gpu-ledger reads under any accepted name (an exporter that renamed or dropped them): their utilisation is unknown, never idle. Counted at most once a minute, with the refresh.",
            )?,
        };
        let build_info = GaugeVec::new(
            Opts::new(
                "gpu_ledger_build_info",
                "Build of this gpu-ledger (version, git revision, compiler); always 1.",
            ),
            &["version", "revision", "rustc"],
        )?;
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("GPU_LEDGER_REVISION"),
                env!("GPU_LEDGER_RUSTC_VERSION"),
            ])
            .set(1.0);
        registry.register(Box::new(build_info))?;
        registry.register(Box::new(m.source_up.clone()))?;
        registry.register(Box::new(m.last_refresh.clone()))?;
        registry.register(Box::new(m.refresh_duration.clone()))?;
        registry.register(Box::new(m.prometheus_queries.clone()))?;
        registry.register(Box::new(m.prometheus_query_errors.clone()))?;
        registry.register(Box::new(m.prometheus_several_clusters.clone()))?;
        registry.register(Box::new(m.prometheus_warnings.clone()))?;
        registry.register(Box::new(m.watch_restarts.clone()))?;
        registry.register(Box::new(m.prometheus_samples_rejected.clone()))?;
        registry.register(Box::new(m.dcgm_devices_fields_missing.clone()))?;
        Ok(m)
    }
}

/// Registers the standard `process_*` families of this process (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_open_fds`, `process_start_time_seconds`, …; Linux,
/// read from /proc at each scrape). Separate from [`SelfMetrics::register`] because their values
/// move between two renders.
pub fn register_process_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))
}

/// Renders a registry in the text exposition format.
pub fn render(registry: &Registry) -> Result<String, prometheus::Error> {
    let families = registry.gather();
    prometheus::TextEncoder::new().encode_to_string(&families)
}

/// Renders a registry plus the ledger families of `ledger`, written directly as text (the
/// `/metrics` path: the ledger is not registered as a `Collector`, so `gather` never builds
/// hundreds of thousands of proto metrics and sorts them). Families are ordered by name as
/// `Registry::gather` orders them; the output equals [`render`] over a registry holding a
/// [`LedgerCollector`] for the same snapshot (and, sharded, the snapshot's shard is the
/// registry's const label: both from [`registry`] and [`Snapshot::with_shard`]).
pub fn render_with_ledger(
    registry: &Registry,
    ledger: &Snapshot,
) -> Result<String, prometheus::Error> {
    let encoder = prometheus::TextEncoder::new();
    let mut blocks: Vec<(String, String)> = Vec::new();
    for mf in registry.gather() {
        let text = encoder.encode_to_string(std::slice::from_ref(&mf))?;
        blocks.push((mf.name().to_string(), text));
    }
    blocks.extend(
        collector::text_blocks(ledger)
            .into_iter()
            .map(|(name, text)| (name.to_string(), text)),
    );
    blocks.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(blocks.iter().map(|(_, t)| t.len()).sum());
    for (_, text) in &blocks {
        out.push_str(text);
    }
    Ok(out)
}

/// Renders only the ledger families of one snapshot (for `report -o metrics`, textfile collectors).
pub fn render_snapshot(snapshot: &Snapshot) -> Result<String, prometheus::Error> {
    Ok(collector::text(snapshot))
}

#[cfg(test)]
mod tests;
