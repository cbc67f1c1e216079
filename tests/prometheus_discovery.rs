//! `report` with only a kubeconfig (issue 23): no `--prometheus-url`, so gpu-ledger finds the
//! cluster's Prometheus among the well-known Services and queries it through kube-apiserver's
//! service proxy. Real kube-apiserver (testkit tier A) and a real Prometheus scraping a replayed
//! dcgm-exporter page.
//!
//! The apiserver refuses to proxy to loopback and link-local endpoints, and to an address that
//! is not the IP of the Pod its `targetRef` names. So Prometheus listens on this machine's own
//! (non-loopback) address, a Prometheus Pod's status carries that address, and the Service is
//! selector-less with Endpoints and an EndpointSlice pointing at that Pod — as the Prometheus
//! Operator's `prometheus-operated` Service (port `web`) looks once its endpoints are filled
//! in (no endpoints controller runs in tier A).
//!
//! * `report_finds_prometheus_through_the_service_proxy`: with no such Service in the searched
//!   namespaces the report exits 1 naming what it tried and where; with `prometheus-operated`
//!   in `monitoring` it says which Service it uses on stderr and the pod's utilisation comes
//!   through the proxy; `--prometheus-service` and `--prometheus-namespace` choose explicitly;
//!   `--prometheus-url` overrides discovery.
//! * Issue 36 item 9: decoys any tenant can create — `prometheus-operated` in a namespace that
//!   sorts before `monitoring`, and a Service labelled `operated-prometheus=true` — are never
//!   chosen: discovery searches only a documented allow-list of namespaces (or the ones named).

mod support;

use std::net::UdpSocket;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use gpu_ledger_testkit::dcgm::{device_uuid, scrape_config};
use gpu_ledger_testkit::{ControlPlane, Prometheus, ReplayExporter};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{eventually, gpu_pod, namespace};

const NODE: &str = "disc-gpu-a";
const POD_NS: &str = "disc-ml";
const POD: &str = "train-0";
/// Allow-listed for discovery (the namespace kube-prometheus and most installs use).
const PROM_NS: &str = "monitoring";
/// A tenant's namespace, sorting before `monitoring`.
const DECOY_NS: &str = "a-tenant";

/// This machine's address on its default route (no packet is sent: a UDP "connect" only picks
/// the source address).
fn own_address() -> String {
    let socket = UdpSocket::bind("0.0.0.0:0").expect("udp socket");
    socket
        .connect("192.0.2.1:9")
        .or_else(|_| socket.connect("10.255.255.1:9"))
        .expect("a route off this machine: the test needs a non-loopback address");
    let ip = socket.local_addr().expect("local address").ip();
    assert!(
        !ip.is_loopback() && !ip.is_unspecified(),
        "no non-loopback address ({ip}): kube-apiserver will not proxy to loopback"
    );
    ip.to_string()
}

/// One dcgm-exporter 4.x page for the pod's GPU, in dcgm-exporter's label order (as the fake
/// exporter in testkit/src/dcgm.rs writes it): 42 % busy.
fn dcgm_page() -> String {
    let uuid = device_uuid(NODE, 0);
    let labels = format!(
        "gpu=\"0\",UUID=\"{uuid}\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",\
         modelName=\"NVIDIA A100-SXM4-40GB\",Hostname=\"{NODE}\",container=\"main\",\
         namespace=\"{POD_NS}\",pod=\"{POD}\""
    );
    format!(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
         DCGM_FI_DEV_GPU_UTIL{{{labels}}} 42\n\
         # HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n\
         # TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n\
         DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.420000\n"
    )
}

fn report(kubeconfig: &Path, extra: &[&str]) -> Output {
    let mut cmd = support::gpu_ledger_command();
    cmd.arg("report")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-o", "json", "--scrape-interval", "1s"])
        .args(extra)
        .output()
        .expect("run gpu-ledger report")
}

/// The pod's row of a report's JSON.
fn pod_row(out: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON on stdout ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pod"] == POD).cloned())
        .unwrap_or_else(|| panic!("no {POD} in {v}"))
}

/// The Prometheus Operator's governing Service `PROM_NS/prometheus-operated`, selector-less,
/// with its endpoints at `host:port`.
async fn expose_prometheus(admin: &kube::Client, host: &str, port: i32) {
    // The Prometheus Operator's governing Service, selector-less, with its endpoints.
    namespace(admin, PROM_NS, &[]).await;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-operated", "labels": {"operated-prometheus": "true"}},
        "spec": {"clusterIP": "None", "ports": [{"name": "web", "port": 9090, "targetPort": port}]}
    }))
    .expect("service");
    Api::<Service>::namespaced(admin.clone(), PROM_NS)
        .create(&PostParams::default(), &service)
        .await
        .expect("create service");
    // The apiserver proxies only to an endpoint address that is the IP of the Pod its
    // `targetRef` names (kubernetes pkg/registry/core/service/storage, `isValidAddress`), so
    // the Prometheus pod is there, its status reporting this machine's address (no kubelet runs
    // in tier A to overwrite it), as the operator's StatefulSet pod would be.
    let pods = Api::<Pod>::namespaced(admin.clone(), PROM_NS);
    let prom_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-k8s-0", "labels": {"app.kubernetes.io/name": "prometheus"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "prometheus",
            "image": "quay.io/prometheus/prometheus:v3.5.0"}]}
    }))
    .expect("prometheus pod");
    pods.create(&PostParams::default(), &prom_pod)
        .await
        .expect("create prometheus pod");
    pods.patch_status(
        "prometheus-k8s-0",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "podIP": host, "podIPs": [{"ip": host}]}}),
        ),
    )
    .await
    .expect("prometheus pod status");
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-operated"},
        "subsets": [{"addresses": [{"ip": host, "targetRef":
            {"kind": "Pod", "namespace": PROM_NS, "name": "prometheus-k8s-0"}}],
            "ports": [{"name": "web", "port": port}]}]
    }))
    .expect("endpoints");
    Api::<Endpoints>::namespaced(admin.clone(), PROM_NS)
        .create(&PostParams::default(), &endpoints)
        .await
        .expect("create endpoints");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-operated-1",
            "labels": {"kubernetes.io/service-name": "prometheus-operated"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": true}, "targetRef":
            {"kind": "Pod", "namespace": PROM_NS, "name": "prometheus-k8s-0"}}],
        "ports": [{"name": "web", "port": port, "protocol": "TCP"}]
    }))
    .expect("endpointslice");
    Api::<EndpointSlice>::namespaced(admin.clone(), PROM_NS)
        .create(&PostParams::default(), &slice)
        .await
        .expect("create endpointslice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_finds_prometheus_through_the_service_proxy() {
    let cp = ControlPlane::shared(false).expect("shared tier A control plane");
    let admin = cp.client("admin").await.expect("admin client");
    let kubeconfig = cp.kubeconfig_path("admin").expect("kubeconfig");

    // The claims: one GPU node, one pod bound to it.
    cp.add_gpu_node(NODE, 1, &[]).await.expect("node");
    namespace(&admin, POD_NS, &[]).await;
    Api::<Pod>::namespaced(admin.clone(), POD_NS)
        .create(&PostParams::default(), &gpu_pod(POD, 1, Some(NODE)))
        .await
        .expect("pod");

    // A tenant's decoys: the Prometheus Operator's Service name in a namespace sorting before
    // `monitoring`, and its label on a Service of any name. Neither may ever be chosen.
    namespace(&admin, DECOY_NS, &[]).await;
    let decoys = Api::<Service>::namespaced(admin.clone(), DECOY_NS);
    for (name, labels) in [
        ("prometheus-operated", json!({})),
        ("metrics", json!({"operated-prometheus": "true"})),
    ] {
        let decoy: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"ports": [{"name": "web", "port": 9090}]}
        }))
        .expect("decoy service");
        decoys
            .create(&PostParams::default(), &decoy)
            .await
            .expect("create decoy service");
    }

    // Nothing that looks like Prometheus where discovery looks: a clear error naming what was
    // tried and where.
    let out = report(&kubeconfig, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for tried in [
        "prometheus-operated",
        "-kube-prometheus-prometheus",
        "prometheus-server",
        "app.kubernetes.io/name=prometheus",
        "namespaces monitoring",
        "--prometheus-service",
        "--prometheus-url",
    ] {
        assert!(err.contains(tried), "{tried} not named in: {err}");
    }
    assert!(
        !err.contains(&format!("using Prometheus {DECOY_NS}/")),
        "a tenant's Service was chosen: {err}"
    );

    // A real Prometheus on this machine's address, scraping the replayed exporter every second.
    let exporter = ReplayExporter::start(dcgm_page()).await.expect("exporter");
    let host = own_address();
    let prometheus = Prometheus::start_on(&host, &scrape_config(&exporter.target(), "1s"))
        .await
        .expect("prometheus");
    let port: i32 = prometheus
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let query = format!(
        "{}/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL",
        prometheus.url()
    );
    eventually(
        "Prometheus has scraped the exporter",
        Duration::from_secs(60),
        || {
            let query = query.clone();
            async move {
                let v: serde_json::Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
                (!v["data"]["result"].as_array()?.is_empty()).then_some(())
            }
        },
    )
    .await;

    expose_prometheus(&admin, &host, port).await;

    let out = report(&kubeconfig, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "using Prometheus {PROM_NS}/prometheus-operated port web"
        )),
        "{err}"
    );
    assert!(!err.contains("did not answer"), "{err}");
    assert!(!err.contains(DECOY_NS), "a tenant's Service named: {err}");
    let row = pod_row(&out);
    let util = row["utilization"]
        .as_f64()
        .unwrap_or_else(|| panic!("{row}"));
    assert!((util - 0.42).abs() < 1e-6, "{row}");

    // Named explicitly: the Service (its Prometheus port looked up), nothing searched.
    let named = format!("{PROM_NS}/prometheus-operated");
    let out = report(&kubeconfig, &["--prometheus-service", &named]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "using Prometheus {named} port web (named by --prometheus-service)"
        )),
        "{err}"
    );
    assert!((pod_row(&out)["utilization"].as_f64().unwrap_or(-1.0) - 0.42).abs() < 1e-6);
    // The namespaces searched are the user's to choose, the tenant's included (both decoys
    // match as the Prometheus Operator's Service there; by name, `metrics` first).
    let out = report(&kubeconfig, &["--prometheus-namespace", DECOY_NS]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "using Prometheus {DECOY_NS}/metrics port web (Prometheus Operator's \
             prometheus-operated Service) through the API server's service proxy (also found: \
             {DECOY_NS}/prometheus-operated"
        )),
        "{err}"
    );

    // --prometheus-url overrides discovery: nothing is looked up, the given server is used.
    let out = report(&kubeconfig, &["--prometheus-url", prometheus.url()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("using Prometheus"), "{err}");
    assert!(pod_row(&out)["utilization"].as_f64().is_some());
}
