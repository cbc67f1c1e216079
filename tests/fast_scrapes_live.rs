//! DCGM scraped faster than `--scrape-interval` assumes (issue 36, item 3), live: a real
//! kube-apiserver (tier A) holding two Kubeflow notebooks' pods, and a real Prometheus backfilled
//! with dcgm-exporter's series at a 5 s scrape interval. `nb-new`'s GPU has 143 s of idle samples,
//! `nb-old`'s an hour. `gpu-ledger report --cull-dry-run --cull-idle-after 10m` with the default
//! `--scrape-interval` (30 s) must neither call `nb-new` idle for 10 minutes nor plan its stop
//! (before the fix it read 29 samples as a full window at 30 s and planned the stop), while
//! `nb-old` — the control that shows a stop can be planned here at all — is stopped; and a
//! `capture` of the same instant, reported offline, must say the same.

mod support;

use std::process::Command;

use chrono::{DateTime, Utc};
use gpu_ledger_testkit::stack::Notebook;
use gpu_ledger_testkit::{GpuNode, Prometheus};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "team-ml";
/// The scrape interval of the backfilled series.
const SCRAPE_SECS: i64 = 5;

/// dcgm-exporter's series for the GPU of `pod` on `node`, every 5 s over the `span_secs` ending
/// at `end` (ms timestamps), idle, in OpenMetrics (`promtool tsdb create-blocks-from`).
fn idle_series(out: &mut String, node: &str, uuid: &str, pod: &str, end: i64, span_secs: i64) {
    use std::fmt::Write as _;
    for name in ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"] {
        let k = (0..=span_secs / SCRAPE_SECS).rev();
        for back in k {
            let t = end - back * SCRAPE_SECS;
            writeln!(
                out,
                "{name}{{gpu=\"0\",UUID=\"{uuid}\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\",container=\"{pod}\",namespace=\"{NS}\",pod=\"{pod}\"}} 0 {t}"
            )
            .expect("write to string");
        }
    }
}

/// The notebook's pod as the StatefulSet controller would create it (tier A runs none), bound
/// to `node`, Running and Ready since an hour before `at`.
async fn notebook_pod(admin: &kube::Client, nb: &Notebook, node: &str, at: DateTime<Utc>) {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS)
        .get(&nb.name)
        .await
        .expect("the notebook's statefulset");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": nb.pod_name(), "namespace": NS,
            "labels": {"statefulset": nb.name, "notebook-name": nb.name},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": nb.name, "uid": sts.metadata.uid, "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": nb.name,
            "image": "kubeflownotebookswg/jupyter-pytorch-cuda:v1.9.0",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("pod");
    let pods = Api::<Pod>::namespaced(admin.clone(), NS);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let started =
        (at - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    pods.patch_status(
        &nb.pod_name(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "startTime": started,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}]}})),
    )
    .await
    .expect("pod status");
}

fn run(args: &[&str]) -> Value {
    let mut c = support::gpu_ledger_command();
    let out = c.args(args).output().expect("run gpu-ledger");
    assert!(
        out.status.success(),
        "gpu-ledger {args:?}: exit {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gpu-ledger {args:?}: JSON: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn pod_row<'a>(report: &'a Value, pod: &str) -> &'a Value {
    report["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["pod"] == pod)
        .unwrap_or_else(|| panic!("no row for {pod}: {report:#}"))
}

fn would_stop(report: &Value) -> Vec<String> {
    report["cull"]["would_stop"]
        .as_array()
        .expect("would_stop")
        .iter()
        .map(|s| s["notebook"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// What a report says of `nb-new` (143 s of samples) and `nb-old` (an hour).
fn assert_verdicts(report: &Value, what: &str) {
    let new = pod_row(report, "nb-new-0");
    let idle_secs = new["idle_seconds"].as_f64();
    assert!(
        new["idle"] != json!(true) || idle_secs.is_some_and(|s| s < 600.0),
        "{what}: 143 s of 5 s samples proved nb-new-0 idle for {idle_secs:?} s: {new:#}"
    );
    if let Some(s) = idle_secs {
        assert!(
            s <= 150.0,
            "{what}: nb-new-0 idle for {s} s from 143 s of samples: {new:#}"
        );
    }
    let stops = would_stop(report);
    assert!(
        !stops.iter().any(|n| n == "nb-new"),
        "{what}: a stop of nb-new planned from 143 s of samples: {:#}",
        report["cull"]
    );
    // The control: an hour of the same samples proves nb-old idle, so a stop can be planned.
    let old = pod_row(report, "nb-old-0");
    assert_eq!(old["idle"], json!(true), "{what}: {old:#}");
    assert!(
        old["idle_seconds"].as_f64().is_some_and(|s| s >= 600.0),
        "{what}: {old:#}"
    );
    assert!(
        stops.iter().any(|n| n == "nb-old"),
        "{what}: nb-old not stopped: {:#}",
        report["cull"]
    );
}

#[tokio::test]
async fn five_second_scrapes_over_143_seconds_plan_no_ten_minute_stop() {
    // An instant in the past on the 5 s grid, so the backfilled blocks hold every sample.
    let at_secs = {
        let t = Utc::now().timestamp() - 3600;
        t - t.rem_euclid(SCRAPE_SECS)
    };
    let at = DateTime::from_timestamp(at_secs, 0).expect("time");
    let mut om = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    let mut util = String::new();
    let mut gr = String::new();
    idle_series(&mut gr, "gpu-node-1", "GPU-new", "nb-new-0", at_secs, 143);
    idle_series(&mut gr, "gpu-node-2", "GPU-old", "nb-old-0", at_secs, 3600);
    // OpenMetrics wants each family's samples together.
    for line in gr.lines() {
        if line.starts_with("DCGM_FI_DEV_GPU_UTIL") {
            util.push_str(line);
            util.push('\n');
        } else {
            om.push_str(line);
            om.push('\n');
        }
    }
    om.push_str("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n");
    om.push_str(&util);
    om.push_str("# EOF\n");
    let prom = Prometheus::start_with_backfill(&om)
        .await
        .expect("a real Prometheus (apt-get install prometheus)");

    let (cp, admin) = support::tier_a().await;
    cp.install_notebook_crd().await.expect("notebook CRD");
    for (node, nb) in [("gpu-node-1", "nb-new"), ("gpu-node-2", "nb-old")] {
        cp.add_node(&GpuNode::new(node, 1)).await.expect("node");
        let nb = Notebook::new(NS, nb).node(node);
        nb.create(&admin).await.expect("notebook");
        notebook_pod(&admin, &nb, node, at).await;
    }

    let kubeconfig = cp.kubeconfig_path("admin").expect("kubeconfig");
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path");
    let at_arg = at.to_rfc3339();
    let cull = ["--cull-dry-run", "--cull-idle-after", "10m", "-o", "json"];
    let mut live = vec![
        "report",
        "--kubeconfig",
        kubeconfig,
        "--prometheus-url",
        prom.url(),
        "--at",
        &at_arg,
    ];
    live.extend(cull);
    assert_verdicts(&run(&live), "live report");

    // The same instant captured and reported offline.
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().to_str().expect("utf-8 path");
    let capture = [
        "capture",
        "--out",
        out,
        "--kubeconfig",
        kubeconfig,
        "--prometheus-url",
        prom.url(),
        "--at",
        &at_arg,
    ];
    let status = Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(capture)
        .output()
        .expect("run capture");
    assert!(
        status.status.success(),
        "capture: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let mut offline = vec!["report", "--from", out, "--at", &at_arg];
    offline.extend(cull);
    assert_verdicts(&run(&offline), "offline report of a capture");
}
