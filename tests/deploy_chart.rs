//! The Helm chart (`deploy/helm/gpu-ledger`) and the kustomize manifests (`deploy/kustomize`):
//! `helm lint`, `helm template` with culling off / dry-run / on and sharding, `kubectl
//! kustomize`, helm-vs-kustomize sync, and installs on a REAL kube-apiserver (testkit tier A):
//! server-side apply (dry-run, then for real), Pod Security "restricted" admission of the pod
//! template, and the `ServiceAccount`'s RBAC matrix with culling off and on.
//!
//! helm and kubectl come from `scripts/build-test-cluster.sh` (via `KUBEBUILDER_ASSETS`,
//! `TEST_ASSET_HELM` / `TEST_ASSET_KUBECTL` or the build cache). Missing binaries fail the tests
//! with a message naming that script: nothing is skipped.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail, ensure};
use gpu_ledger_testkit::{ControlPlane, Tier};
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

fn run(mut cmd: Command, stdin: Option<&str>) -> Result<Output> {
    let desc = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawning {desc}"))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(input.as_bytes())?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("waiting for {desc}"))
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

fn helm_template(sets: &[&str]) -> Result<String> {
    helm_template_ns("gpu-ledger", NS, sets)
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

/// Rules of a ClusterRole/Role as sorted (group, resource, verb) triples.
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
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                for v in strs(&r["verbs"]) {
                    set.push((g.clone(), res.clone(), v));
                }
            }
        }
    }
    set.sort();
    set.dedup();
    set
}

/// `resourceNames` of the role's rules on `resource` (empty: every object of that resource).
fn resource_names(role: &Value, resource: &str) -> Vec<String> {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == resource))
        })
        .flat_map(|r| {
            r["resourceNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string))
        })
        .collect()
}

fn triples(t: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = t
        .iter()
        .map(|(a, b, c)| ((*a).to_string(), (*b).to_string(), (*c).to_string()))
        .collect();
    v.sort();
    v
}

const READ_ONLY_RULES: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "resourcequotas", "get"),
    ("", "resourcequotas", "list"),
    ("", "resourcequotas", "watch"),
    ("apps", "statefulsets", "get"),
    ("kubeflow.org", "notebooks", "get"),
    ("kubeflow.org", "notebooks", "list"),
    ("kubeflow.org", "notebooks", "watch"),
    ("resource.k8s.io", "deviceclasses", "list"),
    ("resource.k8s.io", "deviceclasses", "watch"),
    ("resource.k8s.io", "resourceclaims", "list"),
    ("resource.k8s.io", "resourceclaims", "watch"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
];

const CULLER_RULES: &[(&str, &str, &str)] = &[
    ("", "events", "create"),
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("kubeflow.org", "notebooks", "patch"),
];

/// The leases Role, plus `get` on the kill-switch ConfigMap (by name: `resource_names` checks it).
const LEASE_RULES: &[(&str, &str, &str)] = &[
    ("", "configmaps", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "update"),
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
        "prometheus.bearerToken.secretName=prom-token",
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
        1,
        "{kinds:?}"
    );
    assert_eq!(
        rule_set(find(&objs, "ClusterRole", "gpu-ledger")?),
        triples(READ_ONLY_RULES)
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
        assert_eq!(resource_names(role, "configmaps"), ["gpu-ledger-cull"]);
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
    assert!(!rule_set(role).iter().any(|(_, res, _)| res == "configmaps"));
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
        "--set",
        "culling.mode=maybe",
    ]);
    let out = run(c, None)?;
    assert!(
        !out.status.success(),
        "culling.mode=maybe must fail the render"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("culling.mode must be one of"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let crb = find(
        &objs,
        "ClusterRoleBinding",
        "gpu-ledger-cluster-monitoring-view",
    )?;
    assert_eq!(crb["roleRef"]["name"], "cluster-monitoring-view");
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
        1
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
    assert_eq!(resource_names(role, "configmaps"), ["gpu-ledger-cull"]);
    find(&cull, "RoleBinding", "gpu-ledger-leader-election")?;
    find(&cull, "ClusterRoleBinding", "gpu-ledger-culler")?;
    assert!(args(find(&cull, "Deployment", "gpu-ledger")?).contains(&"--cull=dry-run".to_string()));
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
    // `res/sub` names a subresource (`can-i` would read it as TYPE/NAME).
    let (res, sub) = resource
        .split_once('/')
        .map_or((resource, None), |(r, s)| (r, Some(s)));
    c.args([
        "auth",
        "can-i",
        verb,
        res,
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

fn read_matrix(ns: &'static str) -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
    vec![
        ("list", "pods", None, true),
        ("watch", "pods", None, true),
        ("get", "pods", Some("team-a"), true),
        ("list", "nodes", None, true),
        ("watch", "nodes", None, true),
        ("list", "resourcequotas", None, true),
        ("watch", "resourcequotas", None, true),
        ("list", "notebooks.kubeflow.org", None, true),
        ("watch", "notebooks.kubeflow.org", None, true),
        ("get", "notebooks.kubeflow.org", Some("team-a"), true),
        ("get", "statefulsets.apps", Some("team-a"), true),
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
    m.extend([
        ("patch", "notebooks.kubeflow.org", Some("team-a"), true),
        ("create", "events", Some("team-a"), true),
        ("patch", "events", Some("team-a"), true),
        ("create", "events.events.k8s.io", Some("team-a"), true),
        ("create", "leases.coordination.k8s.io", Some(on_ns), true),
        ("get", "leases.coordination.k8s.io", Some(on_ns), true),
        ("update", "leases.coordination.k8s.io", Some(on_ns), true),
        ("delete", "leases.coordination.k8s.io", Some(on_ns), false),
        // The kill switch is one named ConfigMap: no listing, nothing elsewhere.
        ("list", "configmaps", Some(on_ns), false),
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
    ]);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_installs_on_real_apiserver_with_rbac_matrix() -> Result<()> {
    // Render first: a broken chart fails fast, before a control plane is started.
    let full = [
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "networkPolicy.enabled=true",
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

    let cp = ControlPlane::start(Tier::A).await?;
    install_fixture_crds(&cp).await?;
    for ns in [NS, on_ns, "gl-shard"] {
        create_restricted_namespace(&cp, ns)?;
    }
    kubectl_apply(
        &cp,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n",
        false,
    )?;

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
        ("create", "events", Some("team-a"), false),
        ("create", "events.events.k8s.io", Some("team-a"), false),
        ("create", "leases.coordination.k8s.io", Some(NS), false),
        ("get", "leases.coordination.k8s.io", Some(NS), false),
        ("update", "leases.coordination.k8s.io", Some(NS), false),
    ]);
    check_matrix(&cp, NS, "gpu-ledger", &m)?;

    check_culling_on_release(&cp, &on, on_ns)?;

    // Sharded StatefulSet: accepted by the API server and by Pod Security.
    kubectl_apply(&cp, &sharded, true)?;
    kubectl_apply(&cp, &sharded, false)?;
    assert_pod_admitted(
        &cp,
        find(&docs(&sharded)?, "StatefulSet", "gl-shard-gpu-ledger")?,
        "gl-shard",
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_installs_on_real_apiserver() -> Result<()> {
    let base = kustomize("deploy/kustomize/base")?;
    let overlay = kustomize("deploy/kustomize/overlays/culling")?;
    let cp = ControlPlane::start(Tier::A).await?;
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
        ("create", "leases.coordination.k8s.io", Some(NS), false),
    ]);
    check_matrix(&cp, NS, "gpu-ledger", &m)?;

    kubectl_apply(&cp, &overlay, true)?;
    kubectl_apply(&cp, &overlay, false)?;
    check_matrix(
        &cp,
        NS,
        "gpu-ledger",
        &[
            ("patch", "notebooks.kubeflow.org", Some("team-a"), true),
            ("create", "events", Some("team-a"), true),
            ("create", "leases.coordination.k8s.io", Some(NS), true),
            ("update", "leases.coordination.k8s.io", Some(NS), true),
            ("get", "secrets", Some("team-a"), false),
            ("delete", "notebooks.kubeflow.org", Some("team-a"), false),
        ],
    )?;
    Ok(())
}
