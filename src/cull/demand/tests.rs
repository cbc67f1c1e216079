//! `--cull-when=demand` over the reclaim planner's answer: plans with and without waiting pods.

use chrono::{DateTime, Duration, TimeZone, Utc};

use crate::cull::CullWhen;
use crate::cull::plan::{Action, CullPolicy, SkipReason, plan, still_a_stop};
use crate::ledger::claims::{Claims, NodeInfo, NotebookInfo};
use crate::ledger::{Attribution, Evidence, Ledger, OwnedBy, PodRow, PodState, reclaim};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0)
        .single()
        .expect("valid time")
}

fn base(ns: &str, pod: &str, node: Option<&str>, state: PodState, gpus: u64) -> PodRow {
    PodRow::new(ns, pod)
        .placed(node, state)
        .holding("nvidia.com/gpu", gpus)
}

/// A notebook pod that passes every culling rule at `t0()`, idle `idle_h` hours on `node`.
fn idle_nb(ns: &str, name: &str, node: &str, idle_h: i64) -> PodRow {
    let now = t0();
    let mut p = base(ns, &format!("{name}-0"), Some(node), PodState::Running, 1);
    p.attribution = Attribution::Exclusive;
    p.utilization = Some(0.0);
    p.idle = Some(true);
    p.idle_seconds = Some((idle_h * 3600) as f64);
    p.notebook = Some(name.into());
    p.evidence = Evidence {
        uid: format!("pod-{ns}-{name}"),
        owner: Some(OwnedBy::notebook(
            NotebookInfo::new(ns, name).at_version("42"),
            true,
        )),
        started_at: Some(now - Duration::hours(10)),
        ready_since: Some(now - Duration::hours(10)),
        coverage: Some(1.0),
        newest_sample_at: Some(now - Duration::seconds(30)),
        peak: Some(0.0),
        idle_since: Some(now - Duration::hours(idle_h)),
        devices_found: 1,
        devices_expected: 1,
        ..Evidence::default()
    };
    p
}

fn node(name: &str, gpus: u64) -> NodeInfo {
    NodeInfo::new(name).allocating("nvidia.com/gpu", gpus)
}

/// The ledger with the planner's answer, as `ledger::build` publishes it.
fn ledger(nodes: Vec<NodeInfo>, mut pods: Vec<PodRow>) -> Ledger {
    pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    let claims = Claims {
        nodes,
        ..Claims::default()
    };
    let mut l = Ledger::empty(t0());
    l.usage_available = true;
    l.reclaim = reclaim::plan(&claims, &pods, t0(), crate::ledger::ClaimsScope::Complete);
    l.pods = pods;
    l
}

fn demand() -> CullPolicy {
    CullPolicy {
        when: CullWhen::Demand,
        ..CullPolicy::default()
    }
}

fn stopped(p: &crate::cull::plan::Plan) -> Vec<(&str, Option<&str>)> {
    p.actions
        .iter()
        .map(|a| {
            let Action::Stop {
                notebook,
                for_pending,
                ..
            } = a;
            (notebook.as_str(), for_pending.as_deref())
        })
        .collect()
}

#[test]
fn nothing_is_stopped_while_nothing_waits() {
    let l = ledger(
        vec![node("gpu-1", 2)],
        vec![idle_nb("u", "a", "gpu-1", 5), idle_nb("v", "b", "gpu-1", 3)],
    );
    let p = plan(&l, &demand(), t0());
    assert!(p.actions.is_empty(), "{p:?}");
    assert_eq!(p.candidates, 0);
    let reasons: Vec<SkipReason> = p.skips.iter().map(|s| s.reason).collect();
    assert_eq!(reasons, [SkipReason::NoDemand, SkipReason::NoDemand]);
    // The default, `idle`, stops both (one per namespace).
    assert_eq!(plan(&l, &CullPolicy::default(), t0()).actions.len(), 2);
}

#[test]
fn a_waiting_pod_gets_the_stop_it_needs_and_no_more() {
    let l = ledger(
        vec![node("gpu-1", 1), node("gpu-2", 1)],
        vec![
            idle_nb("u", "long", "gpu-1", 9),
            idle_nb("v", "short", "gpu-2", 3),
            base("ml", "trial", None, PodState::Pending, 1),
        ],
    );
    let p = plan(&l, &demand(), t0());
    // The longest idle of the cheapest options; the other notebook keeps its kernel.
    assert_eq!(stopped(&p), [("long", Some("ml/trial"))]);
    let Action::Stop { .. } = &p.actions[0];
    assert!(
        p.actions[0]
            .reason_text()
            .ends_with("needed by pending pod ml/trial"),
        "{}",
        p.actions[0].reason_text()
    );
    assert!(
        p.skips
            .iter()
            .any(|s| s.pod == "short-0" && s.reason == SkipReason::NoDemand)
    );
}

#[test]
fn a_pod_that_fits_already_needs_no_stop() {
    let l = ledger(
        vec![node("gpu-1", 1), node("gpu-2", 1)],
        vec![
            idle_nb("u", "a", "gpu-1", 9),
            base("ml", "trial", None, PodState::Pending, 1),
        ],
    );
    assert!(plan(&l, &demand(), t0()).actions.is_empty());
}

#[test]
fn an_option_culling_cannot_complete_is_passed_over() {
    // gpu-1 takes the pod with one stop, but its notebook is idle only 1h (under
    // --cull-idle-after 2h): culling takes the next option, two stops on gpu-2.
    let mut young = idle_nb("u", "young", "gpu-1", 1);
    young.resources.insert("nvidia.com/gpu".into(), 2);
    let l = ledger(
        vec![node("gpu-1", 2), node("gpu-2", 2)],
        vec![
            young,
            idle_nb("v", "x", "gpu-2", 9),
            idle_nb("w", "y", "gpu-2", 9),
            base("ml", "big", None, PodState::Pending, 2),
        ],
    );
    let first = &l.reclaim[0].options[0];
    assert_eq!(first.node, "gpu-1");
    let p = plan(&l, &demand(), t0());
    assert_eq!(
        stopped(&p),
        [("x", Some("ml/big")), ("y", Some("ml/big"))],
        "{p:?}"
    );
}

#[test]
fn the_re_check_before_a_stop_drops_it_once_nobody_waits() {
    let nodes = vec![node("gpu-1", 1)];
    let waiting = ledger(
        nodes.clone(),
        vec![
            idle_nb("u", "a", "gpu-1", 9),
            base("ml", "trial", None, PodState::Pending, 1),
        ],
    );
    let uid = "pod-u-a";
    assert_eq!(
        stopped(&plan(&waiting, &demand(), t0())),
        [("a", Some("ml/trial"))]
    );
    assert!(still_a_stop(&waiting, &demand(), t0(), uid));
    // Between the plan and the write the pending pod was deleted: the fresh ledger has no
    // demand, so the stop is called off; under `idle` it still goes ahead.
    let gone = ledger(nodes, vec![idle_nb("u", "a", "gpu-1", 9)]);
    assert!(!still_a_stop(&gone, &demand(), t0(), uid));
    assert!(still_a_stop(&gone, &CullPolicy::default(), t0(), uid));
    // And a pod that is no longer a candidate is never a stop.
    assert!(!still_a_stop(&waiting, &demand(), t0(), "pod-u-missing"));
}

/// Issue 36, item 1: a pending pod with scheduling gates (Kueue holds its pods behind
/// `kueue.x-k8s.io/admission`) cannot be scheduled whatever is freed: nothing is stopped for it.
#[test]
fn a_scheduling_gated_pod_gets_no_stop() {
    let nodes = vec![node("gpu-1", 1)];
    let pods = vec![
        idle_nb("u", "a", "gpu-1", 9),
        base("trials", "gated", None, PodState::Pending, 1),
    ];
    let mut sorted = pods.clone();
    sorted.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    let claims = Claims {
        nodes,
        pods: vec![std::sync::Arc::new(
            crate::ledger::claims::PodClaim::new("trials", "gated")
                .with_uid("gated")
                .claiming("nvidia.com/gpu", 1)
                .gated_by("kueue.x-k8s.io/admission"),
        )],
        ..Claims::default()
    };
    let mut l = Ledger::empty(t0());
    l.usage_available = true;
    l.reclaim = reclaim::plan(&claims, &sorted, t0(), crate::ledger::ClaimsScope::Complete);
    l.pods = sorted;
    let p = plan(&l, &demand(), t0());
    assert!(p.actions.is_empty(), "{p:?}");
    assert!(
        p.skips
            .iter()
            .any(|s| s.pod == "a-0" && s.reason == SkipReason::NoDemand)
    );
}

/// Issue 36, item 2: the pod's only option stops a notebook and also counts on a stuck
/// Terminating pod's force delete, which gpu-ledger never does: the stop alone would leave the
/// pod pending, so nothing is stopped; a second node where a stop alone makes room is used.
#[test]
fn a_stop_that_needs_a_force_delete_too_is_not_made() {
    let mut gone = base("u", "gone-0", Some("gpu-1"), PodState::Terminating, 1);
    gone.stuck = true;
    let pods = vec![
        idle_nb("u", "a", "gpu-1", 9),
        gone.clone(),
        base("ml", "big", None, PodState::Pending, 2),
    ];
    let l = ledger(vec![node("gpu-1", 2)], pods.clone());
    let only = &l.reclaim[0].options;
    assert_eq!(only.len(), 1, "{only:?}");
    assert_eq!(
        (only[0].by_stopping.len(), only[0].stuck_holders.len()),
        (1, 1)
    );
    let p = plan(&l, &demand(), t0());
    assert!(p.actions.is_empty(), "{p:?}");
    assert!(
        p.skips
            .iter()
            .any(|s| s.pod == "a-0" && s.reason == SkipReason::NoDemand)
    );
    // With a node where two stops alone make room, those are made instead.
    let mut more = pods;
    more.push(idle_nb("v", "b", "gpu-2", 8));
    more.push(idle_nb("w", "c", "gpu-2", 7));
    let l = ledger(vec![node("gpu-1", 2), node("gpu-2", 2)], more);
    assert_eq!(l.reclaim[0].options[0].node, "gpu-1");
    assert_eq!(
        stopped(&plan(&l, &demand(), t0())),
        [("b", Some("ml/big")), ("c", Some("ml/big"))]
    );
}
