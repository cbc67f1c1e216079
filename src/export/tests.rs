//! Exposition tests: golden text, vanished pods, hostile label values.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::*;
use crate::ledger::accounting::UNKNOWN_MODEL;
use crate::ledger::{Attribution, Ledger, NamespaceRow, NodeRow, Owner, PodRow, PodState};

fn t() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

fn pod(ns: &str, name: &str) -> PodRow {
    PodRow::new(ns, name)
        .running_on("n1")
        .holding("nvidia.com/gpu", 1)
        .attributed(Attribution::Exclusive)
        .busy_at(0.25)
        .owned_by("Job", "j")
}

fn ledger(pods: Vec<PodRow>) -> Ledger {
    Ledger {
        generated_at: t(),
        pods,
        nodes: vec![NodeRow {
            node: "n1".into(),
            gpus_allocatable: 2.0,
            gpus_claimed: 1.0,
            gpus_free: Some(1.0),
            gpus_unschedulable: 0.0,
            model: None,
        }],
        namespaces: vec![NamespaceRow {
            namespace: "a".into(),
            gpus_claimed: 1.0,
            gpus_idle: 0.0,
            gpus_pending: 0.0,
            gpu_quota: None,
            gpu_quota_keys: BTreeMap::new(),
        }],
        unclaimed_busy: vec![],
        usage_available: true,
        reclaim: vec![],
        quotas: vec![],
        queues: vec![],
        dra_claims_unquotaed: vec![],
        kueue_available: false,
    }
}

#[test]
fn golden_text_and_vanishing_pod() {
    let text = render_snapshot(&Snapshot::new(ledger(vec![pod("a", "p1"), pod("a", "p2")])))
        .expect("render");
    let expected_lines = [
        "gpu_ledger_pod_gpus{namespace=\"a\",pod=\"p1\",node=\"n1\",state=\"running\",resource=\"nvidia.com/gpu\",attribution=\"exclusive\"} 1",
        "gpu_ledger_pod_gpu_utilization_ratio{namespace=\"a\",pod=\"p2\",node=\"n1\"} 0.25",
        "gpu_ledger_pod_owner_info{namespace=\"a\",pod=\"p1\",owner_kind=\"Job\",owner_name=\"j\",notebook=\"\"} 1",
        "gpu_ledger_node_gpus_free{node=\"n1\"} 1",
        "gpu_ledger_namespace_gpu_quota_missing{namespace=\"a\"} 1",
        "# TYPE gpu_ledger_pod_gpus gauge",
    ];
    for line in expected_lines {
        assert!(
            text.lines().any(|l| l == line),
            "missing line {line}\n{text}"
        );
    }
    assert!(
        !text.contains("memory_used_bytes"),
        "unknown values are absent, never 0"
    );
    let text = render_snapshot(&Snapshot::new(ledger(vec![pod("a", "p1")]))).expect("render");
    assert!(
        !text.contains("p2"),
        "a pod that goes away takes its series with it:\n{text}"
    );
}

#[test]
fn hostile_label_values_are_escaped() {
    let mut p = pod("a", "evil\"} 1\ninjected_metric 666\\");
    p.owner = Some(Owner {
        kind: "Job".into(),
        name: "x\ny".into(),
    });
    let text = render_snapshot(&Snapshot::new(ledger(vec![p]))).expect("render");
    assert!(
        !text.lines().any(|l| l.starts_with("injected_metric")),
        "{text}"
    );
    assert!(
        text.contains(r#"pod="evil\"} 1\ninjected_metric 666\\""#),
        "{text}"
    );
    let samples: Vec<(String, BTreeMap<String, String>)> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| sample(l).unwrap_or_else(|| panic!("not a sample line: {l:?}\n{text}")))
        .collect();
    let (_, labels) = samples
        .iter()
        .find(|(name, _)| name == "gpu_ledger_pod_gpus")
        .expect("a gpu_ledger_pod_gpus sample");
    assert_eq!(
        labels.get("pod").map(String::as_str),
        Some("evil\"} 1\ninjected_metric 666\\")
    );
}

/// One sample line of the text format, `name{k="v",…} value` or `name value`: the name and the
/// label values unescaped (`\\`, `\"`, `\n`); `None` when the line is not a well-formed sample.
/// Local on purpose: export may not read with `usage`'s parser (tests/hostile_input.rs checks
/// the round trip through it, and promtool, from outside).
fn sample(line: &str) -> Option<(String, BTreeMap<String, String>)> {
    let mut labels = BTreeMap::new();
    let Some(open) = line.find('{') else {
        let (name, value) = line.split_once(' ')?;
        value.parse::<f64>().ok()?;
        return Some((name.to_string(), labels));
    };
    let mut rest = &line[open + 1..];
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            rest = after;
            break;
        }
        let eq = rest.find("=\"")?;
        let key = rest[..eq].to_string();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    _ => return None,
                },
                '"' => break eq + 2 + i + 1,
                c => value.push(c),
            }
        };
        labels.insert(key, value);
        rest = &rest[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    rest.strip_prefix(' ')?.parse::<f64>().ok()?;
    Some((line[..open].to_string(), labels))
}

#[test]
fn counters_accumulate_gpu_seconds() {
    let first = Snapshot::new(ledger(vec![pod("a", "p1")]));
    let mut next = ledger(vec![pod("a", "p1")]);
    next.generated_at = t() + chrono::Duration::seconds(30);
    let second = first.advance(next);
    assert_eq!(second.gpu_seconds_claimed.get("a"), Some(&30.0));
    assert_eq!(second.gpu_seconds_idle.get("a"), Some(&0.0));
}

#[test]
fn counters_accumulate_gpu_seconds_by_model_and_activity() {
    let mut idle = pod("a", "idle");
    idle.idle = Some(true);
    let mut unknown = pod("a", "unknown");
    unknown.idle = None;
    unknown.gpus = 3.0 / 7.0;
    let mut elsewhere = pod("a", "elsewhere");
    elsewhere.node = Some("n2".into());
    let mut first = ledger(vec![pod("a", "busy"), idle, unknown, elsewhere]);
    first.nodes[0].model = Some("NVIDIA-A100-SXM4-80GB".into());
    let mut next = first.clone();
    next.generated_at = t() + chrono::Duration::seconds(30);
    let second = Snapshot::new(first).advance(next);
    let get = |model: &str, activity: &'static str| {
        second
            .gpu_seconds_by_model
            .get(&("a".to_string(), model.to_string(), activity))
            .copied()
    };
    assert_eq!(get("NVIDIA-A100-SXM4-80GB", "busy"), Some(30.0));
    assert_eq!(get("NVIDIA-A100-SXM4-80GB", "idle"), Some(30.0));
    let unknown = get("NVIDIA-A100-SXM4-80GB", "unknown").expect("unknown activity");
    assert!(
        (unknown - 30.0 * 3.0 / 7.0).abs() < 1e-9,
        "GPU equivalents, unknown apart from busy: {unknown}"
    );
    assert_eq!(
        get(UNKNOWN_MODEL, "busy"),
        Some(30.0),
        "a node without a product label"
    );
    let text = render_snapshot(&second).expect("render");
    assert!(
        text.contains(r#"gpu_ledger_gpu_seconds_by_model_total{namespace="a",model="NVIDIA-A100-SXM4-80GB",activity="idle"} 30"#),
        "{text}"
    );
}

#[test]
fn collector_reads_the_swapped_snapshot() {
    let shared: SharedSnapshot = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(
        Snapshot::new(ledger(vec![pod("a", "old")])),
    ));
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(
            LedgerCollector::new(shared.clone()).expect("collector"),
        ))
        .expect("register");
    SelfMetrics::register(&registry).expect("self metrics");
    assert!(render(&registry).expect("render").contains("pod=\"old\""));
    shared.store(std::sync::Arc::new(Snapshot::new(ledger(vec![pod(
        "a", "new",
    )]))));
    let text = render(&registry).expect("render");
    assert!(text.contains("pod=\"new\"") && !text.contains("pod=\"old\""));
    assert!(text.contains("gpu_ledger_build_info"));
}

/// A snapshot touching every family, with values that need escaping and formatting care.
fn busy_snapshot() -> Snapshot {
    let mut a = pod("a", "evil\"} 1\ninjected 666\\");
    a.resources = [
        ("nvidia.com/gpu".to_string(), 2),
        ("nvidia.com/mig-1g.10gb".to_string(), 3),
    ]
    .into_iter()
    .collect();
    a.gpus_by_resource = vec![
        ("nvidia.com/gpu".to_string(), 2.0),
        ("nvidia.com/mig-1g.10gb".to_string(), 3.0 / 7.0),
    ];
    a.memory_used_bytes = Some(2.5e9);
    a.idle_seconds = Some(1234.5);
    a.notebook = Some("nb\\x".into());
    let mut term = pod("b", "term");
    term.state = PodState::Terminating;
    term.terminating_seconds = Some(7200.0);
    term.stuck = true;
    term.utilization = Some(f64::NAN);
    let mut p = pod("b", "queued");
    p.state = PodState::Pending;
    p.node = None;
    p.pending_seconds = Some(1e-7);
    p.owner = None;
    let mut l = ledger(vec![a, p, term]);
    l.namespaces.push(NamespaceRow {
        namespace: "b".into(),
        gpus_claimed: 1.0 / 3.0,
        gpus_idle: 0.0,
        gpus_pending: 2.0,
        gpu_quota: Some(4.0),
        gpu_quota_keys: [("requests.nvidia.com/gpu".to_string(), 4)].into(),
    });
    l.unclaimed_busy.push(crate::ledger::UnclaimedBusy {
        node: Some("n1".into()),
        uuid: "GPU-1".into(),
        gpu_instance: None,
        utilization: 0.9,
    });
    let mut s = Snapshot::new(l.clone());
    l.generated_at = t() + chrono::Duration::seconds(45);
    s = s.advance(l);
    s
}

#[test]
fn direct_text_equals_the_prometheus_encoder() {
    let s = busy_snapshot();
    let expected = prometheus::TextEncoder::new()
        .encode_to_string(&collector::families(&s))
        .expect("encode");
    assert_eq!(render_snapshot(&s).expect("render"), expected);
    assert!(expected.contains("gpu_ledger_pod_stuck_terminating"));
    assert!(expected.contains("gpu_ledger_unclaimed_busy_gpu_utilization_ratio"));
}

#[test]
fn metrics_endpoint_text_equals_the_registry_path() {
    let s = busy_snapshot();
    let shared: SharedSnapshot = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(s.clone()));
    let with_collector = prometheus::Registry::new();
    SelfMetrics::register(&with_collector).expect("self metrics");
    with_collector
        .register(Box::new(LedgerCollector::new(shared).expect("collector")))
        .expect("register");
    let plain = prometheus::Registry::new();
    SelfMetrics::register(&plain).expect("self metrics");
    assert_eq!(
        render_with_ledger(&plain, &s).expect("render"),
        render(&with_collector).expect("render")
    );
}

#[test]
fn pending_reclaimable_gpus_count_pods_that_fit_only_after_a_reclaim() {
    use crate::ledger::reclaim::{PodRef, Reclaim, ReclaimOption, Stop};
    let option = |node: &str, stop: bool| ReclaimOption {
        node: node.into(),
        by_stopping: if stop {
            vec![Stop {
                namespace: "u".into(),
                pod: "nb-0".into(),
                notebook: "nb".into(),
                owner_kind: "Notebook",
                idle_seconds: 7200.0,
            }]
        } else {
            vec![]
        },
        stuck_holders: vec![],
    };
    let entry = |ns: &str, pod: &str, gpus: f64, options: Vec<ReclaimOption>| Reclaim {
        pending: PodRef {
            namespace: ns.into(),
            pod: pod.into(),
        },
        gpus,
        fits_nowhere: options.is_empty().then(|| "no node".to_string()),
        options,
    };
    let mut l = ledger(vec![pod("a", "p1")]);
    l.reclaim = vec![
        entry("trials", "t1", 2.0, vec![option("n1", true)]),
        entry(
            "trials",
            "t2",
            1.0,
            vec![option("n1", true), option("n2", true)],
        ),
        // Fits as things are: waiting for something else, not for a GPU.
        entry(
            "web",
            "w",
            1.0,
            vec![option("n2", false), option("n1", true)],
        ),
        entry("big", "b", 8.0, vec![]),
    ];
    let text = render_snapshot(&Snapshot::new(l)).expect("render");
    for line in [
        "gpu_ledger_pending_reclaimable_gpus{namespace=\"trials\"} 3",
        "gpu_ledger_pending_reclaimable_gpus{namespace=\"web\"} 0",
        "gpu_ledger_pending_reclaimable_gpus{namespace=\"big\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    let none = render_snapshot(&Snapshot::new(ledger(vec![pod("a", "p1")]))).expect("render");
    assert!(
        !none.contains("gpu_ledger_pending_reclaimable_gpus{"),
        "{none}"
    );
}

#[test]
fn quota_and_queue_families_leave_unknowns_out() {
    use crate::ledger::quota::{QueueRow, QuotaRow, UnquotaedClaim};
    let mut l = ledger(vec![pod("a", "p1")]);
    l.quotas = vec![
        QuotaRow {
            namespace: "team-a".into(),
            resource: "nvidia.com/gpu".into(),
            hard: 4,
            used: Some(4),
            busy: Some(1.0),
            idle: Some(3.0),
        },
        // status.used not written yet, no utilisation: only hard.
        QuotaRow {
            namespace: "team-b".into(),
            resource: "nvidia.com/gpu".into(),
            hard: 2,
            used: None,
            busy: None,
            idle: None,
        },
    ];
    let row = |flavor: &str, starved: bool| QueueRow {
        cluster_queue: "cq".into(),
        cohort: Some("pool".into()),
        flavor: flavor.into(),
        resource: "nvidia.com/gpu".into(),
        nominal: Some(2),
        borrowing_limit: None,
        lending_limit: None,
        admitted: None,
        busy: Some(0.0),
        idle: Some(1.0),
        pending_workloads: 3,
        oldest_pending_seconds: Some(60.0),
        starved_while_lender_idle: starved,
        idle_lenders: vec![],
    };
    l.queues = vec![row("a100", false), row("h100", true)];
    l.dra_claims_unquotaed = vec![
        UnquotaedClaim {
            namespace: "team-d".into(),
            claim: "c0".into(),
            device_classes: vec![],
        },
        UnquotaedClaim {
            namespace: "team-d".into(),
            claim: "c1".into(),
            device_classes: vec![],
        },
    ];
    let text = render_snapshot(&Snapshot::new(l)).expect("render");
    for line in [
        "gpu_ledger_quota_gpus{namespace=\"team-a\",resource=\"nvidia.com/gpu\",kind=\"hard\"} 4",
        "gpu_ledger_quota_gpus{namespace=\"team-a\",resource=\"nvidia.com/gpu\",kind=\"used\"} 4",
        "gpu_ledger_quota_gpus{namespace=\"team-a\",resource=\"nvidia.com/gpu\",kind=\"idle\"} 3",
        "gpu_ledger_quota_gpus{namespace=\"team-b\",resource=\"nvidia.com/gpu\",kind=\"hard\"} 2",
        "gpu_ledger_queue_gpus{cluster_queue=\"cq\",flavor=\"h100\",resource=\"nvidia.com/gpu\",kind=\"nominal\"} 2",
        "gpu_ledger_queue_gpus{cluster_queue=\"cq\",flavor=\"a100\",resource=\"nvidia.com/gpu\",kind=\"idle\"} 1",
        "gpu_ledger_queue_pending_workloads{cluster_queue=\"cq\"} 3",
        "gpu_ledger_queue_starved_while_lender_idle{cluster_queue=\"cq\"} 1",
        "gpu_ledger_dra_claims_unquotaed{namespace=\"team-d\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    for absent in [
        "namespace=\"team-b\",resource=\"nvidia.com/gpu\",kind=\"used\"",
        "namespace=\"team-b\",resource=\"nvidia.com/gpu\",kind=\"idle\"",
        "kind=\"admitted\"",
    ] {
        assert!(!text.contains(absent), "unknown {absent} exported\n{text}");
    }
    assert_eq!(
        text.matches("gpu_ledger_queue_pending_workloads{").count(),
        1,
        "once per ClusterQueue"
    );
}

/// Sharded (`--total-shards` > 1): every sample of `/metrics`, the ledger's families and the
/// registry's own alike, says which shard counted it, so PromQL can add shards and still count
/// HA replicas once (docs/metrics.md); the fast text path equals the registry path there too.
#[test]
fn a_sharded_replica_labels_every_series_with_its_shard() {
    let s = busy_snapshot().with_shard(shard_label(1, 2));
    let registry = super::registry(shard_label(1, 2)).expect("registry");
    SelfMetrics::register(&registry).expect("self metrics");
    let text = render_with_ledger(&registry, &s).expect("render");
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(samples.len() > 20, "{text}");
    for line in &samples {
        assert!(line.contains("shard=\"1\""), "no shard label: {line}");
    }
    for family in [
        "gpu_ledger_gpu_seconds_claimed_total{namespace=\"a\",shard=\"1\"}",
        "gpu_ledger_namespace_gpus_claimed{namespace=\"a\",shard=\"1\"}",
        "gpu_ledger_node_gpus_allocatable{node=\"n1\",shard=\"1\"}",
        "gpu_ledger_last_refresh_timestamp_seconds{shard=\"1\"}",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    let shared: SharedSnapshot = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(s.clone()));
    let with_collector = super::registry(shard_label(1, 2)).expect("registry");
    SelfMetrics::register(&with_collector).expect("self metrics");
    with_collector
        .register(Box::new(LedgerCollector::new(shared).expect("collector")))
        .expect("register");
    assert_eq!(text, render(&with_collector).expect("render"));
}

#[test]
fn one_shard_or_none_adds_no_label() {
    assert_eq!(shard_label(0, 1), None);
    let s = busy_snapshot().with_shard(shard_label(0, 1));
    let registry = super::registry(shard_label(0, 1)).expect("registry");
    SelfMetrics::register(&registry).expect("self metrics");
    let text = render_with_ledger(&registry, &s).expect("render");
    assert!(!text.contains("shard="), "{text}");
    // A snapshot advanced keeps its shard.
    let sharded = busy_snapshot().with_shard(Some(0));
    let next = sharded.advance(sharded.ledger.clone());
    assert_eq!(next.shard, Some(0));
}

/// Health layer: a pod holding a sick card.
fn sick(ns: &str, name: &str, reason: &str) -> PodRow {
    let mut p = pod(ns, name);
    p.gpu_health = Some(crate::ledger::GpuHealth {
        reason: reason.into(),
        device: Some("GPU-4cf8".into()),
        since: None,
    });
    p
}

#[test]
fn a_pod_on_a_sick_card_has_an_unhealthy_series_naming_its_owner() {
    let text = render_snapshot(&Snapshot::new(ledger(vec![
        pod("a", "fine"),
        sick("a", "trainer-0", "xid:79"),
    ])))
    .expect("render");
    let unhealthy: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpu_ledger_pod_gpus_unhealthy{"))
        .collect();
    assert_eq!(
        unhealthy,
        vec![
            r#"gpu_ledger_pod_gpus_unhealthy{namespace="a",pod="trainer-0",reason="xid:79",owner_kind="Job",owner_name="j"} 1"#
        ],
        "{text}"
    );
    // The proto path (a registered collector) renders the same family.
    let s = Snapshot::new(ledger(vec![sick(
        "a",
        "trainer-0",
        "kubelet:\"quoted\"\nmsg",
    )]));
    let expected = prometheus::TextEncoder::new()
        .encode_to_string(&collector::families(&s))
        .expect("encode");
    assert_eq!(render_snapshot(&s).expect("render"), expected);
}

#[test]
fn gpu_seconds_on_sick_cards_are_counted_as_lost_beside_claimed() {
    let first = Snapshot::new(ledger(vec![
        pod("a", "fine"),
        sick("a", "trainer-0", "gpu-lost"),
    ]));
    let mut next = first.ledger.clone();
    next.generated_at = t() + chrono::Duration::seconds(30);
    let second = first.advance(next);
    assert_eq!(second.gpu_seconds_lost.get("a"), Some(&30.0));
    // Claimed is unchanged by the new bucket: it reads the namespace rows as before.
    assert_eq!(second.gpu_seconds_claimed.get("a"), Some(&30.0));
    let text = render_snapshot(&second).expect("render");
    assert!(
        text.contains(r#"gpu_ledger_gpu_seconds_lost_total{namespace="a"} 30"#),
        "{text}"
    );
    // A namespace with no sick card has a 0 series once it holds GPUs (increase() needs it).
    let healthy =
        Snapshot::new(ledger(vec![pod("a", "fine")])).advance(ledger(vec![pod("a", "fine")]));
    assert_eq!(healthy.gpu_seconds_lost.get("a"), Some(&0.0));
}
