//! Two shards of `gpu-ledger serve` (`--shard 0|1 --total-shards 2`, as the chart's StatefulSet
//! runs them) against a real control plane, scraped by a REAL Prometheus loading
//! alerts/gpu-ledger.rules.yaml: every series of each shard carries `shard="<i>"`, each counts
//! only the pods on its own node, and the recording rules add the shards' parts of a namespace
//! (the per-namespace gauge at once, the per-minute GPU-seconds once the accounting group has a
//! minute of data) instead of keeping the larger one.
//!
//! Never skips: missing control-plane binaries or Prometheus fail with what to build or install.

mod support;

use std::time::Duration;

use gpu_ledger::ledger::claims::shard_of;
use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::prometheus::Prometheus;
use gpu_ledger_testkit::stack::metric_value;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use support::{Grants, eventually, gpu_pod, tier_b};

const NS: &str = "team-shards";
const WAIT: Duration = Duration::from_secs(60);
/// The accounting rule group runs once a minute, first anywhere in its first minute, and its
/// per-minute difference needs a minute of scrapes behind it.
const ACCOUNTING_WAIT: Duration = Duration::from_secs(200);

/// Two node names that fall on different shards of two: (shard 0's, shard 1's).
fn one_node_per_shard() -> (String, String) {
    let names: Vec<String> = (1..=20).map(|i| format!("gpu-{i}")).collect();
    let on = |s: u32| {
        names
            .iter()
            .find(|n| shard_of(n, 2) == s)
            .cloned()
            .expect("twenty names cover both shards")
    };
    (on(0), on(1))
}

/// The first sample's value of an instant query, when there is one.
async fn query(prom: &Prometheus, q: &str) -> Option<f64> {
    prom.query(q).await.ok()?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_label_their_series_and_the_rules_add_them() {
    let (node0, node1) = one_node_per_shard();
    let stack = tier_b(
        &[GpuNode::new(&node0, 2), GpuNode::new(&node1, 2)],
        Grants::ReadOnly,
    )
    .await;
    stack.ensure_namespace(NS).await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(stack.admin(), NS);
    // One GPU on shard 0's node, two on shard 1's: the namespace holds 3.
    for (name, gpus, node) in [("a", 1, &node0), ("b", 2, &node1)] {
        pods.create(&PostParams::default(), &gpu_pod(name, gpus, Some(node)))
            .await
            .expect("create pod");
    }
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    let mut shards = Vec::new();
    for shard in ["0", "1"] {
        shards.push(
            stack
                .start_gpu_ledger(
                    bin,
                    "gpu-ledger",
                    &["--shard", shard, "--total-shards", "2"],
                )
                .await
                .expect("gpu-ledger serve shard ready"),
        );
    }

    for (shard, (gl, gpus)) in shards.iter().zip([1.0, 2.0]).enumerate() {
        let label = shard.to_string();
        let text = eventually("each shard counts its own node's pod", WAIT, || async {
            let text = gl.metrics_text().await.ok()?;
            (metric_value(
                &text,
                "gpu_ledger_namespace_gpus_claimed",
                &[("namespace", NS)],
            ) == Some(gpus))
            .then_some(text)
        })
        .await;
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(!samples.is_empty());
        for line in samples {
            assert!(
                line.contains(&format!("shard=\"{label}\"")),
                "shard {label}: a series without its shard label: {line}"
            );
        }
    }

    let targets = shards
        .iter()
        .map(|gl| format!("'{}'", gl.url().trim_start_matches("http://")))
        .collect::<Vec<_>>()
        .join(", ");
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/alerts/gpu-ledger.rules.yaml"
    ))
    .expect("the shipped rules");
    let prom = Prometheus::start_with_rules(
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gpu-ledger\n    honor_labels: true\n    static_configs:\n      - targets: [{targets}]\n"
        ),
        &[("gpu-ledger.rules.yaml", &rules)],
    )
    .await
    .unwrap_or_else(|e| {
        panic!("this test needs a real Prometheus (`apt-get install prometheus`): {e:#}")
    });
    let held = format!("namespace:gpu_ledger_gpus_claimed:sum{{namespace=\"{NS}\"}}");
    // Until both shards are scraped the sum is partial: wait for the whole; a wrong sum fails
    // as this wait's timeout.
    eventually("the per-namespace rule adds both shards", WAIT, || async {
        query(&prom, &held)
            .await
            .filter(|v| (*v - 3.0).abs() < 1e-9)
    })
    .await;

    // A minute of the namespace's 3 GPUs: 180 GPU-seconds, give or take a scrape's jitter.
    let minute =
        format!("namespace:gpu_ledger_gpu_seconds_claimed:increase1m{{namespace=\"{NS}\"}}");
    let seconds = eventually(
        "the per-minute GPU-seconds rule adds both shards",
        ACCOUNTING_WAIT,
        || async {
            query(&prom, &minute)
                .await
                .filter(|v| *v > 3.0 * 60.0 * 0.9)
        },
    )
    .await;
    assert!(
        seconds < 3.0 * 60.0 * 1.1,
        "3 GPUs for a minute, counted once per shard: {seconds}\n{}",
        prom.log_tail(20)
    );
}
