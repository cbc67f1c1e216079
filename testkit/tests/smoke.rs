//! Smoke tests of the harness itself: real etcd + kube-apiserver (tier A), scheduler + KCM +
//! kwok (tier B) and Prometheus with a backfilled TSDB. Needs the binaries from
//! `scripts/build-test-cluster.sh` (fails loudly otherwise).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use std::time::Duration;

use anyhow::{Context, Result};
use gpu_ledger_testkit::util::poll_until;
use gpu_ledger_testkit::{ControlPlane, GpuNode, Prometheus, Tier, TierBOptions};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

fn namespace(name: &str) -> Namespace {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("namespace")
}

/// testkit's GPU pod, held by `finalizer` when given.
fn gpu_pod(name: &str, gpus: u32, finalizer: Option<&str>) -> Pod {
    let mut pod = gpu_ledger_testkit::stack::gpu_pod(name, gpus, None);
    pod.metadata.finalizers = finalizer.map(|f| vec![f.to_string()]);
    pod
}

#[tokio::test]
async fn tier_a_admin_and_rbac() -> Result<()> {
    let cp = ControlPlane::start(Tier::A).await?;
    let admin = cp.client("admin").await?;
    let version = admin.apiserver_version().await?;
    assert_eq!(version.git_version, "v1.36.3");

    let nss: Api<Namespace> = Api::all(admin.clone());
    nss.create(&PostParams::default(), &namespace("smoke-a"))
        .await?;
    assert!(nss.get("smoke-a").await.is_ok());

    for user in ["intruder", "gpu-ledger"] {
        let pods: Api<Pod> = Api::namespaced(cp.client(user).await?, "smoke-a");
        match pods.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{user}: {s:?}"),
            other => panic!("{user} listing pods should be forbidden, got {other:?}"),
        }
    }

    // kubectl built with the cluster talks to it with the generated kubeconfig.
    let out = cp
        .kubectl("admin")?
        .args(["get", "ns", "smoke-a", "-o", "name"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "namespace/smoke-a"
    );

    // The Notebook CRD installs and becomes Established.
    let crd = cp.install_notebook_crd().await?;
    assert_eq!(crd.spec.names.kind, "Notebook");
    Ok(())
}

#[tokio::test]
async fn tier_b_gpu_scheduling_and_finalizers() -> Result<()> {
    let cp = ControlPlane::start(Tier::B(TierBOptions::default())).await?;
    let admin = cp.client("admin").await?;

    cp.add_gpu_node("gpu-a", 2, &[("pool", "smoke")]).await?;
    cp.add_node(
        &GpuNode::new("gpu-ts", 2)
            .time_slicing(4)
            .product("NVIDIA-L4"),
    )
    .await?;
    cp.add_node(&GpuNode::new("gpu-mig", 0).mig("1g.10gb", 7))
        .await?;
    let node = cp.wait_node_ready("gpu-a", Duration::from_secs(60)).await?;
    let alloc = node
        .status
        .and_then(|s| s.allocatable)
        .context("allocatable")?;
    assert_eq!(alloc["nvidia.com/gpu"].0, "2");
    assert_eq!(alloc["cpu"].0, "32");
    let ts = cp
        .wait_node_ready("gpu-ts", Duration::from_secs(60))
        .await?;
    assert_eq!(
        ts.status.and_then(|s| s.allocatable).context("alloc")?["nvidia.com/gpu"].0,
        "8"
    );
    assert_eq!(
        ts.metadata.labels.context("labels")?["nvidia.com/gpu.replicas"],
        "4"
    );
    let mig = cp
        .wait_node_ready("gpu-mig", Duration::from_secs(60))
        .await?;
    assert_eq!(
        mig.status.and_then(|s| s.allocatable).context("alloc")?["nvidia.com/mig-1g.10gb"].0,
        "7"
    );
    // Keep the test pods on gpu-a only: cordon the others.
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in ["gpu-ts", "gpu-mig"] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
            )
            .await?;
    }

    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace("smoke-b"))
        .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "smoke-b");

    // 1 GPU: scheduled onto gpu-a and made Running+Ready by kwok.
    pods.create(&PostParams::default(), &gpu_pod("one-gpu", 1, None))
        .await?;
    let running = poll_until(
        "one-gpu Running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = pods.get("one-gpu").await?;
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            Ok((phase == "Running").then_some(p))
        },
    )
    .await?;
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("gpu-a")
    );

    // More GPUs than any node has: Pending, PodScheduled=False, Insufficient nvidia.com/gpu.
    pods.create(&PostParams::default(), &gpu_pod("too-many", 3, None))
        .await?;
    let msg = poll_until(
        "too-many unschedulable",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = pods.get("too-many").await?;
            let cond = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                })
                .cloned();
            Ok(cond.map(|c| {
                (
                    p.status.and_then(|s| s.phase),
                    c.message.unwrap_or_default(),
                )
            }))
        },
    )
    .await?;
    assert_eq!(msg.0.as_deref(), Some("Pending"));
    assert!(
        msg.1.contains("Insufficient nvidia.com/gpu"),
        "message: {}",
        msg.1
    );

    // A pod with a finalizer stays Terminating until the finalizer is removed.
    let fin = "testkit.gpu-ledger.io/hold";
    pods.create(&PostParams::default(), &gpu_pod("held", 1, Some(fin)))
        .await?;
    poll_until(
        "held Running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = pods.get("held").await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    pods.delete("held", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = pods.get("held").await?;
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "held pod should be Terminating"
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    poll_until(
        "held deleted",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            match pods.get_opt("held").await? {
                None => Ok(Some(())),
                Some(_) => Ok(None),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn prometheus_backfill_is_queryable() -> Result<()> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let t0 = now - 3600;
    let mut om = String::from(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
    );
    for i in 0..60 {
        om.push_str(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",Hostname=\"gpu-a\",UUID=\"GPU-0\"}} {} {}\n",
            i % 100,
            t0 + i * 60
        ));
    }
    om.push_str("# EOF\n");
    let prom = Prometheus::start_with_backfill(&om).await?;
    let at = t0 + 59 * 60;
    let body: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/v1/query", prom.url()))
        .query(&[
            ("query", "DCGM_FI_DEV_GPU_UTIL".to_string()),
            ("time", at.to_string()),
        ])
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(body["status"], "success", "{body}");
    let result = &body["data"]["result"];
    assert_eq!(result.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(result[0]["value"][1], "59");
    let labels: BTreeMap<String, String> = serde_json::from_value(result[0]["metric"].clone())?;
    assert_eq!(labels["Hostname"], "gpu-a");
    Ok(())
}
