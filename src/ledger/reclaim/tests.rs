use chrono::{DateTime, Utc};
use proptest::prelude::*;

use super::*;
use crate::ledger::claims::{NodeInfo, NotebookInfo};

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// Units by resource name, as a node's allocatable map or a pod's resources.
fn res<M: FromIterator<(String, u64)>>(r: &[(&str, u64)]) -> M {
    r.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
}

fn node(name: &str, alloc: &[(&str, u64)]) -> NodeInfo {
    NodeInfo {
        allocatable: res(alloc),
        ..NodeInfo::new(name)
    }
}

fn row(ns: &str, pod: &str, node: Option<&str>, state: PodState, r: &[(&str, u64)]) -> PodRow {
    PodRow {
        gpus: r.iter().map(|(_, u)| *u as f64).sum(),
        resources: res(r),
        ..PodRow::new(ns, pod)
            .placed(node, state)
            .with_uid(format!("uid-{ns}-{pod}"))
    }
}

fn pending(ns: &str, pod: &str, r: &[(&str, u64)]) -> PodRow {
    row(ns, pod, None, PodState::Pending, r)
}

/// A proven-idle notebook pod (`<nb>-0` of notebook `<nb>`), exclusive, idle for `idle` seconds.
fn idle_nb(ns: &str, nb: &str, node: &str, r: &[(&str, u64)], idle: f64) -> PodRow {
    row(ns, &format!("{nb}-0"), Some(node), PodState::Running, r)
        .attributed(Attribution::Exclusive)
        .idle_for(idle)
        .of_notebook(NotebookInfo::new(ns, nb))
}

fn busy(ns: &str, pod: &str, node: &str, r: &[(&str, u64)]) -> PodRow {
    row(ns, pod, Some(node), PodState::Running, r)
        .attributed(Attribution::Exclusive)
        .with_idle(Some(false))
}

fn stuck(ns: &str, pod: &str, node: &str, r: &[(&str, u64)]) -> PodRow {
    let mut p = row(ns, pod, Some(node), PodState::Terminating, r);
    p.stuck = true;
    p
}

fn claim(ns: &str, pod: &str, placement: Placement) -> PodClaim {
    PodClaim::new(ns, pod).placed_by(placement)
}

fn run(nodes: Vec<NodeInfo>, specs: Vec<PodClaim>, mut pods: Vec<PodRow>) -> Vec<Reclaim> {
    pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    let claims = Claims {
        pods: specs.into_iter().map(Into::into).collect(),
        nodes,
        ..Claims::default()
    };
    plan(&claims, &pods, now(), ClaimsScope::Complete)
}

const GPU: &str = "nvidia.com/gpu";

fn stops(o: &ReclaimOption) -> Vec<&str> {
    o.by_stopping.iter().map(|s| s.pod.as_str()).collect()
}

#[test]
fn options_are_free_then_stuck_then_fewest_stops_then_longest_idle() {
    let out = run(
        vec![
            node("a-stops2", &[(GPU, 2)]),
            node("b-stops1-short", &[(GPU, 2)]),
            node("c-stops1-long", &[(GPU, 2)]),
            node("d-stuck", &[(GPU, 2)]),
            node("e-free", &[(GPU, 2)]),
            node("f-busy", &[(GPU, 2)]),
        ],
        vec![],
        vec![
            pending("ml", "trial", &[(GPU, 2)]),
            idle_nb("u", "x1", "a-stops2", &[(GPU, 1)], 9000.0),
            idle_nb("u", "x2", "a-stops2", &[(GPU, 1)], 9000.0),
            idle_nb("u", "y", "b-stops1-short", &[(GPU, 2)], 600.0),
            idle_nb("u", "z", "c-stops1-long", &[(GPU, 2)], 7200.0),
            stuck("u", "gone", "d-stuck", &[(GPU, 2)]),
            busy("u", "train", "f-busy", &[(GPU, 2)]),
        ],
    );
    assert_eq!(out.len(), 1);
    let r = &out[0];
    assert_eq!(r.fits_nowhere, None);
    let nodes: Vec<&str> = r.options.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "e-free",
            "d-stuck",
            "c-stops1-long",
            "b-stops1-short",
            "a-stops2"
        ]
    );
    assert!(r.options[0].is_free());
    assert_eq!(r.options[1].stuck_holders[0].pod, "gone");
    assert_eq!(stops(&r.options[2]), ["z-0"]);
    assert_eq!(stops(&r.options[4]), ["x1-0", "x2-0"]);
    assert!(!r.reclaimable(), "free already: nothing to reclaim");
}

#[test]
fn fewest_stops_take_the_largest_holder() {
    let out = run(
        vec![node("n", &[(GPU, 4)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 2)]),
            idle_nb("u", "one-a", "n", &[(GPU, 1)], 99_999.0),
            idle_nb("u", "one-b", "n", &[(GPU, 1)], 99_999.0),
            idle_nb("u", "two", "n", &[(GPU, 2)], 10.0),
        ],
    );
    assert_eq!(stops(&out[0].options[0]), ["two-0"]);
    assert!(out[0].reclaimable());
}

#[test]
fn shared_unattributed_busy_and_opted_out_holders_are_never_stopped() {
    let mut shared = idle_nb("u", "shared", "n", &[(GPU, 1)], 9000.0);
    shared.attribution = Attribution::Shared;
    let mut unattributed = idle_nb("u", "dark", "n", &[(GPU, 1)], 9000.0);
    unattributed.attribution = Attribution::Unattributed;
    let mut opted = idle_nb("u", "mine", "n", &[(GPU, 1)], 9000.0);
    if let Some(OwnedBy { info: nb, .. }) = &mut opted.evidence.owner {
        nb.cull_opt_out = true;
    }
    let mut snoozed = idle_nb("u", "later", "n", &[(GPU, 1)], 9000.0);
    if let Some(OwnedBy { info: nb, .. }) = &mut snoozed.evidence.owner {
        nb.snooze_until = Some(now() + chrono::Duration::hours(1));
    }
    let mut unverified = idle_nb("u", "claimed", "n", &[(GPU, 1)], 9000.0);
    if let Some(OwnedBy { verified: v, .. }) = &mut unverified.evidence.owner {
        *v = false;
    }
    let mut stopped = idle_nb("u", "stopped", "n", &[(GPU, 1)], 9000.0);
    if let Some(OwnedBy { info: nb, .. }) = &mut stopped.evidence.owner {
        nb.stopped = Some("2026-03-01T00:00:00Z".into());
    }
    let out = run(
        vec![node("n", &[(GPU, 6)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 1)]),
            shared,
            unattributed,
            opted,
            snoozed,
            unverified,
            stopped,
        ],
    );
    assert!(out[0].options.is_empty(), "{:?}", out[0].options);
    assert_eq!(
        out[0].fits_nowhere.as_deref(),
        Some(
            "0/1 nodes would take it: 1 too small for 1 nvidia.com/gpu even with idle notebooks stopped"
        )
    );
}

#[test]
fn a_notebook_with_a_busy_pod_is_not_reclaimable() {
    let mut second = busy("u", "nb-1", "n", &[(GPU, 1)]);
    second.evidence.owner = idle_nb("u", "nb", "n", &[], 0.0).evidence.owner;
    let out = run(
        vec![node("n", &[(GPU, 2)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 1)]),
            idle_nb("u", "nb", "n", &[(GPU, 1)], 9000.0),
            second,
        ],
    );
    assert!(out[0].options.is_empty());
}

#[test]
fn selector_affinity_taints_and_resource_names_keep_pods_off_nodes() {
    let mut labelled = node("labelled", &[(GPU, 1)]);
    labelled.labels.insert(
        "nvidia.com/gpu.product".into(),
        "NVIDIA-H100-80GB-HBM3".into(),
    );
    labelled.labels.insert("gpu-mem-gb".into(), "80".into());
    let mut tainted = labelled.clone();
    tainted.name = "tainted".into();
    tainted.taints.push(Taint {
        key: "nvidia.com/gpu".into(),
        value: "present".into(),
        effect: "NoSchedule".into(),
    });
    let mut small = labelled.clone();
    small.name = "small".into();
    small.labels.insert("gpu-mem-gb".into(), "24".into());
    let plain = node("plain", &[(GPU, 1)]);
    let mig = node("mig", &[("nvidia.com/mig-1g.10gb", 7)]);
    let nodes = vec![labelled, tainted, small, plain, mig];
    let holders = |nodes: &[NodeInfo]| -> Vec<PodRow> {
        nodes
            .iter()
            .map(|n| {
                let r = n.allocatable.iter().next().map(|(k, v)| (k.as_str(), *v));
                idle_nb(
                    "u",
                    &format!("on-{}", n.name),
                    &n.name,
                    &[r.expect("one")],
                    9000.0,
                )
            })
            .collect()
    };
    let placement = Placement {
        node_selector: [(
            "nvidia.com/gpu.product".to_string(),
            "NVIDIA-H100-80GB-HBM3".to_string(),
        )]
        .into(),
        required_terms: Some(vec![NodeSelectorTerm {
            match_expressions: vec![NodeRequirement {
                key: "gpu-mem-gb".into(),
                operator: NodeOp::Gt,
                values: vec!["40".into()],
            }],
            match_fields: vec![],
        }]),
        tolerations: vec![],
        too_large: false,
    };
    let mut pods = holders(&nodes);
    pods.push(pending("ml", "p", &[(GPU, 1)]));
    let out = run(
        nodes.clone(),
        vec![claim("ml", "p", placement.clone())],
        pods,
    );
    let options: Vec<&str> = out[0].options.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(options, ["labelled"], "{:?}", out[0]);

    // Tolerating the taint opens the tainted node too.
    let tolerant = Placement {
        tolerations: vec![Toleration {
            key: "nvidia.com/gpu".into(),
            exists: true,
            value: String::new(),
            effect: String::new(),
        }],
        ..placement.clone()
    };
    let mut pods = holders(&nodes);
    pods.push(pending("ml", "p", &[(GPU, 1)]));
    let out = run(nodes.clone(), vec![claim("ml", "p", tolerant)], pods);
    let options: Vec<&str> = out[0].options.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(options, ["labelled", "tainted"]);

    // A MIG profile fits only where that profile is offered; another profile never does.
    let mut pods = holders(&nodes);
    pods.push(pending("ml", "m", &[("nvidia.com/mig-1g.10gb", 1)]));
    pods.push(pending("ml", "m2", &[("nvidia.com/mig-2g.20gb", 1)]));
    let out = run(nodes.clone(), vec![], pods);
    let options: Vec<&str> = out[0].options.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(options, ["mig"]);
    assert_eq!(stops(&out[0].options[0]), ["on-mig-0"]);
    assert!(out[1].options.is_empty());
    assert_eq!(
        out[1].fits_nowhere.as_deref(),
        Some("0/5 nodes would take it: 1 untolerated taint, 4 no nvidia.com/mig-2g.20gb")
    );
}

#[test]
fn node_affinity_operators_behave_as_in_kubernetes() {
    let mut n = node("gpu-1", &[]);
    n.labels.insert("zone".into(), "a".into());
    n.labels.insert("cores".into(), "16".into());
    let req = |key: &str, op, values: &[&str]| NodeRequirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| (*v).to_string()).collect(),
    };
    let term = |e: Vec<NodeRequirement>, f: Vec<NodeRequirement>| NodeSelectorTerm {
        match_expressions: e,
        match_fields: f,
    };
    assert!(term_matches(
        &term(vec![req("zone", NodeOp::In, &["a", "b"])], vec![]),
        &n
    ));
    assert!(!term_matches(
        &term(vec![req("zone", NodeOp::NotIn, &["a"])], vec![]),
        &n
    ));
    assert!(term_matches(
        &term(vec![req("gone", NodeOp::NotIn, &["a"])], vec![]),
        &n
    ));
    assert!(term_matches(
        &term(vec![req("zone", NodeOp::Exists, &[])], vec![]),
        &n
    ));
    assert!(term_matches(
        &term(vec![req("gone", NodeOp::DoesNotExist, &[])], vec![]),
        &n
    ));
    assert!(term_matches(
        &term(vec![req("cores", NodeOp::Gt, &["8"])], vec![]),
        &n
    ));
    assert!(!term_matches(
        &term(vec![req("cores", NodeOp::Lt, &["8"])], vec![]),
        &n
    ));
    assert!(
        !term_matches(&term(vec![req("zone", NodeOp::Gt, &["1"])], vec![]), &n),
        "not a number"
    );
    assert!(!term_matches(
        &term(vec![req("cores", NodeOp::Gt, &["1", "2"])], vec![]),
        &n
    ));
    assert!(!term_matches(
        &term(vec![req("zone", NodeOp::Unknown, &[])], vec![]),
        &n
    ));
    assert!(term_matches(
        &term(vec![], vec![req("metadata.name", NodeOp::In, &["gpu-1"])]),
        &n
    ));
    assert!(!term_matches(
        &term(
            vec![],
            vec![req("metadata.name", NodeOp::NotIn, &["gpu-1"])]
        ),
        &n
    ));
    assert!(!term_matches(
        &term(vec![], vec![req("metadata.uid", NodeOp::Exists, &[])]),
        &n
    ));
    assert!(
        !term_matches(&term(vec![], vec![]), &n),
        "an empty term matches nothing"
    );
}

#[test]
fn tolerations_match_key_value_and_effect() {
    let taint = |k: &str, v: &str, e: &str| Taint {
        key: k.into(),
        value: v.into(),
        effect: e.into(),
    };
    let tol = |k: &str, exists: bool, v: &str, e: &str| Toleration {
        key: k.into(),
        exists,
        value: v.into(),
        effect: e.into(),
    };
    let t = [taint("gpu", "yes", "NoSchedule")];
    assert!(!tolerates(&[], &t));
    assert!(tolerates(&[], &[taint("gpu", "yes", "PreferNoSchedule")]));
    assert!(tolerates(&[tol("gpu", false, "yes", "")], &t));
    assert!(!tolerates(&[tol("gpu", false, "no", "")], &t));
    assert!(tolerates(&[tol("gpu", true, "", "NoSchedule")], &t));
    assert!(!tolerates(&[tol("gpu", true, "", "NoExecute")], &t));
    assert!(
        tolerates(&[tol("", true, "", "")], &t),
        "tolerates everything"
    );
}

#[test]
fn stuck_holders_come_before_stops_and_are_listed_apart() {
    let out = run(
        vec![node("n", &[(GPU, 2)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 2)]),
            stuck("u", "gone", "n", &[(GPU, 1)]),
            idle_nb("u", "nb", "n", &[(GPU, 1)], 9000.0),
        ],
    );
    let o = &out[0].options[0];
    assert_eq!(stops(o), ["nb-0"]);
    assert_eq!(o.stuck_holders.len(), 1);
    assert_eq!(o.stuck_holders[0].pod, "gone");
}

#[test]
fn dra_and_oversized_placements_are_not_planned_and_say_so() {
    let too_large = Placement {
        too_large: true,
        ..Placement::default()
    };
    let out = run(
        vec![node("n", &[(GPU, 2)])],
        vec![claim("ml", "big", too_large)],
        vec![
            pending("ml", "big", &[(GPU, 1)]),
            pending("ml", "dra", &[("dra:gpu.nvidia.com", 1)]),
        ],
    );
    assert!(
        out[0]
            .fits_nowhere
            .as_deref()
            .is_some_and(|r| r.contains("too large"))
    );
    assert!(
        out[1]
            .fits_nowhere
            .as_deref()
            .is_some_and(|r| r.contains("DRA"))
    );
}

// ---- properties -------------------------------------------------------------------------

const NAMES: [&str; 3] = [
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/gpu.shared",
];

#[derive(Debug, Clone)]
struct World {
    nodes: Vec<NodeInfo>,
    pods: Vec<PodRow>,
    specs: Vec<PodClaim>,
}

fn world() -> impl Strategy<Value = World> {
    let node_s = (0usize..3, 1u64..5, any::<bool>(), any::<bool>());
    let holder = (0usize..4, 0usize..3, 1u64..3, 0u8..6, 0u32..20_000);
    let want = (0usize..3, 1u64..4, any::<bool>(), any::<bool>());
    (
        prop::collection::vec(node_s, 1..4),
        prop::collection::vec(holder, 0..10),
        prop::collection::vec(want, 1..4),
    )
        .prop_map(|(ns, hs, ws)| {
            let nodes: Vec<NodeInfo> = ns
                .iter()
                .enumerate()
                .map(|(i, (r, units, labelled, tainted))| {
                    let mut n = node(&format!("n{i}"), &[(NAMES[*r], *units)]);
                    if *labelled {
                        n.labels.insert("pool".into(), "big".into());
                    }
                    if *tainted {
                        n.taints.push(Taint {
                            key: "dedicated".into(),
                            value: "x".into(),
                            effect: "NoSchedule".into(),
                        });
                    }
                    n
                })
                .collect();
            let mut pods = Vec::new();
            for (i, (n, r, units, kind, idle)) in hs.into_iter().enumerate() {
                let Some(n) = nodes.get(n % nodes.len()) else {
                    continue;
                };
                let r = [(NAMES[r], units)];
                let name = format!("h{i}");
                let p = match kind {
                    0 => busy("u", &name, &n.name, &r),
                    1 => stuck("u", &name, &n.name, &r),
                    2 => {
                        let mut p = idle_nb("u", &name, &n.name, &r, f64::from(idle));
                        p.attribution = Attribution::Shared;
                        p
                    }
                    3 => {
                        let mut p = idle_nb("u", &name, &n.name, &r, f64::from(idle));
                        p.attribution = Attribution::Unattributed;
                        p
                    }
                    _ => idle_nb("u", &name, &n.name, &r, f64::from(idle)),
                };
                pods.push(p);
            }
            let mut specs = Vec::new();
            for (i, (r, units, selector, tolerate)) in ws.into_iter().enumerate() {
                let name = format!("w{i}");
                pods.push(pending("ml", &name, &[(NAMES[r], units)]));
                let mut placement = Placement::default();
                if selector {
                    placement.node_selector.push(("pool".into(), "big".into()));
                }
                if tolerate {
                    placement.tolerations.push(Toleration {
                        key: "dedicated".into(),
                        exists: true,
                        ..Toleration::default()
                    });
                }
                specs.push(claim("ml", &name, placement));
            }
            World { nodes, pods, specs }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn options_are_sound_minimal_and_stable(w in world(), seed in any::<u64>()) {
        let out = run(w.nodes.clone(), w.specs.clone(), w.pods.clone());
        for r in &out {
            let spec = w.specs.iter().find(|s| s.name == r.pending.pod).expect("spec");
            let want = w.pods.iter().find(|p| p.pod == r.pending.pod).expect("row");
            let (name, units) = want.resources.iter().next().expect("one resource");
            prop_assert_eq!(r.fits_nowhere.is_some(), r.options.is_empty());
            for o in &r.options {
                let n = w.nodes.iter().find(|n| n.name == o.node).expect("a real node");
                // The node is one the pod may use: selector, taints, resource name.
                prop_assert!(spec.placement.node_selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)));
                prop_assert!(tolerates(&spec.placement.tolerations, &n.taints));
                prop_assert!(n.allocatable.get(name).is_some_and(|a| a >= units));
                // Every stop is a proven-idle, exclusive notebook pod on that node holding the name.
                let holder = |ns: &str, pod: &str| w.pods.iter().find(|p| p.namespace == ns && p.pod == pod).expect("holder");
                for s in &o.by_stopping {
                    let h = holder(&s.namespace, &s.pod);
                    prop_assert_eq!(h.node.as_deref(), Some(o.node.as_str()));
                    prop_assert!(matches!(h.attribution, Attribution::Exclusive | Attribution::Mig));
                    prop_assert_eq!(h.idle, Some(true));
                    prop_assert!(h.resources.get(name).is_some_and(|u| *u > 0));
                }
                for s in &o.stuck_holders {
                    let h = holder(&s.namespace, &s.pod);
                    prop_assert!(h.stuck && h.state == PodState::Terminating);
                    prop_assert_eq!(h.node.as_deref(), Some(o.node.as_str()));
                }
                // Room: free + freed covers the request ...
                let on: Vec<&PodRow> = w.pods.iter().filter(|p| p.node.as_deref() == Some(n.name.as_str()) && p.state.holds()).collect();
                let held: u64 = on.iter().map(|p| p.resources.get(name).copied().unwrap_or(0)).sum();
                let alloc = n.allocatable[name];
                let free = alloc.saturating_sub(held);
                let units_of = |ns: &str, pod: &str| holder(ns, pod).resources.get(name).copied().unwrap_or(0);
                let stuck_units: u64 = o.stuck_holders.iter().map(|s| units_of(&s.namespace, &s.pod)).sum();
                let stop_units: Vec<u64> = o.by_stopping.iter().map(|s| units_of(&s.namespace, &s.pod)).collect();
                prop_assert!(free + stuck_units + stop_units.iter().sum::<u64>() >= *units);
                // ... and no smaller set of stops would: dropping the smallest stop falls short
                // even with every stuck holder and every larger idle holder is not fewer.
                if !stop_units.is_empty() {
                    let all_stuck: u64 = on.iter().filter(|p| p.stuck && p.state == PodState::Terminating).map(|p| p.resources.get(name).copied().unwrap_or(0)).sum();
                    let mut idle_units: Vec<u64> = on.iter().filter(|p| p.idle == Some(true) && matches!(p.attribution, Attribution::Exclusive | Attribution::Mig) && p.state == PodState::Running).map(|p| p.resources.get(name).copied().unwrap_or(0)).collect();
                    idle_units.sort_unstable_by(|a, b| b.cmp(a));
                    let best_smaller: u64 = idle_units.iter().take(stop_units.len() - 1).sum();
                    prop_assert!(free + all_stuck + best_smaller < *units, "a smaller set of stops would do");
                }
            }
        }
        // Stable: the same answer whatever the order of the inputs.
        let mut pods = w.pods.clone();
        let mut nodes = w.nodes.clone();
        let k = usize::try_from(seed % 7).unwrap_or(0);
        let len = pods.len().max(1);
        pods.rotate_left(k % len);
        nodes.reverse();
        let claims = Claims { pods: w.specs.iter().cloned().map(Into::into).collect(), nodes, ..Claims::default() };
        pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
        prop_assert_eq!(plan(&claims, &pods, now(), ClaimsScope::Complete), out);
    }
}

/// Issue 36, item 1: a pod with scheduling gates (Kueue's pod integration gates
/// `kueue.x-k8s.io/admission` until it admits the workload) is not considered by the scheduler:
/// no stop can serve it, so it has no option and is not reclaimable demand; the same pod
/// ungated still is.
#[test]
fn a_scheduling_gated_pod_is_no_demand() {
    let gated = claim("ml", "gated", Placement::default()).gated_by("kueue.x-k8s.io/admission");
    let out = run(
        vec![node("n", &[(GPU, 1)])],
        vec![gated, claim("ml", "open", Placement::default())],
        vec![
            pending("ml", "gated", &[(GPU, 1)]),
            pending("ml", "open", &[(GPU, 1)]),
            idle_nb("u", "nb", "n", &[(GPU, 1)], 9000.0),
        ],
    );
    assert_eq!(out[0].pending.pod, "gated");
    assert!(out[0].options.is_empty(), "{:?}", out[0].options);
    assert_eq!(
        out[0].fits_nowhere.as_deref(),
        Some("scheduling gated: kueue.x-k8s.io/admission")
    );
    assert!(!out[0].reclaimable());
    assert_eq!(out[1].pending.pod, "open");
    assert_eq!(stops(&out[1].options[0]), ["nb-0"]);
    assert!(out[1].reclaimable());
}

/// Issue 36, item 2: an option that counts on a stuck holder's force delete as well as on stops
/// is not one the stops alone make: `by_stops_alone` says which options culling can complete.
#[test]
fn an_option_with_stuck_holders_is_not_made_by_stops_alone() {
    let out = run(
        vec![node("mixed", &[(GPU, 2)]), node("stops", &[(GPU, 1)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 2)]),
            stuck("u", "gone", "mixed", &[(GPU, 1)]),
            idle_nb("u", "nb", "mixed", &[(GPU, 1)], 9000.0),
        ],
    );
    let o = &out[0].options[0];
    assert_eq!((stops(o), o.stuck_holders.len()), (vec!["nb-0"], 1));
    assert!(!o.by_stops_alone(), "the stop alone leaves the pod pending");
    let out = run(
        vec![node("n", &[(GPU, 1)])],
        vec![],
        vec![
            pending("ml", "p", &[(GPU, 1)]),
            idle_nb("u", "nb", "n", &[(GPU, 1)], 9000.0),
        ],
    );
    assert!(out[0].options[0].by_stops_alone());
    let free = ReclaimOption {
        node: "n".into(),
        by_stopping: Vec::new(),
        stuck_holders: Vec::new(),
    };
    assert!(!free.by_stops_alone(), "free already: no stop makes it");
}

mod extended_resources {
    //! KEP-5004: a pending pod asking an extended resource that a DeviceClass names is served by
    //! DRA on nodes that do not advertise it (kube-scheduler's DynamicResources plugin).

    use super::*;
    use crate::ledger::claims::{
        DeviceClassInfo, DraAllocation, DraDevice, DraDeviceKind, ResourceClaimInfo,
    };

    const DRIVER: &str = "gpu.nvidia.com";
    const HELD_AS: &str = "dra:gpu.nvidia.com";
    const IMPLICIT: &str = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";

    fn class(name: &str, driver: &str, extended: Option<&str>, made: &str) -> DeviceClassInfo {
        DeviceClassInfo {
            name: name.into(),
            drivers: vec![driver.into()],
            mig: false,
            extended_resource_name: extended.map(str::to_string),
            created_at: DateTime::parse_from_rfc3339(made)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }

    fn device(node: &str, name: &str) -> DraDevice {
        DraDevice {
            driver: DRIVER.into(),
            pool: node.into(),
            name: name.into(),
            node: Some(node.into()),
            kind: DraDeviceKind::Gpu,
            uuid: Some(format!("GPU-{node}-{name}")),
            parent_uuid: None,
            profile: None,
            product: None,
            pool_generation: 1,
            taints: Vec::new(),
        }
    }

    fn holding(name: &str, node: &str, device: &str) -> ResourceClaimInfo {
        ResourceClaimInfo {
            namespace: "u".into(),
            name: name.into(),
            allocated: Some(vec![DraAllocation {
                request: "container-0-request-0".into(),
                driver: DRIVER.into(),
                pool: node.into(),
                device: device.into(),
            }]),
            ..ResourceClaimInfo::default()
        }
    }

    fn run_dra(
        nodes: Vec<NodeInfo>,
        classes: Vec<DeviceClassInfo>,
        devices: Vec<DraDevice>,
        rcs: Vec<ResourceClaimInfo>,
        mut pods: Vec<PodRow>,
    ) -> Vec<Reclaim> {
        pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
        let claims = Claims {
            nodes,
            device_classes: classes,
            dra_devices: devices,
            resource_claims: rcs,
            dra_enabled: true,
            ..Claims::default()
        };
        plan(&claims, &pods, now(), ClaimsScope::Complete)
    }

    fn nvidia_gpu_class() -> DeviceClassInfo {
        class(DRIVER, DRIVER, Some(GPU), "2026-01-01T00:00:00Z")
    }

    #[test]
    fn a_dra_only_node_takes_the_pod_once_the_idle_holder_of_its_device_stops() {
        // dra-1's only device is held by an idle notebook (through the claim the scheduler
        // made for its own nvidia.com/gpu); the node advertises no nvidia.com/gpu at all.
        let out = run_dra(
            vec![node("dra-1", &[])],
            vec![nvidia_gpu_class()],
            vec![device("dra-1", "gpu-0")],
            vec![holding("nb-0-extended-resources-x", "dra-1", "gpu-0")],
            vec![
                pending("ml", "one", &[(GPU, 1)]),
                pending("ml", "two", &[(GPU, 2)]),
                pending("ml", "implicit", &[(IMPLICIT, 1)]),
                idle_nb("u", "nb", "dra-1", &[(HELD_AS, 1)], 3600.0),
            ],
        );
        let of = |pod: &str| {
            out.iter()
                .find(|r| r.pending.pod == pod)
                .unwrap_or_else(|| panic!("{pod} planned: {out:?}"))
        };
        for pod in ["one", "implicit"] {
            let r = of(pod);
            assert_eq!(r.fits_nowhere, None, "{r:?}");
            assert_eq!(r.options.len(), 1, "{r:?}");
            assert_eq!(r.options[0].node, "dra-1");
            assert_eq!(stops(&r.options[0]), ["nb-0"], "{r:?}");
        }
        let two = of("two");
        assert!(two.options.is_empty(), "{two:?}");
        assert_eq!(
            two.fits_nowhere.as_deref(),
            Some(
                "0/1 nodes would take it: 1 too small for 2 nvidia.com/gpu even with idle notebooks stopped"
            )
        );
    }

    #[test]
    fn a_free_device_fits_and_a_busy_holder_is_never_stopped() {
        let out = run_dra(
            vec![node("dra-1", &[]), node("dra-2", &[])],
            vec![nvidia_gpu_class()],
            vec![
                device("dra-1", "gpu-0"),
                device("dra-1", "gpu-1"),
                device("dra-2", "gpu-0"),
            ],
            vec![
                holding("a", "dra-1", "gpu-0"),
                holding("b", "dra-2", "gpu-0"),
            ],
            vec![
                pending("ml", "one", &[(GPU, 1)]),
                busy("u", "train-a", "dra-1", &[(HELD_AS, 1)]),
                busy("u", "train-b", "dra-2", &[(HELD_AS, 1)]),
            ],
        );
        let r = &out[0];
        let nodes: Vec<&str> = r.options.iter().map(|o| o.node.as_str()).collect();
        assert_eq!(nodes, ["dra-1"], "{r:?}");
        assert!(r.options[0].is_free());
    }

    #[test]
    fn a_device_plugin_node_is_planned_by_its_own_allocatable_only() {
        // The scheduler serves a resource the node advertises with the device plugin, never
        // with DRA: the DRA device published there does not make room.
        let out = run_dra(
            vec![node("mixed", &[(GPU, 1)])],
            vec![nvidia_gpu_class()],
            vec![device("mixed", "gpu-1")],
            vec![],
            vec![
                pending("ml", "two", &[(GPU, 2)]),
                busy("u", "ext", "mixed", &[(GPU, 1)]),
            ],
        );
        assert!(out[0].options.is_empty(), "{out:?}");
        assert!(
            out[0]
                .fits_nowhere
                .as_deref()
                .is_some_and(|w| w.contains("1 too small")),
            "{out:?}"
        );
    }

    #[test]
    fn of_two_classes_naming_one_resource_the_newer_wins_then_the_lower_name() {
        // `other` names nvidia.com/gpu too, for a driver with no device on dra-1.
        let plan_with = |other_made: &str, other_name: &str| {
            let out = run_dra(
                vec![node("dra-1", &[])],
                vec![
                    nvidia_gpu_class(),
                    class(other_name, "other.example.com", Some(GPU), other_made),
                ],
                vec![device("dra-1", "gpu-0")],
                vec![],
                vec![pending("ml", "one", &[(GPU, 1)])],
            );
            out[0].options.len()
        };
        assert_eq!(
            plan_with("2026-06-01T00:00:00Z", "z-other"),
            0,
            "newer wins"
        );
        assert_eq!(
            plan_with("2025-06-01T00:00:00Z", "a-other"),
            1,
            "older loses"
        );
        assert_eq!(
            plan_with("2026-01-01T00:00:00Z", "a-other"),
            0,
            "tie: lower name"
        );
        assert_eq!(
            plan_with("2026-01-01T00:00:00Z", "z-other"),
            1,
            "tie: lower name"
        );
    }
}

/// Health layer: `p` holds a sick card.
fn on_sick_card(mut p: PodRow) -> PodRow {
    p.gpu_health = Some(crate::ledger::GpuHealth {
        reason: "xid:79".into(),
        device: Some("GPU-4cf8".into()),
        since: None,
    });
    p
}

#[test]
fn a_sick_card_is_never_offered_by_a_stop_or_a_force_delete() {
    let out = run(
        vec![
            node("a-sick-idle", &[(GPU, 1)]),
            node("b-sick-stuck", &[(GPU, 1)]),
            node("c-healthy-idle", &[(GPU, 1)]),
        ],
        vec![],
        vec![
            pending("ml", "trial", &[(GPU, 1)]),
            on_sick_card(idle_nb("u", "x", "a-sick-idle", &[(GPU, 1)], 9000.0)),
            on_sick_card(stuck("u", "gone", "b-sick-stuck", &[(GPU, 1)])),
            idle_nb("u", "y", "c-healthy-idle", &[(GPU, 1)], 600.0),
        ],
    );
    let nodes: Vec<&str> = out[0].options.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(nodes, ["c-healthy-idle"], "{out:?}");
    // With only the sick cards, the pod fits nowhere.
    let out = run(
        vec![
            node("a-sick-idle", &[(GPU, 1)]),
            node("b-sick-stuck", &[(GPU, 1)]),
        ],
        vec![],
        vec![
            pending("ml", "trial", &[(GPU, 1)]),
            on_sick_card(idle_nb("u", "x", "a-sick-idle", &[(GPU, 1)], 9000.0)),
            on_sick_card(stuck("u", "gone", "b-sick-stuck", &[(GPU, 1)])),
        ],
    );
    assert!(out[0].options.is_empty(), "{out:?}");
    assert!(out[0].fits_nowhere.is_some());
}
