//! Claims of only some namespaces (`--namespaces`, [`ClaimsScope::Namespaces`]): the ledger
//! cannot prove a device unclaimed nor a node's free capacity (pure).

use super::*;

/// n1: a watched pod holding GPU-1; GPU-2 busy, held (DCGM says) by a pod of a namespace
/// that is not watched; GPU-3 busy without workload labels. n2: nothing watched on it, GPU-4
/// busy.
fn scene() -> (Claims, Usage) {
    let c = claims(
        vec![PodB::new("team-a", "p").on_node("n1").gpu(1).build()],
        vec![node("n1", 3), node("n2", 1)],
    );
    let u = usage(vec![
        DevB::new("GPU-1", "n1")
            .held_by("team-a", "p")
            .util(0.8, 0.8)
            .build(),
        DevB::new("GPU-2", "n1")
            .held_by("team-b", "q")
            .util(0.9, 0.9)
            .build(),
        DevB::new("GPU-3", "n1").util(0.9, 0.9).build(),
        DevB::new("GPU-4", "n2").util(0.9, 0.9).build(),
    ]);
    (c, u)
}

#[test]
fn a_namespaced_ledger_reports_no_unclaimed_busy_device_and_no_node_free() {
    let (c, u) = scene();
    let policy = Policy {
        claims_scope: ClaimsScope::Namespaces,
        ..Policy::default()
    };
    let l = build(&c, &u, now(), &policy);
    assert!(
        l.unclaimed_busy.is_empty(),
        "pods of unwatched namespaces may hold these: {:?}",
        l.unclaimed_busy
    );
    for n in &l.nodes {
        assert_eq!(n.gpus_free, None, "{n:?}");
    }
    // What is seen is still reported: the watched pod, its device, its node's capacity.
    let p = pod(&l, "p");
    assert_eq!(p.utilization, Some(0.8));
    let n1 = l.nodes.iter().find(|n| n.node == "n1").expect("n1");
    assert_eq!((n1.gpus_allocatable, n1.gpus_claimed), (3.0, 1.0));
    let json = serde_json::to_value(&l).expect("json");
    assert!(json["nodes"][0]["gpus_free"].is_null(), "{json}");
}

#[test]
fn a_complete_ledger_still_reports_them() {
    let (c, u) = scene();
    let l = build(&c, &u, now(), &Policy::default());
    let uuids: Vec<&str> = l.unclaimed_busy.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-2", "GPU-3", "GPU-4"]);
    let free: Vec<Option<f64>> = l.nodes.iter().map(|n| n.gpus_free).collect();
    assert_eq!(free, [Some(2.0), Some(1.0)]);
}
