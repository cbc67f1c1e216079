//! Benchmarks of the pure path at cluster scale: `ledger::build` and `/metrics` rendering
//! (10,000 nodes × 8 GPUs, 80,000 GPU pods) — the served path (`render_with_ledger`: registry +
//! ledger text written directly) and the former `Collector` path (proto families through
//! `Registry::gather` and `TextEncoder`) for comparison. The offline report of a 400-node dump is
//! timed end to end by `scripts/bench.sh`. Figures are recorded in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_ledger::export::LedgerCollector;
use gpu_ledger::ledger::accounting::Snapshot;
use gpu_ledger::ledger::claims::{Claims, NodeInfo, PodClaim};
use gpu_ledger::ledger::usage::{DeviceKey, DeviceUsage, Signal, Usage, Workload};
use gpu_ledger::ledger::{self, Policy};

/// The allocator the `gpu-ledger` binary ships with (src/main.rs): the build allocates and frees
/// every row, so the allocator is part of what is measured.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).expect("valid")
}

/// `nodes` nodes with 8 GPUs each, one single-GPU pod per GPU, one device series per GPU.
fn cluster(nodes: usize) -> (Claims, Usage) {
    let mut claims = Claims::default();
    let mut devices = Vec::with_capacity(nodes * 8);
    for n in 0..nodes {
        let node = format!("gpu-node-{n:05}");
        claims.nodes.push(NodeInfo {
            hami: gpu_ledger::ledger::hami_inputs::HamiNode::default(),
            name: node.clone(),
            allocatable: [("nvidia.com/gpu".to_string(), 8)].into(),
            replicas: 1,
            product: Some("NVIDIA-H100-80GB-HBM3".into()),
            gpu_labels: BTreeMap::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: Some(true),
        });
        for g in 0..8 {
            let ns = format!("team-{}", (n * 8 + g) % 200);
            let pod = format!("job-{n:05}-{g}");
            claims.pods.push(Arc::new(PodClaim {
                started_at: Some(now() - Duration::hours(5)),
                ready_since: Some(now() - Duration::hours(5)),
                ..PodClaim::new(ns.clone(), pod.clone())
                    .with_uid(format!("uid-{n}-{g}"))
                    .running_on(node.clone())
                    .created(now() - Duration::hours(5))
                    .claiming("nvidia.com/gpu", 1)
            }));
            let util = if g % 3 == 0 { 0.0 } else { 0.7 };
            devices.push(DeviceUsage {
                key: DeviceKey {
                    uuid: format!("GPU-{n:05}-{g}"),
                    gpu_instance: None,
                },
                hostname: Some(node.clone()),
                exporter: None,
                instance: None,
                model: Some("NVIDIA H100 80GB HBM3".into()),
                mig_profile: None,
                mig_uuid: None,
                workloads: vec![Workload { namespace: ns, pod }],
                per_pod_utilization: vec![],
                per_pod_memory_bytes: Vec::new(),
                per_pod_windows: Vec::new(),
                signal: Some(Signal::GrEngineActive),
                utilization: Some(util),
                peak: Some(util),
                coverage: 1.0,
                last_sample_at: Some(now() - Duration::seconds(15)),
                memory_used_bytes: Some(2.0e9),
                last_active_at: Some(now() - Duration::hours(1)),
                covered_since: Some(now() - Duration::hours(24)),
            });
        }
    }
    (
        claims,
        Usage {
            hami: Vec::new(),
            devices,
            available: true,
            partial: false,
            ..Usage::default()
        },
    )
}

fn bench_build(c: &mut Criterion) {
    let (claims, usage) = cluster(10_000);
    let policy = Policy::default();
    let mut g = c.benchmark_group("ledger_build");
    g.sample_size(10);
    g.bench_function("10k_nodes_80k_pods", |b| {
        b.iter(|| black_box(ledger::build(&claims, &usage, now(), &policy)));
    });
    g.finish();
}

fn bench_render(c: &mut Criterion) {
    let (claims, usage) = cluster(10_000);
    let ledger = ledger::build(&claims, &usage, now(), &Policy::default());
    let snapshot = Snapshot::new(ledger);

    // Served path: self-metrics registry + ledger families written as text.
    let plain = prometheus::Registry::new();
    gpu_ledger::export::SelfMetrics::register(&plain).expect("self metrics");
    let served = gpu_ledger::export::render_with_ledger(&plain, &snapshot).expect("render");

    // Collector path: the same families as proto metrics through gather() and TextEncoder.
    let shared = Arc::new(arc_swap::ArcSwap::from_pointee(snapshot.clone()));
    let registry = prometheus::Registry::new();
    gpu_ledger::export::SelfMetrics::register(&registry).expect("self metrics");
    registry
        .register(Box::new(LedgerCollector::new(shared).expect("collector")))
        .expect("register");
    let gathered = gpu_ledger::export::render(&registry).expect("render");
    assert_eq!(served, gathered, "both paths render the same text");

    let mut g = c.benchmark_group("metrics_render");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(served.len() as u64));
    g.bench_function("10k_nodes_80k_pods", |b| {
        b.iter(|| {
            black_box(gpu_ledger::export::render_with_ledger(&plain, &snapshot).expect("render"))
        });
    });
    g.bench_function("10k_nodes_80k_pods_collector_path", |b| {
        b.iter(|| black_box(gpu_ledger::export::render(&registry).expect("render")));
    });
    g.finish();
}

criterion_group!(benches, bench_build, bench_render);
criterion_main!(benches);
