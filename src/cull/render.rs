//! Culling's own rendering of a plan for `report --cull-dry-run`: text (the table's section),
//! the `cull` object of the JSON (docs/report-json.md) and the plan's `gpu_ledger_cull_*`
//! families for `-o metrics`. It lives beside the plan so that no other sink imports culling.

use std::collections::BTreeMap;

use serde::Serialize;

use super::metrics::CullMetrics;
use super::plan::{Action, CircuitReason, Notice, Plan, rfc3339};

/// The `cull` object of `report -o json --cull-dry-run`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CullJson {
    /// Notebooks that met every rule, before the per-cycle caps and the circuit breaker.
    pub candidates: usize,
    /// Why the circuit breaker blocks every stop, or `null` when it is closed.
    pub circuit: Option<&'static str>,
    /// What `--cull=dry-run` would stop now.
    pub would_stop: Vec<WouldStop>,
    /// Every other GPU pod and the first rule it failed.
    pub skipped: Vec<Skipped>,
    /// Notices the plan would write or cancel (`--cull-notice`; empty without it).
    pub notices: Vec<NoticeJson>,
}

/// One notice of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoticeJson {
    /// `schedule` or `cancel`.
    pub kind: &'static str,
    pub namespace: String,
    pub notebook: String,
    pub pod: String,
    /// When the stop is (schedule) or was (cancel) due, RFC 3339 UTC.
    pub stop_at: String,
    /// The evidence (schedule) or why it is cancelled (cancel), in words.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WouldStop {
    pub namespace: String,
    pub notebook: String,
    pub pod: String,
    pub idle_seconds: f64,
    pub peak_utilization: Option<f64>,
    /// The stop time the target's stop marker would be set to.
    pub stop_value: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    pub namespace: String,
    pub pod: String,
    pub notebook: Option<String>,
    pub reason: &'static str,
    /// What the reason alone does not say (the activity veto's time and source); absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl CullJson {
    pub fn of(plan: &Plan) -> Self {
        CullJson {
            candidates: plan.candidates,
            circuit: plan.circuit.map(CircuitReason::as_str),
            would_stop: plan
                .actions
                .iter()
                .map(|a| {
                    let Action::Stop {
                        namespace,
                        notebook,
                        pod,
                        idle_seconds,
                        peak_utilization,
                        stop_value,
                        ..
                    } = a;
                    WouldStop {
                        namespace: namespace.clone(),
                        notebook: notebook.clone(),
                        pod: pod.clone(),
                        idle_seconds: *idle_seconds,
                        peak_utilization: *peak_utilization,
                        stop_value: stop_value.clone(),
                        reason: a.reason_text(),
                    }
                })
                .collect(),
            skipped: plan
                .skips
                .iter()
                .map(|s| Skipped {
                    namespace: s.namespace.clone(),
                    pod: s.pod.clone(),
                    notebook: s.notebook.clone(),
                    reason: s.reason.as_str(),
                    detail: s.detail.clone(),
                })
                .collect(),
            notices: plan
                .notices
                .iter()
                .map(|n| {
                    let (Notice::Schedule { pod, stop_at, .. }
                    | Notice::Cancel { pod, stop_at, .. }) = n;
                    let (namespace, notebook, _) = n.object();
                    NoticeJson {
                        kind: n.kind(),
                        namespace: namespace.to_string(),
                        notebook: notebook.to_string(),
                        pod: pod.clone(),
                        stop_at: rfc3339(*stop_at),
                        reason: n.reason_text(),
                    }
                })
                .collect(),
        }
    }
}

/// The plan as `gpu_ledger_cull_candidates`, `gpu_ledger_cull_would_stop`,
/// `gpu_ledger_cull_skips_total{reason}` (this plan's skips) and
/// `gpu_ledger_cull_circuit_open{reason}`: the families `serve --cull=dry-run` exports after one
/// plan. Which notebooks would stop is not a metric (no object names in culling labels).
pub fn plan_metrics(plan: &Plan) -> Result<String, prometheus::Error> {
    let m = CullMetrics::unregistered()?;
    // A dry-run plan is culling enabled in dry-run: its circuit state is meant to be read.
    m.observe_plan(plan, true);
    let registry = prometheus::Registry::new();
    registry.register(Box::new(m.candidates))?;
    registry.register(Box::new(m.would_stop))?;
    registry.register(Box::new(m.skips))?;
    registry.register(Box::new(m.circuit_open))?;
    prometheus::TextEncoder::new().encode_to_string(&registry.gather())
}

/// Writes a plan as text (the offline `report --cull-dry-run`).
pub fn render_plan(plan: &Plan, out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(out)?;
    let circuit = plan.circuit.map_or("closed", CircuitReason::as_str);
    writeln!(
        out,
        "CULL PLAN  candidates={}  would_stop={}  circuit={circuit}",
        plan.candidates,
        plan.actions.len()
    )?;
    for a in &plan.actions {
        let Action::Stop {
            namespace,
            notebook,
            pod,
            ..
        } = a;
        writeln!(
            out,
            "  STOP  {namespace}/{notebook}  pod={pod}  {}",
            a.reason_text()
        )?;
    }
    for n in &plan.notices {
        let (namespace, notebook, _) = n.object();
        match n {
            Notice::Schedule { stop_at, pod, .. } => writeln!(
                out,
                "  NOTICE  {namespace}/{notebook}  pod={pod}  stops at {} unless used or snoozed: {}",
                rfc3339(*stop_at),
                n.reason_text()
            )?,
            Notice::Cancel { stop_at, pod, .. } => writeln!(
                out,
                "  CANCEL  {namespace}/{notebook}  pod={pod}  stop at {} cancelled: {}",
                rfc3339(*stop_at),
                n.reason_text()
            )?,
        }
    }
    // A veto by the user's own activity is named: it is the one skip a user acts on by
    // waiting, and the time tells how long.
    for s in plan.skips.iter().filter(|s| s.detail.is_some()) {
        let notebook = s.notebook.as_deref().unwrap_or("");
        let detail = s.detail.as_deref().unwrap_or_default();
        writeln!(
            out,
            "  HELD  {}/{notebook}  pod={}  {}: {detail}",
            s.namespace,
            s.pod,
            s.reason.as_str()
        )?;
    }
    let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &plan.skips {
        *by_reason.entry(s.reason.as_str()).or_default() += 1;
    }
    if !by_reason.is_empty() {
        let parts: Vec<String> = by_reason.iter().map(|(r, n)| format!("{r}={n}")).collect();
        writeln!(out, "  skipped: {}", parts.join(" "))?;
    }
    Ok(())
}
