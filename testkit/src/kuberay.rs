//! KubeRay's operator (`ray-operator`) as a local process against a test control plane.
//!
//! The binary is built from KubeRay's Go module at a pinned release by
//! `scripts/build-kuberay.sh` (`KUBERAY_BIN` overrides); its CRDs come from that module's own
//! `config/crd/bases` (`--print-crds`). It runs as the control plane's `admin` user (no test
//! here is about the operator's own permissions), leader election off, metrics and health
//! probes on loopback ports of their own, webhooks off (`ENABLE_WEBHOOKS` unset, as in the
//! operator's default manifests). Its `RayClusterStatusConditions` gate is on by default from
//! v1.3, so it writes `RayClusterSuspending`/`RayClusterSuspended`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::{ApiResource, GroupVersionKind};

use crate::ControlPlane;
use crate::process::ChildGuard;
use crate::util::{free_ports, ready_answer};

/// The KubeRay release built and run here.
pub const VERSION: &str = "v1.5.0";
/// KubeRay's API group and the version it serves.
pub const GROUP: &str = "ray.io";
pub const API_VERSION: &str = "v1";

/// The `ray.io/v1` RayCluster resource.
pub fn raycluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, API_VERSION, "RayCluster"),
        "rayclusters",
    )
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-kuberay.sh")
}

/// The operator binary: `$KUBERAY_BIN`, else `scripts/build-kuberay.sh`'s cache entry. Missing
/// is an error naming the script (a test that needs the operator fails, it never skips).
pub fn kuberay_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUBERAY_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("KUBERAY_BIN={} is not a file", p.display());
    }
    let p = crate::bins::cache_root()
        .join(format!("kuberay-{}", VERSION.trim_start_matches('v')))
        .join("bin/ray-operator");
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found: run scripts/build-kuberay.sh (the README's test command does) or set \
             KUBERAY_BIN",
            p.display()
        )
    }
}

/// Installs KubeRay's RayCluster, RayJob and RayService CRDs from its module and waits until
/// each is Established (the operator starts a controller per kind and needs all three).
pub async fn install_crds(cp: &ControlPlane) -> Result<()> {
    let out = crate::process::run_ok(
        {
            let mut cmd = Command::new(script());
            cmd.arg("--print-crds");
            cmd
        },
        None,
    )
    .context("asking scripts/build-kuberay.sh for KubeRay's CRDs")?;
    let bases = PathBuf::from(out.trim());
    for file in [
        "ray.io_rayclusters.yaml",
        "ray.io_rayjobs.yaml",
        "ray.io_rayservices.yaml",
    ] {
        let file = bases.join(file);
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let crd: CustomResourceDefinition = serde_norway::from_str(&text)
            .with_context(|| format!("parsing CRD {}", file.display()))?;
        cp.install_crd(&crd).await?;
    }
    Ok(())
}

/// A running operator; stopped when dropped.
pub struct KubeRay {
    guard: ChildGuard,
    health_url: String,
}

impl KubeRay {
    /// Starts the operator on `cp` (CRDs installed first, [`install_crds`]) and waits until its
    /// `/readyz` answers.
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        let bin = kuberay_bin()?;
        let [health, metrics] = free_ports(2)?[..] else {
            bail!("two free ports expected");
        };
        let mut cmd = Command::new(bin);
        cmd.arg(format!(
            "-kubeconfig={}",
            cp.kubeconfig_path("admin")?.display()
        ))
        .arg("-enable-leader-election=false")
        .arg(format!("-health-probe-bind-address=127.0.0.1:{health}"))
        .arg(format!("-metrics-addr=127.0.0.1:{metrics}"))
        .arg("-log-stdout-encoder=console");
        let guard = ChildGuard::spawn("kuberay", cmd, &cp.log_path("kuberay"))?;
        let mut k = Self {
            guard,
            health_url: format!("http://127.0.0.1:{health}/readyz"),
        };
        k.wait_ready(Duration::from_secs(120)).await?;
        Ok(k)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let start = Instant::now();
        loop {
            if let Some(status) = self.guard.try_exit_status() {
                bail!(
                    "ray-operator exited ({status}) before becoming ready; last 40 lines of {}:\n{}",
                    self.guard.log_path().display(),
                    self.guard.log_tail(40)
                );
            }
            // controller-runtime's probe answers exactly `ok` (see `util::ready_answer`).
            let last = match ready_answer(&http, &self.health_url, "ok").await {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            if start.elapsed() >= timeout {
                bail!(
                    "ray-operator not ready at {} after {timeout:?} (last answer: {last}); last 40 \
                     lines of {}:\n{}",
                    self.health_url,
                    self.guard.log_path().display(),
                    self.guard.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The operator's log so far (the last `n` lines), for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        self.guard.log_tail(n)
    }
}
