//! `report --cull-dry-run --cull-when=demand` on the bundled homelab: the flag reaches the plan,
//! the planner's cheapest way comes first (a stuck holder's force delete before a stop), and a
//! pod that fits only by a stop gets it, said for whom.

mod support;

use serde_json::Value;
use support::{homelab, homelab_copy, report_json};

fn cull(dir: &std::path::Path, when: &str) -> Value {
    let out = report_json(
        dir,
        &[
            "--cull-dry-run",
            "--cull-idle-after",
            "1h",
            "--cull-when",
            when,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn would_stop(v: &Value) -> Vec<(String, String)> {
    v["cull"]["would_stop"]
        .as_array()
        .expect("would_stop")
        .iter()
        .map(|s| {
            (
                s["notebook"].as_str().unwrap_or_default().to_string(),
                s["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn skip_reason(v: &Value, pod: &str) -> Option<String> {
    v["cull"]["skipped"]
        .as_array()?
        .iter()
        .find(|s| s["pod"] == pod)
        .and_then(|s| s["reason"].as_str())
        .map(str::to_string)
}

#[test]
fn demand_waits_for_a_pod_that_needs_the_stop() {
    // idle: team-ml's idle owners are stopped whether or not anyone waits, one per cycle (the
    // per-namespace cap): RayCluster ray-sweep first (equal idleness; the owner without a
    // notebook sorts first), alice-nb in the next cycle.
    let idle = cull(&homelab(), "idle");
    let stops = would_stop(&idle);
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].0, "ray-sweep");
    assert!(!stops[0].1.contains("needed by"), "{stops:?}");
    assert_eq!(
        skip_reason(&idle, "alice-nb-0").as_deref(),
        Some("per_namespace_cap")
    );

    // demand: hp-trial-42 would fit on lab-2 once the stuck bob-nb-0 is force-deleted, which
    // costs nobody a kernel: no stop.
    let demand = cull(&homelab(), "demand");
    assert!(would_stop(&demand).is_empty(), "{:#}", demand["cull"]);
    assert_eq!(
        skip_reason(&demand, "alice-nb-0").as_deref(),
        Some("no_demand")
    );
    assert_eq!(
        skip_reason(&demand, "ray-sweep-gpu-worker-t6kzr").as_deref(),
        Some("no_demand")
    );

    // The trial pinned to lab-1 (`nodeSelector`): only alice-nb's stop makes room.
    let dir = homelab_copy();
    let path = dir.path().join("pods.json");
    let mut pods: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("pods")).expect("json");
    let trial = pods["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|p| p["metadata"]["name"] == "hp-trial-42")
        .expect("hp-trial-42");
    trial["spec"]["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": "lab-1"});
    std::fs::write(&path, pods.to_string()).expect("write");
    let pinned = cull(dir.path(), "demand");
    let options: Vec<&str> = pinned["reclaim"][0]["options"]
        .as_array()
        .expect("options")
        .iter()
        .filter_map(|o| o["node"].as_str())
        .collect();
    assert_eq!(options, ["lab-1"]);
    let stops = would_stop(&pinned);
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].0, "alice-nb");
    assert!(
        stops[0]
            .1
            .ends_with("needed by pending pod trials/hp-trial-42"),
        "{stops:?}"
    );
}

#[test]
fn an_unknown_cull_when_is_refused() {
    let out = report_json(&homelab(), &["--cull-dry-run", "--cull-when", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cull-when"), "{err}");
}
