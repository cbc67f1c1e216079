//! Writes a synthetic `report --from DIR` dump for benchmarks: `cargo run --release -p
//! gpu-ledger-testkit --example offline_dump -- DIR [--nodes 400] [--pods 5000] [--samples 1]`.
//!
//! `nodes.json` / `pods.json` are `kubectl get -A -o json` Lists (kwok-like nodes with 8 GPUs;
//! GPU pods of 1, 2 and 4 GPUs filling most cards, some Pending, some Terminating, the rest
//! non-GPU pods up to `--pods`); `dcgm.prom` is a Prometheus `/federate` dump of dcgm-exporter
//! series (scraped without `honor_labels`, so workload labels are `exported_*`), six fields per
//! GPU, `--samples` samples per series 30 s apart (≈ 8 MB at 400 nodes and one sample).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

const NEWEST: i64 = 1_795_849_200; // 2026-11-28T09:00:00Z
const GPUS: u32 = 8;

struct Args {
    dir: PathBuf,
    nodes: u32,
    pods: u32,
    samples: u32,
}

fn args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        dir: PathBuf::new(),
        nodes: 400,
        pods: 5000,
        samples: 1,
    };
    while let Some(x) = it.next() {
        let mut num = |name: &str| -> Result<u32> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name}: not a number"))
        };
        match x.as_str() {
            "--nodes" => a.nodes = num("--nodes")?,
            "--pods" => a.pods = num("--pods")?,
            "--samples" => a.samples = num("--samples")?.max(1),
            _ if x.starts_with("--") => bail!("unknown flag {x}"),
            _ => a.dir = PathBuf::from(x),
        }
    }
    if a.dir.as_os_str().is_empty() {
        bail!("usage: offline_dump DIR [--nodes N] [--pods N] [--samples N]");
    }
    Ok(a)
}

fn ts(secs: i64) -> String {
    chrono_like(secs)
}

/// RFC 3339 without pulling chrono into the testkit: days-from-civil inverse.
fn chrono_like(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn node_name(n: u32) -> String {
    format!("gpu-node-{n:04}")
}

fn node(n: u32) -> Value {
    let name = node_name(n);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("node-uid-{n}"), "resourceVersion": "1000",
            "creationTimestamp": ts(NEWEST - 200 * 86_400),
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
                "type": "kwok"
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"}
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", n / 256, n % 256)},
        "status": {
            "capacity": {"cpu": "128", "memory": "2113474560Ki", "pods": "110", "ephemeral-storage": "959786032Ki", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "127", "memory": "2112425984Ki", "pods": "110", "ephemeral-storage": "884538529110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": ts(NEWEST - 20), "lastTransitionTime": ts(NEWEST - 200 * 86_400), "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", n / 256, n % 256)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1.4", "osImage": "Ubuntu 24.04.3 LTS", "kernelVersion": "6.8.0-85-generic", "architecture": "amd64", "operatingSystem": "linux"}
        }
    })
}

enum State {
    Running,
    Pending,
    Terminating,
}

struct PodSpec<'a> {
    ns: String,
    name: String,
    node: Option<&'a str>,
    gpus: u32,
    state: State,
    notebook: bool,
}

fn pod(i: usize, p: &PodSpec) -> Value {
    let created = NEWEST - 3 * 86_400 - (i as i64 % 5000) * 60;
    let mut limits = json!({"cpu": "4", "memory": "16Gi"});
    if p.gpus > 0 {
        limits["nvidia.com/gpu"] = json!(p.gpus.to_string());
    }
    let owner = if p.notebook {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": p.name.trim_end_matches("-0"), "uid": format!("sts-{i}"), "controller": true, "blockOwnerDeletion": true})
    } else {
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": format!("{}-job", p.name), "uid": format!("job-{i}"), "controller": true, "blockOwnerDeletion": true})
    };
    let mut meta = json!({
        "name": p.name, "namespace": p.ns, "uid": format!("pod-uid-{i:06}"), "resourceVersion": format!("{}", 2000 + i),
        "creationTimestamp": ts(created),
        "labels": {"app": "train", "pod-template-hash": "7c65d6cfc9"},
        "ownerReferences": [owner]
    });
    if matches!(p.state, State::Terminating) {
        meta["deletionTimestamp"] = json!(ts(NEWEST - 3600));
        meta["deletionGracePeriodSeconds"] = json!(30);
        meta["finalizers"] = json!(["example.com/hold"]);
    }
    let mut spec = json!({
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "resources": {"limits": limits.clone(), "requests": limits},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "schedulerName": "default-scheduler",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    });
    let status = match (p.node, &p.state) {
        (Some(n), State::Running | State::Terminating) => {
            spec["nodeName"] = json!(n);
            json!({"phase": "Running", "startTime": ts(created + 5),
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(created + 1)},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": ts(created + 2)},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": ts(created + 5)},
                    {"type": "Ready", "status": "True", "lastTransitionTime": ts(created + 5)}],
                "hostIP": "10.0.0.1", "podIP": format!("10.244.{}.{}", i / 250 % 256, i % 250 + 2), "qosClass": "Guaranteed",
                "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "started": true,
                    "image": "nvcr.io/nvidia/pytorch:25.01-py3", "imageID": "", "containerID": format!("containerd://{i:064x}"),
                    "state": {"running": {"startedAt": ts(created + 5)}}}]})
        }
        _ => json!({"phase": "Pending", "qosClass": "Guaranteed",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": ts(created + 1),
                "message": "0/400 nodes are available: 400 Insufficient nvidia.com/gpu. preemption: 0/400 nodes are available: 400 No preemption victims found for incoming pod."}]}),
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})
}

fn uuid(node: u32, gpu: u32) -> String {
    format!(
        "GPU-{node:08x}-{gpu:04x}-4b7a-8e2f-{:012x}",
        u64::from(node) * 8 + u64::from(gpu)
    )
}

fn main() -> Result<()> {
    let a = args()?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let names: Vec<String> = (0..a.nodes).map(node_name).collect();
    let mut pods: Vec<PodSpec> = Vec::new();
    // device holder per (node, gpu)
    let mut holder: Vec<Vec<Option<usize>>> = vec![vec![None; GPUS as usize]; a.nodes as usize];
    for (n, name) in names.iter().enumerate() {
        // 4 + 2 + 1 (+ 1 free on every fifth node): ~97 % of cards claimed.
        let mut sizes = vec![4, 2, 1];
        if n % 5 != 0 {
            sizes.push(1);
        }
        let mut g = 0;
        for (k, size) in sizes.into_iter().enumerate() {
            let idx = pods.len();
            let notebook = size == 1 && k == 3 && n % 2 == 0;
            let state = if n % 17 == 0 && k == 2 {
                State::Terminating
            } else {
                State::Running
            };
            pods.push(PodSpec {
                ns: format!("team-{:02}", (n * 4 + k) % 40),
                name: if notebook {
                    format!("nb-{n:04}-0")
                } else {
                    format!("train-{n:04}-{k}")
                },
                node: Some(name),
                gpus: size,
                state,
                notebook,
            });
            for _ in 0..size {
                holder[n][g] = Some(idx);
                g += 1;
            }
        }
    }
    for i in 0..(a.nodes / 4) {
        pods.push(PodSpec {
            ns: format!("team-{:02}", i % 40),
            name: format!("queued-{i:04}"),
            node: None,
            gpus: 1 + i % 2,
            state: State::Pending,
            notebook: false,
        });
    }
    let mut extra = 0;
    while pods.len() < a.pods as usize {
        let n = extra % a.nodes as usize;
        pods.push(PodSpec {
            ns: format!("svc-{:02}", extra % 30),
            name: format!("web-{extra:05}"),
            node: Some(&names[n]),
            gpus: 0,
            state: State::Running,
            notebook: false,
        });
        extra += 1;
    }

    let list = |items: Vec<Value>| json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    let nodes_json = list((0..a.nodes).map(node).collect());
    let pods_json = list(pods.iter().enumerate().map(|(i, p)| pod(i, p)).collect());
    std::fs::write(
        a.dir.join("nodes.json"),
        serde_json::to_vec_pretty(&nodes_json)?,
    )?;
    std::fs::write(
        a.dir.join("pods.json"),
        serde_json::to_vec_pretty(&pods_json)?,
    )?;

    let fields: [(&str, &str); 6] = [
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ];
    let mut out = String::with_capacity(10 << 20);
    let _ = writeln!(
        out,
        "# Prometheus /federate dump of dcgm-exporter series (synthetic, testkit/examples/offline_dump.rs),\n# {} samples per series at 30s steps.",
        a.samples
    );
    for (f, (field, help)) in fields.iter().enumerate() {
        let _ = writeln!(out, "# HELP {field} {help}\n# TYPE {field} gauge");
        for n in 0..a.nodes {
            for g in 0..GPUS {
                let h = holder[n as usize][g as usize].map(|i| &pods[i]);
                let mut labels = format!(
                    "DCGM_FI_DRIVER_VERSION=\"580.95.05\",Hostname=\"{}\",UUID=\"{}\",container=\"nvidia-dcgm-exporter\",device=\"nvidia{g}\",",
                    names[n as usize],
                    uuid(n, g)
                );
                if let Some(p) = h {
                    let _ = write!(
                        labels,
                        "exported_container=\"main\",exported_namespace=\"{}\",exported_pod=\"{}\",",
                        p.ns, p.name
                    );
                }
                let _ = write!(
                    labels,
                    "gpu=\"{g}\",instance=\"10.0.{}.{}:9400\",job=\"gpu-metrics\",modelName=\"NVIDIA H100 80GB HBM3\",namespace=\"gpu-operator\",pci_bus_id=\"00000000:{:02X}:00.0\",pod=\"nvidia-dcgm-exporter-{n:05x}\"",
                    n / 256,
                    n % 256,
                    0x18 + g
                );
                // a third of the held cards idle, the rest busy
                let busy = h.is_some() && (n + g) % 3 != 0;
                for s in (0..a.samples).rev() {
                    let t = (NEWEST - i64::from(s) * 30) * 1000;
                    let v = match f {
                        0 if busy => "0.730000".to_string(),
                        0 => "0.000000".to_string(),
                        1 if busy => "73".to_string(),
                        1 => "0".to_string(),
                        2 => if h.is_some() { "20480" } else { "0" }.to_string(),
                        3 => "41".to_string(),
                        4 => "312.512000".to_string(),
                        _ => "1980".to_string(),
                    };
                    let _ = writeln!(out, "{field}{{{labels}}} {v} {t}");
                }
            }
        }
    }
    std::fs::write(a.dir.join("dcgm.prom"), &out)?;
    let gpu_pods = pods.iter().filter(|p| p.gpus > 0).count();
    eprintln!(
        "wrote {}: {} nodes x {GPUS} GPUs, {} pods ({gpu_pods} GPU), dcgm.prom {:.1} MB",
        a.dir.display(),
        a.nodes,
        pods.len(),
        out.len() as f64 / 1e6
    );
    Ok(())
}
