//! **Test double** for NVIDIA dcgm-exporter, for end-to-end tests on machines without GPUs.
//!
//! No real component can produce DCGM telemetry here (no GPUs, and run-ai/fake-gpu-operator's
//! kwok status exporter binds a fixed port on all interfaces and needs its own topology
//! ConfigMap), so this serves dcgm-exporter's exact text format for the GPU pods on kwok nodes:
//! label names and order as in dcgm-exporter 4.x (`gpu`, `UUID`, `pci_bus_id`, `device`,
//! `modelName`, `Hostname`, then `container`, `namespace`, `pod`), doubles printed with six
//! decimals, one series per physical GPU, pod labels only on allocated GPUs.
//!
//! Utilisation comes from the pod annotation [`UTILIZATION_ANNOTATION`] (percent, default 0).
//! Devices are numbered per node; running pods holding `nvidia.com/gpu` get devices in name
//! order, as the kubelet's device manager would hand them out. It binds 127.0.0.1 only.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

/// Pod annotation holding the simulated GPU utilisation in percent (0–100).
pub const UTILIZATION_ANNOTATION: &str = "gpu-ledger.test/utilization";
/// Pod annotation that hides the pod from the exporter (simulates missing pod labels).
pub const HIDDEN_ANNOTATION: &str = "gpu-ledger.test/no-telemetry";

/// A running fake exporter; stops when dropped.
pub struct FakeDcgmExporter {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeDcgmExporter {
    /// Serves `/metrics` on a free loopback port, reading pods and nodes through `client`.
    pub async fn start(client: kube::Client) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding fake dcgm exporter")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    break;
                };
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let client = client.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let (status, body) = match render(&client).await {
                        Ok(b) => ("200 OK", b),
                        Err(e) => ("500 Internal Server Error", format!("{e:#}\n")),
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Ok(FakeDcgmExporter { addr, stop, task })
    }

    /// `host:port` to put in a Prometheus scrape config.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for FakeDcgmExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

/// **Test double** for dcgm-exporter replaying ONE recorded scrape on every request: the lines
/// of a real exporter's `/metrics` (the corpus under `tests/fixtures/dcgm-real/`, each citing its
/// source) served verbatim, as dcgm-exporter serves them (`text/plain; charset=utf-8`, no
/// timestamps, so Prometheus stamps each scrape itself). It binds 127.0.0.1 only.
pub struct ReplayExporter {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ReplayExporter {
    /// Serves `scrape` on a free loopback port.
    pub async fn start(scrape: String) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding replay dcgm exporter")?;
        let addr = listener.local_addr()?;
        let body = Arc::new(scrape);
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Ok(ReplayExporter { addr, task })
    }

    /// `host:port` to put in a Prometheus scrape config.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for ReplayExporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn gpu_units(pod: &Pod) -> u32 {
    let spec = match &pod.spec {
        Some(s) => s,
        None => return 0,
    };
    spec.containers
        .iter()
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("nvidia.com/gpu"))
        .filter_map(|q| q.0.parse::<u32>().ok())
        .sum()
}

/// Stable fake UUID for GPU `index` of `node`.
pub fn device_uuid(node: &str, index: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-0000-{:012x}",
        (h >> 32) as u32,
        (h >> 16) as u16,
        index,
        h & 0xffff_ffff_ffff
    )
}

async fn render(client: &kube::Client) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes = nodes
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    let pods = pods
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in &pods.items {
        let holds = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Running" || ph == "Pending");
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        if let (true, Some(node)) = (holds, node)
            && gpu_units(p) > 0
        {
            by_node.entry(node).or_default().push(p);
        }
    }
    let mut util = String::from(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
    );
    let mut gr = String::from(
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n",
    );
    let mut fb = String::from(
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n",
    );
    for node in &nodes.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let count = node
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("nvidia.com/gpu"))
            .and_then(|q| q.0.parse::<u32>().ok())
            .unwrap_or(0);
        let model = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("nvidia.com/gpu.product"))
            .map_or("NVIDIA A100-SXM4-80GB".to_string(), |p| p.replace('-', " "));
        let mut holders: Vec<&Pod> = by_node.get(&name).cloned().unwrap_or_default();
        holders.sort_by_key(|p| p.metadata.name.clone());
        let mut assigned: Vec<Option<&Pod>> = Vec::new();
        for p in holders {
            for _ in 0..gpu_units(p) {
                assigned.push(Some(p));
            }
        }
        for i in 0..count {
            let holder = assigned.get(i as usize).copied().flatten();
            let ann = holder.and_then(|p| p.metadata.annotations.as_ref());
            let hidden = ann.is_some_and(|a| a.contains_key(HIDDEN_ANNOTATION));
            let percent: f64 = ann
                .and_then(|a| a.get(UTILIZATION_ANNOTATION))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            let mut labels = format!(
                "gpu=\"{i}\",UUID=\"{}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"{model}\",Hostname=\"{name}\"",
                device_uuid(&name, i),
                0x18 + i
            );
            if let (Some(p), false) = (holder, hidden) {
                let container = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .map(|c| c.name.clone())
                    .unwrap_or_default();
                let _ = write!(
                    labels,
                    ",container=\"{container}\",namespace=\"{}\",pod=\"{}\"",
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default()
                );
            }
            let _ = writeln!(
                util,
                "DCGM_FI_DEV_GPU_UTIL{{{labels}}} {}",
                percent.round() as i64
            );
            let _ = writeln!(
                gr,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {:.6}",
                percent / 100.0
            );
            let used = if holder.is_some() { 2048 } else { 0 };
            let _ = writeln!(fb, "DCGM_FI_DEV_FB_USED{{{labels}}} {used}");
        }
    }
    Ok(format!("{util}{gr}{fb}"))
}

/// A Prometheus config scraping `target` every `interval` the way a default ServiceMonitor does:
/// target labels `namespace`/`pod` name the exporter, `honor_labels: false`, so dcgm-exporter's
/// workload labels arrive as `exported_namespace`/`exported_pod`.
pub fn scrape_config(target: &str, interval: &str) -> String {
    format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nscrape_configs:\n- job_name: nvidia-dcgm-exporter\n  honor_labels: false\n  scrape_interval: {interval}\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      namespace: gpu-operator\n      pod: nvidia-dcgm-exporter-x7k2p\n      container: nvidia-dcgm-exporter\n"
    )
}
