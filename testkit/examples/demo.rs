//! The homelab demo on a live local cluster (run it with `scripts/demo`, which builds first):
//! tier B control plane with three one-GPU kwok nodes `lab-1..3` (`NVIDIA-RTX-A1000`), the fake
//! dcgm-exporter test double scraped by a real Prometheus, and `gpu-ledger serve` (read-only
//! shipped RBAC). The shape of `examples/homelab`:
//!
//! * `team-ml/alice-nb` — a Kubeflow Notebook whose pod sits at 0 % on `lab-1`;
//! * `team-ml/bob-nb` — a stopped Notebook (`kubeflow-resource-stopped`, StatefulSet at 0)
//!   whose pod is held Terminating on `lab-2` by a finalizer, still holding its card;
//! * `bench/llm-bench-7f9c` — a busy LLM pod at 98 % on `lab-3`;
//! * `trials/hp-trial-42` — a GPU trial Pending: every card is claimed.
//!
//! Prints `gpu-ledger report -o table` against the live cluster and the URLs, then runs until
//! Ctrl-C / SIGTERM and stops everything it started.
//!
//! Usage: `demo --gpu-ledger PATH [--idle-wait SECONDS]`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::stack::{Notebook, STOP_ANNOTATION, Stack, notebook_resource};
use gpu_ledger_testkit::util::poll_until;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

const READ_ONLY_RBAC: &str = include_str!("../../deploy/kustomize/base/rbac.yaml");
const FINALIZER: &str = "storage.example.com/unmount-protection";

fn parse_args() -> Result<(PathBuf, u64)> {
    let mut bin = None;
    let mut idle_wait = 60;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gpu-ledger" => bin = args.next().map(PathBuf::from),
            "--idle-wait" => {
                idle_wait = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .context("--idle-wait SECONDS")?;
            }
            "-h" | "--help" => {
                println!("usage: demo --gpu-ledger PATH [--idle-wait SECONDS]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (usage: demo --gpu-ledger PATH)"),
        }
    }
    let bin = bin.context("--gpu-ledger PATH is required (scripts/demo passes it)")?;
    if !bin.is_file() {
        bail!("{} not found: run `cargo build --release`", bin.display());
    }
    Ok((bin, idle_wait))
}

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

#[allow(clippy::too_many_lines)]
#[tokio::main]
async fn main() -> Result<()> {
    let (bin, idle_wait) = parse_args()?;
    step(
        "starting the cluster (etcd, kube-apiserver, scheduler, controller-manager, kwok), fake DCGM and Prometheus",
    );
    let nodes: Vec<GpuNode> = (1..=3)
        .map(|i| GpuNode::new(&format!("lab-{i}"), 1).product("NVIDIA-RTX-A1000"))
        .collect();
    let stack = Stack::start(&nodes).await?;
    let admin = stack.admin();
    stack.grant_rbac(READ_ONLY_RBAC, "gpu-ledger").await?;

    step("creating the homelab workloads");
    let alice = Notebook::new("team-ml", "alice-nb").node("lab-1");
    let bob = Notebook::new("team-ml", "bob-nb")
        .node("lab-2")
        .pod_finalizer(FINALIZER);
    stack.create_notebook(&alice).await?;
    stack.create_notebook(&bob).await?;
    let llm = gpu_ledger_testkit::stack::gpu_pod("llm-bench-7f9c", 1, Some(98.0));
    let mut llm_json = serde_json::to_value(&llm)?;
    llm_json["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "lab-3"});
    stack.ensure_namespace("bench").await?;
    Api::<Pod>::namespaced(admin.clone(), "bench")
        .create(&Default::default(), &serde_json::from_value(llm_json)?)
        .await
        .context("creating bench/llm-bench-7f9c")?;
    stack.wait_pod_running("team-ml", "alice-nb-0").await?;
    stack.wait_pod_running("team-ml", "bob-nb-0").await?;
    stack.wait_pod_running("bench", "llm-bench-7f9c").await?;
    stack.ensure_namespace("trials").await?;
    stack
        .create_gpu_pod("trials", "hp-trial-42", 1, None)
        .await?;

    // Stop bob-nb the way the Kubeflow UI does; Kubeflow's controller would scale the
    // StatefulSet to 0, which we do here directly. The finalizer keeps the pod Terminating.
    let notebooks: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "team-ml", &notebook_resource());
    let stamp = kubeflow_now();
    let nb = notebooks
        .patch(
            "bob-nb",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {STOP_ANNOTATION: stamp}}})),
        )
        .await
        .context("stopping bob-nb")?;
    gpu_ledger_testkit::stack::scale_owned_statefulset(
        &admin,
        "team-ml",
        "bob-nb",
        nb.metadata.uid.as_deref().unwrap_or_default(),
        0,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-ml");
    poll_until(
        "bob-nb-0 Terminating",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            Ok(pods
                .get_opt("bob-nb-0")
                .await?
                .filter(|p| p.metadata.deletion_timestamp.is_some())
                .map(|_| ()))
        },
    )
    .await?;

    step("starting gpu-ledger serve");
    let gl = stack.start_gpu_ledger(&bin, "gpu-ledger", &[]).await?;
    step(&format!(
        "waiting up to {idle_wait} s for alice-nb to be proven idle (10 s window)"
    ));
    let proven = poll_until(
        "alice-nb-0 idle",
        Duration::from_secs(idle_wait),
        Duration::from_millis(500),
        || async {
            let l = gl.ledger_json().await?;
            Ok(l["pods"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pod"] == "alice-nb-0"))
                .filter(|p| p["idle"] == true)
                .map(|_| ()))
        },
    )
    .await;
    if let Err(e) = proven {
        eprintln!("warning: {e:#}");
    }

    let admin_kubeconfig = stack.cp.kubeconfig_path("admin")?;
    let out = Command::new(&bin)
        .env("KUBECONFIG", &admin_kubeconfig)
        .env("GPU_LEDGER_LOG", "warn")
        .args(["report", "-o", "table"])
        .args(["--prometheus-url", stack.prometheus.url()])
        .args([
            "--window",
            "10s",
            "--scrape-interval",
            "1s",
            "--max-staleness",
            "5s",
        ])
        .args(["--history-lookback", "10m"])
        .output()
        .context("running gpu-ledger report")?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("gpu-ledger report failed ({})", out.status);
    }
    println!("\n$ gpu-ledger report -o table   (live cluster)\n");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    println!();
    println!("gpu-ledger /metrics         {}/metrics", gl.url());
    println!("gpu-ledger /api/v1/ledger   {}/api/v1/ledger", gl.url());
    println!("Prometheus                  {}", stack.prometheus.url());
    println!("export KUBECONFIG={}", admin_kubeconfig.display());
    println!("logs: {}", stack.cp.dir().display());
    println!("\nRunning; Ctrl-C stops everything.");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    step("stopping gpu-ledger, Prometheus and the cluster");
    drop(gl);
    drop(stack);
    Ok(())
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (what the Kubeflow UI writes).
fn kubeflow_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
