//! `gpu-ledger capture` against the live tier B stack (kwok GPU nodes, the fake dcgm-exporter
//! test double scraped every second by a real Prometheus), as token user `gpu-ledger` bound to the
//! shipped read-only RBAC only: `report --from DIR --at T -o json` equals the live
//! `report --at T -o json`, field for field. Then the live report's "What to do" commands are run
//! as printed, through a shell, and do what they say.
//!
//! Why the two can be equal: the claims do not change between the capture and the live report
//! (nothing is created or deleted in between), and both read Prometheus as of the same `T` (a few
//! seconds in the past, so no scrape before `T` is still being written when the capture reads).
//! One field differs honestly, by method, and is checked separately: `idle_seconds` (with
//! `idle_bounded_by_history`) of idle pods, where the live history's bucketed start errs late by
//! up to one bucket (see the comment at the comparison).

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use gpu_ledger_testkit::stack::{Notebook, notebook_resource};
use gpu_ledger_testkit::{GpuNode, binary};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::{Grants, eventually, tier_b};

const TEAM: &str = "team-ml";
const RESEARCH: &str = "research";
const WAIT: Duration = Duration::from_secs(90);
/// The stack's timings (1 s scrapes), shared by every report below.
const TIMINGS: [&str; 8] = [
    "--scrape-interval",
    "1s",
    "--window",
    "10s",
    "--max-staleness",
    "5s",
    "--stuck-after",
    "1s",
];

fn gpu_ledger() -> Command {
    support::gpu_ledger_command()
}

/// When the first DCGM sample naming `namespace/pod` was taken (ms), from a capture's dump.
fn first_sample_ms(dcgm: &str, namespace: &str, pod: &str) -> Option<i64> {
    let ns = format!("exported_namespace=\"{namespace}\"");
    let pod = format!("exported_pod=\"{pod}\"");
    dcgm.lines()
        .filter(|l| l.starts_with("DCGM_") && l.contains(&ns) && l.contains(&pod))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .min()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf8")
}

fn live_report(kubeconfig: &Path, prometheus: &str, extra: &[&str]) -> Output {
    gpu_ledger()
        .arg("report")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--prometheus-url", prometheus])
        .args(TIMINGS)
        .args(extra)
        .output()
        .expect("run live report")
}

fn pod<'a>(ledger: &'a Value, ns: &str, name: &str) -> Option<&'a Value> {
    ledger["pods"]
        .as_array()?
        .iter()
        .find(|p| p["namespace"] == ns && p["pod"] == name)
}

/// Paths where two JSON documents differ, for a readable failure.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                differences(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: offline {a} != live {b}")),
        _ => {}
    }
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_then_offline_report_equals_the_live_report() {
    let stack = tier_b(
        &[GpuNode::new("gpu-1", 2), GpuNode::new("gpu-2", 2)],
        Grants::ReadOnly,
    )
    .await;
    let admin = stack.admin();
    let prom = stack.prometheus.url().to_string();
    let reader = stack.cp.kubeconfig_path("gpu-ledger").expect("kubeconfig");
    let admin_kubeconfig = stack.cp.kubeconfig_path("admin").expect("kubeconfig");

    // The device series must start well before any pod (see the module comment).
    let http = reqwest::Client::new();
    eventually("40 s of DCGM samples in Prometheus", WAIT, || async {
        let v: Value = http
            .get(format!("{prom}/api/v1/query"))
            .query(&[(
                "query",
                "min(count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[5m]))",
            )])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (n >= 40.0).then_some(())
    })
    .await;

    stack.ensure_namespace(TEAM).await.expect("namespace");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}
    }))
    .expect("quota");
    Api::<ResourceQuota>::namespaced(admin.clone(), TEAM)
        .create(&PostParams::default(), &quota)
        .await
        .expect("team quota");
    stack
        .create_gpu_pod(TEAM, "busy", 1, Some(90.0))
        .await
        .expect("busy pod");
    stack
        .create_gpu_pod(TEAM, "idle", 1, Some(0.0))
        .await
        .expect("idle pod");
    // A pod whose finalizer nobody removes: deleted, it stays Terminating and holds its GPU.
    let mut held = gpu_ledger_testkit::stack::gpu_pod("held", 1, Some(0.0));
    held.metadata.finalizers = Some(vec!["gpu-ledger.test/hold".into()]);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), TEAM);
    pods.create(&PostParams::default(), &held)
        .await
        .expect("held pod");
    stack
        .create_notebook(&Notebook::new(RESEARCH, "nb"))
        .await
        .expect("notebook");
    for (ns, name) in [
        (TEAM, "busy"),
        (TEAM, "idle"),
        (TEAM, "held"),
        (RESEARCH, "nb-0"),
    ] {
        stack.wait_pod_running(ns, name).await.expect("running");
    }
    // Every card is taken now: this one stays Pending.
    stack
        .create_gpu_pod(RESEARCH, "waiting", 1, None)
        .await
        .expect("pending pod");
    pods.delete("held", &DeleteParams::default())
        .await
        .expect("delete held pod");

    // Settled: idleness proven for 15 s (so `T`, 3 s ago, lies well inside the pods' own
    // telemetry, not in the device history from before them), the held pod stuck, the pending
    // pod's reason known.
    let idle_for =
        |v: &Value, ns: &str, name: &str| pod(v, ns, name).and_then(|p| p["idle_seconds"].as_f64());
    eventually("a settled live ledger", WAIT, || async {
        let out = live_report(&reader, &prom, &["-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let settled = pod(&v, TEAM, "idle")?["idle"] == true
            && pod(&v, RESEARCH, "nb-0")?["idle"] == true
            && idle_for(&v, TEAM, "idle")? >= 15.0
            && idle_for(&v, RESEARCH, "nb-0")? >= 15.0
            && pod(&v, TEAM, "busy")?["idle"] == false
            && pod(&v, TEAM, "held")?["stuck"] == true
            && pod(&v, RESEARCH, "waiting")?["pending_reason"].is_string();
        settled.then_some(())
    })
    .await;

    let at = (chrono::Utc::now() - chrono::Duration::seconds(3))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let dir = tempfile::tempdir().expect("tmp");
    let out = gpu_ledger()
        .arg("capture")
        .arg("--out")
        .arg(dir.path())
        .arg("--kubeconfig")
        .arg(&reader)
        .args(["--prometheus-url", &prom, "--at", &at])
        .output()
        .expect("run capture");
    ok(&out, "capture");
    for f in [
        "pods.json",
        "nodes.json",
        "quotas.json",
        "notebooks.json",
        "statefulsets.json",
        "dcgm.prom",
        "capture.json",
    ] {
        assert!(dir.path().join(f).is_file(), "capture wrote no {f}");
    }
    let dcgm = std::fs::read_to_string(dir.path().join("dcgm.prom")).expect("dcgm.prom");
    let sample = dcgm
        .lines()
        .find(|l| l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{"))
        .expect("a GR_ENGINE_ACTIVE sample");
    let ts: i64 = sample
        .rsplit(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("millisecond timestamp on {sample}"));
    assert!(ts > 1_600_000_000_000, "{sample}");
    // Only GPU pods leave the cluster.
    let captured: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("pods.json")).expect("pods.json"),
    )
    .expect("json");
    assert_eq!(captured["kind"], "List");
    assert_eq!(captured["items"].as_array().expect("items").len(), 5);
    assert!(
        captured["items"][0]["metadata"]
            .get("managedFields")
            .is_none(),
        "kubectl hides managedFields"
    );

    let offline = gpu_ledger()
        .arg("report")
        .arg("--from")
        .arg(dir.path())
        .args(TIMINGS)
        .args(["--at", &at, "-o", "json"])
        .output()
        .expect("offline report");
    let offline: Value = serde_json::from_str(&ok(&offline, "offline report")).expect("json");
    let live = live_report(&reader, &prom, &["--at", &at, "-o", "json"]);
    let live: Value = serde_json::from_str(&ok(&live, "live report")).expect("json");
    // Exact on every field but one honest difference: the live history (bucketed PromQL over
    // the lookback, buckets of min(lookback/288, window) = 10 s here, per device across its
    // series) proves idleness from the end of the bucket holding the device's first sample, so
    // where that sample is the pod's own, back to within one bucket after the pod's start and no
    // further; the dump is reduced sample by sample across the device's series and proves it
    // back to the pod's start.
    // Live is the lower of the two (idle time is under-, never over-estimated). The new series
    // starts with its first scrape after the pod started, which a busy machine can delay: live
    // proves idleness back to within one bucket of that first sample, read from the dump.
    let bucket = 10.0;
    let at_secs = chrono::DateTime::parse_from_rfc3339(&at)
        .expect("at")
        .timestamp_millis() as f64
        / 1000.0;
    let mut offline_rest = offline.clone();
    let mut live_rest = live.clone();
    for (o, l) in offline_rest["pods"]
        .as_array_mut()
        .expect("pods")
        .iter_mut()
        .zip(live_rest["pods"].as_array_mut().expect("pods"))
    {
        let name = format!("{}/{}", o["namespace"], o["pod"]);
        if let (Some(os), Some(ls)) = (o["idle_seconds"].as_f64(), l["idle_seconds"].as_f64())
            && o["idle"] == true
        {
            let first = first_sample_ms(
                &dcgm,
                o["namespace"].as_str().expect("namespace"),
                o["pod"].as_str().expect("pod"),
            )
            .unwrap_or_else(|| panic!("{name}: no sample names the pod in dcgm.prom"));
            // Seconds between the start offline proves idleness from and the pod's first sample.
            let lag = (first as f64 / 1000.0 - (at_secs - os)).max(0.0);
            assert!(
                ls <= os && os - ls <= bucket + lag + 1e-3,
                "{name}: live idle {ls} s, offline {os} s: more than one bucket apart after the \
                 pod's first sample ({lag:.3} s after the start offline proves idleness from)"
            );
            assert_eq!(
                o["idle_bounded_by_history"], false,
                "{name}: offline proves it since start"
            );
            assert_eq!(
                l["idle_bounded_by_history"],
                json!(ls < os),
                "{name}: live is bounded exactly when it stops short of the pod's start"
            );
            for p in [&mut *o, &mut *l] {
                p["idle_seconds"] = Value::Null;
                p["idle_bounded_by_history"] = Value::Null;
            }
        }
    }
    // The reclaim planner plans the pending pod from the dump's pod spec and node labels and
    // taints as from the watches (compared below), and repeats the idle pods' `idle_seconds`
    // (checked above) in its stops.
    assert!(
        offline["reclaim"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["pending"]["pod"] == "waiting")),
        "the pending pod is planned: {:#}",
        offline["reclaim"]
    );
    for doc in [&mut offline_rest, &mut live_rest] {
        for r in doc["reclaim"].as_array_mut().into_iter().flatten() {
            for o in r["options"].as_array_mut().into_iter().flatten() {
                for s in o["by_stopping"].as_array_mut().into_iter().flatten() {
                    s["idle_seconds"] = Value::Null;
                }
            }
        }
    }
    let mut diff = Vec::new();
    differences(&offline_rest, &live_rest, "", &mut diff);
    assert!(
        diff.is_empty(),
        "report --from DIR --at T differs from the live report at T:\n{}\n--- offline:\n{offline:#}",
        diff.join("\n")
    );
    // Offline, an idle pod is idle since its own start: T minus status.startTime, to the ms.
    let captured_pods: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("pods.json")).expect("pods.json"),
    )
    .expect("json");
    let t = chrono::DateTime::parse_from_rfc3339(&at).expect("at");
    for (ns, name) in [(TEAM, "idle"), (RESEARCH, "nb-0")] {
        let started = captured_pods["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .and_then(|p| p["status"]["startTime"].as_str())
            .expect("startTime");
        let started = chrono::DateTime::parse_from_rfc3339(started).expect("time");
        let expected = (t - started).num_milliseconds() as f64 / 1000.0;
        assert_eq!(
            pod(&offline, ns, name).expect("pod")["idle_seconds"].as_f64(),
            Some(expected),
            "{ns}/{name}"
        );
    }
    // The comparison covered what it should.
    assert_eq!(live["pods"].as_array().map(Vec::len), Some(5), "{live:#}");
    assert_eq!(pod(&live, RESEARCH, "nb-0").expect("nb")["notebook"], "nb");
    for (ns, name) in [(TEAM, "idle"), (RESEARCH, "nb-0")] {
        let p = pod(&live, ns, name).expect("pod");
        assert!(
            p["idle"] == true
                && p["attribution"] == "exclusive"
                && p["idle_seconds"].as_f64() > Some(10.0),
            "{p:#}"
        );
    }
    let busy = pod(&live, TEAM, "busy").expect("busy");
    assert!(
        busy["idle"] == false && busy["utilization"].as_f64() > Some(0.8),
        "{busy:#}"
    );

    // The live table's "What to do", run exactly as printed.
    let table = ok(&live_report(&reader, &prom, &[]), "live table");
    let todo = table
        .split("\nWhat to do\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no What to do in\n{table}"));
    let commands: Vec<&str> = todo
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
        .collect();
    let stop = commands
        .iter()
        .find(|c| {
            c.starts_with("kubectl annotate notebook -n research -- nb kubeflow-resource-stopped=")
        })
        .unwrap_or_else(|| panic!("no stop command in\n{todo}"));
    let unhold = commands
        .iter()
        .find(|c| c.starts_with("kubectl patch pod -n team-ml ") && c.ends_with(" -- held"))
        .unwrap_or_else(|| panic!("no finalizer command in\n{todo}"));
    let cap = commands
        .iter()
        .find(|c| c.starts_with("kubectl create quota gpu-quota -n research "))
        .unwrap_or_else(|| panic!("no quota command in\n{todo}"));
    assert!(
        !commands
            .iter()
            .any(|c| c.contains("quota") && c.contains("team-ml")),
        "team-ml has a GPU quota: {todo}"
    );
    let kubectl = binary("kubectl").expect("kubectl (scripts/build-test-cluster.sh)");
    let bindir = kubectl.parent().expect("bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bindir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for command in [stop, unhold, cap] {
        let out = Command::new("sh")
            .args(["-c", command])
            .env("PATH", &path)
            .env("KUBECONFIG", &admin_kubeconfig)
            .output()
            .expect("sh");
        ok(&out, command);
    }
    let value = stop.rsplit('=').next().expect("value");
    let nb = Api::<DynamicObject>::namespaced_with(admin.clone(), RESEARCH, &notebook_resource())
        .get("nb")
        .await
        .expect("notebook");
    assert_eq!(
        nb.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubeflow-resource-stopped"))
            .map(String::as_str),
        Some(value)
    );
    assert!(
        chrono::DateTime::parse_from_rfc3339(value).is_ok() && value.ends_with('Z'),
        "{value}"
    );
    eventually(
        "the held pod gone once its finalizer is cleared",
        WAIT,
        || async {
            pods.get_opt("held")
                .await
                .ok()
                .and_then(|p| p.is_none().then_some(()))
        },
    )
    .await;
    let rq = Api::<ResourceQuota>::namespaced(admin.clone(), RESEARCH)
        .get("gpu-quota")
        .await
        .expect("the quota the hint created");
    let hard = rq.spec.and_then(|s| s.hard).unwrap_or_default();
    assert_eq!(
        hard.get("requests.nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("2"),
        "today's demand: the notebook's GPU and the pending pod's"
    );
    let after = live_report(&reader, &prom, &["-o", "json"]);
    let after: Value = serde_json::from_str(&ok(&after, "live report")).expect("json");
    let research = after["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .find(|n| n["namespace"] == RESEARCH)
        .expect("research");
    assert_eq!(research["gpu_quota"], 2.0, "{research}");
    assert!(pod(&after, TEAM, "held").is_none(), "{after:#}");
}
