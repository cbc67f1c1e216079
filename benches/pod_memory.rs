//! Heap profile of one Pending GPU pod in `serve`: the bytes each stage of the served path keeps
//! (or briefly holds) per extra Pending pod, counted exactly by dhat's allocator (requested
//! sizes; the shipped allocator's rounding and pages are not in these figures).
//!
//! `scripts/bench-scale.sh` measures the same thing as RSS over a live cluster (+3,000 Pending
//! pods, docs/benchmarks.md), where allocator pages, refresh transients and sampling noise blur
//! it; this attributes it. The pods are the bench's own (`testkit/examples/scale_bench.rs`): one
//! `nvidia.com/gpu`, a node selector nothing matches, the two tolerations the API server's
//! `DefaultTolerationSeconds` admission adds, and kube-scheduler's `PodScheduled=False` message.
//! They go through the same projection (`claims::project::pod`) and keyed store shape
//! (`Stores::pods`, `namespace/name`) as the watch, then `ledger::build`, the published
//! [`Snapshot`], and the two renders a scrape and an API read make.
//!
//! Run: `cargo bench --bench pod_memory` (prints a table; figures in docs/benchmarks.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use gpu_ledger::claims::project;
use gpu_ledger::export::render_with_ledger;
use gpu_ledger::ledger::accounting::Snapshot;
use gpu_ledger::ledger::claims::{Claims, NodeInfo, PodClaim};
use gpu_ledger::ledger::units::ResourceNames;
use gpu_ledger::ledger::usage::Usage;
use gpu_ledger::ledger::{self, Ledger, Policy};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// dhat's allocator counts the bytes each allocation asks for (not the allocator's rounding), and
/// records where it was made, for `dhat-heap.json`.
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes live on the heap now.
fn live() -> isize {
    dhat::HeapStats::get().curr_bytes.cast_signed()
}

/// The bench's N: 500 nodes × 8 GPUs, one Running single-GPU pod per GPU.
const NODES: usize = 500;
/// Pending GPU pods added, as the bench's slope phase adds them.
const EXTRA: usize = 3_000;
/// GPU namespaces the bench spreads its pods over.
const GPU_NAMESPACES: usize = 20;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).expect("valid")
}

/// A pod as the API server returns it to the watch: metadata the server sets, the tolerations
/// `DefaultTolerationSeconds` adds, and (pending) the condition kube-scheduler writes.
fn api_pod(ns: &str, name: &str, node: Option<&str>) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "uid": format!("6f1c2d3e-{name}"),
            "resourceVersion": "123456", "creationTimestamp": "2026-09-21T10:00:00Z",
            "labels": {"app": "bench"},
            "annotations": {"gpu-ledger.test/utilization": "0"},
        },
        "spec": {
            "containers": [{"name": "main", "image": "bench",
                "resources": {"limits": {"cpu": "100m", "nvidia.com/gpu": "1"},
                              "requests": {"cpu": "100m", "nvidia.com/gpu": "1"}}}],
            "terminationGracePeriodSeconds": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
    });
    if let Some(n) = node {
        v["spec"]["nodeName"] = json!(n);
        v["status"] = json!({"phase": "Running", "startTime": "2026-09-21T10:00:05Z",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-09-21T10:00:09Z"}]});
    } else {
        v["spec"]["nodeSelector"] = json!({"gpu-ledger.bench/none": "true"});
        // kube-scheduler's wording for a selector no node matches (v1.3x).
        let message = format!(
            "0/{NODES} nodes are available: {NODES} node(s) didn't match Pod's node \
             affinity/selector. preemption: 0/{NODES} nodes are available: {NODES} \
             Preemption is not helpful for scheduling."
        );
        v["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": "2026-09-21T10:00:01Z"}]});
    }
    serde_json::from_value(v).expect("valid pod")
}

fn nodes() -> Vec<NodeInfo> {
    (0..NODES)
        .map(|n| {
            let name = format!("gpu-node-{n:04}");
            NodeInfo {
                hami: gpu_ledger::ledger::hami_inputs::HamiNode::default(),
                labels: BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), name.clone()),
                    ("kubernetes.io/os".to_string(), "linux".to_string()),
                    (
                        "nvidia.com/gpu.product".to_string(),
                        "NVIDIA-H100-80GB-HBM3".to_string(),
                    ),
                ]),
                name,
                allocatable: [("nvidia.com/gpu".to_string(), 8)].into(),
                replicas: 1,
                product: Some("NVIDIA-H100-80GB-HBM3".into()),
                gpu_labels: BTreeMap::new(),
                taints: Vec::new(),
                ready: Some(true),
            }
        })
        .collect()
}

/// Projects `pods` into `store` the way the pod watch does.
fn watch_into(store: &DashMap<String, Arc<PodClaim>>, pods: impl Iterator<Item = Pod>) {
    let names = ResourceNames::default();
    for pod in pods {
        if let Some(claim) = project::pod(&names, &pod).expect("projects") {
            store.insert(
                format!("{}/{}", claim.namespace, claim.name),
                Arc::new(claim),
            );
        }
    }
}

/// The build's copy of the claims, as `Stores::claims_for` makes it.
fn claims_of(store: &DashMap<String, Arc<PodClaim>>, nodes: &[NodeInfo]) -> Claims {
    Claims {
        pods: store.iter().map(|e| e.value().clone()).collect(),
        nodes: nodes.to_vec(),
        ..Claims::default()
    }
}

/// Bytes of each part of a ledger, measured by dropping it (the heap is freed exactly).
fn ledger_parts(mut ledger: Ledger) -> Vec<(&'static str, isize)> {
    let mut parts = Vec::new();
    let mut drop_part = |name, f: &mut dyn FnMut(&mut Ledger)| {
        let before = live();
        f(&mut ledger);
        parts.push((name, before - live()));
    };
    drop_part("pods (rows)", &mut |l| l.pods = Vec::new());
    drop_part("reclaim (plans)", &mut |l| l.reclaim = Vec::new());
    drop_part("namespaces", &mut |l| l.namespaces = Vec::new());
    drop_part("nodes", &mut |l| l.nodes = Vec::new());
    drop_part("quotas, queues, rest", &mut |l| {
        *l = Ledger::empty(l.generated_at);
    });
    parts
}

/// Heap bytes `value` owns, measured by cloning it (a clone allocates exactly what it owns).
fn owned<T: Clone>(value: &T) -> isize {
    let before = live();
    let copy = value.clone();
    let bytes = live() - before;
    drop(copy);
    bytes
}

/// Where one Pending pod's bytes go: its projection and its ledger row, field by field.
fn print_fields(
    store: &DashMap<String, Arc<PodClaim>>,
    nodes: &[NodeInfo],
    policy: &Policy,
    usage: &Usage,
) {
    let key = "team-00/extra-queued-00000";
    let claim = store.get(key).expect("a pending pod").value().clone();
    let c: &PodClaim = &claim;
    println!("one Pending pod, field by field (inline size + heap it owns, bytes)");
    println!(
        "  PodClaim inline {} + Arc header 16 + store key {}",
        size_of::<PodClaim>(),
        key.len()
    );
    let fields: [(&str, isize); 7] = [
        (
            "namespace, name, uid",
            owned(&c.namespace) + owned(&c.name) + owned(&c.uid),
        ),
        ("resources (LiteMap)", owned(&c.resources)),
        ("unschedulable_message", owned(&c.unschedulable_message)),
        (
            "placement.node_selector (sorted Vec)",
            owned(&c.placement.node_selector),
        ),
        ("placement.tolerations", owned(&c.placement.tolerations)),
        (
            "placement.required_terms",
            owned(&c.placement.required_terms),
        ),
        (
            "controller, labels, resource_claims",
            owned(&c.controller) + owned(&c.labels) + owned(&c.resource_claims),
        ),
    ];
    for (name, bytes) in fields {
        println!("    {name:<40} {bytes:>6}");
    }
    let claims = Claims {
        pods: vec![claim.clone()],
        nodes: nodes.to_vec(),
        ..Claims::default()
    };
    let ledger = ledger::build(&claims, usage, now(), policy);
    let row = &ledger.pods[0];
    println!("  PodRow inline {}", size_of::<ledger::PodRow>());
    let fields: [(&str, isize); 6] = [
        ("namespace, pod", owned(&row.namespace) + owned(&row.pod)),
        ("resources (LiteMap)", owned(&row.resources)),
        ("gpus_by_resource", owned(&row.gpus_by_resource)),
        ("pending_reason", owned(&row.pending_reason)),
        ("owner, notebook, devices", {
            owned(&row.owner) + owned(&row.notebook) + owned(&row.devices)
        }),
        ("evidence", owned(&row.evidence)),
    ];
    for (name, bytes) in fields {
        println!("    {name:<40} {bytes:>6}");
    }
    if let Some(plan) = ledger.reclaim.first() {
        println!(
            "  reclaim plan inline {} + heap {}",
            size_of_val(plan),
            owned(plan)
        );
    }
    println!();
}

struct Stage {
    base: isize,
    extra: isize,
}

fn per_pod(s: &Stage) -> f64 {
    (s.extra - s.base) as f64 / EXTRA as f64
}

fn main() {
    // dhat writes its own summary on exit; it goes to the temp dir, not the working tree.
    let _profiler = dhat::Profiler::builder()
        .file_name(std::env::temp_dir().join("gpu-ledger-pod-memory-dhat.json"))
        .build();
    let policy = Policy::default();
    let usage = Usage {
        hami: Vec::new(),
        devices: Vec::new(),
        available: true,
        partial: false,
        ..Usage::default()
    };
    let nodes = nodes();
    let running = (0..NODES * 8).map(|i| {
        let (n, g) = (i / 8, i % 8);
        api_pod(
            &format!("team-{:02}", i % GPU_NAMESPACES),
            &format!("job-{n:04}-{g}"),
            Some(&format!("gpu-node-{n:04}")),
        )
    });
    let pending = || {
        (0..EXTRA).map(|i| {
            api_pod(
                &format!("team-{:02}", i % GPU_NAMESPACES),
                &format!("extra-queued-{i:05}"),
                None,
            )
        })
    };

    // One measurement per stage, base cluster and base + EXTRA pending pods.
    let mut rows: Vec<(String, Stage)> = Vec::new();
    let store = DashMap::new();
    let before = live();
    watch_into(&store, running);
    let store_base = live() - before;
    let before = live();
    watch_into(&store, pending());
    let store_extra = live() - before + store_base;
    rows.push((
        "store: projected PodClaim + key (Stores::pods)".into(),
        Stage {
            base: store_base,
            extra: store_extra,
        },
    ));

    let base_store: DashMap<String, Arc<PodClaim>> = store
        .iter()
        .filter(|e| !e.key().contains("extra-queued"))
        .map(|e| (e.key().clone(), e.value().clone()))
        .collect();

    let measure = |store: &DashMap<String, Arc<PodClaim>>| {
        let start = live();
        let claims = claims_of(store, &nodes);
        let claims_bytes = live() - start;
        let ledger = ledger::build(&claims, &usage, now(), &policy);
        let ledger_bytes = live() - start - claims_bytes;
        drop(claims);
        let snapshot = Snapshot::new(Ledger::empty(now() - chrono::Duration::seconds(10)));
        let at = live();
        let next = snapshot.advance(ledger);
        let counters = live() - at;
        let metrics = render_with_ledger(&prometheus::Registry::new(), &next).expect("renders");
        let json = serde_json::to_vec(&next.ledger).expect("encodes");
        let (metrics_len, json_len) = (metrics.len(), json.len());
        drop((metrics, json));
        let parts = ledger_parts(next.ledger);
        (
            claims_bytes,
            ledger_bytes,
            counters,
            metrics_len,
            json_len,
            parts,
        )
    };
    let b = measure(&base_store);
    let e = measure(&store);
    let stage = |name: &str, base: isize, extra: isize| (name.to_string(), Stage { base, extra });
    rows.push(stage(
        "build input: Claims copy (held during a build)",
        b.0,
        e.0,
    ));
    rows.push(stage("ledger (kept in the published snapshot)", b.1, e.1));
    for ((name, base), (_, extra)) in b.5.iter().zip(&e.5) {
        rows.push(stage(&format!("  of which {name}"), *base, *extra));
    }
    rows.push(stage("snapshot counters (Snapshot::advance)", b.2, e.2));
    rows.push(stage(
        "/metrics text (per scrape, freed after)",
        b.3.cast_signed(),
        e.3.cast_signed(),
    ));
    rows.push(stage(
        "/api/v1/ledger JSON (per read, freed after)",
        b.4.cast_signed(),
        e.4.cast_signed(),
    ));

    print_fields(&store, &nodes, &policy, &usage);
    println!(
        "heap bytes per extra Pending GPU pod ({NODES} nodes, {} Running GPU pods, +{EXTRA} Pending)",
        NODES * 8
    );
    println!(
        "{:<52} {:>12} {:>12} {:>10}",
        "stage", "base bytes", "+pending", "per pod"
    );
    for (name, s) in &rows {
        println!(
            "{:<52} {:>12} {:>12} {:>10.0}",
            name,
            s.base,
            s.extra,
            per_pod(s)
        );
    }
}
