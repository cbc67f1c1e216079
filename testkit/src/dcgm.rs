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
//!
//! GPUs handed out through DRA are labelled as dcgm-exporter does with `--kubernetes-enable-dra`
//! (kubernetes/website, feature gate `KubeletPodResourcesDynamicResources`, shows real series):
//! every device a `gpu.nvidia.com` ResourceSlice publishes on the node is a device (one that the
//! device plugin advertises too, by UUID, is the same device); each pod a claim allocating it is
//! reserved for gets its own series with `pod`/`namespace`/`container` and `dra_claim_name`,
//! `dra_claim_namespace`, `dra_device_name`, `dra_driver_name`, `dra_pool_name` (plus
//! `dra_mig_device_uuid`, `dra_mig_profile` on MIG devices). A MIG device is a GPU instance:
//! the parent's `gpu`/`UUID` with `GPU_I_PROFILE` and `GPU_I_ID`, and no `GPU_UTIL`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};

/// The driver name of NVIDIA's DRA driver for GPUs (the ResourceSlices whose devices are
/// reported; `dra.rs` publishes them).
pub const DRIVER: &str = "gpu.nvidia.com";

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

/// The DRA objects the exporter maps devices with (`--kubernetes-enable-dra`): `None` when
/// `resource.k8s.io/v1` is not served.
struct DraView {
    slices: Vec<ResourceSlice>,
    claims: Vec<ResourceClaim>,
}

async fn dra_view(client: &kube::Client) -> Result<Option<DraView>> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slices = match slices.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        Err(e) => return Err(e).context("listing resourceslices"),
    };
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let claims = claims
        .list(&ListParams::default())
        .await
        .context("listing resourceclaims")?
        .items;
    Ok(Some(DraView { slices, claims }))
}

/// A device as the exporter labels it: identity labels, then holders (one series each).
struct Device<'a> {
    /// `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`[, `GPU_I_PROFILE`, `GPU_I_ID`].
    identity: String,
    /// Holding pods with the `dra_*` labels of the claim that gave them the device (sorted
    /// attribute labels, as the exporter writes them), empty for extended resources.
    holders: Vec<(&'a Pod, String)>,
    mig: bool,
}

/// A whole GPU or MIG device a slice of `gpu.nvidia.com` publishes on a node.
struct SliceDevice {
    name: String,
    pool: String,
    minor: u32,
    uuid: String,
    product: Option<String>,
    /// (parent UUID, profile) of a MIG device.
    mig: Option<(String, String)>,
}

fn slice_devices(view: &DraView, node: &str) -> Vec<SliceDevice> {
    let mut out = Vec::new();
    for s in &view.slices {
        if s.spec.driver != DRIVER || s.spec.node_name.as_deref() != Some(node) {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            let attr = |k: &str| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .and_then(|v| v.string.clone())
            };
            let Some(uuid) = attr("uuid") else { continue };
            let minor = d
                .name
                .strip_prefix("gpu-")
                .and_then(|r| r.split('-').next())
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            let mig = (attr("type").as_deref() == Some("mig"))
                .then(|| Some((attr("parentUUID")?, attr("profile")?)))
                .flatten();
            out.push(SliceDevice {
                name: d.name.clone(),
                pool: s.spec.pool.name.clone(),
                minor,
                uuid,
                product: attr("productName"),
                mig,
            });
        }
    }
    out
}

/// Pods holding `(pool, device)` through a claim, each with the claim's `dra_*` labels.
fn dra_holders<'a>(
    view: &DraView,
    by_uid: &BTreeMap<String, &'a Pod>,
    node: &str,
    dev: &SliceDevice,
) -> Vec<(&'a Pod, String)> {
    let mut out = Vec::new();
    for c in &view.claims {
        let Some(status) = &c.status else { continue };
        let allocated = status
            .allocation
            .iter()
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
            .any(|r| r.driver == DRIVER && r.pool == dev.pool && r.device == dev.name);
        if !allocated {
            continue;
        }
        let mut labels = format!(
            "dra_claim_name=\"{}\",dra_claim_namespace=\"{}\",dra_device_name=\"{}\",dra_driver_name=\"{}\"",
            c.metadata.name.clone().unwrap_or_default(),
            c.metadata.namespace.clone().unwrap_or_default(),
            dev.name,
            DRIVER,
        );
        if let Some((_, profile)) = &dev.mig {
            let _ = write!(
                labels,
                ",dra_mig_device_uuid=\"{}\",dra_mig_profile=\"{profile}\"",
                dev.uuid
            );
        }
        let _ = write!(labels, ",dra_pool_name=\"{}\"", dev.pool);
        for r in status.reserved_for.iter().flatten() {
            if let Some(p) = by_uid.get(&r.uid)
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            {
                out.push((*p, labels.clone()));
            }
        }
    }
    out.sort_by_key(|(p, _)| p.metadata.name.clone());
    out
}

fn annotation<'p>(p: &'p Pod, key: &str) -> Option<&'p String> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(key))
}

#[allow(clippy::too_many_lines)]
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
    let dra = dra_view(client).await?;
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    let mut by_uid: BTreeMap<String, &Pod> = BTreeMap::new();
    for p in &pods.items {
        let holds = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Running" || ph == "Pending");
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        if let (true, Some(node)) = (holds, node) {
            if let Some(uid) = &p.metadata.uid {
                by_uid.insert(uid.clone(), p);
            }
            if gpu_units(p) > 0 {
                by_node.entry(node).or_default().push(p);
            }
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
        let identity = |minor: u32, uuid: &str, model: &str| {
            format!(
                "gpu=\"{minor}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{minor}\",modelName=\"{model}\"",
                0x18 + minor
            )
        };
        let published = dra
            .as_ref()
            .map(|v| slice_devices(v, &name))
            .unwrap_or_default();
        let mut devices: Vec<Device<'_>> = Vec::new();
        // GPUs of the device plugin; a card a slice publishes as well is one device.
        for i in 0..count {
            let uuid = device_uuid(&name, i);
            let mut d = Device {
                identity: identity(i, &uuid, &model),
                holders: Vec::new(),
                mig: false,
            };
            if let Some(p) = assigned.get(i as usize).copied().flatten() {
                d.holders.push((p, String::new()));
            }
            if let (Some(v), Some(sd)) = (&dra, published.iter().find(|s| s.uuid == uuid)) {
                d.holders.extend(dra_holders(v, &by_uid, &name, sd));
            }
            devices.push(d);
        }
        let plugin_uuids: Vec<String> = (0..count).map(|i| device_uuid(&name, i)).collect();
        for sd in &published {
            if plugin_uuids.contains(&sd.uuid) {
                continue;
            }
            let Some(v) = &dra else { continue };
            let model = sd.product.clone().unwrap_or_else(|| model.clone());
            let identity = match &sd.mig {
                None => identity(sd.minor, &sd.uuid, &model),
                // A GPU instance: the parent's identity plus profile and instance id (here
                // numbered by its place among the parent's MIG devices in the slice).
                Some((parent, profile)) => {
                    let gi = published
                        .iter()
                        .filter(|o| o.mig.as_ref().is_some_and(|(p, _)| p == parent))
                        .position(|o| o.name == sd.name)
                        .unwrap_or(0)
                        + 1;
                    format!(
                        "{},GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{gi}\"",
                        identity(sd.minor, parent, &model)
                    )
                }
            };
            devices.push(Device {
                identity,
                holders: dra_holders(v, &by_uid, &name, sd),
                mig: sd.mig.is_some(),
            });
        }
        for d in &devices {
            // Device-wide values: the busiest holder's annotation.
            let percent = d
                .holders
                .iter()
                .filter_map(|(p, _)| annotation(p, UTILIZATION_ANNOTATION)?.parse::<f64>().ok())
                .fold(0.0_f64, f64::max);
            let used = if d.holders.is_empty() { 0 } else { 2048 };
            let shown: Vec<&(&Pod, String)> = d
                .holders
                .iter()
                .filter(|(p, _)| annotation(p, HIDDEN_ANNOTATION).is_none())
                .collect();
            let mut series: Vec<String> = Vec::new();
            for (p, dra_labels) in &shown {
                let container = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .map(|c| c.name.clone())
                    .unwrap_or_default();
                let mut l = format!(
                    "{},Hostname=\"{name}\",container=\"{container}\"",
                    d.identity
                );
                if !dra_labels.is_empty() {
                    let _ = write!(l, ",{dra_labels}");
                }
                let _ = write!(
                    l,
                    ",namespace=\"{}\",pod=\"{}\"",
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default()
                );
                series.push(l);
            }
            if series.is_empty() {
                series.push(format!("{},Hostname=\"{name}\"", d.identity));
            }
            for labels in &series {
                // MIG instances have no DCGM_FI_DEV_GPU_UTIL (dcgm-exporter#50).
                if !d.mig {
                    let _ = writeln!(
                        util,
                        "DCGM_FI_DEV_GPU_UTIL{{{labels}}} {}",
                        percent.round() as i64
                    );
                }
                let _ = writeln!(
                    gr,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {:.6}",
                    percent / 100.0
                );
                let _ = writeln!(fb, "DCGM_FI_DEV_FB_USED{{{labels}}} {used}");
            }
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
