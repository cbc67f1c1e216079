//! Sharding (`--shard i --total-shards n`) loses and duplicates nothing: for a generated cluster,
//! the union over shards of the ledgers built from `claims::shard`-filtered claims equals the
//! unsharded ledger — every pod and node in exactly one shard, pending pods in shard 0 only,
//! per-namespace sums adding up, busy unclaimed GPUs reported once. Pure and fast.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use gpu_ledger::ledger::claims::{
    self, Claims, Deletion, NodeInfo, OwnerRef, PodClaim, PodPhase, QuotaInfo,
};
use gpu_ledger::ledger::usage::{DeviceKey, DeviceUsage, Signal, Usage, Workload};
use gpu_ledger::ledger::{self, Ledger, PodState, Policy};

const TOTAL: u32 = 3;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).expect("valid")
}

fn device(node: &str, g: u32, holder: Option<(&str, &str)>, util: Option<f64>) -> DeviceUsage {
    DeviceUsage {
        key: DeviceKey {
            uuid: format!("GPU-{node}-{g}"),
            gpu_instance: None,
        },
        hostname: Some(node.to_string()),
        exporter: None,
        instance: None,
        model: Some("NVIDIA H100 80GB HBM3".into()),
        mig_profile: None,
        mig_uuid: None,
        workloads: holder
            .map(|(ns, pod)| Workload {
                namespace: ns.into(),
                pod: pod.into(),
            })
            .into_iter()
            .collect(),
        per_pod_utilization: vec![],
        per_pod_memory_bytes: Vec::new(),
        per_pod_windows: Vec::new(),
        signal: util.map(|_| Signal::GrEngineActive),
        utilization: util,
        peak: util,
        coverage: 1.0,
        last_sample_at: Some(now() - Duration::seconds(15)),
        memory_used_bytes: Some(1.0e9),
        last_active_at: Some(now() - Duration::hours(3)),
        covered_since: Some(now() - Duration::hours(24)),
    }
}

fn pod(ns: &str, name: &str, node: Option<&str>, gpus: u64, i: usize) -> PodClaim {
    let created = now() - Duration::minutes(30 + i64::try_from(i).expect("small index"));
    let claim = PodClaim::new(ns, name)
        .with_uid(format!("uid-{ns}-{name}"))
        .created(created)
        .claiming("nvidia.com/gpu", gpus)
        .controlled_by(OwnerRef {
            group: "batch".into(),
            kind: "Job".into(),
            name: format!("{name}-job"),
            uid: format!("job-{i}"),
        });
    match node {
        Some(node) => PodClaim {
            started_at: Some(created),
            ready_since: Some(created),
            ..claim.running_on(node)
        },
        None => PodClaim {
            unschedulable_message: Some(
                "0/400 nodes are available: 400 Insufficient nvidia.com/gpu".into(),
            ),
            ..claim
        },
    }
}

/// 400 nodes × 8 GPUs (every tenth time-sliced ×4), pods of 1/2/4 GPUs on most cards (some idle,
/// some Terminating, some Succeeded), 150 Pending pods, busy cards no pod claims, one pod on a
/// node missing from the node list, GPU quotas in some namespaces.
fn cluster() -> (Claims, Usage) {
    let mut c = Claims::default();
    let mut devices = Vec::new();
    let mut i = 0;
    for n in 0..400usize {
        let node = format!("gpu-node-{n:04}");
        let replicas = if n % 10 == 0 { 4 } else { 1 };
        c.nodes.push(NodeInfo {
            hami: gpu_ledger::ledger::hami_inputs::HamiNode::default(),
            name: node.clone(),
            allocatable: [("nvidia.com/gpu".to_string(), 8 * u64::from(replicas))].into(),
            replicas,
            product: Some("NVIDIA-H100-80GB-HBM3".into()),
            gpu_labels: BTreeMap::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: Some(true),
        });
        let mut g = 0;
        for (k, size) in [4u64, 2, 1].into_iter().enumerate() {
            if n % 7 == 3 && k == 0 {
                g += 4; // leave cards free
                continue;
            }
            i += 1;
            let ns = format!("team-{:02}", (n + k) % 23);
            let name = format!("job-{n:04}-{k}");
            let mut p = pod(&ns, &name, Some(&node), size, i);
            if n % 11 == 0 && k == 1 {
                p.deletion = Some(Deletion {
                    deadline: now() - Duration::minutes(20),
                    grace_seconds: 30,
                });
            }
            if n % 13 == 0 && k == 2 {
                p.phase = PodPhase::Succeeded;
            }
            let idle = (n + k) % 3 == 0;
            for _ in 0..size {
                devices.push(device(
                    &node,
                    g,
                    Some((&ns, &name)),
                    Some(if idle { 0.0 } else { 0.8 }),
                ));
                g += 1;
            }
            c.pods.push(p.into());
        }
        while g < 8 {
            // unclaimed cards: some busy (a process outside Kubernetes), some idle, some unknown
            let util = match (n + g as usize) % 3 {
                0 => Some(0.6),
                1 => Some(0.0),
                _ => None,
            };
            devices.push(device(&node, g, None, util));
            g += 1;
        }
    }
    for q in 0..150 {
        i += 1;
        c.pods.push(
            pod(
                &format!("team-{:02}", q % 23),
                &format!("queued-{q:03}"),
                None,
                1 + q % 4,
                i,
            )
            .into(),
        );
    }
    // Terminating before it was ever scheduled: no node, so shard 0 like pending pods.
    let mut p = pod("team-00", "deleted-unscheduled", None, 1, i + 1);
    p.deletion = Some(Deletion {
        deadline: now(),
        grace_seconds: 0,
    });
    c.pods.push(p.into());
    // Bound to a node the node list does not (yet) show.
    c.pods
        .push(pod("team-01", "orphan", Some("gpu-node-gone"), 2, i + 2).into());
    for ns in 0..8 {
        c.quotas.push(QuotaInfo {
            namespace: format!("team-{ns:02}"),
            name: "gpu".into(),
            gpu_hard: [("requests.nvidia.com/gpu".to_string(), 64)].into(),
            names_gpu: true,
            ..QuotaInfo::default()
        });
    }
    (
        c,
        Usage {
            hami: Vec::new(),
            devices,
            available: true,
            partial: false,
            ..Usage::default()
        },
    )
}

fn build(c: &Claims, u: &Usage) -> Ledger {
    ledger::build(c, u, now(), &Policy::default())
}

fn sharded(c: &Claims, u: &Usage) -> Vec<Ledger> {
    (0..TOTAL)
        .map(|s| {
            let mut l = build(&claims::shard(c.clone(), s, TOTAL), u);
            l.retain_shard(s, TOTAL);
            l
        })
        .collect()
}

#[test]
fn union_of_shards_equals_the_unsharded_ledger() {
    let (c, u) = cluster();
    let whole = build(&c, &u);
    let shards = sharded(&c, &u);

    // The fixture is not trivial.
    assert!(whole.pods.len() > 1000, "{}", whole.pods.len());
    assert!(whole.pods.iter().any(|p| p.state == PodState::Pending));
    assert!(whole.pods.iter().any(|p| p.state == PodState::Terminating));
    assert!(whole.pods.iter().any(|p| p.idle == Some(true)));
    assert!(!whole.unclaimed_busy.is_empty());
    for (s, l) in shards.iter().enumerate() {
        assert!(l.nodes.len() > 80, "shard {s} has {} nodes", l.nodes.len());
    }

    // Pods: every row in exactly one shard, identical to the unsharded row.
    let mut union: Vec<_> = shards.iter().flat_map(|l| l.pods.iter().cloned()).collect();
    union.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    assert_eq!(union.len(), whole.pods.len());
    assert_eq!(union, whole.pods);

    // Pending (and other node-less) pods only in shard 0; bound pods in their node's shard.
    for (s, l) in shards.iter().enumerate() {
        for p in &l.pods {
            let owner = p.node.as_deref().map_or(0, |n| claims::shard_of(n, TOTAL));
            assert_eq!(owner, s as u32, "{}/{} in shard {s}", p.namespace, p.pod);
            if p.state == PodState::Pending {
                assert_eq!(s, 0, "pending {}/{} in shard {s}", p.namespace, p.pod);
            }
        }
    }

    // Nodes: every row in exactly one shard (incl. the node only a pod names).
    let mut nodes: Vec<_> = shards
        .iter()
        .flat_map(|l| l.nodes.iter().cloned())
        .collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    assert_eq!(nodes, whole.nodes);

    // Busy GPUs no pod claims: reported once, by the shard owning their node.
    let mut busy: Vec<_> = shards
        .iter()
        .flat_map(|l| l.unclaimed_busy.iter().cloned())
        .collect();
    busy.sort_by(|a, b| (&a.node, &a.uuid).cmp(&(&b.node, &b.uuid)));
    assert_eq!(busy, whole.unclaimed_busy);

    // Quota rows are cluster-wide: once, by shard 0, with the unsharded limits; what their pods
    // do no shard can prove (busy / idle unknown).
    assert!(!whole.quotas.is_empty() && whole.quotas.iter().all(|q| q.idle.is_some()));
    assert!(
        shards[1..]
            .iter()
            .all(|l| l.quotas.is_empty() && l.queues.is_empty())
    );
    let limits = |l: &Ledger| -> Vec<(String, String, u64, Option<u64>)> {
        l.quotas
            .iter()
            .map(|q| (q.namespace.clone(), q.resource.clone(), q.hard, q.used))
            .collect()
    };
    assert_eq!(limits(&shards[0]), limits(&whole));
    assert!(
        shards[0]
            .quotas
            .iter()
            .all(|q| q.busy.is_none() && q.idle.is_none())
    );
}

#[test]
fn per_namespace_sums_add_up_across_shards() {
    let (c, u) = cluster();
    let whole = build(&c, &u);
    let shards = sharded(&c, &u);
    let mut sums: BTreeMap<&str, [f64; 3]> = BTreeMap::new();
    for l in &shards {
        for ns in &l.namespaces {
            let e = sums.entry(&ns.namespace).or_default();
            e[0] += ns.gpus_claimed;
            e[1] += ns.gpus_idle;
            e[2] += ns.gpus_pending;
        }
    }
    let names: BTreeSet<&str> = whole
        .namespaces
        .iter()
        .map(|n| n.namespace.as_str())
        .collect();
    assert_eq!(names, sums.keys().copied().collect());
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    for ns in &whole.namespaces {
        let [claimed, idle, pending] = sums[ns.namespace.as_str()];
        assert!(
            close(claimed, ns.gpus_claimed)
                && close(idle, ns.gpus_idle)
                && close(pending, ns.gpus_pending),
            "{}: shards sum to claimed {claimed} idle {idle} pending {pending}, unsharded {ns:?}",
            ns.namespace
        );
    }
    // Pending demand lives in shard 0 only.
    for l in &shards[1..] {
        assert!(l.namespaces.iter().all(|n| n.gpus_pending == 0.0));
    }
    let total = |f: fn(&ledger::NamespaceRow) -> f64| whole.namespaces.iter().map(f).sum::<f64>();
    assert!(total(|n| n.gpus_pending) > 0.0 && total(|n| n.gpus_idle) > 0.0);
}

#[test]
fn one_shard_is_the_identity() {
    let (c, u) = cluster();
    let mut one = build(&claims::shard(c.clone(), 0, 1), &u);
    one.retain_shard(0, 1);
    assert_eq!(one, build(&c, &u));
}
