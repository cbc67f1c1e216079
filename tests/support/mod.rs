//! Shared helpers for the control-plane integration tests (tiers A and B).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_ledger_testkit::stack::{LEDGER_NAMESPACE, Stack};
use gpu_ledger_testkit::{ControlPlane, GpuNode, Tier, TierBOptions};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

/// The RBAC gpu-ledger ships (deploy/kustomize), so tests prove it is enough, not a test-only one.
pub const READ_ONLY_RBAC: &str = include_str!("../../deploy/kustomize/base/rbac.yaml");
pub const CULLING_RBAC: &str =
    include_str!("../../deploy/kustomize/overlays/culling/culling-rbac.yaml");

/// What the token user `gpu-ledger` may do on a [`tier_b`] stack: the shipped read-only RBAC,
/// and culling's on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grants {
    ReadOnly,
    Culling,
}

/// The `gpu-ledger` binary as a command whose environment cannot configure it: every
/// `GPU_LEDGER_*` variable of the test's own environment removed.
pub fn gpu_ledger_command() -> std::process::Command {
    gpu_ledger_testkit::process::isolated_command(env!("CARGO_BIN_EXE_gpu-ledger"))
}

/// testkit's tier-B [`Stack`] with `nodes`, the shipped RBAC granted to the token user
/// `gpu-ledger` as `grants` says: the set-up the tier-B tests share.
pub async fn tier_b(nodes: &[GpuNode], grants: Grants) -> Stack {
    tier_b_with(nodes, TierBOptions::default(), grants).await
}

/// [`tier_b`] with tier-B options (an audit log, extra controllers, kwok configs).
pub async fn tier_b_with(nodes: &[GpuNode], options: TierBOptions, grants: Grants) -> Stack {
    let stack = Stack::start_with(nodes, options)
        .await
        .expect("stack (run scripts/build-test-cluster.sh if binaries are missing)");
    stack
        .grant_rbac(READ_ONLY_RBAC, "gpu-ledger")
        .await
        .expect("read-only RBAC");
    if grants == Grants::Culling {
        stack
            .grant_rbac(CULLING_RBAC, "gpu-ledger")
            .await
            .expect("culling RBAC");
    }
    stack
}

/// testkit's tier-A control plane (etcd + kube-apiserver, RBAC on, token users) and its admin
/// client: the set-up every tier-A test starts with.
pub async fn tier_a() -> (ControlPlane, kube::Client) {
    let cp = ControlPlane::start(Tier::A)
        .await
        .expect("tier A control plane (run scripts/build-test-cluster.sh if binaries are missing)");
    let admin = cp.client("admin").await.expect("admin client");
    (cp, admin)
}

/// [`tier_a`] with the shipped read-only RBAC granted to the token user `gpu-ledger` and
/// namespace `ns` created: the set-up of the tier-A watch tests.
pub async fn tier_a_watching(ns: &str) -> (ControlPlane, kube::Client) {
    let (cp, admin) = tier_a().await;
    grant_shipped_read_only(&admin).await;
    namespace(&admin, ns, &[]).await;
    (cp, admin)
}

/// The annotations of Notebook `ns/name` (empty when it has none), or the API's error.
pub async fn try_notebook_annotations(
    admin: &kube::Client,
    ns: &str,
    name: &str,
) -> kube::Result<BTreeMap<String, String>> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &gpu_ledger_testkit::stack::notebook_resource(),
    );
    Ok(api
        .get(name)
        .await?
        .metadata
        .annotations
        .unwrap_or_default())
}

/// The annotations of Notebook `ns/name` (empty when it has none); the test fails when the
/// Notebook cannot be read.
pub async fn notebook_annotations(
    admin: &kube::Client,
    ns: &str,
    name: &str,
) -> BTreeMap<String, String> {
    try_notebook_annotations(admin, ns, name)
        .await
        .unwrap_or_else(|e| panic!("get notebook {ns}/{name}: {e}"))
}

/// Whether Notebook `ns/name` carries Kubeflow's stop annotation (`kubeflow-resource-stopped`).
pub async fn notebook_stopped(admin: &kube::Client, ns: &str, name: &str) -> bool {
    notebook_annotations(admin, ns, name)
        .await
        .contains_key(gpu_ledger_testkit::stack::STOP_ANNOTATION)
}

/// Binds the shipped read-only ClusterRole to the token user `gpu-ledger`.
pub async fn grant_shipped_read_only(admin: &kube::Client) {
    gpu_ledger_testkit::stack::apply_rbac(admin, READ_ONLY_RBAC, "gpu-ledger", LEDGER_NAMESPACE)
        .await
        .expect("shipped read-only RBAC");
}

pub async fn namespace(admin: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let ns: Api<Namespace> = Api::all(admin.clone());
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let obj: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("ns");
    ns.create(&PostParams::default(), &obj)
        .await
        .expect("create namespace");
}

/// testkit's GPU pod (`gpus` × `nvidia.com/gpu`); `node` binds it directly (no scheduler needed).
pub fn gpu_pod(name: &str, gpus: u32, node: Option<&str>) -> Pod {
    let mut pod = gpu_ledger_testkit::stack::gpu_pod(name, gpus, None);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = node.map(Into::into);
    }
    pod
}

/// `p` with a node selector for `node` alone: the scheduler still decides, on that node only
/// (with DRAExtendedResource a `nvidia.com/gpu` request may otherwise land on a DRA node).
pub fn pinned(mut p: Pod, node: &str) -> Pod {
    if let Some(spec) = p.spec.as_mut() {
        spec.node_selector = Some(BTreeMap::from([(
            "kubernetes.io/hostname".to_string(),
            node.to_string(),
        )]));
    }
    p
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The bundled homelab example (`examples/homelab`).
pub fn homelab() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/homelab")
}

/// A copy of the homelab dumps in a temp dir, to replace or change one file.
pub fn homelab_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    for f in std::fs::read_dir(homelab()).expect("homelab") {
        let f = f.expect("entry").path();
        let name = f.file_name().expect("name").to_owned();
        if f.extension().is_some_and(|x| x == "json") || name == "dcgm.prom" {
            std::fs::copy(&f, dir.path().join(&name)).expect("copy");
        }
    }
    dir
}

/// `gpu-ledger report --from DIR -o json EXTRA…`, with the dump size limit at its default.
pub fn report_json(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "--from"])
        .arg(dir)
        .args(["-o", "json"])
        .args(extra)
        .env_remove("GPU_LEDGER_MAX_DUMP_SIZE")
        .output()
        .expect("run gpu-ledger")
}

/// `kubectl describe notebook`'s Events section (type, reason, age, from, message lines): the
/// story a notebook's owner reads.
pub fn described_events(stack: &gpu_ledger_testkit::stack::Stack, ns: &str, nb: &str) -> String {
    let out = stack
        .cp
        .kubectl("admin")
        .expect("kubectl")
        .args(["describe", "notebook", "-n", ns, nb])
        .output()
        .expect("run kubectl describe");
    assert!(out.status.success(), "kubectl describe: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_once("\nEvents:")
        .map(|(_, events)| events.to_string())
        .unwrap_or_default()
}

/// Whether a described Events section has a line of this type and reason.
pub fn has_event_line(events: &str, kind: &str, reason: &str) -> bool {
    events.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(kind) && words.next() == Some(reason)
    })
}

/// The notebook's owner snoozes it for an hour (`gpu-ledger.io/snooze-until`, as the notice's
/// suggested `kubectl annotate` does); returns the annotation's value.
pub async fn snooze_for_an_hour(admin: &kube::Client, ns: &str, nb: &str) -> String {
    let until = (chrono::Utc::now() + chrono::Duration::hours(1))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    annotate_notebook(admin, ns, nb, "gpu-ledger.io/snooze-until", &until).await;
    until
}

/// Sets one annotation of Notebook `ns/nb` (a merge patch, as `kubectl annotate --overwrite`).
pub async fn annotate_notebook(admin: &kube::Client, ns: &str, nb: &str, key: &str, value: &str) {
    let notebooks: Api<kube::api::DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &gpu_ledger_testkit::stack::notebook_resource(),
    );
    notebooks
        .patch(
            nb,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate notebook {ns}/{nb} {key}={value}: {e}"));
}

/// Waits until `kubectl describe notebook` tells a notice's story — the Warning
/// `GpuIdleStopScheduled`, then the Normal `ending` (`IdleGPUStopped` or `GpuIdleStopCancelled`)
/// — and checks the Normal `never` is not in it.
pub async fn assert_notice_story(
    stack: &gpu_ledger_testkit::stack::Stack,
    ns: &str,
    nb: &str,
    ending: &str,
    never: &str,
) {
    let story = eventually(
        &format!("{nb}'s story in kubectl describe"),
        Duration::from_secs(120),
        || async {
            let e = described_events(stack, ns, nb);
            (has_event_line(&e, "Warning", "GpuIdleStopScheduled")
                && has_event_line(&e, "Normal", ending))
            .then_some(e)
        },
    )
    .await;
    assert!(!has_event_line(&story, "Normal", never), "{story}");
}

/// Kueue's kinds gpu-ledger reads, as their CRD manifest files name them.
pub const KUEUE_CRDS: [&str; 4] = [
    "resourceflavors",
    "clusterqueues",
    "localqueues",
    "workloads",
];

/// Installs Kueue's own CRD manifests of [`KUEUE_CRDS`] (from its Go module, v0.17.0: the
/// directory `scripts/build-kueue.sh --print-crds` names) with `kubectl apply --server-side`
/// (the Workload CRD is too large for client-side apply's annotation), and waits until they are
/// Established. Fails loudly when the module cannot be had.
pub fn install_kueue_crds(cp: &gpu_ledger_testkit::ControlPlane) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/build-kueue.sh"))
        .arg("--print-crds")
        .output()
        .expect("run scripts/build-kueue.sh --print-crds");
    assert!(
        out.status.success(),
        "scripts/build-kueue.sh --print-crds failed (the Kueue Go module is needed):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut apply = cp.kubectl("admin").expect("kubectl");
    apply.args(["apply", "--server-side"]);
    for plural in KUEUE_CRDS {
        apply
            .arg("-f")
            .arg(dir.join(format!("kueue.x-k8s.io_{plural}.yaml")));
    }
    gpu_ledger_testkit::process::run_ok(apply, None).expect("apply Kueue's CRDs");
    // `kubectl wait` errors out while a fresh CRD has no conditions yet: retry for a minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut wait = cp.kubectl("admin").expect("kubectl");
        wait.args(["wait", "--for=condition=Established", "--timeout=10s"]);
        for plural in KUEUE_CRDS {
            wait.arg(format!("crd/{plural}.kueue.x-k8s.io"));
        }
        match gpu_ledger_testkit::process::run_ok(wait, None) {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("Kueue's CRDs not Established within a minute: {e:#}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// `gpu-ledger report -o json` live and from a `capture` of the same instant (3 s ago, so the
/// Prometheus samples then are complete), both as the token user `gpu-ledger` with one-second
/// timings; the capture directory comes back too, for a look at the files.
pub fn live_and_offline(
    stack: &Stack,
) -> (serde_json::Value, serde_json::Value, tempfile::TempDir) {
    live_and_offline_from(&stack.cp, stack.prometheus.url())
}

/// [`live_and_offline`] against control plane `cp` and the Prometheus at `prom` (a tier-A
/// control plane with a Prometheus of the test's own).
pub fn live_and_offline_from(
    cp: &gpu_ledger_testkit::ControlPlane,
    prom: &str,
) -> (serde_json::Value, serde_json::Value, tempfile::TempDir) {
    let bin = env!("CARGO_BIN_EXE_gpu-ledger");
    let kubeconfig = cp.kubeconfig_path("gpu-ledger").expect("kubeconfig");
    let at = (chrono::Utc::now() - chrono::Duration::seconds(3))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let timings = [
        "--scrape-interval",
        "1s",
        "--window",
        "10s",
        "--max-staleness",
        "5s",
    ];
    let run = |args: &[std::ffi::OsString], what: &str| -> std::process::Output {
        let mut c = gpu_ledger_testkit::process::isolated_command(bin);
        let out = c
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {what}: {e}"));
        assert!(
            out.status.success(),
            "{what}: exit {:?}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let json = |out: std::process::Output, what: &str| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what} JSON: {e}"))
    };
    let os = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };
    let dir = tempfile::tempdir().expect("tmp");
    let mut capture = os(&["capture", "--out"]);
    capture.push(dir.path().into());
    capture.push("--kubeconfig".into());
    capture.push(kubeconfig.clone().into());
    capture.extend(os(&["--prometheus-url", prom, "--at", &at]));
    run(&capture, "capture");
    let mut offline = os(&["report", "--from"]);
    offline.push(dir.path().into());
    offline.extend(os(&timings));
    offline.extend(os(&["--at", &at, "-o", "json"]));
    let offline = json(run(&offline, "offline report"), "offline report");
    let mut live = os(&["report", "--kubeconfig"]);
    live.push(kubeconfig.into());
    live.extend(os(&["--prometheus-url", prom]));
    live.extend(os(&timings));
    live.extend(os(&["--at", &at, "-o", "json"]));
    let live = json(run(&live, "live report"), "live report");
    (live, offline, dir)
}

// --- Kubeflow Notebooks 2.0 Workspaces (tests/fixtures/workspace) ---

pub const WORKSPACE_FIXTURES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/workspace");

pub fn workspace_api() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kubeflow.org", "v1beta1", "Workspace"),
        "workspaces",
    )
}

/// Creates Workspace `ns/name` (WorkspaceKind `jupyterlab`, podConfig `pod_config`) and the
/// StatefulSet its controller would create for it (`workspace_controller.go`: `generateName`
/// from the Workspace's name, controller ownerReference, labels
/// `notebooks.kubeflow.org/workspace-name` and `statefulset`, one replica, container `main`),
/// its pod pinned to `node` with an idle GPU. Its status is written as the controller's would
/// be while running, with a `lastActivity` in seconds as the published CRD's example.
pub async fn create_workspace(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    pod_config: &str,
    node: &str,
) {
    gpu_ledger_testkit::stack::ensure_namespace(admin, ns)
        .await
        .expect("namespace");
    let workspaces: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), ns, &workspace_api());
    let mut ws = kube::api::DynamicObject::new(name, &workspace_api());
    ws.data = serde_json::json!({"spec": {"kind": "jupyterlab", "paused": false,
        "podTemplate": {"options": {"imageConfig": "jupyterlab_scipy_190", "podConfig": pod_config},
            "volumes": {"home": "home-pvc"}}}});
    let ws = workspaces
        .create(&PostParams::default(), &ws)
        .await
        .expect("workspace");
    let status = serde_json::json!({"status": {
        "activity": {"lastActivity": 1_704_067_200_i64, "lastUpdate": 1_704_067_200_i64},
        "pauseTime": 0, "pendingRestart": false, "state": "Running", "stateMessage": "",
        "podTemplateOptions": {"imageConfig": {"desired": "jupyterlab_scipy_190"},
            "podConfig": {"desired": pod_config}}}});
    workspaces
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(status),
        )
        .await
        .expect("workspace status");
    let labels = serde_json::json!({
        "notebooks.kubeflow.org/workspace-name": name, "statefulset": name});
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": format!("{name}-"), "namespace": ns,
            "labels": {"notebooks.kubeflow.org/workspace-name": name},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
                "name": name, "uid": ws.metadata.uid, "controller": true,
                "blockOwnerDeletion": true}]},
        "spec": {"replicas": 1, "serviceName": "",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    gpu_ledger_testkit::dcgm::UTILIZATION_ANNOTATION: "0"}},
                "spec": {"containers": [{"name": "main",
                    "image": "ghcr.io/kubeflow/kubeflow/notebook-servers/jupyter-scipy:v1.9.0",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 1}}}
    }))
    .expect("statefulset JSON");
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await
        .expect("workspace statefulset");
}

/// Installs the Workspace CRD as published and the trimmed WorkspaceKind CRD
/// (tests/fixtures/workspace/README.md).
pub async fn install_workspace_crds(cp: &ControlPlane) {
    for file in [
        "kubeflow.org_workspaces.yaml",
        "kubeflow.org_workspacekinds.trimmed.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{WORKSPACE_FIXTURES}/{file}")).expect(file);
        let crd = serde_norway::from_str(&text).expect(file);
        cp.install_crd(&crd).await.expect(file);
    }
}

/// WorkspaceKind `jupyterlab`: podConfig options `big_gpu` (spawner label `gpu=big`) and
/// `exempt_gpu` (`gpu=exempt`); its first `activityRules` entry exempts `gpu=exempt`
/// (`pauseWorkspace: false`), a catch-all after it pauses.
pub async fn create_workspace_kind(admin: &kube::Client) {
    let kinds: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("kubeflow.org", "v1beta1", "WorkspaceKind"),
            "workspacekinds",
        ),
    );
    let kind: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "kubeflow.org/v1beta1", "kind": "WorkspaceKind",
        "metadata": {"name": "jupyterlab"},
        "spec": {
            "activityRules": [
                {"match": {"matchPodConfig": {"selector": {"matchLabels": {"gpu": "exempt"}}}},
                 "config": {"secondsSinceActive": 3600},
                 "effect": {"pauseWorkspace": false}},
                {"config": {"secondsSinceActive": 3600}, "effect": {"pauseWorkspace": true}}
            ],
            "podTemplate": {
                "activityProbe": {"jupyter": {"portId": "jupyterlab", "lastActivity": true}},
                "options": {"podConfig": {"default": "big_gpu", "values": [
                    {"id": "big_gpu", "spawner": {"displayName": "1 GPU",
                        "labels": [{"key": "gpu", "value": "big"}]}},
                    {"id": "exempt_gpu", "spawner": {"displayName": "1 GPU, never paused",
                        "labels": [{"key": "gpu", "value": "exempt"}]}}
                ]}}}
        }
    }))
    .expect("workspacekind");
    kinds
        .create(&PostParams::default(), &kind)
        .await
        .expect("create workspacekind");
}
