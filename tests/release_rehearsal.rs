//! The release, rehearsed with real parts where this machine can run them
//! (.github/workflows/release.yml does the rest; docs/testing.md, "Release rehearsal"):
//!
//! - Debian's `buildah` (vfs storage, chroot isolation: no daemon, no network) builds an OCI
//!   image `FROM scratch` holding the gpu-ledger binary and the shared libraries `ldd` names,
//!   and `buildah run` executes `gpu-ledger --version` inside it;
//! - Debian's `docker-registry` serves on loopback; `buildah push` the image and `helm push` the
//!   packaged chart to it;
//! - `helm install oci://127.0.0.1:PORT/charts/gpu-ledger` on the real kube-apiserver (testkit
//!   tier A, with the Prometheus Operator CRDs) renders and applies the chart with the rehearsed
//!   image reference, and the kube-prometheus-stack defaults come with it.
//!
//! Not rehearsed: the base image pull (no internet), multi-arch (one architecture here), the
//! cosign signature and the SBOM (need OIDC and BuildKit), and a `--release` build (the test
//! build's binary is packed, stripped, to keep the cold test run short).
//!
//! Also here: the chart rendered with kube-prometheus-stack's default selectors, proving its
//! Prometheus would load the ServiceMonitor and the rules and its Grafana the dashboard.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gpu_ledger_testkit::process::{ChildGuard, run, run_ok};
use gpu_ledger_testkit::util::{free_port, poll_until};
use serde::Deserialize as _;
use serde_json::Value;

const CHART: &str = "deploy/helm/gpu-ledger";
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Helm release name kube-prometheus-stack is installed under in its own README, and so
/// the value of the `release` label its Prometheus selects by default.
const STACK_RELEASE: &str = "kube-prometheus-stack";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A tool the rehearsal needs, or a loud failure saying how to get it (never a skip).
fn tool(name: &str, install: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!("`{name}` is not on PATH: the release rehearsal needs it ({install})")
        })
}

fn helm(home: &Path) -> Result<Command> {
    let mut c = Command::new(gpu_ledger_testkit::binary("helm")?);
    c.current_dir(root())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    Ok(c)
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

fn find<'a>(objs: &'a [Value], kind: &str) -> Result<&'a Value> {
    let kinds: Vec<_> = objs.iter().map(|o| o["kind"].clone()).collect();
    objs.iter()
        .find(|o| o["kind"] == kind)
        .with_context(|| format!("no {kind} among {kinds:?}"))
}

/// `matchLabels` semantics: every pair of the selector is among the labels.
fn selects(match_labels: &BTreeMap<&str, &str>, labels: &Value) -> bool {
    match_labels
        .iter()
        .all(|(k, v)| labels.get(*k).and_then(Value::as_str) == Some(*v))
}

// --------------------------------------------------------------------------------------------
// The image: buildah, FROM scratch
// --------------------------------------------------------------------------------------------

/// `buildah` with its own storage under `dir`: vfs (no overlay mount needed) and nothing shared
/// with any other image store on the machine.
fn buildah(dir: &Path) -> Result<Command> {
    let mut c = Command::new(tool(
        "buildah",
        "apt-get install --no-install-recommends buildah",
    )?);
    c.arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args(["--storage-driver", "vfs"]);
    Ok(c)
}

/// Shared libraries the binary loads, as `ldd` resolves them (the vDSO has no file).
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let mut c = Command::new(tool("ldd", "apt-get install libc-bin")?);
    c.arg(bin);
    let out = run_ok(c, None)?;
    let mut libs = Vec::new();
    for line in out.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    ensure!(
        libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
        "ldd named no libc for {}: {out}",
        bin.display()
    );
    Ok(libs)
}

/// Builds `localhost/gpu-ledger:rehearsal` from the test build's binary, stripped, and the
/// libraries it links; returns the image name.
fn build_image(dir: &Path) -> Result<String> {
    let rootfs = dir.join("rootfs");
    let bin_dir = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin_dir)?;
    let bin = bin_dir.join("gpu-ledger");
    std::fs::copy(env!("CARGO_BIN_EXE_gpu-ledger"), &bin)?;
    // What [profile.release] strip = true does for the shipped binary.
    let mut c = Command::new(tool("strip", "apt-get install binutils")?);
    c.arg(&bin);
    run_ok(c, None)?;
    for lib in shared_libraries(&bin)? {
        let rel = lib.strip_prefix("/").context("absolute library path")?;
        let to = rootfs.join(rel);
        std::fs::create_dir_all(to.parent().context("library directory")?)?;
        // Follow symlinks: the image holds the file the loader opens under that name.
        std::fs::copy(&lib, &to).with_context(|| format!("copying {}", lib.display()))?;
    }

    let image = "localhost/gpu-ledger:rehearsal".to_string();
    let mut c = buildah(dir)?;
    c.args(["from", "scratch"]);
    let ctr = run_ok(c, None)?.trim().to_string();
    let mut c = buildah(dir)?;
    c.args(["copy", ctr.as_str()])
        .arg(format!("{}/", rootfs.display()))
        .arg("/");
    run_ok(c, None)?;
    // The Dockerfile's runtime settings: entrypoint, default command, distroless' nonroot user,
    // the allocator setting, the OCI labels.
    let mut c = buildah(dir)?;
    c.args([
        "config",
        "--entrypoint",
        r#"["/usr/local/bin/gpu-ledger"]"#,
        "--cmd",
        "serve",
        "--user",
        "65532:65532",
        "--env",
        "MIMALLOC_PURGE_DELAY=0",
        "--port",
        "8080",
        "--label",
        "org.opencontainers.image.title=gpu-ledger",
        "--label",
        &format!("org.opencontainers.image.version={VERSION}"),
        "--label",
        "org.opencontainers.image.licenses=Apache-2.0",
        ctr.as_str(),
    ]);
    run_ok(c, None)?;
    let mut c = buildah(dir)?;
    c.args(["commit", "--rm", ctr.as_str(), image.as_str()]);
    run_ok(c, None)?;
    Ok(image)
}

/// `buildah run` the committed image's binary: what the Deployment's container would start.
fn version_inside(dir: &Path, image: &str) -> Result<String> {
    let mut c = buildah(dir)?;
    c.args(["from", image]);
    let ctr = run_ok(c, None)?.trim().to_string();
    let mut c = buildah(dir)?;
    c.args([
        "run",
        "--isolation",
        "chroot",
        ctr.as_str(),
        "--",
        "/usr/local/bin/gpu-ledger",
        "--version",
    ]);
    let out = run_ok(c, None);
    let mut rm = buildah(dir)?;
    rm.args(["rm", ctr.as_str()]);
    run_ok(rm, None)?;
    out
}

// --------------------------------------------------------------------------------------------
// The registry: Debian's docker-registry on loopback
// --------------------------------------------------------------------------------------------

struct Registry {
    _guard: ChildGuard,
    addr: String,
}

/// Starts docker-registry on a free loopback port (again on another port when the probed one
/// was taken before the registry bound it) and waits until `/v2/` answers.
async fn start_registry(dir: &Path) -> Result<Registry> {
    let bin = tool(
        "docker-registry",
        "apt-get install --no-install-recommends docker-registry",
    )?;
    let mut last = String::new();
    for attempt in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let config = dir.join(format!("registry-{attempt}.yml"));
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("registry").display()
            ),
        )?;
        let mut c = Command::new(&bin);
        c.arg("serve").arg(&config);
        let mut guard = ChildGuard::spawn(
            "docker-registry",
            c,
            &dir.join(format!("registry-{attempt}.log")),
        )?;
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/v2/");
        let ready = poll_until(
            "docker-registry answers /v2/",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                let exited = guard.try_exit_status();
                let get = client.get(&url).send();
                async move {
                    if let Some(status) = exited {
                        bail!("docker-registry exited ({status})");
                    }
                    Ok(get
                        .await
                        .ok()
                        .filter(|r| r.status().is_success())
                        .map(|_| ()))
                }
            },
        )
        .await;
        match ready {
            Ok(()) => {
                return Ok(Registry {
                    _guard: guard,
                    addr,
                });
            }
            Err(e) => last = format!("{e:#}\n{}", guard.log_tail(20)),
        }
    }
    bail!("docker-registry did not start in three attempts: {last}")
}

// --------------------------------------------------------------------------------------------
// Tests
// --------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rehearsed_release_installs_from_a_local_registry() -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("release-rehearsal")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let dir = dir.path();

    // 1. The image, and the binary running inside it.
    let image = build_image(dir)?;
    let version = version_inside(dir, &image)?;
    ensure!(
        version.starts_with(&format!("gpu-ledger {VERSION}")),
        "`gpu-ledger --version` inside the image printed {version:?}"
    );

    // 2. Image and chart pushed to a registry, as the release pushes them to ghcr.io.
    let registry = start_registry(dir).await?;
    let repo = format!("{}/gpu-ledger/gpu-ledger", registry.addr);
    let digest_file = dir.join("digest");
    let mut c = buildah(dir)?;
    c.args(["push", "--tls-verify=false", "--digestfile"])
        .arg(&digest_file)
        .arg(&image)
        .arg(format!("docker://{repo}:{VERSION}"));
    run_ok(c, None)?;
    let digest = std::fs::read_to_string(&digest_file)?.trim().to_string();
    ensure!(digest.starts_with("sha256:"), "digest {digest:?}");
    let manifest = reqwest::Client::new()
        .get(format!(
            "http://{}/v2/gpu-ledger/gpu-ledger/manifests/{digest}",
            registry.addr
        ))
        .header(
            "Accept",
            "application/vnd.oci.image.manifest.v1+json, \
             application/vnd.docker.distribution.manifest.v2+json",
        )
        .send()
        .await?;
    ensure!(
        manifest.status().is_success(),
        "the registry does not serve {repo}@{digest}: {}",
        manifest.status()
    );

    let helm_home = dir.join("helm");
    let mut c = helm(&helm_home)?;
    c.args(["package", CHART, "--destination"])
        .arg(dir.join("charts"));
    run_ok(c, None)?;
    let package = dir.join(format!("charts/gpu-ledger-{VERSION}.tgz"));
    ensure!(
        package.is_file(),
        "helm package wrote no {}",
        package.display()
    );
    let mut c = helm(&helm_home)?;
    c.arg("push")
        .arg(&package)
        .arg(format!("oci://{}/charts", registry.addr))
        .arg("--plain-http");
    run_ok(c, None)?;

    // 3. helm install from the registry on a real API server that serves the Prometheus
    //    Operator's CRDs, as a cluster with kube-prometheus-stack does.
    let (cp, _admin) = support::tier_a().await;
    let mut c = cp.kubectl("admin")?;
    c.arg("apply")
        .arg("-f")
        .arg(root().join("tests/fixtures/crds"));
    run_ok(c, None)?;
    let mut c = cp.kubectl("admin")?;
    c.args([
        "wait",
        "--for=condition=Established",
        "--timeout=120s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
    run_ok(c, None)?;
    let mut c = helm(&helm_home)?;
    c.arg("install")
        .arg("gpu-ledger")
        .arg(format!("oci://{}/charts/gpu-ledger", registry.addr))
        .args(["--version", VERSION, "--plain-http"])
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path("admin")?)
        .args(["--namespace", "gpu-ledger", "--create-namespace"])
        .args(["--set", &format!("image.repository={repo}")])
        .args(["--set", &format!("image.digest={digest}")]);
    let out = run(c, None)?;
    ensure!(
        out.status.success(),
        "helm install from oci://{}/charts/gpu-ledger failed:\n{}",
        registry.addr,
        String::from_utf8_lossy(&out.stderr)
    );

    // The Deployment the API server stored runs the rehearsed image, by digest.
    let mut c = cp.kubectl("admin")?;
    c.args([
        "-n",
        "gpu-ledger",
        "get",
        "deployment/gpu-ledger",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    let stored = run_ok(c, None)?;
    ensure!(
        stored == format!("{repo}@{digest}"),
        "the Deployment runs {stored:?}, not the rehearsed {repo}@{digest}"
    );
    // The CRDs are served: ServiceMonitor and PrometheusRule came by default, with the stack's
    // selector label.
    let mut c = cp.kubectl("admin")?;
    c.args([
        "-n",
        "gpu-ledger",
        "get",
        "servicemonitors,prometheusrules",
        "-l",
        &format!("release={STACK_RELEASE}"),
        "-o",
        "name",
    ]);
    let monitoring = run_ok(c, None)?;
    for want in [
        "servicemonitor.monitoring.coreos.com/gpu-ledger",
        "prometheusrule.monitoring.coreos.com/gpu-ledger",
    ] {
        ensure!(
            monitoring.lines().any(|l| l == want),
            "{want} is missing: {monitoring}"
        );
    }
    let mut c = helm(&helm_home)?;
    c.arg("list")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path("admin")?)
        .args(["--namespace", "gpu-ledger", "-o", "json"]);
    let list: Value = serde_json::from_str(&run_ok(c, None)?)?;
    let release = list
        .as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == "gpu-ledger"))
        .with_context(|| format!("helm list has no gpu-ledger: {list}"))?;
    ensure!(
        release["status"] == "deployed"
            && release["chart"] == format!("gpu-ledger-{VERSION}").as_str()
            && release["app_version"] == VERSION,
        "helm list: {release}"
    );
    Ok(())
}

/// `helm template` with the monitoring.coreos.com/v1 APIs served (or not), as JSON objects.
fn render(home: &Path, crds: bool, sets: &[&str]) -> Result<Vec<Value>> {
    let mut c = helm(home)?;
    c.args([
        "template",
        "gpu-ledger",
        CHART,
        "--namespace",
        "gpu-ledger",
        "--kube-version",
        "v1.36.3",
    ]);
    if crds {
        c.args([
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
        ]);
    }
    for s in sets {
        c.args(["--set", s]);
    }
    docs(&run_ok(c, None)?)
}

/// The `expr` of one alert in a rendered PrometheusRule.
fn alert_expr<'a>(rule: &'a Value, alert: &str) -> Result<&'a str> {
    rule["spec"]["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .find(|r| r["alert"] == alert)
        .and_then(|r| r["expr"].as_str())
        .with_context(|| format!("no alert {alert}"))
}

/// `promtool check rules` on a rendered PrometheusRule's spec (a Prometheus rule file).
fn promtool_check_rules(dir: &Path, rule: &Value) -> Result<()> {
    let promtool = tool("promtool", "apt-get install prometheus")?;
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!(
        "rendered-rules-{}.yaml",
        std::thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", "-")
    ));
    std::fs::write(&file, serde_norway::to_string(&rule["spec"])?)?;
    let mut c = Command::new(promtool);
    c.args(["check", "rules"]).arg(&file);
    run_ok(c, None).context("the chart's rendered rules do not load")?;
    Ok(())
}

#[test]
fn kube_prometheus_stack_default_selectors_pick_up_the_chart() -> Result<()> {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("release-rehearsal-helm");
    // kube-prometheus-stack's defaults (prometheus-community/helm-charts,
    // charts/kube-prometheus-stack/templates/prometheus/prometheus.yaml): with
    // *SelectorNilUsesHelmValues true, serviceMonitorSelector and ruleSelector are
    // matchLabels {release: <the stack's release name>}, their namespace selectors {} (every
    // namespace). Its Grafana's dashboard sidecar loads ConfigMaps labelled
    // grafana_dashboard: "1".
    let prometheus_selector = BTreeMap::from([("release", STACK_RELEASE)]);
    let sidecar_selector = BTreeMap::from([("grafana_dashboard", "1")]);

    let objs = render(&home, true, &[])?;
    let sm = find(&objs, "ServiceMonitor")?;
    let rule = find(&objs, "PrometheusRule")?;
    let service = find(&objs, "Service")?;
    let dashboard = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"].get("gpu-ledger.json").is_some())
        .context("no dashboard ConfigMap")?;

    ensure!(
        selects(&prometheus_selector, &sm["metadata"]["labels"]),
        "the stack's serviceMonitorSelector does not select the ServiceMonitor: {}",
        sm["metadata"]["labels"]
    );
    ensure!(
        selects(&prometheus_selector, &rule["metadata"]["labels"]),
        "the stack's ruleSelector does not select the PrometheusRule: {}",
        rule["metadata"]["labels"]
    );
    ensure!(
        selects(&sidecar_selector, &dashboard["metadata"]["labels"]),
        "Grafana's sidecar does not load the dashboard ConfigMap: {}",
        dashboard["metadata"]["labels"]
    );
    // The ServiceMonitor finds the Service, in its namespace, on a port it has.
    let sm_select: BTreeMap<&str, &str> = sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("ServiceMonitor selector")?
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
        .collect();
    ensure!(
        !sm_select.is_empty() && selects(&sm_select, &service["metadata"]["labels"]),
        "the ServiceMonitor does not select the Service"
    );
    ensure!(
        sm["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .is_some_and(|n| n.contains(&service["metadata"]["namespace"])),
        "the ServiceMonitor looks in other namespaces than the Service's"
    );
    let port = &sm["spec"]["endpoints"][0]["port"];
    ensure!(
        service["spec"]["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| &p["name"] == port)),
        "the Service has no port {port}"
    );
    // The dashboard is dashboards/gpu-ledger.json, with the cluster and job variables.
    let shipped: Value = serde_json::from_str(&std::fs::read_to_string(
        root().join("dashboards/gpu-ledger.json"),
    )?)?;
    let embedded: Value = serde_json::from_str(
        dashboard["data"]["gpu-ledger.json"]
            .as_str()
            .context("dashboard data")?,
    )?;
    ensure!(
        embedded == shipped,
        "the ConfigMap's dashboard is not dashboards/gpu-ledger.json"
    );
    let vars: Vec<&str> = shipped["templating"]["list"]
        .as_array()
        .context("templating")?
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    ensure!(
        vars.contains(&"cluster") && vars.contains(&"job"),
        "dashboard variables {vars:?}"
    );
    // GpuLedgerDown watches the job the ServiceMonitor gives the target: the value of the
    // Service label named by jobLabel.
    let job_label = sm["spec"]["jobLabel"].as_str().context("jobLabel")?;
    let job = service["metadata"]["labels"][job_label]
        .as_str()
        .context("the Service lacks the jobLabel label")?;
    let down = alert_expr(rule, "GpuLedgerDown")?;
    ensure!(
        down.contains(&format!("up{{job=\"{job}\"}} == 0"))
            && down.contains(&format!("absent(up{{job=\"{job}\"}})")),
        "GpuLedgerDown does not watch job {job:?}: {down}"
    );

    // The rules as the chart rendered them (thresholds and the job substituted) still load.
    promtool_check_rules(&home, rule)?;

    // Another stack release name: one value.
    let objs = render(&home, true, &["prometheusRelease=monitoring"])?;
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        let o = find(&objs, kind)?;
        ensure!(
            !selects(&prometheus_selector, &o["metadata"]["labels"])
                && o["metadata"]["labels"]["release"] == "monitoring",
            "{kind} labels {}",
            o["metadata"]["labels"]
        );
    }

    // No Prometheus Operator: no ServiceMonitor; rules forced on load without a target, so
    // GpuLedgerDown must not page for the missing target ...
    let objs = render(&home, false, &["prometheusRule.enabled=true"])?;
    ensure!(
        !objs.iter().any(|o| o["kind"] == "ServiceMonitor"),
        "a ServiceMonitor without its CRD"
    );
    let down = alert_expr(find(&objs, "PrometheusRule")?, "GpuLedgerDown")?;
    ensure!(
        !down.contains("absent("),
        "GpuLedgerDown pages when nothing scrapes gpu-ledger: {down}"
    );
    ensure!(down.contains("== 0"), "{down}");
    promtool_check_rules(&home, find(&objs, "PrometheusRule")?)?;
    // ... until the chart configures a scrape (plain Prometheus, annotations).
    let objs = render(
        &home,
        false,
        &[
            "prometheusRule.enabled=true",
            "scrapeAnnotations.enabled=true",
        ],
    )?;
    ensure!(alert_expr(find(&objs, "PrometheusRule")?, "GpuLedgerDown")?.contains("absent("));
    let pod = &find(&objs, "Deployment")?["spec"]["template"]["metadata"]["annotations"];
    ensure!(
        pod["prometheus.io/scrape"] == "true"
            && pod["prometheus.io/port"] == "8080"
            && pod["prometheus.io/path"] == "/metrics",
        "scrape annotations {pod}"
    );
    Ok(())
}
