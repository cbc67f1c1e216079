//! The culling self-metrics of `docs/metrics.md` (tikv `prometheus`), all with bounded labels.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::actuator::{NoticeResult, StopResult};
use super::hold_back::HoldBack;
use super::lease::{Leadership, LeaseError};
use super::plan::{CircuitReason, Plan, SkipReason};

/// Buckets of `gpu_ledger_cull_time_to_free_seconds`: 10 s to 1 h.
const TIME_TO_FREE_BUCKETS_SECONDS: [f64; 10] = [
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 2700.0, 3600.0,
];

/// Handles to the culling families; cheap to clone.
#[derive(Debug, Clone)]
pub struct CullMetrics {
    pub candidates: IntGauge,
    pub would_stop: IntGauge,
    pub stops: IntCounterVec,
    pub skips: IntCounterVec,
    pub circuit_open: IntGaugeVec,
    /// Read from the leadership claim at every scrape once registered (see [`LeaderGauge`]).
    pub leader: IntGauge,
    pub time_to_free: Histogram,
    /// 1 when the mode is `dry-run` or `on`: alerts on culling gate on it.
    pub enabled: IntGauge,
    /// 1 for the reason the last acting cycle was held back.
    pub held_back: IntGaugeVec,
    pub lease_errors: IntCounterVec,
    /// Notebooks whose last stop failed and that back off (see [`super::backoff`]).
    pub backoff: IntGauge,
    /// Notices before a stop written or cancelled (`--cull-notice`), by kind and result.
    pub notices: IntCounterVec,
    /// Notice webhook posts by result (`sent`, `error`).
    pub notice_webhook: IntCounterVec,
}

/// `gpu_ledger_cull_leader`, set from the leadership claim when scraped: a claim that ran out
/// between culling cycles (a hung renewal, a dead elector) reads 0 at once.
struct LeaderGauge {
    gauge: IntGauge,
    leadership: Arc<dyn Leadership>,
}

impl Collector for LeaderGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.gauge.set(i64::from(self.leadership.is_leader()));
        self.gauge.collect()
    }
}

impl CullMetrics {
    /// Creates the families and registers them; every label value starts at 0.
    /// `gpu_ledger_cull_leader` reads `leadership` at every scrape.
    pub fn register(
        registry: &Registry,
        leadership: Arc<dyn Leadership>,
    ) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.candidates.clone()))?;
        registry.register(Box::new(m.would_stop.clone()))?;
        registry.register(Box::new(m.stops.clone()))?;
        registry.register(Box::new(m.skips.clone()))?;
        registry.register(Box::new(m.circuit_open.clone()))?;
        registry.register(Box::new(LeaderGauge {
            gauge: m.leader.clone(),
            leadership,
        }))?;
        registry.register(Box::new(m.time_to_free.clone()))?;
        registry.register(Box::new(m.enabled.clone()))?;
        registry.register(Box::new(m.held_back.clone()))?;
        registry.register(Box::new(m.lease_errors.clone()))?;
        registry.register(Box::new(m.backoff.clone()))?;
        registry.register(Box::new(m.notices.clone()))?;
        registry.register(Box::new(m.notice_webhook.clone()))?;
        Ok(m)
    }

    /// The families without a registry (tests, offline use).
    pub fn unregistered() -> Result<Self, prometheus::Error> {
        let m = CullMetrics {
            candidates: IntGauge::with_opts(Opts::new(
                "gpu_ledger_cull_candidates",
                "Notebooks that qualified for a stop in the last plan (as of the last refresh).",
            ))?,
            would_stop: IntGauge::with_opts(Opts::new(
                "gpu_ledger_cull_would_stop",
                "Stops the last plan would make, after caps and the circuit breaker.",
            ))?,
            stops: IntCounterVec::new(
                Opts::new("gpu_ledger_cull_stops_total", "Stop attempts by result."),
                &["result"],
            )?,
            skips: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_cull_skips_total",
                    "GPU notebook pods skipped per plan, by reason.",
                ),
                &["reason"],
            )?,
            circuit_open: IntGaugeVec::new(
                Opts::new(
                    "gpu_ledger_cull_circuit_open",
                    "1 while the circuit breaker blocks culling, by reason (always 0 with --cull=off).",
                ),
                &["reason"],
            )?,
            leader: IntGauge::with_opts(Opts::new(
                "gpu_ledger_cull_leader",
                "1 while this replica's culling lease claim holds (local monotonic clock).",
            ))?,
            enabled: IntGauge::with_opts(Opts::new(
                "gpu_ledger_cull_enabled",
                "1 when culling may act (--cull=dry-run or on), 0 with --cull=off.",
            ))?,
            held_back: IntGaugeVec::new(
                Opts::new(
                    "gpu_ledger_cull_held_back",
                    "1 for the reason the leader's last culling cycle did not act (kill switch, invalid kill switch, ...).",
                ),
                &["reason"],
            )?,
            lease_errors: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_cull_lease_errors_total",
                    "Culling Lease requests that failed, by reason (timeout, error, conflict).",
                ),
                &["reason"],
            )?,
            backoff: IntGauge::with_opts(Opts::new(
                "gpu_ledger_cull_backoff_notebooks",
                "Notebooks whose last stop failed: they sit out 1, 2, 4, ... cycles (at most 1 h) and are skipped as reason backoff.",
            ))?,
            notices: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_cull_notices_total",
                    "Notices before a stop (--cull-notice) by kind (schedule, cancel) and result.",
                ),
                &["kind", "result"],
            )?,
            notice_webhook: IntCounterVec::new(
                Opts::new(
                    "gpu_ledger_cull_notice_webhook_total",
                    "Notice webhook posts (--cull-notice-webhook-url-file) by result (sent, error).",
                ),
                &["result"],
            )?,
            time_to_free: Histogram::with_opts(
                HistogramOpts::new(
                    "gpu_ledger_cull_time_to_free_seconds",
                    "Seconds from our stop to the notebook's pod being gone from the ledger.",
                )
                .buckets(TIME_TO_FREE_BUCKETS_SECONDS.to_vec()),
            )?,
        };
        for r in StopResult::ALL {
            m.stops.with_label_values(&[r.as_str()]);
        }
        for r in SkipReason::ALL {
            m.skips.with_label_values(&[r.as_str()]);
        }
        for r in CircuitReason::ALL {
            m.circuit_open.with_label_values(&[r.as_str()]).set(0);
        }
        for r in HoldBack::ALL {
            m.held_back.with_label_values(&[r.as_str()]).set(0);
        }
        for kind in ["schedule", "cancel"] {
            for r in NoticeResult::ALL {
                m.notices.with_label_values(&[kind, r.as_str()]);
            }
        }
        for r in ["sent", "error"] {
            m.notice_webhook.with_label_values(&[r]);
        }
        for r in LeaseError::REASONS {
            m.lease_errors.with_label_values(&[r]);
        }
        Ok(m)
    }

    /// Records why the last cycle did not act (`None`: it was not held back).
    pub fn observe_held_back(&self, held_back: Option<HoldBack>) {
        for r in HoldBack::ALL {
            self.held_back
                .with_label_values(&[r.as_str()])
                .set(i64::from(held_back == Some(r)));
        }
    }

    /// Records one plan: gauges, skip counters and the circuit state. With culling off
    /// (`enabled` false) the circuit reads closed: it blocks nothing then, and must not alert.
    pub fn observe_plan(&self, plan: &Plan, enabled: bool) {
        self.candidates
            .set(i64::try_from(plan.candidates).unwrap_or(i64::MAX));
        self.would_stop
            .set(i64::try_from(plan.actions.len()).unwrap_or(i64::MAX));
        for s in &plan.skips {
            self.skips.with_label_values(&[s.reason.as_str()]).inc();
        }
        for r in CircuitReason::ALL {
            self.circuit_open
                .with_label_values(&[r.as_str()])
                .set(i64::from(enabled && plan.circuit == Some(r)));
        }
    }

    pub fn observe_stop(&self, result: StopResult) {
        self.stops.with_label_values(&[result.as_str()]).inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    #[test]
    fn registers_exactly_the_documented_families() {
        let registry = Registry::new();
        let leadership = Arc::new(crate::cull::lease::StaticLeadership::new(true));
        let m = CullMetrics::register(&registry, leadership.clone()).expect("register");
        m.observe_stop(StopResult::DryRun);
        m.time_to_free.observe(42.0);
        let mut names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "gpu_ledger_cull_backoff_notebooks",
                "gpu_ledger_cull_candidates",
                "gpu_ledger_cull_circuit_open",
                "gpu_ledger_cull_enabled",
                "gpu_ledger_cull_held_back",
                "gpu_ledger_cull_leader",
                "gpu_ledger_cull_lease_errors_total",
                "gpu_ledger_cull_notice_webhook_total",
                "gpu_ledger_cull_notices_total",
                "gpu_ledger_cull_skips_total",
                "gpu_ledger_cull_stops_total",
                "gpu_ledger_cull_time_to_free_seconds",
                "gpu_ledger_cull_would_stop",
            ]
        );
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .expect("encode");
        let text = String::from_utf8(text).expect("utf8");
        assert!(
            text.contains("gpu_ledger_cull_stops_total{result=\"dry_run\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_ledger_cull_skips_total{reason=\"shared_gpu\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("gpu_ledger_cull_circuit_open{reason=\"usage_unavailable\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("gpu_ledger_cull_held_back{reason=\"kill_switch_invalid\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("gpu_ledger_cull_lease_errors_total{reason=\"timeout\"} 0"),
            "{text}"
        );
        assert!(text.contains("gpu_ledger_cull_leader 1"), "{text}");
        // The leader gauge follows the claim at scrape time, not at the last cycle.
        leadership.set(false);
        let again = TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        assert!(again.contains("gpu_ledger_cull_leader 0"), "{again}");
        // A second registration of the same families is refused (one culler per registry).
        assert!(CullMetrics::register(&registry, leadership).is_err());
    }

    #[test]
    fn plan_sets_gauges_and_circuit() {
        let m = CullMetrics::unregistered().expect("metrics");
        let plan = Plan {
            candidates: 2,
            circuit: Some(CircuitReason::IdleShare),
            ..Plan::default()
        };
        m.observe_plan(&plan, true);
        assert_eq!(m.candidates.get(), 2);
        assert_eq!(m.would_stop.get(), 0);
        assert_eq!(m.circuit_open.with_label_values(&["idle_share"]).get(), 1);
        m.observe_plan(&Plan::default(), true);
        assert_eq!(m.circuit_open.with_label_values(&["idle_share"]).get(), 0);
        // Culling off: the breaker blocks nothing, so it reads closed.
        m.observe_plan(&plan, false);
        assert_eq!(m.candidates.get(), 2, "planning is still exported");
        assert_eq!(m.circuit_open.with_label_values(&["idle_share"]).get(), 0);
    }
}
