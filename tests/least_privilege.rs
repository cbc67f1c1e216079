//! Least privilege on a REAL kube-apiserver, as the chart's ServiceAccount (a TokenRequest
//! token, `kubectl create token`), not an impersonated or rebound user:
//!
//! * `shipped_rbac_is_exactly_what_the_binary_uses` (tier B stack: kwok nodes, the fake
//!   dcgm-exporter test double scraped by a real Prometheus, kube-apiserver restarted with an
//!   audit log): the real `gpu-ledger serve` runs with the chart's RBAC for
//!   `ledger.namespaces`, culling and the namespace selector, first in dry-run, then on. Every
//!   (group, resource, verb) the chart grants appears in the audit log as an allowed request of
//!   the ServiceAccount, and none of its requests was forbidden: the RBAC is enough and holds
//!   nothing unused. (Removed verbs are denied: the `kubectl auth can-i` matrices in
//!   `tests/deploy_chart.rs`.)
//! * `notebook_policy_allows_only_the_stop_annotations` (tier A; 1.36 enables the
//!   ValidatingAdmissionPolicy plugin and `admissionregistration.k8s.io/v1` by default): with the
//!   chart's policy the ServiceAccount's stop patch (`cull::actuator::stop_patch`, sent as the
//!   actuator sends it) passes; a spec, label, finalizer or foreign-annotation change, and
//!   removing or changing `kubeflow-resource-stopped`, are denied. The notice before a stop
//!   (`cull::actuator::notice_patch`: written, then removed) passes too. The same writes succeed before
//!   the policy exists (RBAC's `notebooks: patch` allows them), and other users are not limited.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gpu_ledger::cull::actuator::{notice_patch, stop_patch};
use gpu_ledger::cull::plan::{Action, CancelReason};
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::process::run_ok;
use gpu_ledger_testkit::stack::{
    LEDGER_NAMESPACE, Notebook, STOP_ANNOTATION, Stack, notebook_resource,
};
use gpu_ledger_testkit::{ControlPlane, GpuNode};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize as _;
use serde_json::{Value, json};

const CHART: &str = "deploy/helm/gpu-ledger";
/// The chart's ServiceAccount for release `gpu-ledger` in [`LEDGER_NAMESPACE`].
const SA: &str = "gpu-ledger";
const POLICY: &str = "gpu-ledger-notebook-stop-only";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin(name: &str) -> PathBuf {
    gpu_ledger_testkit::binary(name)
        .unwrap_or_else(|e| panic!("{e:#}\n(build it with scripts/build-test-cluster.sh)"))
}

/// `helm template gpu-ledger` into [`LEDGER_NAMESPACE`] for Kubernetes 1.36, as JSON objects.
fn chart(sets: &[&str]) -> Result<Vec<Value>> {
    chart_serving(sets, &[])
}

/// [`chart`] for a cluster that serves `api_versions` (`--api-versions`).
fn chart_serving(sets: &[&str], api_versions: &[&str]) -> Result<Vec<Value>> {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("least-privilege-helm-home");
    let mut c = Command::new(bin("helm"));
    c.current_dir(root())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .args([
            "template",
            "gpu-ledger",
            CHART,
            "--namespace",
            LEDGER_NAMESPACE,
        ])
        .args(["--kube-version", "v1.36.3"]);
    for v in api_versions {
        c.args(["--api-versions", v]);
    }
    for s in sets {
        c.args(["--set", s]);
    }
    let yaml = run_ok(c, None)?;
    let mut out = Vec::new();
    for d in serde_norway::Deserializer::from_str(&yaml) {
        let v = Value::deserialize(d).context("rendered YAML")?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn of_kinds(objs: &[Value], kinds: &[&str]) -> Vec<Value> {
    objs.iter()
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
        .cloned()
        .collect()
}

/// Server-side apply of `objs` as admin.
fn apply(cp: &ControlPlane, objs: &[Value]) -> Result<()> {
    let mut c = cp.kubectl("admin")?;
    c.args([
        "apply",
        "--server-side",
        "--field-manager=least-privilege-test",
        "-f",
        "-",
    ]);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objs});
    run_ok(c, Some(&list.to_string()))?;
    Ok(())
}

fn namespace(cp: &ControlPlane, name: &str) -> Result<()> {
    apply(
        cp,
        &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})],
    )
}

/// A kubeconfig authenticating as the chart's ServiceAccount with a fresh TokenRequest token.
fn service_account_kubeconfig(cp: &ControlPlane) -> Result<PathBuf> {
    let mut c = cp.kubectl("admin")?;
    c.args([
        "create",
        "token",
        SA,
        "-n",
        LEDGER_NAMESPACE,
        "--duration=1h",
    ]);
    let token = run_ok(c, None)?.trim().to_string();
    ensure!(!token.is_empty(), "empty token");
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testkit", "cluster": {
            "server": cp.server_url(),
            "certificate-authority": cp.ca_path(),
        }}],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": SA, "context": {"cluster": "testkit", "user": SA}}],
        "current-context": SA,
    });
    let path = cp.dir().join("kubeconfig-serviceaccount.yaml");
    std::fs::write(&path, kc.to_string())?;
    Ok(path)
}

async fn client_from(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// --------------------------------------------------------------------------------------------
// The admission policy
// --------------------------------------------------------------------------------------------

fn notebooks(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &notebook_resource())
}

/// Creates Notebook `ns/name` (as admin) with a foreign annotation and a label.
async fn create_notebook(admin: &kube::Client, ns: &str, name: &str) -> Result<DynamicObject> {
    let mut nb = DynamicObject::new(name, &notebook_resource());
    nb.metadata.annotations = Some(BTreeMap::from([("owner-note".into(), "keep".into())]));
    nb.metadata.labels = Some(BTreeMap::from([("app".into(), name.into())]));
    nb.data = json!({"spec": {"template": {"spec": {"containers": [{
        "name": name, "image": "kubeflownotebookswg/jupyter-pytorch-cuda:v1.9.0"}]}}}});
    Ok(notebooks(admin, ns)
        .create(&PostParams::default(), &nb)
        .await?)
}

/// gpu-ledger's stop of `nb` (pod `nb-0`, idle 2h), as the plan would hand it to the actuator.
fn the_stop(nb: &DynamicObject) -> Action {
    Action::notebook_stop(
        nb.metadata.namespace.clone().unwrap_or_default(),
        nb.metadata.name.clone().unwrap_or_default(),
    )
    .with_uid(nb.metadata.uid.clone().unwrap_or_default())
    .at_version(nb.metadata.resource_version.clone().unwrap_or_default())
    .of_pod("nb-0", "uid")
    .idle_for(7200.0, Some(0.0))
    .stopping_at("2026-12-01T09:00:00Z")
}

/// gpu-ledger's own stop patch for `nb`, as `cull::actuator` builds it.
fn the_stop_patch(nb: &DynamicObject) -> Value {
    stop_patch(
        &the_stop(nb),
        nb.metadata.resource_version.as_deref().unwrap_or_default(),
    )
}

/// gpu-ledger's notice patches for `nb` (schedule, then cancel) pass the policy; returns the
/// Notebook as it is afterwards (its new resourceVersion).
async fn the_notices_pass(
    admin: &kube::Client,
    sa: &Api<DynamicObject>,
    nb: &DynamicObject,
) -> Result<DynamicObject> {
    let name = nb.metadata.name.clone().unwrap_or_default();
    let stop_at = chrono::DateTime::parse_from_rfc3339("2026-12-01T09:10:00Z")?.to_utc();
    let schedule = the_stop(nb).notice(stop_at);
    let cancel = the_stop(nb).notice_cancelled(stop_at, CancelReason::Activity);
    let ns = nb.metadata.namespace.clone().unwrap_or_default();
    for notice in [schedule, cancel] {
        let fresh = notebooks(admin, &ns).get(&name).await?;
        let rv = fresh.metadata.resource_version.clone().unwrap_or_default();
        merge_patch(sa, &name, &notice_patch(&notice, &rv))
            .await
            .with_context(|| {
                format!("gpu-ledger's {} notice must pass the policy", notice.kind())
            })?;
        let after = notebooks(admin, &ns).get(&name).await?;
        let ann = after.metadata.annotations.unwrap_or_default();
        ensure!(
            ann.contains_key("gpu-ledger.io/stop-scheduled-at") == (notice.kind() == "schedule"),
            "{} notice: {ann:?}",
            notice.kind()
        );
    }
    Ok(notebooks(admin, &ns).get(&name).await?)
}

/// A JSON merge patch as the actuator sends it (field manager gpu-ledger).
async fn merge_patch(
    api: &Api<DynamicObject>,
    name: &str,
    body: &Value,
) -> Result<(), kube::Error> {
    let pp = PatchParams {
        field_manager: Some("gpu-ledger".into()),
        ..PatchParams::default()
    };
    api.patch(name, &pp, &Patch::Merge(body)).await.map(|_| ())
}

/// The writes `notebooks: patch` allows that gpu-ledger never makes, with the policy message
/// that must deny each.
fn forbidden_changes() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "spec",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "x",
                "image": "attacker.example/miner:latest"}]}}}}),
            "may not change a Notebook's spec",
        ),
        (
            "label",
            json!({"metadata": {"labels": {"app": "hijacked"}}}),
            "may not change a Notebook's labels",
        ),
        (
            "new label",
            json!({"metadata": {"labels": {"extra": "x"}}}),
            "may not change a Notebook's labels",
        ),
        (
            "finalizer",
            json!({"metadata": {"finalizers": ["attacker.example/hold"]}}),
            "finalizers",
        ),
        (
            "other annotation",
            json!({"metadata": {"annotations": {"notebooks.kubeflow.org/http-rewrite-uri": "/evil"}}}),
            "may only write the annotations",
        ),
        (
            "foreign annotation changed",
            json!({"metadata": {"annotations": {"owner-note": "changed"}}}),
            "may only write the annotations",
        ),
        (
            "foreign annotation removed",
            json!({"metadata": {"annotations": {"owner-note": null}}}),
            "may only write the annotations",
        ),
    ]
}

fn assert_denied(result: Result<(), kube::Error>, what: &str, message: &str) {
    match result {
        Err(kube::Error::Api(s)) => {
            assert!(
                s.message.contains(POLICY) && s.message.contains(message),
                "{what}: denied, but not by the policy's rule {message:?}: {s:?}"
            );
        }
        Ok(()) => panic!("{what}: the ServiceAccount's write was admitted"),
        Err(e) => panic!("{what}: unexpected error {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notebook_policy_allows_only_the_stop_annotations() -> Result<()> {
    let objs = chart(&["culling.mode=on"])?;
    let rbac = of_kinds(
        &objs,
        &[
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    );
    let policy = of_kinds(
        &objs,
        &[
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
    );
    ensure!(
        policy.len() == 2,
        "the chart renders the policy and its binding: {policy:?}"
    );

    let (cp, admin) = support::tier_a().await;
    cp.install_notebook_crd().await?;
    for ns in [LEDGER_NAMESPACE, "team-a", "team-b"] {
        namespace(&cp, ns)?;
    }
    apply(&cp, &rbac)?;
    let sa = client_from(&service_account_kubeconfig(&cp)?).await?;
    let sa_a = notebooks(&sa, "team-a");

    // Before the policy, RBAC alone lets the token rewrite a notebook's spec: the hole.
    create_notebook(&admin, "team-a", "before").await?;
    merge_patch(&sa_a, "before", &forbidden_changes()[0].1)
        .await
        .context("without the policy, notebooks: patch allows a spec change")?;

    apply(&cp, &policy)?;
    // Policies take effect asynchronously: probe on a notebook of its own until denied.
    create_notebook(&admin, "team-a", "probe").await?;
    let attempt = std::sync::atomic::AtomicU32::new(0);
    poll(
        "the policy to be enforced",
        Duration::from_secs(60),
        || async {
            // A new value each time: a patch that changes nothing is (rightly) admitted.
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let body = json!({"metadata": {"labels": {"probe": n.to_string()}}});
            let r = merge_patch(&sa_a, "probe", &body).await;
            matches!(r, Err(kube::Error::Api(ref s)) if s.message.contains(POLICY)).then_some(())
        },
    )
    .await?;

    // Every forbidden change is denied, before and after the stop.
    let nb = create_notebook(&admin, "team-a", "nb").await?;
    for (what, body, message) in forbidden_changes() {
        assert_denied(merge_patch(&sa_a, "nb", &body).await, what, message);
    }
    // The notice before a stop passes: written, then removed, as the actuator sends them.
    let nb = the_notices_pass(&admin, &sa_a, &nb).await?;
    // The stop itself passes: gpu-ledger's exact patch.
    merge_patch(&sa_a, "nb", &the_stop_patch(&nb))
        .await
        .context("gpu-ledger's stop patch must pass the policy")?;
    let stopped = notebooks(&admin, "team-a").get("nb").await?;
    let ann = stopped.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get(STOP_ANNOTATION).map(String::as_str),
        Some("2026-12-01T09:00:00Z")
    );
    assert_eq!(
        ann.get("gpu-ledger.io/stopped-by").map(String::as_str),
        Some("gpu-ledger")
    );
    assert_eq!(ann.get("owner-note").map(String::as_str), Some("keep"));
    // Its own bookkeeping annotations stay writable.
    merge_patch(
        &sa_a,
        "nb",
        &json!({"metadata": {"annotations": {"gpu-ledger.io/stop-reason": "re-checked"}}}),
    )
    .await
    .context("gpu-ledger.io/stop-reason is gpu-ledger's own")?;
    // Once stopped, the stop can be neither lifted nor rewritten by the token.
    assert_denied(
        merge_patch(
            &sa_a,
            "nb",
            &json!({"metadata": {"annotations": {STOP_ANNOTATION: null}}}),
        )
        .await,
        "remove kubeflow-resource-stopped",
        "never remove or change it",
    );
    assert_denied(
        merge_patch(
            &sa_a,
            "nb",
            &json!({"metadata": {"annotations": {STOP_ANNOTATION: "2030-01-01T00:00:00Z"}}}),
        )
        .await,
        "change kubeflow-resource-stopped",
        "never remove or change it",
    );
    for (what, body, message) in forbidden_changes() {
        assert_denied(
            merge_patch(&sa_a, "nb", &body).await,
            &format!("{what} (stopped)"),
            message,
        );
    }
    // Cluster-wide: another namespace is protected the same way.
    create_notebook(&admin, "team-b", "other").await?;
    assert_denied(
        merge_patch(
            &notebooks(&sa, "team-b"),
            "other",
            &forbidden_changes()[0].1,
        )
        .await,
        "spec in team-b",
        "may not change a Notebook's spec",
    );

    // Only the ServiceAccount is limited: the owner (admin here) restarts the notebook and edits
    // its spec as before.
    let admin_a = notebooks(&admin, "team-a");
    merge_patch(
        &admin_a,
        "nb",
        &json!({"metadata": {"annotations": {STOP_ANNOTATION: null}}}),
    )
    .await
    .context("the owner removes the stop annotation")?;
    merge_patch(&admin_a, "nb", &forbidden_changes()[0].1)
        .await
        .context("the owner edits the spec")?;
    Ok(())
}

// --------------------------------------------------------------------------------------------
// The RBAC against the audit log
// --------------------------------------------------------------------------------------------

const NS: &str = "team-ml";
const SELECTOR: &str = "gpu-ledger.io/cull=false";

/// Audit policy: metadata of every request of the ServiceAccount, nothing else.
fn audit_policy() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  \
         - level: Metadata\n    users: [\"system:serviceaccount:{LEDGER_NAMESPACE}:{SA}\"]\n  \
         - level: None\n"
    )
}

/// One request of the ServiceAccount, from the audit log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    group: String,
    resource: String,
    name: String,
    verb: String,
    allowed: bool,
    code: i64,
}

fn audit_requests(log: &Path) -> Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = serde_json::from_str(line).context("audit line")?;
        let Some(obj) = e.get("objectRef") else {
            continue; // discovery and other non-resource URLs
        };
        let mut resource = obj["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = obj["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        out.push(Request {
            group: obj["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            name: obj["name"].as_str().unwrap_or_default().to_string(),
            verb: e["verb"].as_str().unwrap_or_default().to_string(),
            allowed: e["annotations"]["authorization.k8s.io/decision"] == "allow",
            code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Every (group, resource or resource/name, verb) that the rendered roles grant.
fn granted(objs: &[Value]) -> BTreeSet<(String, String, String)> {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let mut set = BTreeSet::new();
    for role in objs
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for r in role["rules"].as_array().into_iter().flatten() {
            let names = strs(&r["resourceNames"]);
            for g in strs(&r["apiGroups"]) {
                for res in strs(&r["resources"]) {
                    for v in strs(&r["verbs"]) {
                        if names.is_empty() {
                            set.insert((g.clone(), res.clone(), v.clone()));
                        }
                        for n in &names {
                            set.insert((g.clone(), format!("{res}/{n}"), v.clone()));
                        }
                    }
                }
            }
        }
    }
    set
}

/// `gpu-ledger serve` as the ServiceAccount (test timings as `Stack::start_gpu_ledger`).
fn serve(
    stack: &Stack,
    kubeconfig: &Path,
    name: &str,
    args: &[&str],
) -> Result<(ChildGuard, String)> {
    let port = gpu_ledger_testkit::util::free_port()?;
    let mut cmd = support::gpu_ledger_command();
    cmd.env("KUBECONFIG", kubeconfig)
        .env(
            "GPU_LEDGER_LOG",
            std::env::var("TESTKIT_GPU_LEDGER_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", LEDGER_NAMESPACE)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--prometheus-url", stack.prometheus.url()])
        .args(["--refresh-interval", "1s", "--scrape-interval", "1s"])
        .args([
            "--window",
            "10s",
            "--max-staleness",
            "5s",
            "--history-lookback",
            "10m",
        ])
        .args(["--namespaces", NS])
        // As the chart passes it with ledger.namespaces: DaemonSet pods where dcgm-exporter runs.
        .args(["--exporter-namespaces", "gpu-operator"])
        .args(["--cull-idle-after", "15s", "--cull-min-runtime", "5s"])
        .args([
            "--cull-kill-switch",
            "gpu-ledger-cull",
            "--lease-name",
            "gpu-ledger",
        ])
        .args(["--cull-namespace-selector", SELECTOR])
        // The stack scrapes without honor_labels; the scheme is detected (on every refresh, from
        // the window's own series, so a start with only unallocated GPUs does not stick).
        .args(args);
    let log = stack.cp.dir().join(format!("{name}.log"));
    Ok((
        ChildGuard::spawn(name, cmd, &log)?,
        format!("http://127.0.0.1:{port}"),
    ))
}

/// The log of a gpu-ledger process without the once-a-second "refreshed" lines.
fn interesting(p: &ChildGuard) -> String {
    std::fs::read_to_string(p.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("refreshed"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// RayCluster `name` in [`NS`] and one GPU worker of it on `n1`, as KubeRay's operator writes
/// the pod (controller ownerReference to the cluster, label `ray.io/cluster`); the operator
/// itself does not run here.
async fn create_raycluster_worker(admin: &kube::Client, name: &str) -> Result<()> {
    let rcs = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        NS,
        &gpu_ledger_testkit::kuberay::raycluster_resource(),
    );
    let rc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}},
    }))?;
    let rc = rcs.create(&PostParams::default(), &rc).await?;
    let mut pod = support::gpu_pod(&format!("{name}-gpu-worker-x7k2p"), 1, Some("n1"));
    pod.metadata.labels = Some(BTreeMap::from([("ray.io/cluster".into(), name.into())]));
    pod.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name,
        "uid": rc.metadata.uid.context("RayCluster uid")?,
        "controller": true, "blockOwnerDeletion": true,
    }))?]);
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

#[allow(clippy::too_many_lines)] // one scenario: audit on, dry-run, on, compare
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_rbac_is_exactly_what_the_binary_uses() -> Result<()> {
    // Kueue is served below (its CRDs): the chart adds the Role on Kueue's ConfigMap in
    // kueue-system, which gpu-ledger reads once it found Kueue.
    let objs = chart_serving(
        &[
            "culling.mode=on",
            &format!("ledger.namespaces={{{NS}}}"),
            &format!("culling.excludeNamespaceSelector={SELECTOR}"),
        ],
        &["kueue.x-k8s.io/v1beta2/ClusterQueue"],
    )?;
    let rbac = of_kinds(
        &objs,
        &[
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    );
    let want = granted(&rbac);
    ensure!(
        want.contains(&(String::new(), "namespaces".into(), "list".into())),
        "the selector's role is rendered: {want:?}"
    );

    // n1: one card for the notebook, one for the RayCluster's worker; n2: the Workspace's.
    let stack = Stack::start(&[GpuNode::new("n1", 2), GpuNode::new("n2", 1)]).await?;
    let policy_file = stack.cp.dir().join("audit-policy.yaml");
    let audit_log = stack.cp.dir().join("audit.log");
    std::fs::write(&policy_file, audit_policy())?;
    stack
        .cp
        .restart_apiserver_with(&[
            &format!("--audit-policy-file={}", policy_file.display()),
            &format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-format=json",
        ])
        .await?;
    let admin = stack.cp.client("admin").await?;
    for ns in [LEDGER_NAMESPACE, NS, "gpu-operator", "kueue-system"] {
        namespace(&stack.cp, ns)?;
    }
    // Kueue's CRDs, so the Kueue grants are exercised (gpu-ledger reads Kueue when it is served).
    support::install_kueue_crds(&stack.cp);
    // Notebooks 2.0's CRDs, so the Workspace grants are exercised (read, re-read, pause).
    support::install_workspace_crds(&stack.cp).await;
    // KubeRay's CRDs, so the RayCluster grants are exercised (read when served, suspended when
    // idle). Its operator does not run: the worker pod is written as the operator writes it.
    gpu_ledger_testkit::kuberay::install_crds(&stack.cp).await?;
    apply(&stack.cp, &rbac)?;
    let kubeconfig = service_account_kubeconfig(&stack.cp)?;
    let nb = Notebook::new(NS, "idle-nb").node("n1");
    stack.create_notebook(&nb).await?;
    stack.wait_pod_running(NS, &nb.pod_name()).await?;
    support::create_workspace_kind(&admin).await;
    support::create_workspace(&admin, NS, "idle-ws", "big_gpu", "n2").await;
    create_raycluster_worker(&admin, "idle-rc").await?;
    stack
        .wait_pod_running(NS, "idle-rc-gpu-worker-x7k2p")
        .await?;

    // Dry-run: plans, re-reads the notebook, publishes IdleGPUWouldStop every cycle (create,
    // then patch of the same Event), holds and renews the Lease, reads the kill switch and the
    // namespace selector.
    let (mut dry, dry_url) = serve(&stack, &kubeconfig, "gpu-ledger-dry", &["--cull=dry-run"])?;
    let events: Api<Event> = Api::namespaced(admin.clone(), NS);
    let found = poll(
        "a repeated IdleGPUWouldStop Event",
        Duration::from_secs(120),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("IdleGPUWouldStop")
                        && e.series.as_ref().is_some_and(|s| s.count >= 2)
                })
                .then_some(())
        },
    )
    .await;
    if let Err(e) = found {
        let http = reqwest::Client::new();
        let ledger = match http.get(format!("{dry_url}/api/v1/ledger")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        let dcgm = match http
            .get(format!("{}/api/v1/query", stack.prometheus.url()))
            .query(&[("query", "DCGM_FI_DEV_GPU_UTIL")])
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        bail!(
            "{e:#}\ndry-run log:\n{}\nledger: {ledger}\nDCGM_FI_DEV_GPU_UTIL: {dcgm}",
            interesting(&dry)
        );
    }
    // SIGTERM: the Lease is released (update) for the next process.
    dry.terminate(Duration::from_secs(10));

    // On: the idle notebook is stopped (patch).
    let (mut on, _) = serve(&stack, &kubeconfig, "gpu-ledger-on", &["--cull=on"])?;
    let nbs = notebooks(&admin, NS);
    poll(
        "the notebook to be stopped",
        Duration::from_secs(120),
        || async {
            let n = nbs.get("idle-nb").await.ok()?;
            n.metadata
                .annotations
                .is_some_and(|a| a.contains_key(STOP_ANNOTATION))
                .then_some(())
        },
    )
    .await
    .with_context(|| format!("cull=on log:\n{}", interesting(&on)))?;
    // ... and the idle Workspace paused (one stop per namespace per cycle: a later cycle).
    let workspaces: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), NS, &support::workspace_api());
    poll(
        "the workspace to be paused",
        Duration::from_secs(120),
        || async {
            let w = workspaces.get("idle-ws").await.ok()?;
            (w.data.pointer("/spec/paused") == Some(&Value::Bool(true))).then_some(())
        },
    )
    .await
    .with_context(|| format!("cull=on log:\n{}", interesting(&on)))?;
    // And the idle RayCluster is suspended (get, patch): one stop per namespace and cycle.
    let rcs = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        NS,
        &gpu_ledger_testkit::kuberay::raycluster_resource(),
    );
    poll(
        "the RayCluster to be suspended",
        Duration::from_secs(120),
        || async {
            let rc = rcs.get("idle-rc").await.ok()?;
            (rc.data["spec"]["suspend"] == json!(true)).then_some(())
        },
    )
    .await
    .with_context(|| format!("cull=on log:\n{}", interesting(&on)))?;
    on.terminate(Duration::from_secs(10));

    let requests = audit_requests(&audit_log)?;
    ensure!(
        !requests.is_empty(),
        "no audited request of the ServiceAccount"
    );
    let forbidden: BTreeSet<&Request> = requests.iter().filter(|r| !r.allowed).collect();
    ensure!(
        forbidden.is_empty(),
        "the binary needed permissions the chart does not grant: {forbidden:#?}"
    );
    let used: BTreeSet<(String, String, String)> = requests
        .iter()
        .flat_map(|r| {
            let plain = (r.group.clone(), r.resource.clone(), r.verb.clone());
            let named = (
                r.group.clone(),
                format!("{}/{}", r.resource, r.name),
                r.verb.clone(),
            );
            [plain, named]
        })
        .collect();
    let unused: Vec<&(String, String, String)> =
        want.iter().filter(|g| !used.contains(g)).collect();
    ensure!(
        unused.is_empty(),
        "granted but never used by the binary: {unused:?}\nused: {used:#?}"
    );
    Ok(())
}
