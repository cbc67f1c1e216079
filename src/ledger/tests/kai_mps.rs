//! KAI-Scheduler fractions and MPS clients (pure): who holds what share of a card, what proves a
//! sharer idle, and what the reclaim planner may offer.

use super::super::claims::GPU_MEMORY_LABEL;
use super::super::kai_pod::{FRACTION_RESOURCE, KaiPod};
use super::super::mps::SHARING_STRATEGY_LABEL;
use super::*;

const RES_NS: &str = "kai-resource-reservation";

/// A reservation pod of group `g` on `node` that recorded card `uuid`.
fn reservation(name: &str, node: &str, g: &str, uuid: &str) -> PodClaim {
    let mut p = PodB::new(RES_NS, name).on_node(node).gpu(1).build();
    p.kai = Some(KaiPod {
        groups: vec![g.into()],
        reserved_uuid: Some(uuid.into()),
        ..KaiPod::default()
    });
    p
}

/// A fraction user in `ns` on `node` (`None`: pending) of groups `gs`.
fn user(ns: &str, name: &str, node: Option<&str>, gs: &[&str], k: KaiPod) -> PodClaim {
    let b = PodB::new(ns, name);
    let mut p = match node {
        Some(n) => b.on_node(n).build(),
        None => b.build(),
    };
    p.kai = Some(KaiPod {
        groups: gs.iter().map(|g| (*g).to_string()).collect(),
        ..k
    });
    p
}

fn fraction(f: f64) -> KaiPod {
    KaiPod {
        fraction: Some(f),
        ..KaiPod::default()
    }
}

fn memory(mib: u64) -> KaiPod {
    KaiPod {
        memory_mib: Some(mib),
        ..KaiPod::default()
    }
}

fn with_label(mut n: NodeInfo, k: &str, v: &str) -> NodeInfo {
    n.gpu_labels.insert(k.into(), v.into());
    n
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn share(p: &PodRow) -> Option<f64> {
    match &p.sharing {
        Sharing::KaiFraction { share, .. } => *share,
        other => panic!("{}: not a KAI fraction: {other:?}", p.pod),
    }
}

#[test]
fn a_reserved_card_is_handed_to_its_users_in_their_namespaces() {
    let c = claims(
        vec![
            reservation("gpu-reservation-1", "n1", "g1", "GPU-1"),
            user("team-a", "half", Some("n1"), &["g1"], fraction(0.5)),
            user("team-b", "mem", Some("n1"), &["g1"], memory(6000)),
            user("team-b", "waiting", None, &[], fraction(0.25)),
        ],
        vec![with_label(node("n1", 1), GPU_MEMORY_LABEL, "24000")],
    );
    let u = usage(vec![
        DevB::new("GPU-1", "n1")
            .held_by(RES_NS, "gpu-reservation-1")
            .build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    assert!(close(pod(&l, "half").gpus, 0.5));
    assert!(close(pod(&l, "mem").gpus, 0.25), "6000 of 24000 MiB");
    assert_eq!(share(pod(&l, "mem")), Some(0.25));
    assert!(close(pod(&l, "waiting").gpus, 0.25), "pending demand");
    let r = pod(&l, "gpu-reservation-1");
    assert!(close(r.gpus, 0.25), "the unassigned rest: {}", r.gpus);
    assert!(matches!(
        &r.sharing,
        Sharing::KaiReservation { users: 2, unassigned, .. } if close(*unassigned, 0.25)
    ));
    // The metrics' per-resource split follows the shares.
    assert_eq!(
        pod(&l, "half").gpus_by_resource,
        [(FRACTION_RESOURCE.to_string(), 0.5)]
    );
    assert!(close(r.gpus_by_resource[0].1, 0.25));
    // The card is counted once on its node, and idle: every user is idle with it.
    assert!(close(l.nodes[0].gpus_claimed, 1.0));
    for name in ["half", "mem"] {
        let p = pod(&l, name);
        assert_eq!(p.attribution, Attribution::Shared, "{name}");
        assert_eq!(p.idle, Some(true), "{name}");
        assert_eq!(p.utilization, None, "the card's reading is not {name}'s");
        assert_eq!(p.devices[0].uuid, "GPU-1");
    }
    let ns = |n: &str| {
        l.namespaces
            .iter()
            .find(|r| r.namespace == n)
            .expect("namespace row")
    };
    assert!(close(ns("team-a").gpus_claimed, 0.5));
    assert!(close(ns("team-b").gpus_claimed, 0.25));
    assert!(close(ns("team-b").gpus_pending, 0.25));
    assert!(close(ns(RES_NS).gpus_claimed, 0.25));
}

#[test]
fn a_busy_card_proves_nothing_per_user_and_no_labels_join_by_uuid() {
    let c = claims(
        vec![
            reservation("gpu-reservation-1", "n1", "g1", "GPU-1"),
            user("team-a", "a", Some("n1"), &["g1"], fraction(0.5)),
            user("team-b", "b", Some("n1"), &["g1"], fraction(0.5)),
        ],
        vec![node("n1", 1)],
    );
    // No workload labels: only the reservation pod's recorded UUID joins the card.
    let u = usage(vec![DevB::new("GPU-1", "n1").util(0.9, 0.9).build()]);
    let l = build(&c, &u, now(), &Policy::default());
    for name in ["a", "b"] {
        let p = pod(&l, name);
        assert_eq!(p.attribution, Attribution::Shared, "{name}");
        assert_eq!(p.idle, None, "busy card: {name} may be the idle one");
        assert_eq!(p.devices.len(), 1);
    }
    let r = pod(&l, "gpu-reservation-1");
    assert!(close(r.gpus, 0.0));
    assert_eq!(r.attribution, Attribution::Exclusive, "found by its UUID");
    assert_eq!(r.idle, Some(false));
    assert!(l.unclaimed_busy.is_empty(), "{:?}", l.unclaimed_busy);
}

#[test]
fn shares_over_a_card_are_scaled_down_and_unknown_shares_are_said() {
    let c = claims(
        vec![
            reservation("gpu-reservation-1", "n1", "g1", "GPU-1"),
            user("team-a", "big", Some("n1"), &["g1"], fraction(0.8)),
            user("team-a", "bigger", Some("n1"), &["g1"], fraction(0.8)),
            // gpu-memory on a node without GFD's memory label: no share, never guessed.
            user("team-a", "mem", Some("n1"), &["g1"], memory(4000)),
            // A fraction whose reservation pod is gone (KAI deletes such pods).
            user("team-a", "orphan", Some("n1"), &["g9"], fraction(0.5)),
            // A value not understood.
            user(
                "team-a",
                "bad",
                Some("n1"),
                &["g1"],
                KaiPod {
                    invalid: vec!["gpu-fraction"],
                    ..KaiPod::default()
                },
            ),
        ],
        vec![node("n1", 1)],
    );
    let l = build(&c, &Usage::default(), now(), &Policy::default());
    assert!(close(pod(&l, "big").gpus, 0.5), "{}", pod(&l, "big").gpus);
    assert!(close(pod(&l, "bigger").gpus, 0.5));
    assert!(close(pod(&l, "gpu-reservation-1").gpus, 0.0));
    assert!(
        close(l.nodes[0].gpus_claimed, 1.0),
        "never more than the card"
    );
    for (name, why) in [
        ("mem", "nvidia.com/gpu.memory"),
        ("orphan", "no reservation pod"),
        ("bad", "not understood: gpu-fraction"),
    ] {
        let p = pod(&l, name);
        assert!(close(p.gpus, 0.0), "{name}");
        let Sharing::KaiFraction { unknown, .. } = &p.sharing else {
            panic!("{name}: {:?}", p.sharing)
        };
        assert!(
            unknown.as_deref().is_some_and(|u| u.contains(why)),
            "{name}: {unknown:?}"
        );
    }
    // Outside the configured reservation namespaces a pod is a plain whole-GPU holder.
    let policy = Policy {
        kai_reservation_namespaces: vec!["elsewhere".into()],
        ..Policy::default()
    };
    let l = build(&c, &Usage::default(), now(), &policy);
    let r = pod(&l, "gpu-reservation-1");
    assert!(close(r.gpus, 1.0));
    assert_eq!(r.sharing, Sharing::Exclusive);
}

#[test]
fn a_multi_device_fraction_is_idle_only_when_every_card_is() {
    let c = claims(
        vec![
            reservation("gpu-reservation-1", "n1", "g1", "GPU-1"),
            reservation("gpu-reservation-2", "n1", "g2", "GPU-2"),
            user(
                "team-a",
                "wide",
                Some("n1"),
                &["g1", "g2"],
                KaiPod {
                    num_devices: Some(2),
                    ..fraction(0.5)
                },
            ),
        ],
        vec![node("n1", 2)],
    );
    let idle = usage(vec![
        DevB::new("GPU-1", "n1").build(),
        DevB::new("GPU-2", "n1").build(),
    ]);
    let l = build(&c, &idle, now(), &Policy::default());
    let p = pod(&l, "wide");
    assert!(close(p.gpus, 1.0), "half of each of two cards");
    assert_eq!(p.idle, Some(true));
    assert_eq!(p.devices.len(), 2);
    let one_busy = usage(vec![
        DevB::new("GPU-1", "n1").build(),
        DevB::new("GPU-2", "n1").util(0.9, 0.9).build(),
    ]);
    let l = build(&c, &one_busy, now(), &Policy::default());
    assert_eq!(pod(&l, "wide").idle, None);
}

#[test]
fn reservation_pods_and_mps_clients_are_never_offered_even_stuck() {
    // n1 is full: its only card held by a stuck reservation pod; n2 by a stuck MPS client.
    let mut res = reservation("gpu-reservation-1", "n1", "g1", "GPU-1");
    res.deletion = PodB::new("x", "y")
        .deleted(Duration::hours(1), 0)
        .build()
        .deletion;
    let mps = PodB::new("team-b", "mps")
        .on_node("n2")
        .gpu(1)
        .deleted(Duration::hours(1), 0)
        .build();
    let mut n2 = with_label(node("n2", 1), SHARING_STRATEGY_LABEL, "mps");
    n2.replicas = 1;
    let c = claims(
        vec![res, mps, PodB::new("team-c", "waiting").gpu(1).build()],
        vec![node("n1", 1), n2],
    );
    let l = build(&c, &Usage::default(), now(), &Policy::default());
    assert!(pod(&l, "gpu-reservation-1").stuck && pod(&l, "mps").stuck);
    let plan = &l.reclaim[0];
    assert!(plan.options.is_empty(), "{plan:?}");
    assert!(plan.fits_nowhere.is_some());
}

#[test]
fn mps_clients_are_never_proven_idle_where_time_slicing_would_be() {
    let on = |strategy: &str| {
        let mut n = with_label(node("n1", 4), SHARING_STRATEGY_LABEL, strategy);
        n.replicas = 4;
        n.product = Some("Tesla-T4-SHARED".into());
        let n = with_label(n, GPU_MEMORY_LABEL, "15360");
        let c = claims(
            vec![
                PodB::new("a", "s1").on_node("n1").gpu(1).build(),
                PodB::new("a", "s2").on_node("n1").gpu(1).build(),
            ],
            vec![n],
        );
        // The node's one card, idle, named by nobody: time-slicing's "every GPU of the node idle".
        build(
            &c,
            &usage(vec![DevB::new("GPU-t", "n1").build()]),
            now(),
            &Policy::default(),
        )
    };
    let sliced = on("time-slicing");
    assert_eq!(pod(&sliced, "s1").idle, Some(true));
    assert_eq!(pod(&sliced, "s1").sharing, Sharing::TimeSliced);
    let mps = on("mps");
    for name in ["s1", "s2"] {
        let p = pod(&mps, name);
        assert_eq!(p.idle, None, "{name}");
        assert_eq!(p.idle_seconds, None);
        assert!(close(p.gpus, 0.25));
        assert_eq!(
            p.sharing,
            Sharing::Mps {
                replicas: 4,
                memory_cap_bytes: Some(15360 * 1024 * 1024 / 4),
                compute_cap_percent: 25.0,
            }
        );
    }
    assert!(
        close(mps.nodes[0].gpus_allocatable, 1.0),
        "4 replicas of 1 card"
    );
    assert!(close(mps.namespaces[0].gpus_idle, 0.0));
    assert_eq!(mps.nodes[0].model.as_deref(), Some("Tesla-T4"));
    // Per-process readings under MPS are no client's either.
    let mut n = with_label(node("n1", 2), SHARING_STRATEGY_LABEL, "mps");
    n.replicas = 2;
    let c = claims(
        vec![PodB::new("a", "s1").on_node("n1").gpu(1).build()],
        vec![n],
    );
    let mut d = DevB::new("GPU-m", "n1").held_by("a", "s1").build();
    d.per_pod_utilization.push((
        Workload {
            namespace: "a".into(),
            pod: "s1".into(),
        },
        0.0,
    ));
    let l = build(&c, &usage(vec![d]), now(), &Policy::default());
    assert_eq!(pod(&l, "s1").idle, None);
    assert_eq!(pod(&l, "s1").utilization, None);
}
