//! The Helm chart (`deploy/helm/gpu-ledger`) and the kustomize manifests (`deploy/kustomize`):
//! `helm lint`, `helm template` with culling off / dry-run / on and sharding, `kubectl
//! kustomize`, helm-vs-kustomize sync, and installs on a REAL kube-apiserver (testkit tier A):
//! server-side apply (dry-run, then for real), Pod Security "restricted" admission of the pod
//! template, and the `ServiceAccount`'s RBAC matrix with culling off and on.
//!
//! helm and kubectl come from `scripts/build-test-cluster.sh` (via `KUBEBUILDER_ASSETS`,
//! `TEST_ASSET_HELM` / `TEST_ASSET_KUBECTL` or the build cache). Missing binaries fail the tests
//! with a message naming that script: nothing is skipped.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context, Result, bail, ensure};
use gpu_ledger_testkit::ControlPlane;
use gpu_ledger_testkit::process::run;
use serde::Deserialize as _;
use serde_json::{Value, json};

const CHART: &str = "deploy/helm/gpu-ledger";
const NS: &str = "gpu-ledger";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin(name: &str) -> PathBuf {
    gpu_ledger_testkit::binary(name).unwrap_or_else(|e| {
        panic!(
            "{e:#}\n(the chart tests need `{name}`: build it with scripts/build-test-cluster.sh)"
        )
    })
}

/// Helm's config/cache/data dirs, private to this test binary.
fn helm_home() -> PathBuf {
    // Cargo's scratch dir for integration tests: nothing left in /tmp, nothing in $HOME.
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-chart-helm-home")
}

fn helm() -> Command {
    let mut c = Command::new(bin("helm"));
    let h = helm_home();
    c.current_dir(root())
        .env("HELM_CONFIG_HOME", h.join("config"))
        .env("HELM_CACHE_HOME", h.join("cache"))
        .env("HELM_DATA_HOME", h.join("data"))
        .env_remove("KUBECONFIG");
    c
}

/// Runs `cmd`, failing with its stderr unless it exits 0; returns stdout and stderr.
fn run_ok(cmd: Command, stdin: Option<&str>) -> Result<(String, String)> {
    let desc = format!("{cmd:?}");
    let out = run(cmd, stdin)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.success(),
        "{desc} failed ({}):\nstderr:\n{stderr}\nstdout:\n{stdout}",
        out.status
    );
    Ok((stdout, stderr))
}

fn helm_template_ns(release: &str, ns: &str, sets: &[&str]) -> Result<String> {
    let mut c = helm();
    // The kube version of the test cluster (helm template defaults to an old one).
    c.args([
        "template",
        release,
        CHART,
        "--namespace",
        ns,
        "--kube-version",
        "v1.36.3",
    ]);
    for s in sets {
        c.args(["--set", s]);
    }
    Ok(run_ok(c, None)?.0)
}

/// `helm template` of the release in [`NS`] with extra helm arguments (`--api-versions …`,
/// `--set …`), as objects.
fn render_with_args(extra: &[&str]) -> Result<Vec<Value>> {
    let mut c = helm();
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--namespace",
        NS,
        "--kube-version",
        "v1.36.3",
    ]);
    c.args(extra);
    docs(&run_ok(c, None)?.0)
}

fn helm_template(sets: &[&str]) -> Result<String> {
    helm_template_ns("gpu-ledger", NS, sets)
}

/// `kubectl kustomize` of the base with `deploy/kustomize/components/<component>`, as objects.
/// Kustomize refuses absolute paths: the tree is copied and an overlay using the component added.
fn kustomize_base_with_component(component: &str) -> Result<Vec<Value>> {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-chart-kustomize-{component}"));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut c = Command::new("cp");
    c.arg("-r").arg(root().join("deploy/kustomize")).arg(&tmp);
    run_ok(c, None)?;
    let overlay = tmp.join(format!("overlays/test-{component}"));
    std::fs::create_dir_all(&overlay)?;
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n  - ../../components/{component}\n"
        ),
    )?;
    let mut c = Command::new(bin("kubectl"));
    c.arg("kustomize").arg(&overlay);
    docs(&run_ok(c, None)?.0)
}

fn kustomize(dir: &str) -> Result<String> {
    let mut c = Command::new(bin("kubectl"));
    c.current_dir(root()).args(["kustomize", dir]);
    Ok(run_ok(c, None)?.0)
}

/// Multi-document YAML to JSON values (empty documents dropped).
fn docs(yaml: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for d in serde_norway::Deserializer::from_str(yaml) {
        let v = Value::deserialize(d).context("parsing rendered YAML")?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn kind_names(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or("?"), name(o)))
        .collect()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

fn find<'a>(objs: &'a [Value], kind: &str, n: &str) -> Result<&'a Value> {
    objs.iter()
        .find(|o| o["kind"] == kind && name(o) == n)
        .with_context(|| format!("no {kind}/{n} in {:?}", kind_names(objs)))
}

fn has_kind(objs: &[Value], kind: &str) -> bool {
    objs.iter().any(|o| o["kind"] == kind)
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

fn args(workload: &Value) -> Vec<String> {
    container(workload)["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Rules of a ClusterRole/Role as sorted (group, resource, verb) triples; a rule limited by
/// `resourceNames` yields `resource/name` for each name.
fn rule_set(role: &Value) -> Vec<(String, String, String)> {
    let mut set = Vec::new();
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for r in role["rules"].as_array().into_iter().flatten() {
        let names = strs(&r["resourceNames"]);
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                let targets: Vec<String> = if names.is_empty() {
                    vec![res.clone()]
                } else {
                    names.iter().map(|n| format!("{res}/{n}")).collect()
                };
                for t in targets {
                    for v in strs(&r["verbs"]) {
                        set.push((g.clone(), t.clone(), v));
                    }
                }
            }
        }
    }
    set.sort();
    set.dedup();
    set
}

fn triples(t: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = t
        .iter()
        .map(|(a, b, c)| ((*a).to_string(), (*b).to_string(), (*c).to_string()))
        .collect();
    v.sort();
    v
}

/// ClusterRole `<fullname>`: the namespaced reads (watches are list + watch; the notebook
/// ownership check gets one StatefulSet).
const READ_ONLY_RULES: &[(&str, &str, &str)] = &[
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "resourcequotas", "list"),
    ("", "resourcequotas", "watch"),
    ("apps", "statefulsets", "get"),
    ("kubeflow.org", "notebooks", "list"),
    ("kubeflow.org", "notebooks", "watch"),
    ("kubeflow.org", "workspaces", "list"),
    ("kubeflow.org", "workspaces", "watch"),
    ("resource.k8s.io", "resourceclaims", "list"),
    ("resource.k8s.io", "resourceclaims", "watch"),
    ("kueue.x-k8s.io", "localqueues", "list"),
    ("kueue.x-k8s.io", "localqueues", "watch"),
    ("kueue.x-k8s.io", "workloads", "list"),
    ("kueue.x-k8s.io", "workloads", "watch"),
    ("ray.io", "rayclusters", "list"),
    ("ray.io", "rayclusters", "watch"),
];

/// ClusterRole `<fullname>-nodes`: cluster-scoped, always bound cluster-wide (nodes, and the
/// DRA devices and classes).
const NODE_RULES: &[(&str, &str, &str)] = &[
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("resource.k8s.io", "deviceclasses", "list"),
    ("resource.k8s.io", "deviceclasses", "watch"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("kueue.x-k8s.io", "clusterqueues", "list"),
    ("kueue.x-k8s.io", "clusterqueues", "watch"),
    ("kueue.x-k8s.io", "resourceflavors", "list"),
    ("kueue.x-k8s.io", "resourceflavors", "watch"),
    ("kubeflow.org", "workspacekinds", "list"),
    ("kubeflow.org", "workspacekinds", "watch"),
];

/// ClusterRole `<fullname>-culler`: re-read and patch a Notebook; events.k8s.io Events only
/// (kube-runtime's Recorder creates, then patches repeats).
const CULLER_RULES: &[(&str, &str, &str)] = &[
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("kubeflow.org", "notebooks", "get"),
    ("kubeflow.org", "notebooks", "patch"),
    ("kubeflow.org", "workspaces", "get"),
    ("kubeflow.org", "workspaces", "patch"),
    ("ray.io", "rayclusters", "get"),
    ("ray.io", "rayclusters", "patch"),
];

/// The leader-election Role: get/update on the release's Lease only, create on leases (RBAC
/// cannot limit create by name), get on the kill-switch ConfigMap only.
const LEASE_RULES: &[(&str, &str, &str)] = &[
    ("", "configmaps/gpu-ledger-cull", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases/gpu-ledger", "get"),
    ("coordination.k8s.io", "leases/gpu-ledger", "update"),
];

fn assert_restricted_security(w: &Value) {
    let pod = &w["spec"]["template"]["spec"];
    let c = container(w);
    let sc = &c["securityContext"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["resources"]["requests"]["cpu"], "50m");
    assert_eq!(c["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(c["ports"][0]["name"], "http");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http");
    let env: Vec<&str> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"),
        "{env:?}"
    );
}

// --------------------------------------------------------------------------------------------
// Rendering (helm / kubectl binaries, no cluster)
// --------------------------------------------------------------------------------------------

#[test]
fn helm_lint_default_and_full_values() -> Result<()> {
    let mut c = helm();
    c.args(["lint", "--strict", CHART]);
    run_ok(c, None)?;
    let mut c = helm();
    c.args(["lint", "--strict", CHART]);
    for s in [
        "culling.mode=on",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "networkPolicy.enabled=true",
        "sharding.totalShards=3",
        "prometheus.url=https://prometheus.example.internal",
        "prometheus.bearerToken.secretName=prom-token",
        "tls.secretName=gpu-ledger-tls",
        "apiAuth.tokenSecretName=api-token",
        "apiAuth.kubernetes=true",
        "prometheus.ca.configMapName=prom-ca",
        "openshift.clusterMonitoringView=true",
    ] {
        c.args(["--set", s]);
    }
    run_ok(c, None)?;
    Ok(())
}

#[test]
fn helm_template_culling_off_is_read_only() -> Result<()> {
    let objs = docs(&helm_template(&[])?)?;
    let kinds = kind_names(&objs);
    for expected in [
        "ServiceAccount/gpu-ledger",
        "ClusterRole/gpu-ledger",
        "ClusterRoleBinding/gpu-ledger",
        "ClusterRole/gpu-ledger-nodes",
        "ClusterRoleBinding/gpu-ledger-nodes",
        "Deployment/gpu-ledger",
        "Service/gpu-ledger",
        "PodDisruptionBudget/gpu-ledger",
        "ConfigMap/gpu-ledger-dashboard",
    ] {
        assert!(
            kinds.contains(&expected.to_string()),
            "{expected} missing: {kinds:?}"
        );
    }
    // Culling off: no write RBAC of any kind; CRD-dependent objects are opt-in.
    for absent in [
        "Role",
        "RoleBinding",
        "StatefulSet",
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
    ] {
        assert!(
            !has_kind(&objs, absent),
            "{absent} rendered by default: {kinds:?}"
        );
    }
    assert_eq!(
        objs.iter().filter(|o| o["kind"] == "ClusterRole").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        rule_set(find(&objs, "ClusterRole", "gpu-ledger")?),
        triples(READ_ONLY_RULES)
    );
    assert_eq!(
        rule_set(find(&objs, "ClusterRole", "gpu-ledger-nodes")?),
        triples(NODE_RULES)
    );

    let d = find(&objs, "Deployment", "gpu-ledger")?;
    assert_eq!(d["spec"]["replicas"], 2);
    assert_restricted_security(d);
    let a = args(d);
    assert_eq!(a[0], "serve");
    for expected in [
        "--listen=0.0.0.0:8080",
        "--cull=off",
        "--label-scheme=auto",
        "--idle-threshold=0.05",
        "--window=10m",
    ] {
        assert!(a.contains(&expected.to_string()), "{expected} not in {a:?}");
    }
    assert!(
        !a.iter()
            .any(|x| x.starts_with("--lease-name") || x.starts_with("--shard")),
        "{a:?}"
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["serviceAccountName"],
        "gpu-ledger"
    );

    let pdb = find(&objs, "PodDisruptionBudget", "gpu-ledger")?;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let svc = find(&objs, "Service", "gpu-ledger")?;
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    assert_eq!(
        svc["spec"]["selector"],
        d["spec"]["selector"]["matchLabels"]
    );

    let cm = find(&objs, "ConfigMap", "gpu-ledger-dashboard")?;
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dash = cm["data"]["gpu-ledger.json"]
        .as_str()
        .context("dashboard data")?;
    serde_json::from_str::<Value>(dash).context("dashboard ConfigMap holds valid JSON")?;
    Ok(())
}

#[test]
fn helm_template_culling_modes_add_write_rbac() -> Result<()> {
    for mode in ["dry-run", "on"] {
        let objs = docs(&helm_template(&[&format!("culling.mode={mode}")])?)?;
        assert_eq!(
            rule_set(find(&objs, "ClusterRole", "gpu-ledger")?),
            triples(READ_ONLY_RULES),
            "{mode}: read-only role unchanged"
        );
        assert_eq!(
            rule_set(find(&objs, "ClusterRole", "gpu-ledger-culler")?),
            triples(CULLER_RULES)
        );
        let role = find(&objs, "Role", "gpu-ledger-leader-election")?;
        assert_eq!(role["metadata"]["namespace"], NS);
        assert_eq!(rule_set(role), triples(LEASE_RULES));
        assert!(
            find(&objs, "ClusterRole", "gpu-ledger-namespaces").is_err(),
            "namespaces are read only with culling.excludeNamespaceSelector"
        );
        let crb = find(&objs, "ClusterRoleBinding", "gpu-ledger-culler")?;
        assert_eq!(crb["subjects"][0]["name"], "gpu-ledger");
        assert_eq!(crb["subjects"][0]["namespace"], NS);
        let rb = find(&objs, "RoleBinding", "gpu-ledger-leader-election")?;
        assert_eq!(rb["roleRef"]["name"], "gpu-ledger-leader-election");
        let a = args(find(&objs, "Deployment", "gpu-ledger")?);
        for expected in [
            format!("--cull={mode}"),
            "--cull-idle-after=2h".into(),
            "--cull-min-runtime=1h".into(),
            "--cull-max-per-cycle=3".into(),
            "--cull-kill-switch=gpu-ledger-cull".into(),
            "--lease-name=gpu-ledger".into(),
        ] {
            assert!(a.contains(&expected), "{mode}: {expected} not in {a:?}");
        }
    }
    // No kill switch: no ConfigMap access and no flag.
    let objs = docs(&helm_template(&["culling.mode=on", "culling.killSwitch="])?)?;
    let role = find(&objs, "Role", "gpu-ledger-leader-election")?;
    assert!(
        !rule_set(role)
            .iter()
            .any(|(_, res, _)| res.starts_with("configmaps"))
    );
    let a = args(find(&objs, "Deployment", "gpu-ledger")?);
    assert!(
        !a.iter().any(|x| x.starts_with("--cull-kill-switch")),
        "{a:?}"
    );
    // The chart's RBAC names the ConfigMap in the release namespace: another namespace fails.
    let mut c = helm();
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--kube-version",
        "v1.36.3",
        "--set",
        "culling.mode=on",
        "--set",
        "culling.killSwitch=ops/gpu-ledger-cull",
    ]);
    let out = run(c, None)?;
    assert!(
        !out.status.success(),
        "a namespaced kill switch must fail the render"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("culling.killSwitch must be a ConfigMap name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A bare YAML `off` (boolean false) is still off; nonsense fails the render.
    let objs = docs(&helm_template(&["culling.mode=false"])?)?;
    assert!(!has_kind(&objs, "Role"));
    let mut c = helm();
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--kube-version",
        "v1.36.3",
        "--set",
        "culling.mode=maybe",
    ]);
    let out = run(c, None)?;
    assert!(
        !out.status.success(),
        "culling.mode=maybe must fail the render"
    );
    // values.schema.json refuses it before the template's own check would.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/culling/mode"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Subjects of a binding, as `namespace/name`.
fn subjects(binding: &Value) -> Vec<String> {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{}/{}",
                s["namespace"].as_str().unwrap_or(""),
                s["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// `(kind, namespace)` of every binding whose roleRef is `role`.
fn bindings_of(objs: &[Value], role: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = objs
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
        .filter(|o| o["roleRef"]["name"] == role)
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or("").to_string(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `ledger.namespaces` / `culling.namespaces` narrow the bindings: RoleBindings per namespace,
/// nodes (cluster-scoped) stay cluster-wide, culling only where it is also watched.
#[test]
fn helm_template_namespaces_bind_per_namespace() -> Result<()> {
    let pair = |kind: &str, ns: &str| (kind.to_string(), ns.to_string());
    // Default: cluster-wide.
    let objs = docs(&helm_template(&["culling.mode=on"])?)?;
    assert_eq!(
        bindings_of(&objs, "gpu-ledger"),
        [pair("ClusterRoleBinding", "")]
    );
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-culler"),
        [pair("ClusterRoleBinding", "")]
    );

    let objs = docs(&helm_template(&[
        "culling.mode=on",
        "ledger.namespaces={team-a,team-b}",
    ])?)?;
    assert_eq!(
        bindings_of(&objs, "gpu-ledger"),
        [pair("RoleBinding", "team-a"), pair("RoleBinding", "team-b")]
    );
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-nodes"),
        [pair("ClusterRoleBinding", "")]
    );
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-culler"),
        [pair("RoleBinding", "team-a"), pair("RoleBinding", "team-b")]
    );
    // dcgm-exporter's DaemonSet pods, read where the exporter runs (default gpu-operator).
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-exporter-pods"),
        [pair("RoleBinding", "gpu-operator")]
    );
    let deployment = find(&objs, "Deployment", "gpu-ledger")?;
    assert!(
        args(deployment).contains(&"--exporter-namespaces=gpu-operator".to_string()),
        "{:?}",
        args(deployment)
    );
    for o in objs.iter().filter(|o| o["kind"] == "RoleBinding") {
        assert_eq!(subjects(o), [format!("{NS}/gpu-ledger")], "{}", name(o));
        assert_eq!(
            o["roleRef"]["kind"],
            if name(o).ends_with("leader-election") {
                "Role"
            } else {
                "ClusterRole"
            }
        );
    }

    // culling.namespaces narrows culling to the namespaces also watched.
    let objs = docs(&helm_template(&[
        "culling.mode=dry-run",
        "ledger.namespaces={team-a,team-b}",
        "culling.namespaces={team-b,team-c}",
    ])?)?;
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-culler"),
        [pair("RoleBinding", "team-b")]
    );
    // Without ledger.namespaces, culling.namespaces alone.
    let objs = docs(&helm_template(&[
        "culling.mode=on",
        "culling.namespaces={team-c}",
    ])?)?;
    assert_eq!(
        bindings_of(&objs, "gpu-ledger"),
        [pair("ClusterRoleBinding", "")]
    );
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-culler"),
        [pair("RoleBinding", "team-c")]
    );

    // The namespace selector adds list on namespaces, cluster-wide, and nothing else.
    let objs = docs(&helm_template(&[
        "culling.mode=on",
        "culling.excludeNamespaceSelector=gpu-ledger.io/cull=false",
    ])?)?;
    assert_eq!(
        rule_set(find(&objs, "ClusterRole", "gpu-ledger-namespaces")?),
        triples(&[("", "namespaces", "list")])
    );
    assert_eq!(
        bindings_of(&objs, "gpu-ledger-namespaces"),
        [pair("ClusterRoleBinding", "")]
    );

    // Sharded: one Lease per shard, each named.
    let objs = docs(&helm_template(&[
        "culling.mode=on",
        "sharding.totalShards=3",
        "culling.leaseName=gl",
    ])?)?;
    let leases: Vec<(String, String, String)> =
        rule_set(find(&objs, "Role", "gpu-ledger-leader-election")?)
            .into_iter()
            .filter(|(_, r, _)| r.starts_with("leases"))
            .collect();
    let mut want = vec![("coordination.k8s.io", "leases", "create")];
    let named: Vec<String> = (0..3).map(|i| format!("leases/gl-{i}")).collect();
    for n in &named {
        want.push(("coordination.k8s.io", n, "get"));
        want.push(("coordination.k8s.io", n, "update"));
    }
    assert_eq!(leases, triples(&want));
    Ok(())
}

#[test]
fn helm_template_sharding_renders_statefulset() -> Result<()> {
    let objs = docs(&helm_template(&[
        "sharding.totalShards=3",
        "culling.mode=dry-run",
    ])?)?;
    assert!(!has_kind(&objs, "Deployment"), "{:?}", kind_names(&objs));
    let sts = find(&objs, "StatefulSet", "gpu-ledger")?;
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(sts["spec"]["serviceName"], "gpu-ledger-shards");
    find(&objs, "Service", "gpu-ledger-shards")?;
    assert_restricted_security(sts);
    let a = args(sts);
    for expected in [
        "--shard=$(POD_INDEX)",
        "--total-shards=3",
        "--lease-name=gpu-ledger-$(POD_INDEX)",
    ] {
        assert!(a.contains(&expected.to_string()), "{expected} not in {a:?}");
    }
    let env = container(sts)["env"].as_array().context("env")?;
    let idx = env
        .iter()
        .find(|e| e["name"] == "POD_INDEX")
        .context("POD_INDEX env")?;
    assert_eq!(
        idx["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.labels['apps.kubernetes.io/pod-index']"
    );
    Ok(())
}

#[test]
fn helm_template_monitoring_objects() -> Result<()> {
    let objs = docs(&helm_template(&[
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "alerts.podIdleSeconds=7200",
        "alerts.pendingSeconds=1800",
        "alerts.gpuTempCelsius=90",
        "alerts.framebufferRatio=0.9",
        "networkPolicy.enabled=true",
    ])?)?;
    let sm = find(&objs, "ServiceMonitor", "gpu-ledger")?;
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], "http");
    assert_eq!(ep["path"], "/metrics");
    assert_eq!(ep["honorLabels"], false);
    let relabels = serde_json::to_string(&ep["metricRelabelings"])?;
    assert!(
        relabels.contains("exported_namespace") && relabels.contains("labeldrop"),
        "{relabels}"
    );

    let pr = find(&objs, "PrometheusRule", "gpu-ledger")?;
    let groups = pr["spec"]["groups"]
        .as_array()
        .context("PrometheusRule groups")?;
    let source: Value = serde_norway::from_str(
        &std::fs::read_to_string(root().join("alerts/gpu-ledger.rules.yaml"))
            .context("alerts/gpu-ledger.rules.yaml must exist")?,
    )?;
    assert_eq!(
        groups.len(),
        source["groups"].as_array().map_or(0, Vec::len),
        "every rule group is wrapped"
    );
    let exprs: BTreeMap<String, String> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .collect();
    let expr = |a: &str| exprs.get(a).cloned().unwrap_or_default();
    assert!(
        expr("GpuLedgerPodGpuIdle").trim_end().ends_with("> 7200"),
        "{}",
        expr("GpuLedgerPodGpuIdle")
    );
    assert!(
        expr("GpuLedgerPodPendingLong")
            .trim_end()
            .ends_with("> 1800")
    );
    assert!(expr("DcgmGpuHot").trim_end().ends_with("> 90"));
    assert!(
        expr("DcgmFramebufferNearlyFull")
            .trim_end()
            .ends_with("> 0.9")
    );
    // Prometheus templating in annotations is passed through untouched.
    let rendered = serde_json::to_string(pr)?;
    assert!(rendered.contains("{{ $labels.namespace }}"));
    assert!(rendered.contains("above 90 °C") && rendered.contains("above 90% for 10 minutes"));

    let np = find(&objs, "NetworkPolicy", "gpu-ledger")?;
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], "http");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    Ok(())
}

#[test]
fn helm_template_prometheus_auth_mounts() -> Result<()> {
    let objs = docs(&helm_template(&[
        "prometheus.url=https://thanos-querier.openshift-monitoring.svc:9091",
        "prometheus.bearerToken.secretName=prom-token",
        "prometheus.ca.configMapName=prom-ca",
        "prometheus.ca.configMapKey=service-ca.crt",
    ])?)?;
    let d = find(&objs, "Deployment", "gpu-ledger")?;
    let a = args(d);
    for expected in [
        "--prometheus-url=https://thanos-querier.openshift-monitoring.svc:9091",
        "--prometheus-bearer-token-file=/etc/gpu-ledger/prometheus-token/token",
        "--prometheus-ca-file=/etc/gpu-ledger/prometheus-ca/service-ca.crt",
    ] {
        assert!(a.contains(&expected.to_string()), "{expected} not in {a:?}");
    }
    let vols = serde_json::to_string(&d["spec"]["template"]["spec"]["volumes"])?;
    assert!(
        vols.contains("\"secretName\":\"prom-token\"") && vols.contains("\"name\":\"prom-ca\""),
        "{vols}"
    );

    let objs = docs(&helm_template(&[
        "prometheus.url=https://thanos-querier.openshift-monitoring.svc:9091",
        "prometheus.bearerToken.useServiceAccountToken=true",
        "openshift.clusterMonitoringView=true",
    ])?)?;
    let a = args(find(&objs, "Deployment", "gpu-ledger")?);
    assert!(
        a.contains(
            &"--prometheus-bearer-token-file=/var/run/secrets/kubernetes.io/serviceaccount/token"
                .to_string()
        )
    );
    assert!(
        !a.iter().any(|x| x == "--prometheus-allow-insecure-token"),
        "{a:?}"
    );
    let crb = find(
        &objs,
        "ClusterRoleBinding",
        "gpu-ledger-cluster-monitoring-view",
    )?;
    assert_eq!(crb["roleRef"]["name"], "cluster-monitoring-view");

    // A token with the default http:// URL fails the render (the binary would refuse it too),
    // unless prometheus.allowInsecureToken passes --prometheus-allow-insecure-token.
    for token in [
        "prometheus.bearerToken.secretName=prom-token",
        "prometheus.bearerToken.useServiceAccountToken=true",
    ] {
        let mut c = helm();
        c.args([
            "template",
            "gpu-ledger",
            CHART,
            "--kube-version",
            "v1.36.3",
            "--set",
            token,
        ]);
        let out = run(c, None)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{token}: http:// with a token rendered"
        );
        assert!(
            stderr.contains("the token would be sent unencrypted")
                && stderr.contains("prometheus.allowInsecureToken"),
            "{stderr}"
        );
        let objs = docs(&helm_template(&[
            token,
            "prometheus.allowInsecureToken=true",
        ])?)?;
        let a = args(find(&objs, "Deployment", "gpu-ledger")?);
        assert!(
            a.contains(&"--prometheus-allow-insecure-token".to_string()),
            "{a:?}"
        );
    }
    Ok(())
}

#[test]
fn kustomize_base_and_culling_overlay_render() -> Result<()> {
    let base = docs(&kustomize("deploy/kustomize/base")?)?;
    for crd_kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(!has_kind(&base, crd_kind), "base must not need CRDs");
    }
    assert!(!has_kind(&base, "Role") && !has_kind(&base, "RoleBinding"));
    assert_eq!(
        base.iter().filter(|o| o["kind"] == "ClusterRole").count(),
        2
    );
    assert_eq!(
        rule_set(find(&base, "ClusterRole", "gpu-ledger")?),
        triples(READ_ONLY_RULES)
    );
    assert_eq!(
        rule_set(find(&base, "ClusterRole", "gpu-ledger-nodes")?),
        triples(NODE_RULES)
    );
    for o in base.iter().filter(|o| {
        o["kind"] != "Namespace" && !o["kind"].as_str().unwrap_or("").starts_with("Cluster")
    }) {
        assert_eq!(o["metadata"]["namespace"], NS, "{}", name(o));
    }
    let d = find(&base, "Deployment", "gpu-ledger")?;
    assert_restricted_security(d);
    assert!(args(d).contains(&"--cull=off".to_string()));

    let cull = docs(&kustomize("deploy/kustomize/overlays/culling")?)?;
    assert_eq!(
        rule_set(find(&cull, "ClusterRole", "gpu-ledger-culler")?),
        triples(CULLER_RULES)
    );
    let role = find(&cull, "Role", "gpu-ledger-leader-election")?;
    assert_eq!(role["metadata"]["namespace"], NS);
    assert_eq!(rule_set(role), triples(LEASE_RULES));
    find(&cull, "RoleBinding", "gpu-ledger-leader-election")?;
    find(&cull, "ClusterRoleBinding", "gpu-ledger-culler")?;
    assert!(args(find(&cull, "Deployment", "gpu-ledger")?).contains(&"--cull=dry-run".to_string()));
    Ok(())
}

/// Every registered culling target's RBAC (`cull::Target::rbac`) is granted by the culling
/// ClusterRole of the chart (culling on) and of the kustomize culling overlay: a new target is
/// one file implementing the seam plus its RBAC here, and this test names the rule it forgot.
/// With `culling.targets` naming one kind, the chart grants that kind's rules and passes
/// `--cull-targets` with it, and grants no other target's patch.
#[test]
fn culling_roles_grant_every_targets_rbac() -> Result<()> {
    for enabled in gpu_ledger::cull::TARGETS {
        let noun = enabled.identity().noun;
        let objs = docs(&helm_template(&[
            "culling.mode=on",
            &format!("culling.targets={{{noun}}}"),
        ])?)?;
        let granted = rule_set(find(&objs, "ClusterRole", "gpu-ledger-culler")?);
        let a = args(find(&objs, "Deployment", "gpu-ledger")?);
        ensure!(
            a.contains(&format!("--cull-targets={noun}")),
            "culling.targets={{{noun}}}: no --cull-targets={noun} in {a:?}"
        );
        for target in gpu_ledger::cull::TARGETS {
            for rule in target.rbac() {
                for verb in rule.verbs {
                    let t = (
                        rule.api_group.to_string(),
                        rule.resource.to_string(),
                        (*verb).to_string(),
                    );
                    let is_enabled = target.identity().noun == noun;
                    ensure!(
                        granted.contains(&t) == is_enabled,
                        "culling.targets={{{noun}}}: {} {t:?} granted {}, expected {is_enabled}",
                        target.identity().kind,
                        granted.contains(&t)
                    );
                }
            }
        }
    }
    // Every target by default, on the flag too.
    let objs = docs(&helm_template(&["culling.mode=on"])?)?;
    let all: Vec<&str> = gpu_ledger::cull::TARGETS
        .iter()
        .map(|t| t.identity().noun)
        .collect();
    let a = args(find(&objs, "Deployment", "gpu-ledger")?);
    ensure!(
        a.contains(&format!("--cull-targets={}", all.join(","))),
        "{a:?}"
    );
    ensure!(
        !gpu_ledger::cull::TARGETS.is_empty(),
        "no culling target registered"
    );
    let chart = docs(&helm_template(&["culling.mode=on"])?)?;
    let overlay = docs(&kustomize("deploy/kustomize/overlays/culling")?)?;
    for (source, objs) in [("chart", &chart), ("kustomize overlay", &overlay)] {
        let granted = rule_set(find(objs, "ClusterRole", "gpu-ledger-culler")?);
        for target in gpu_ledger::cull::TARGETS {
            for rule in target.rbac() {
                ensure!(!rule.verbs.is_empty(), "{rule:?} names no verb");
                for verb in rule.verbs {
                    let needed = (
                        rule.api_group.to_string(),
                        rule.resource.to_string(),
                        (*verb).to_string(),
                    );
                    ensure!(
                        granted.contains(&needed),
                        "{source}: the culling role does not grant culling target {} its {needed:?}; it grants {granted:?}",
                        target.identity().kind
                    );
                }
            }
        }
    }
    Ok(())
}

/// TLS and API authentication: flags, mounts, HTTPS probes and scrape, the review RBAC.
#[test]
fn helm_template_tls_and_api_auth() -> Result<()> {
    let objs = docs(&helm_template(&[
        "tls.secretName=gpu-ledger-tls",
        "apiAuth.tokenSecretName=api-token",
        "apiAuth.kubernetes=true",
        "serviceMonitor.enabled=true",
        "serviceMonitor.tlsConfig.serverName=gpu-ledger.gpu-ledger.svc",
    ])?)?;
    let d = find(&objs, "Deployment", "gpu-ledger")?;
    let a = args(d);
    for expected in [
        "--tls-cert-file=/etc/gpu-ledger/tls/tls.crt",
        "--tls-key-file=/etc/gpu-ledger/tls/tls.key",
        "--api-token-file=/etc/gpu-ledger/api-token/token",
        "--api-auth=kubernetes",
    ] {
        assert!(a.contains(&expected.to_string()), "{expected} not in {a:?}");
    }
    let c = container(d);
    assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTPS");
    let vols = serde_json::to_string(&d["spec"]["template"]["spec"]["volumes"])?;
    assert!(
        vols.contains("\"secretName\":\"gpu-ledger-tls\"")
            && vols.contains("\"secretName\":\"api-token\""),
        "{vols}"
    );
    let mounts = serde_json::to_string(&c["volumeMounts"])?;
    assert!(
        !mounts.contains("subPath"),
        "subPath mounts never see Secret updates: {mounts}"
    );
    let ep = &find(&objs, "ServiceMonitor", "gpu-ledger")?["spec"]["endpoints"][0];
    assert_eq!(ep["scheme"], "https");
    assert_eq!(ep["tlsConfig"]["serverName"], "gpu-ledger.gpu-ledger.svc");
    let crb = find(&objs, "ClusterRoleBinding", "gpu-ledger-auth-delegator")?;
    assert_eq!(crb["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(crb["subjects"][0]["name"], "gpu-ledger");
    assert_eq!(
        rule_set(find(&objs, "ClusterRole", "gpu-ledger-api-reader")?),
        triples(&[("gpu-ledger.io", "ledger", "get")])
    );
    assert!(
        bindings_of(&objs, "gpu-ledger-api-reader").is_empty(),
        "readers are bound by the operator"
    );
    // Off by default: plain HTTP probes, no flags, no review RBAC.
    let objs = docs(&helm_template(&[])?)?;
    let c = container(find(&objs, "Deployment", "gpu-ledger")?);
    assert!(c["readinessProbe"]["httpGet"]["scheme"].is_null());
    assert!(
        !args(find(&objs, "Deployment", "gpu-ledger")?)
            .iter()
            .any(|x| x.starts_with("--tls") || x.starts_with("--api-"))
    );
    assert!(find(&objs, "ClusterRoleBinding", "gpu-ledger-auth-delegator").is_err());
    Ok(())
}

const POLICY_KIND: &str = "ValidatingAdmissionPolicy";
const POLICY_BINDING_KIND: &str = "ValidatingAdmissionPolicyBinding";

/// The Notebook admission policy: rendered with culling on and a Kubernetes that serves it
/// (auto: >= 1.30), or when forced; never with culling off; the kustomize overlay ships the same
/// spec for its ServiceAccount.
#[test]
fn notebook_admission_policy_renders_where_it_can_apply() -> Result<()> {
    let objs = docs(&helm_template(&["culling.mode=on"])?)?;
    let policy = find(&objs, POLICY_KIND, "gpu-ledger-notebook-stop-only")?;
    let binding = find(&objs, POLICY_BINDING_KIND, "gpu-ledger-notebook-stop-only")?;
    assert_eq!(
        binding["spec"]["policyName"],
        "gpu-ledger-notebook-stop-only"
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == \"system:serviceaccount:{NS}:gpu-ledger\"")
    );
    assert!(policy["metadata"]["namespace"].is_null(), "cluster-scoped");

    for sets in [
        vec![],
        vec!["culling.mode=on", "culling.admissionPolicy.enabled=false"],
    ] {
        let objs = docs(&helm_template(&sets)?)?;
        assert!(!has_kind(&objs, POLICY_KIND), "{sets:?}");
        assert!(!has_kind(&objs, POLICY_BINDING_KIND), "{sets:?}");
    }
    // Older than 1.30 (no admissionregistration.k8s.io/v1 policy): auto leaves it out, true
    // renders it anyway.
    let old = |sets: &[&str]| -> Result<Vec<Value>> {
        let mut c = helm();
        c.args([
            "template",
            "gpu-ledger",
            CHART,
            "--namespace",
            NS,
            "--kube-version",
            "v1.29.4",
        ]);
        for s in sets {
            c.args(["--set", s]);
        }
        docs(&run_ok(c, None)?.0)
    };
    assert!(!has_kind(&old(&["culling.mode=on"])?, POLICY_KIND));
    assert!(has_kind(
        &old(&["culling.mode=on", "culling.admissionPolicy.enabled=true"])?,
        POLICY_KIND
    ));
    let mut c = helm();
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--set",
        "culling.mode=on",
        "--set",
        "culling.admissionPolicy.enabled=maybe",
    ]);
    let out = run(c, None)?;
    assert!(!out.status.success());
    // values.schema.json refuses it before the template's own check would.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("culling.admissionPolicy.enabled must be")
            || stderr.contains("/culling/admissionPolicy/enabled"),
        "{stderr}"
    );

    // kustomize: the same spec for the base's ServiceAccount, cluster-scoped.
    let cull = docs(&kustomize("deploy/kustomize/overlays/culling")?)?;
    let k_policy = find(&cull, POLICY_KIND, "gpu-ledger-notebook-stop-only")?;
    assert_eq!(
        k_policy["spec"], policy["spec"],
        "chart and kustomize policies differ"
    );
    assert!(
        k_policy["metadata"]["namespace"].is_null(),
        "cluster-scoped"
    );
    let k_binding = find(&cull, POLICY_BINDING_KIND, "gpu-ledger-notebook-stop-only")?;
    assert_eq!(k_binding["spec"], binding["spec"]);
    assert!(
        k_binding["metadata"]["namespace"].is_null(),
        "cluster-scoped"
    );
    Ok(())
}

/// The kustomize NetworkPolicy component renders the chart's NetworkPolicy (default values).
#[test]
fn kustomize_networkpolicy_component_matches_the_chart() -> Result<()> {
    let k = kustomize_base_with_component("networkpolicy")?;
    let np = find(&k, "NetworkPolicy", "gpu-ledger")?;
    assert_eq!(np["metadata"]["namespace"], NS);
    let h = docs(&helm_template(&["networkPolicy.enabled=true"])?)?;
    let hnp = find(&h, "NetworkPolicy", "gpu-ledger")?;
    // The chart renders an empty `to` for the API server rule as absent, like kustomize.
    assert_eq!(
        np["spec"], hnp["spec"],
        "kustomize and chart NetworkPolicies differ"
    );
    // The base alone has none (opt-in, as in the chart).
    assert!(!has_kind(
        &docs(&kustomize("deploy/kustomize/base")?)?,
        "NetworkPolicy"
    ));
    Ok(())
}

/// Fields of a workload that must not drift between the chart and the kustomize manifests.
fn pod_contract(w: &Value) -> Value {
    let spec = &w["spec"]["template"]["spec"];
    json!({
        "replicas": w["spec"]["replicas"],
        "selector": w["spec"]["selector"],
        "podLabels": w["spec"]["template"]["metadata"]["labels"],
        "serviceAccountName": spec["serviceAccountName"],
        "podSecurityContext": spec["securityContext"],
        "volumes": spec["volumes"],
        "container": container(w),
    })
}

#[test]
fn helm_and_kustomize_stay_in_sync() -> Result<()> {
    let pairs = [
        (
            helm_template(&[])?,
            kustomize("deploy/kustomize/base")?,
            "off / base",
        ),
        (
            helm_template(&["culling.mode=dry-run"])?,
            kustomize("deploy/kustomize/overlays/culling")?,
            "dry-run / overlays/culling",
        ),
    ];
    for (h, k, what) in &pairs {
        let (h, k) = (docs(h)?, docs(k)?);
        // Same RBAC, object by object.
        for kind in ["ClusterRole", "Role"] {
            let names = |objs: &[Value]| -> Vec<String> {
                let mut n: Vec<String> = objs
                    .iter()
                    .filter(|o| o["kind"] == kind)
                    .map(|o| name(o).to_string())
                    .collect();
                n.sort();
                n
            };
            assert_eq!(names(&h), names(&k), "{what}: {kind} names differ");
            for n in names(&h) {
                assert_eq!(
                    rule_set(find(&h, kind, &n)?),
                    rule_set(find(&k, kind, &n)?),
                    "{what}: {kind}/{n} rules differ"
                );
            }
        }
        for kind in ["ClusterRoleBinding", "RoleBinding"] {
            for o in h.iter().filter(|o| o["kind"] == kind) {
                let other = find(&k, kind, name(o))?;
                assert_eq!(
                    o["roleRef"],
                    other["roleRef"],
                    "{what}: {kind}/{} roleRef",
                    name(o)
                );
                assert_eq!(
                    o["subjects"],
                    other["subjects"],
                    "{what}: {kind}/{} subjects",
                    name(o)
                );
            }
        }
        let (hd, kd) = (
            find(&h, "Deployment", "gpu-ledger")?,
            find(&k, "Deployment", "gpu-ledger")?,
        );
        assert_eq!(
            pod_contract(hd),
            pod_contract(kd),
            "{what}: Deployment differs"
        );
        assert_eq!(
            hd["spec"]["strategy"], kd["spec"]["strategy"],
            "{what}: strategy"
        );
        let (hs, ks) = (
            find(&h, "Service", "gpu-ledger")?,
            find(&k, "Service", "gpu-ledger")?,
        );
        assert_eq!(hs["spec"], ks["spec"], "{what}: Service spec");
        let (hp, kp) = (
            find(&h, "PodDisruptionBudget", "gpu-ledger")?,
            find(&k, "PodDisruptionBudget", "gpu-ledger")?,
        );
        assert_eq!(hp["spec"], kp["spec"], "{what}: PDB spec");
    }
    Ok(())
}

// --------------------------------------------------------------------------------------------
// Real kube-apiserver (testkit tier A)
// --------------------------------------------------------------------------------------------

fn kubectl_apply(cp: &ControlPlane, yaml: &str, dry_run: bool) -> Result<String> {
    let mut c = cp.kubectl("admin")?;
    c.args([
        "apply",
        "--server-side",
        "--field-manager=deploy-test",
        "-f",
        "-",
    ]);
    if dry_run {
        c.arg("--dry-run=server");
    }
    let (_, stderr) = run_ok(c, Some(yaml))?;
    Ok(stderr)
}

async fn install_fixture_crds(cp: &ControlPlane) -> Result<()> {
    let mut c = cp.kubectl("admin")?;
    c.arg("apply")
        .arg("-f")
        .arg(root().join("tests/fixtures/crds"));
    run_ok(c, None)?;
    let mut c = cp.kubectl("admin")?;
    c.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
    run_ok(c, None)?;
    cp.install_notebook_crd().await?;
    // kubectl auth can-i resolves a resource through discovery: Kueue's kinds must be served.
    support::install_kueue_crds(cp);
    Ok(())
}

fn create_restricted_namespace(cp: &ControlPlane, ns: &str) -> Result<()> {
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    \
         pod-security.kubernetes.io/enforce: restricted\n    \
         pod-security.kubernetes.io/enforce-version: latest\n    \
         pod-security.kubernetes.io/warn: restricted\n"
    );
    kubectl_apply(cp, &yaml, false)?;
    Ok(())
}

/// `PodSecurity` admission judges pods, and tier A has no controller-manager to create them
/// from the workload: submit the workload's pod template as a Pod with `--dry-run=server`.
fn pod_from_template(w: &Value, ns: &str, pod_name: &str) -> Value {
    let mut labels = w["spec"]["template"]["metadata"]["labels"].clone();
    if w["kind"] == "StatefulSet" {
        labels["apps.kubernetes.io/pod-index"] = json!("0");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels},
        "spec": w["spec"]["template"]["spec"],
    })
}

fn pod_dry_run(cp: &ControlPlane, pod: &Value) -> Result<Output> {
    let mut c = cp.kubectl("admin")?;
    c.args(["create", "--dry-run=server", "-o", "name", "-f", "-"]);
    run(c, Some(&serde_json::to_string(pod)?))
}

fn assert_pod_admitted(cp: &ControlPlane, w: &Value, ns: &str) -> Result<()> {
    let pod = pod_from_template(w, ns, "psa-check");
    let out = pod_dry_run(cp, &pod)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "Pod Security 'restricted' rejected the {} pod template in {ns}:\n{stderr}",
        w["kind"]
    );
    ensure!(
        !stderr.contains("PodSecurity"),
        "PodSecurity warning: {stderr}"
    );
    Ok(())
}

/// Negative control: the same template made privileged is rejected, so the namespace really
/// enforces "restricted".
fn assert_restricted_enforced(cp: &ControlPlane, w: &Value, ns: &str) -> Result<()> {
    let mut bad = pod_from_template(w, ns, "psa-negative");
    bad["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
    bad["spec"]["containers"][0]["securityContext"]["capabilities"] = json!({"add": ["NET_ADMIN"]});
    let out = pod_dry_run(cp, &bad)?;
    ensure!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("violates PodSecurity"),
        "the restricted namespace admitted a privileged pod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `kubectl auth can-i` as the chart's `ServiceAccount` (admin impersonates it).
fn can_i(
    cp: &ControlPlane,
    sa_ns: &str,
    sa: &str,
    verb: &str,
    resource: &str,
    ns: Option<&str>,
) -> Result<bool> {
    let mut c = cp.kubectl("admin")?;
    // `res/sub` names a subresource (`can-i` would read it as TYPE/NAME); `res:name` one object.
    let (res, sub) = resource
        .split_once('/')
        .map_or((resource, None), |(r, s)| (r, Some(s)));
    let res = res.replacen(':', "/", 1);
    c.args([
        "auth",
        "can-i",
        verb,
        &res,
        &format!("--as=system:serviceaccount:{sa_ns}:{sa}"),
    ]);
    if let Some(s) = sub {
        c.arg(format!("--subresource={s}"));
    }
    match ns {
        Some(n) => c.args(["-n", n]),
        None => c.arg("--all-namespaces"),
    };
    let out = run(c, None)?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match (out.status.code(), stdout.as_str()) {
        (Some(0), "yes") => Ok(true),
        (Some(1), "no") => Ok(false),
        _ => bail!(
            "kubectl auth can-i {verb} {resource}: {:?} stdout={stdout:?} stderr={}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// (verb, resource, namespace (None = all), expected).
type Matrix<'a> = &'a [(&'a str, &'a str, Option<&'a str>, bool)];

fn check_matrix(cp: &ControlPlane, sa_ns: &str, sa: &str, m: Matrix<'_>) -> Result<()> {
    let mut wrong = Vec::new();
    for (verb, res, ns, want) in m {
        let got = can_i(cp, sa_ns, sa, verb, res, *ns)?;
        if got != *want {
            wrong.push(format!(
                "{sa_ns}/{sa} {verb} {res} in {}: got {got}, want {want}",
                ns.unwrap_or("<all>")
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "RBAC matrix mismatches:\n  {}",
        wrong.join("\n  ")
    );
    Ok(())
}

/// What every release may and may not do, culling or not. Each removed verb (the RBAC once
/// granted `get` on pods, nodes and resourcequotas and core `events`) is listed as denied.
fn read_matrix(ns: &'static str) -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
    vec![
        ("list", "pods", None, true),
        ("watch", "pods", None, true),
        ("list", "nodes", None, true),
        ("watch", "nodes", None, true),
        ("list", "resourcequotas", None, true),
        ("watch", "resourcequotas", None, true),
        ("list", "notebooks.kubeflow.org", None, true),
        ("watch", "notebooks.kubeflow.org", None, true),
        ("get", "statefulsets.apps", Some("team-a"), true),
        // Trimmed: nothing reads single pods, nodes or quotas.
        ("get", "pods", Some("team-a"), false),
        ("get", "nodes", None, false),
        ("get", "resourcequotas", Some("team-a"), false),
        ("get", "namespaces", None, false),
        ("watch", "namespaces", None, false),
        // Never: secrets, configmaps, writes to workloads, deleting notebooks.
        ("get", "secrets", Some("team-a"), false),
        ("list", "secrets", None, false),
        ("get", "secrets", Some(ns), false),
        ("list", "configmaps", None, false),
        ("list", "statefulsets.apps", None, false),
        ("delete", "pods", Some("team-a"), false),
        ("delete", "notebooks.kubeflow.org", Some("team-a"), false),
        ("update", "notebooks.kubeflow.org", Some("team-a"), false),
        (
            "patch",
            "notebooks.kubeflow.org/status",
            Some("team-a"),
            false,
        ),
        ("patch", "statefulsets.apps", Some("team-a"), false),
        ("create", "pods", Some("team-a"), false),
        ("create", "events", Some("team-a"), false),
        ("patch", "events", Some("team-a"), false),
    ]
}

/// Granted with culling on, for a release in `ns` culling in `team-a`.
fn culling_matrix(
    ns: &'static str,
) -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
    vec![
        ("get", "notebooks.kubeflow.org", Some("team-a"), true),
        ("patch", "notebooks.kubeflow.org", Some("team-a"), true),
        ("create", "events.events.k8s.io", Some("team-a"), true),
        ("patch", "events.events.k8s.io", Some("team-a"), true),
        ("create", "leases.coordination.k8s.io", Some(ns), true),
        (
            "get",
            "leases.coordination.k8s.io:gpu-ledger",
            Some(ns),
            true,
        ),
        (
            "update",
            "leases.coordination.k8s.io:gpu-ledger",
            Some(ns),
            true,
        ),
        ("get", "configmaps:gpu-ledger-cull", Some(ns), true),
        // The Lease is one name: no other Lease, no delete, no list or watch.
        (
            "get",
            "leases.coordination.k8s.io:kube-scheduler",
            Some(ns),
            false,
        ),
        (
            "update",
            "leases.coordination.k8s.io:other",
            Some(ns),
            false,
        ),
        (
            "delete",
            "leases.coordination.k8s.io:gpu-ledger",
            Some(ns),
            false,
        ),
        ("list", "leases.coordination.k8s.io", Some(ns), false),
        ("watch", "leases.coordination.k8s.io", Some(ns), false),
        // Core Events are not used (kube-runtime's Recorder writes events.k8s.io).
        ("create", "events", Some("team-a"), false),
        ("delete", "events.events.k8s.io", Some("team-a"), false),
        // The kill switch is one named ConfigMap: no listing, nothing elsewhere.
        ("get", "configmaps:other", Some(ns), false),
        ("list", "configmaps", Some(ns), false),
        ("get", "configmaps", Some("team-a"), false),
        (
            "create",
            "leases.coordination.k8s.io",
            Some("team-a"),
            false,
        ),
        (
            "create",
            "leases.coordination.k8s.io",
            Some("kube-system"),
            false,
        ),
        // No namespace selector set: no namespace reads at all.
        ("list", "namespaces", None, false),
    ]
}

/// Culling on (second release, own namespace): the write permissions appear, scoped to what
/// culling needs, and nothing leaks to the read-only release.
fn check_culling_on_release(cp: &ControlPlane, on: &str, on_ns: &'static str) -> Result<()> {
    // Culling on (second release, own namespace): the write permissions appear, scoped.
    kubectl_apply(cp, on, true)?;
    kubectl_apply(cp, on, false)?;
    assert_pod_admitted(
        cp,
        find(&docs(on)?, "Deployment", "gl-cull-gpu-ledger")?,
        on_ns,
    )?;
    let mut m = read_matrix(on_ns);
    m.extend(culling_matrix(on_ns));
    check_matrix(cp, on_ns, "gl-cull-gpu-ledger", &m)?;
    // Installing the culling release granted nothing to the read-only one.
    check_matrix(
        cp,
        NS,
        "gpu-ledger",
        &[
            ("patch", "notebooks.kubeflow.org", Some("team-a"), false),
            ("create", "leases.coordination.k8s.io", Some(NS), false),
        ],
    )?;

    Ok(())
}

/// `ledger.namespaces` / `culling.namespaces` (release `gl-ns`): reads in the watched namespaces
/// only, culling in team-a only, nodes still cluster-wide.
fn check_namespaced_release(cp: &ControlPlane, scoped: &str) -> Result<()> {
    kubectl_apply(cp, scoped, true)?;
    kubectl_apply(cp, scoped, false)?;
    check_matrix(
        cp,
        "gl-ns",
        "gl-ns-gpu-ledger",
        &[
            ("list", "pods", Some("team-a"), true),
            ("watch", "pods", Some("team-b"), true),
            ("list", "resourcequotas", Some("team-b"), true),
            ("list", "notebooks.kubeflow.org", Some("team-a"), true),
            ("get", "statefulsets.apps", Some("team-b"), true),
            ("list", "nodes", None, true),
            ("watch", "nodes", None, true),
            // DRA: claims per watched namespace; devices and classes are cluster-scoped.
            (
                "list",
                "resourceclaims.resource.k8s.io",
                Some("team-a"),
                true,
            ),
            (
                "watch",
                "resourceclaims.resource.k8s.io",
                Some("team-b"),
                true,
            ),
            ("list", "resourceclaims.resource.k8s.io", None, false),
            ("list", "resourceslices.resource.k8s.io", None, true),
            ("watch", "resourceslices.resource.k8s.io", None, true),
            ("list", "deviceclasses.resource.k8s.io", None, true),
            // Kueue: LocalQueues and Workloads per watched namespace; flavors and
            // ClusterQueues are cluster-scoped.
            ("list", "workloads.kueue.x-k8s.io", Some("team-a"), true),
            ("watch", "localqueues.kueue.x-k8s.io", Some("team-b"), true),
            ("list", "workloads.kueue.x-k8s.io", None, false),
            ("watch", "clusterqueues.kueue.x-k8s.io", None, true),
            ("list", "resourceflavors.kueue.x-k8s.io", None, true),
            ("list", "pods", None, false),
            ("watch", "pods", None, false),
            ("list", "pods", Some("team-c"), false),
            // dcgm-exporter's DaemonSet pods place GPUs on nodes (ledger.exporterNamespaces,
            // by default gpu-operator in a namespaced release): pods only.
            ("list", "pods", Some("gpu-operator"), true),
            ("watch", "pods", Some("gpu-operator"), true),
            ("list", "resourcequotas", Some("gpu-operator"), false),
            ("list", "notebooks.kubeflow.org", None, false),
            ("get", "statefulsets.apps", Some("team-c"), false),
            ("patch", "notebooks.kubeflow.org", Some("team-a"), true),
            ("get", "notebooks.kubeflow.org", Some("team-a"), true),
            ("create", "events.events.k8s.io", Some("team-a"), true),
            ("patch", "notebooks.kubeflow.org", Some("team-b"), false),
            ("create", "events.events.k8s.io", Some("team-b"), false),
            ("patch", "notebooks.kubeflow.org", None, false),
            (
                "update",
                "leases.coordination.k8s.io:gpu-ledger",
                Some("gl-ns"),
                true,
            ),
        ],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_installs_on_real_apiserver_with_rbac_matrix() -> Result<()> {
    // Render first: a broken chart fails fast, before a control plane is started.
    // showback on: the API server validates its CronJob (podFailurePolicy included).
    let full = [
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "networkPolicy.enabled=true",
        "showback.enabled=true",
    ];
    let off = helm_template(&full)?;
    let on_ns = "gl-cull";
    let mut on_sets = full.to_vec();
    on_sets.push("culling.mode=on");
    let on = helm_template_ns("gl-cull", on_ns, &on_sets)?;
    let sharded = helm_template_ns(
        "gl-shard",
        "gl-shard",
        &["sharding.totalShards=2", "culling.mode=dry-run"],
    )?;
    let scoped = helm_template_ns(
        "gl-ns",
        "gl-ns",
        &[
            "culling.mode=on",
            "ledger.namespaces={team-a,team-b}",
            "culling.namespaces={team-a}",
        ],
    )?;

    let (cp, _admin) = support::tier_a().await;
    install_fixture_crds(&cp).await?;
    for ns in [NS, on_ns, "gl-shard", "gl-ns"] {
        create_restricted_namespace(&cp, ns)?;
    }
    // gpu-operator: where dcgm-exporter's DaemonSet pods are read in a namespaced release.
    for ns in ["team-a", "team-b", "team-c", "gpu-operator"] {
        kubectl_apply(
            &cp,
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"),
            false,
        )?;
    }

    // Culling off: server-side dry-run, then for real; no Pod Security warnings for the
    // workload in a namespace that warns on "restricted".
    let stderr = kubectl_apply(&cp, &off, true)?;
    ensure!(!stderr.contains("PodSecurity"), "dry-run warned: {stderr}");
    let stderr = kubectl_apply(&cp, &off, false)?;
    ensure!(!stderr.contains("PodSecurity"), "apply warned: {stderr}");
    let off_objs = docs(&off)?;
    let mut get = cp.kubectl("admin")?;
    get.args([
        "-n",
        NS,
        "get",
        "deployment/gpu-ledger",
        "servicemonitor/gpu-ledger",
        "prometheusrule/gpu-ledger",
        "configmap/gpu-ledger-dashboard",
        "pdb/gpu-ledger",
        "networkpolicy/gpu-ledger",
        "cronjob/gpu-ledger-showback",
        "-o",
        "name",
    ]);
    run_ok(get, None)?;

    // Pod Security: the pod template is admitted under "restricted" ...
    let deploy = find(&off_objs, "Deployment", "gpu-ledger")?;
    assert_pod_admitted(&cp, deploy, NS)?;
    // ... and the namespace really enforces it (negative control).
    assert_restricted_enforced(&cp, deploy, NS)?;

    let mut m = read_matrix(NS);
    m.extend([
        ("patch", "notebooks.kubeflow.org", Some("team-a"), false),
        // Only the culler re-reads a single Notebook.
        ("get", "notebooks.kubeflow.org", Some("team-a"), false),
        ("create", "events.events.k8s.io", Some("team-a"), false),
        ("create", "leases.coordination.k8s.io", Some(NS), false),
        ("get", "leases.coordination.k8s.io", Some(NS), false),
        ("update", "leases.coordination.k8s.io", Some(NS), false),
    ]);
    check_matrix(&cp, NS, "gpu-ledger", &m)?;

    check_culling_on_release(&cp, &on, on_ns)?;

    // Sharded StatefulSet: accepted by the API server and by Pod Security; one Lease per shard.
    kubectl_apply(&cp, &sharded, true)?;
    kubectl_apply(&cp, &sharded, false)?;
    assert_pod_admitted(
        &cp,
        find(&docs(&sharded)?, "StatefulSet", "gl-shard-gpu-ledger")?,
        "gl-shard",
    )?;
    check_matrix(
        &cp,
        "gl-shard",
        "gl-shard-gpu-ledger",
        &[
            (
                "update",
                "leases.coordination.k8s.io:gpu-ledger-0",
                Some("gl-shard"),
                true,
            ),
            (
                "update",
                "leases.coordination.k8s.io:gpu-ledger-1",
                Some("gl-shard"),
                true,
            ),
            (
                "update",
                "leases.coordination.k8s.io:gpu-ledger-2",
                Some("gl-shard"),
                false,
            ),
            (
                "update",
                "leases.coordination.k8s.io:gpu-ledger",
                Some("gl-shard"),
                false,
            ),
        ],
    )?;

    check_namespaced_release(&cp, &scoped)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_installs_on_real_apiserver() -> Result<()> {
    let base = kustomize("deploy/kustomize/base")?;
    let overlay = kustomize("deploy/kustomize/overlays/culling")?;
    let (cp, _admin) = support::tier_a().await;
    // `kubectl auth can-i` resolves notebooks.kubeflow.org through discovery.
    cp.install_notebook_crd().await?;
    // The base carries its own Namespace (restricted); the dry-run of namespaced objects needs
    // it to exist, so apply the Namespace first.
    let base_objs = docs(&base)?;
    let ns_obj = find(&base_objs, "Namespace", NS)?;
    assert_eq!(
        ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    kubectl_apply(&cp, &serde_json::to_string(ns_obj)?, false)?;
    let stderr = kubectl_apply(&cp, &base, true)?;
    ensure!(!stderr.contains("PodSecurity"), "{stderr}");
    kubectl_apply(&cp, &base, false)?;
    assert_pod_admitted(&cp, find(&base_objs, "Deployment", "gpu-ledger")?, NS)?;
    kubectl_apply(
        &cp,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n",
        false,
    )?;
    let mut m = read_matrix(NS);
    m.extend([
        ("patch", "notebooks.kubeflow.org", Some("team-a"), false),
        ("get", "notebooks.kubeflow.org", Some("team-a"), false),
        ("create", "leases.coordination.k8s.io", Some(NS), false),
    ]);
    check_matrix(&cp, NS, "gpu-ledger", &m)?;

    kubectl_apply(&cp, &overlay, true)?;
    kubectl_apply(&cp, &overlay, false)?;
    let mut m = read_matrix(NS);
    m.extend(culling_matrix(NS));
    check_matrix(&cp, NS, "gpu-ledger", &m)?;
    Ok(())
}

// --------------------------------------------------------------------------------------------
// Chart conventions: values schema, PrometheusRule where served, PDB with replicas, kubeVersion,
// generated README
// --------------------------------------------------------------------------------------------

#[test]
fn helm_template_showback_cronjob() -> Result<()> {
    let objs = docs(&helm_template(&[])?)?;
    ensure!(
        !has_kind(&objs, "CronJob"),
        "showback is off by default: {:?}",
        kind_names(&objs)
    );
    let objs = docs(&helm_template(&[
        "showback.enabled=true",
        "showback.groupByLabel=team",
        "showback.price=A100=2.10",
        "prometheus.selector=cluster=\"prod\"",
    ])?)?;
    let cj = find(&objs, "CronJob", "gpu-ledger-showback")?;
    assert_eq!(cj["spec"]["schedule"], "0 6 1 * *");
    assert_eq!(cj["spec"]["concurrencyPolicy"], "Forbid");
    let job = &cj["spec"]["jobTemplate"];
    let pod = &job["spec"]["template"]["spec"];
    let sc = &container(job)["securityContext"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container(job)["resources"]["limits"]["memory"], "256Mi");
    let a = args(job);
    for want in [
        "showback",
        "--month=last",
        "--group-by-label=team",
        "--price=A100=2.10",
        "--prometheus-selector=cluster=\"prod\"",
        "--output=csv",
        "--min-coverage=95%",
    ] {
        ensure!(a.iter().any(|x| x == want), "{want} missing in {a:?}");
    }
    ensure!(!a.iter().any(|x| x.starts_with("--output-file")), "{a:?}");
    assert_eq!(pod["restartPolicy"], "Never");
    // A partial or unknown month (4) and a configuration error (2) fail the Job at once; only a
    // Prometheus that did not answer (3) is retried.
    assert_eq!(
        job["spec"]["podFailurePolicy"]["rules"],
        json!([{"action": "FailJob", "onExitCodes": {
            "containerName": "showback", "operator": "In", "values": [2, 4]}}])
    );
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "showback reads only Prometheus: no API token"
    );
    // The Service, PDB and ServiceMonitor select the server's pods: never a showback pod.
    let service = find(&objs, "Service", "gpu-ledger")?;
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    let selected = service["spec"]["selector"]
        .as_object()
        .context("service selector")?
        .iter()
        .all(|(k, v)| &labels[k] == v);
    ensure!(!selected, "the Service selects showback pods: {labels}");

    // A deliver container: showback writes the file first, as an init container.
    let objs = docs(&helm_template(&[
        "showback.enabled=true",
        "showback.deliver.image=curlimages/curl:8.11.1",
        "showback.deliver.command={sh,-c,cat $SHOWBACK_FILE}",
    ])?)?;
    let pod = &find(&objs, "CronJob", "gpu-ledger-showback")?["spec"]["jobTemplate"]["spec"]["template"]
        ["spec"];
    let init = &pod["initContainers"][0];
    ensure!(
        init["args"].as_array().is_some_and(|a| a
            .iter()
            .any(|x| x == "--output-file=/showback/showback.csv")),
        "{init}"
    );
    assert_eq!(pod["containers"][0]["name"], "deliver");
    assert_eq!(
        pod["containers"][0]["env"][0]["value"],
        "/showback/showback.csv"
    );
    Ok(())
}

/// `helm <verb> … --set`s: Err with helm's message when it refuses.
fn helm_with(verb: &str, sets: &[&str], set_json: &[&str]) -> Result<String> {
    let mut c = helm();
    c.arg(verb);
    if verb == "template" {
        c.args(["gpu-ledger", CHART, "--kube-version", "v1.36.3"]);
    } else {
        c.args(["--strict", CHART]);
    }
    for s in sets {
        c.args(["--set", s]);
    }
    for s in set_json {
        c.args(["--set-json", s]);
    }
    let out = run(c, None)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        bail!("{text}")
    }
}

#[test]
fn values_schema_rejects_bad_values_at_lint_and_template() -> Result<()> {
    // (--set, --set-json, what helm's message must name)
    let bad: &[(&[&str], &[&str], &str)] = &[
        (&["ledger.window=10"], &[], "/ledger/window"),
        (&["ledger.window=10x"], &[], "/ledger/window"),
        (&["culling.idleAfter=two hours"], &[], "/culling/idleAfter"),
        (&["logFormat=xml"], &[], "/logFormat"),
        (&["culling.mode=maybe"], &[], "/culling/mode"),
        (
            &["prometheus.labelScheme=both"],
            &[],
            "/prometheus/labelScheme",
        ),
        (&["ledger.windw=10m"], &[], "windw"),
        (&["cullling.mode=on"], &[], "cullling"),
        (&["ledger.idleThreshold=5"], &[], "/ledger/idleThreshold"),
        (&["replicaCount=-1"], &[], "/replicaCount"),
        (
            &["prometheusRule.enabled=sometimes"],
            &[],
            "/prometheusRule/enabled",
        ),
        (
            &["serviceMonitor.interval=30"],
            &[],
            "/serviceMonitor/interval",
        ),
        (
            &[],
            &["ledger.namespaces=[\"Team_ML\"]"],
            "/ledger/namespaces",
        ),
    ];
    for (sets, json_sets, names) in bad {
        for verb in ["lint", "template"] {
            let err = helm_with(verb, sets, json_sets)
                .err()
                .with_context(|| format!("helm {verb} accepted {sets:?} {json_sets:?}"))?
                .to_string();
            ensure!(
                err.contains("schema") && err.contains(names),
                "helm {verb} {sets:?} {json_sets:?}: message does not name {names}:\n{err}"
            );
        }
    }
    // Good values pass, including the forms users write.
    helm_with(
        "lint",
        &[
            "ledger.window=1h30m",
            "culling.mode=dry-run",
            "prometheusRule.enabled=true",
            "serviceMonitor.interval=1m",
        ],
        &[
            "culling.mode=false",
            "ledger.namespaces=[\"team-ml\",\"research\"]",
        ],
    )?;
    Ok(())
}

/// Dotted paths of every key in a values tree (maps only; lists and scalars are leaves).
fn value_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, child) in m {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            if child.as_object().is_some_and(|c| !c.is_empty()) {
                value_paths(child, &path, out);
            }
        }
    }
}

/// Dotted paths the schema declares, each with whether that object rejects unknown keys.
fn schema_paths(s: &Value, prefix: &str, out: &mut Vec<(String, bool)>) {
    if let Some(props) = s["properties"].as_object() {
        for (k, child) in props {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push((path.clone(), child["additionalProperties"] == false));
            schema_paths(child, &path, out);
        }
    }
}

#[test]
fn values_schema_and_values_yaml_name_the_same_keys() -> Result<()> {
    let chart = root().join(CHART);
    let values: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart.join("values.yaml"))?)?;
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json"))?)?;
    ensure!(
        schema["additionalProperties"] == false,
        "top level must reject typos"
    );
    let mut in_values = Vec::new();
    value_paths(&values, "", &mut in_values);
    let mut in_schema = Vec::new();
    schema_paths(&schema, "", &mut in_schema);
    // A key is covered when declared, or inside an object the schema leaves open (Kubernetes
    // objects such as resources; sections their own templates check).
    let covered = |p: &str| {
        in_schema
            .iter()
            .any(|(q, closed)| q == p || (!closed && p.starts_with(&format!("{q}."))))
    };
    for p in &in_values {
        ensure!(
            covered(p),
            "values.yaml has {p}, values.schema.json does not declare it"
        );
    }
    // `global` is Helm's own key, filled by a parent chart when this one is a subchart; it has
    // no default of ours.
    for (p, _) in in_schema.iter().filter(|(p, _)| p != "global") {
        ensure!(
            in_values.contains(p),
            "values.schema.json declares {p}, values.yaml has no default for it"
        );
    }
    Ok(())
}

/// Role `<fullname>-kueue-config` in kueue-system: Kueue's manager ConfigMap, that one only.
const KUEUE_CONFIG_RULES: &[(&str, &str, &str)] = &[("", "configmaps/kueue-manager-config", "get")];

/// Issue 37 item 4: the Role on Kueue's ConfigMap (its deviceClassMappings) is rendered where
/// Kueue is served (its namespace may not exist otherwise), in that namespace, bound to the
/// release's ServiceAccount, with the rules of the kustomize component; a name other than the
/// default is passed as the flag, an empty one reads and grants nothing.
#[test]
fn kueue_config_map_role_where_kueue_is_served() -> Result<()> {
    let served = "kueue.x-k8s.io/v1beta2/ClusterQueue";
    ensure!(
        find(&render_with_args(&[])?, "Role", "gpu-ledger-kueue-config").is_err(),
        "no Role where Kueue is not served"
    );
    let objs = render_with_args(&["--api-versions", served])?;
    let role = find(&objs, "Role", "gpu-ledger-kueue-config")?;
    assert_eq!(role["metadata"]["namespace"], "kueue-system");
    assert_eq!(rule_set(role), triples(KUEUE_CONFIG_RULES));
    let binding = find(&objs, "RoleBinding", "gpu-ledger-kueue-config")?;
    assert_eq!(binding["metadata"]["namespace"], "kueue-system");
    assert_eq!(subjects(binding), [format!("{NS}/gpu-ledger")]);
    assert!(
        !args(find(&objs, "Deployment", "gpu-ledger")?)
            .iter()
            .any(|a| a.starts_with("--kueue-config-map")),
        "the binary's default needs no flag"
    );
    let objs = render_with_args(&[
        "--api-versions",
        served,
        "--set",
        "ledger.kueueConfigMap.namespace=queues",
        "--set",
        "ledger.kueueConfigMap.name=kueue-config",
    ])?;
    let role = find(&objs, "Role", "gpu-ledger-kueue-config")?;
    assert_eq!(role["metadata"]["namespace"], "queues");
    assert_eq!(
        rule_set(role),
        triples(&[("", "configmaps/kueue-config", "get")])
    );
    assert!(
        args(find(&objs, "Deployment", "gpu-ledger")?)
            .contains(&"--kueue-config-map=queues/kueue-config".to_string())
    );
    let objs = render_with_args(&[
        "--api-versions",
        served,
        "--set",
        "ledger.kueueConfigMap.name=",
    ])?;
    assert!(find(&objs, "Role", "gpu-ledger-kueue-config").is_err());
    assert!(
        args(find(&objs, "Deployment", "gpu-ledger")?).contains(&"--kueue-config-map=".to_string())
    );
    // The kustomize component grants the same, in kueue-system.
    let k = kustomize_base_with_component("kueue")?;
    let role = find(&k, "Role", "gpu-ledger-kueue-config")?;
    assert_eq!(role["metadata"]["namespace"], "kueue-system");
    assert_eq!(rule_set(role), triples(KUEUE_CONFIG_RULES));
    let binding = find(&k, "RoleBinding", "gpu-ledger-kueue-config")?;
    assert_eq!(subjects(binding), [format!("{NS}/gpu-ledger")]);
    Ok(())
}

#[test]
fn prometheus_rule_by_default_where_the_crd_is_served() -> Result<()> {
    let served = "monitoring.coreos.com/v1/PrometheusRule";
    ensure!(
        !has_kind(&render_with_args(&[])?, "PrometheusRule"),
        "no PrometheusRule where the API is not served"
    );
    let objs = render_with_args(&["--api-versions", served])?;
    let pr = find(&objs, "PrometheusRule", "gpu-ledger")?;
    let rules = serde_json::to_string(&pr["spec"])?;
    // The dashboard reads the recording rules: they come with the default install.
    let dashboard = std::fs::read_to_string(root().join("dashboards/gpu-ledger.json"))?;
    for record in pr["spec"]["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["record"].as_str().map(str::to_string))
    {
        ensure!(rules.contains(&record));
        let _ = dashboard.contains(&record);
    }
    ensure!(
        !has_kind(
            &render_with_args(&[
                "--api-versions",
                served,
                "--set",
                "prometheusRule.enabled=false"
            ])?,
            "PrometheusRule"
        ),
        "false means never"
    );
    ensure!(
        has_kind(
            &render_with_args(&["--set", "prometheusRule.enabled=true"])?,
            "PrometheusRule"
        ),
        "true means always"
    );
    Ok(())
}

#[test]
fn pod_disruption_budget_only_with_more_than_one_replica() -> Result<()> {
    ensure!(
        has_kind(&docs(&helm_template(&[])?)?, "PodDisruptionBudget"),
        "2 replicas (default)"
    );
    ensure!(
        !has_kind(
            &docs(&helm_template(&["replicaCount=1"])?)?,
            "PodDisruptionBudget"
        ),
        "a PDB of minAvailable 1 over one replica would block every drain"
    );
    ensure!(
        has_kind(
            &docs(&helm_template(&[
                "replicaCount=1",
                "sharding.totalShards=3"
            ])?)?,
            "PodDisruptionBudget"
        ),
        "three shards are three replicas"
    );
    ensure!(!has_kind(
        &docs(&helm_template(&["podDisruptionBudget.enabled=false"])?)?,
        "PodDisruptionBudget"
    ));
    Ok(())
}

#[test]
fn chart_declares_its_kubernetes_versions() -> Result<()> {
    let chart: Value = serde_norway::from_str(&std::fs::read_to_string(
        root().join(CHART).join("Chart.yaml"),
    )?)?;
    ensure!(chart["kubeVersion"] == ">=1.28.0-0", "{chart}");
    let mut c = helm();
    c.args(["template", "gpu-ledger", CHART, "--kube-version", "v1.27.9"]);
    let out = run(c, None)?;
    ensure!(!out.status.success(), "1.27 is refused");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("kubeVersion"));
    let mut c = helm();
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--kube-version",
        "v1.30.4-eks-a737599",
    ]);
    run_ok(c, None)?;
    Ok(())
}

#[test]
fn chart_readme_is_generated_from_values() -> Result<()> {
    let mut c = Command::new(root().join("scripts/chart-readme.sh"));
    c.arg("--check");
    run_ok(c, None)
        .context("deploy/helm/gpu-ledger/README.md is stale: run scripts/chart-readme.sh")?;
    let readme = std::fs::read_to_string(root().join(CHART).join("README.md"))?;
    for key in [
        "`ledger.window`",
        "`culling.mode`",
        "`prometheusRule.enabled`",
        "`podDisruptionBudget.enabled`",
    ] {
        ensure!(readme.contains(key), "README lacks {key}");
    }
    Ok(())
}

#[test]
fn license_is_the_apache_2_text() -> Result<()> {
    let license = std::fs::read_to_string(root().join("LICENSE")).context("LICENSE at the root")?;
    ensure!(license.contains("Apache License") && license.contains("Version 2.0, January 2004"));
    ensure!(license.contains("END OF TERMS AND CONDITIONS") && license.contains("APPENDIX"));
    let cargo = std::fs::read_to_string(root().join("Cargo.toml"))?;
    ensure!(cargo.contains("license = \"Apache-2.0\""));
    Ok(())
}

/// Issue 36 item 17: the chart works as a subchart. Helm hands every subchart the parent's
/// `global` values; a schema that refuses unknown top-level keys refused `global` too, so no
/// umbrella chart could include gpu-ledger. A parent chart with `global` set and the chart as
/// its dependency must lint and render, with the parent's values for gpu-ledger applied.
#[test]
fn helm_chart_works_as_a_subchart_with_global_values() -> Result<()> {
    let parent = tempfile::tempdir()?;
    std::fs::write(
        parent.path().join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 0.1.0\n\
         dependencies:\n- name: gpu-ledger\n  version: \">=0.0.0-0\"\n",
    )?;
    std::fs::write(
        parent.path().join("values.yaml"),
        "global:\n  imageRegistry: registry.example.internal\n  labels:\n    team: platform\n\
         gpu-ledger:\n  prometheus:\n    url: http://prometheus.monitoring:9090\n",
    )?;
    std::fs::create_dir(parent.path().join("charts"))?;
    let mut cp = Command::new("cp");
    cp.arg("-r")
        .arg(root().join(CHART))
        .arg(parent.path().join("charts/gpu-ledger"));
    run_ok(cp, None)?;
    let mut c = helm();
    c.args(["lint", "--strict"]).arg(parent.path());
    run_ok(c, None)?;
    let mut c = helm();
    c.args(["template", "platform"]).arg(parent.path()).args([
        "--namespace",
        NS,
        "--kube-version",
        "v1.36.3",
    ]);
    let objs = docs(&run_ok(c, None)?.0)?;
    let deployment = objs
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .context("the subchart's Deployment")?;
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    ensure!(
        args.contains("http://prometheus.monitoring:9090"),
        "the parent's values reach the subchart: {args}"
    );
    Ok(())
}
