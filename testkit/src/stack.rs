//! The whole end-to-end stack in one call: a tier B control plane with fake GPU nodes, the
//! Notebook CRD, the [`FakeDcgmExporter`] test double, a real Prometheus scraping it every
//! second, and helpers to run the real `gpu-ledger` binary against it.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use gpu_ledger_testkit::{GpuNode, stack::Stack};
//! let stack = Stack::start(&[GpuNode::new("gpu-1", 1)]).await?;
//! stack.grant_rbac(include_str!("../../deploy/kustomize/base/rbac.yaml"), "gpu-ledger").await?;
//! let ledger = stack
//!     .start_gpu_ledger(std::path::Path::new("target/debug/gpu-ledger"), "gpu-ledger", &[])
//!     .await?;
//! println!("{}", ledger.ledger_json().await?);
//! # Ok(()) }
//! ```
//!
//! Also here: [`apply_rbac`] (the shipped RBAC YAML, rebound to a token user), [`Notebook`]
//! (Notebook CR + the StatefulSet Kubeflow's controller would create) and
//! [`spawn_notebook_stop_rule`] (the one rule of Kubeflow's notebook controller that culling
//! relies on).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::dcgm::{self, HIDDEN_ANNOTATION, UTILIZATION_ANNOTATION};
use crate::process::ChildGuard;
use crate::util::free_port;
use crate::{ControlPlane, FakeDcgmExporter, GpuNode, Prometheus, Tier, TierBOptions};

/// Kubeflow's stop annotation: present (any value) means "scale the notebook to zero".
pub const STOP_ANNOTATION: &str = "kubeflow-resource-stopped";
/// Namespace the gpu-ledger processes "run in" (`POD_NAMESPACE`; also the lease namespace).
pub const LEDGER_NAMESPACE: &str = "gpu-ledger";

/// Control plane + nodes + fake DCGM + Prometheus. Fields are public so tests can stop and
/// restart Prometheus ([`Prometheus::stop`] / [`Prometheus::restart`]).
pub struct Stack {
    pub cp: ControlPlane,
    pub dcgm: FakeDcgmExporter,
    pub prometheus: Prometheus,
    admin: kube::Client,
}

/// `kubeflow.org/v1` `Notebook`.
pub fn notebook_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    )
}

impl Stack {
    /// Starts tier B, adds `nodes` and waits until they are Ready, installs the Notebook CRD,
    /// starts the fake DCGM exporter (admin client) and a Prometheus scraping it every second.
    pub async fn start(nodes: &[GpuNode]) -> Result<Self> {
        Self::start_with(nodes, TierBOptions::default()).await
    }

    /// [`Stack::start`] with tier B options (an audit log, extra controllers, kwok configs).
    pub async fn start_with(nodes: &[GpuNode], options: TierBOptions) -> Result<Self> {
        let cp = ControlPlane::start(Tier::B(options)).await?;
        let admin = cp.client("admin").await?;
        for n in nodes {
            cp.add_node(n).await?;
        }
        for n in nodes {
            cp.wait_node_ready(n.name(), Duration::from_secs(60))
                .await?;
        }
        cp.install_notebook_crd().await?;
        let dcgm = FakeDcgmExporter::start(admin.clone()).await?;
        let prometheus = Prometheus::start(&dcgm::scrape_config(&dcgm.target(), "1s")).await?;
        Ok(Self {
            cp,
            dcgm,
            prometheus,
            admin,
        })
    }

    /// An admin client (`system:masters`).
    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    /// Creates namespace `name` unless it exists.
    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        ensure_namespace(&self.admin, name).await
    }

    /// [`apply_rbac`] with the admin client, into [`LEDGER_NAMESPACE`].
    pub async fn grant_rbac(&self, yaml: &str, user: &str) -> Result<()> {
        apply_rbac(&self.admin, yaml, user, LEDGER_NAMESPACE).await
    }

    /// Runs `gpu-ledger serve` as token user `user` with test timings (1 s refresh and scrape,
    /// 10 s window, 5 s max staleness, 10 m history) plus `args`, and waits up to 60 s for
    /// `/readyz` to answer 200. Each process gets its own `POD_NAME` (`gpu-ledger-<n>`, also
    /// its lease identity) and `POD_NAMESPACE` [`LEDGER_NAMESPACE`].
    pub async fn start_gpu_ledger(
        &self,
        bin: &Path,
        user: &str,
        args: &[&str],
    ) -> Result<GpuLedgerProcess> {
        self.start_gpu_ledger_with(bin, user, args, &LedgerOptions::default())
            .await
    }

    /// [`Stack::start_gpu_ledger`] with a kubeconfig of its own (e.g. through a
    /// [`crate::FaultProxy`]) and extra environment variables.
    pub async fn start_gpu_ledger_with(
        &self,
        bin: &Path,
        user: &str,
        args: &[&str],
        options: &LedgerOptions,
    ) -> Result<GpuLedgerProcess> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        if !bin.is_file() {
            bail!("gpu-ledger binary {} not found", bin.display());
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
        let name = format!("gpu-ledger-{n}");
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = crate::process::isolated_command(bin);
        let kubeconfig = match &options.kubeconfig {
            Some(k) => k.clone(),
            None => self.cp.kubeconfig_path(user)?,
        };
        cmd.env("KUBECONFIG", kubeconfig)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .env("POD_NAME", &name)
            .env("POD_NAMESPACE", LEDGER_NAMESPACE)
            .env(
                "GPU_LEDGER_LOG",
                std::env::var("TESTKIT_GPU_LEDGER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--prometheus-url", self.prometheus.url()])
            .args(["--refresh-interval", "1s", "--scrape-interval", "1s"])
            .args(["--window", "10s", "--max-staleness", "5s"])
            .args(["--history-lookback", "10m"])
            .args(args);
        let log = self.cp.dir().join(format!("{name}.log"));
        let guard = ChildGuard::spawn(&name, cmd, &log)?;
        let mut p = GpuLedgerProcess {
            guard,
            url,
            name,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        p.wait_ready(Duration::from_secs(60)).await?;
        Ok(p)
    }

    /// Creates `nb` (Notebook CR, owned StatefulSet) as admin; see [`Notebook`].
    pub async fn create_notebook(&self, nb: &Notebook) -> Result<()> {
        nb.create(&self.admin).await
    }

    /// Creates a plain GPU pod in `namespace` (the scheduler places it) with the fake DCGM
    /// utilisation annotation (`None`: no annotation, i.e. 0 %).
    pub async fn create_gpu_pod(
        &self,
        namespace: &str,
        name: &str,
        gpus: u32,
        utilization_percent: Option<f64>,
    ) -> Result<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        pods.create(
            &PostParams::default(),
            &gpu_pod(name, gpus, utilization_percent),
        )
        .await
        .with_context(|| format!("creating pod {namespace}/{name}"))
    }

    /// Waits until pod `namespace/name` is Running.
    pub async fn wait_pod_running(&self, namespace: &str, name: &str) -> Result<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        crate::util::poll_until(
            &format!("pod {namespace}/{name} Running"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let p = pods.get_opt(name).await?;
                Ok(p.filter(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                }))
            },
        )
        .await
    }
}

/// A pod asking for `gpus` × `nvidia.com/gpu` with the fake DCGM utilisation annotation.
pub fn gpu_pod(name: &str, gpus: u32, utilization_percent: Option<f64>) -> Pod {
    let mut annotations = BTreeMap::new();
    if let Some(u) = utilization_percent {
        annotations.insert(UTILIZATION_ANNOTATION.to_string(), u.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
            "terminationGracePeriodSeconds": 1
        }
    }))
    .expect("static pod JSON is a valid Pod")
}

/// Creates namespace `name` unless it exists.
pub async fn ensure_namespace(admin: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

/// The namespace the shipped manifests (`deploy/`) install the release in.
const SHIPPED_NAMESPACE: &str = "gpu-ledger";

/// Applies the RBAC objects of `yaml` (multi-document; the shipped files under
/// `deploy/kustomize`) so the token user `user` gets exactly the shipped permissions:
/// ClusterRoles and Roles are created as written (Roles in `namespace`, except those the
/// manifests put in another project's namespace, e.g. kueue-system, which stay there), every
/// ClusterRoleBinding / RoleBinding gets its subjects replaced by `User user` (RoleBindings in
/// `namespace`, with the same exception). Other kinds (ServiceAccount, Deployment, …) are ignored. Existing objects are
/// left alone, so applying twice is harmless.
pub async fn apply_rbac(
    admin: &kube::Client,
    yaml: &str,
    user: &str,
    namespace: &str,
) -> Result<()> {
    ensure_namespace(admin, namespace).await?;
    let mut applied = 0;
    for doc in split_yaml(yaml) {
        let mut v: Value = match serde_norway::from_str(&doc) {
            Ok(Value::Null) | Err(_) => continue,
            Ok(v) => v,
        };
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let (plural, namespaced) = match kind.as_str() {
            "ClusterRole" => ("clusterroles", false),
            "ClusterRoleBinding" => ("clusterrolebindings", false),
            "Role" => ("roles", true),
            "RoleBinding" => ("rolebindings", true),
            _ => continue,
        };
        if kind.ends_with("Binding") {
            v["subjects"] =
                json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]);
        }
        // An object the shipped manifests put in another project's namespace (the Role on
        // Kueue's ConfigMap in kueue-system) stays there; the release's own move to `namespace`.
        let own = v["metadata"]["namespace"]
            .as_str()
            .filter(|ns| *ns != SHIPPED_NAMESPACE)
            .map(str::to_string);
        let target = own.unwrap_or_else(|| namespace.to_string());
        if namespaced {
            ensure_namespace(admin, &target).await?;
            v["metadata"]["namespace"] = json!(target);
        }
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", &kind),
            plural,
        );
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(admin.clone(), &target, &ar)
        } else {
            Api::all_with(admin.clone(), &ar)
        };
        let obj: DynamicObject = serde_json::from_value(v).context("RBAC object")?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating {kind} {name}")),
        }
        applied += 1;
    }
    if applied == 0 {
        bail!("no RBAC object found in the given YAML");
    }
    Ok(())
}

fn split_yaml(yaml: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in yaml.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(d) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    docs
}

/// A Kubeflow Notebook the way Kubeflow's controller materialises it: the `kubeflow.org/v1`
/// Notebook CR and a StatefulSet of the same name, controller-owned by the Notebook (owner
/// reference `apiVersion: kubeflow.org/v1beta1`, as Kubeflow writes it), one replica, pod
/// label `notebook-name`, `nvidia.com/gpu: 1` limit and the fake DCGM utilisation annotation.
/// kube-controller-manager's StatefulSet controller then creates pod `<name>-0`.
#[derive(Debug, Clone)]
pub struct Notebook {
    pub namespace: String,
    pub name: String,
    /// Fake DCGM utilisation in percent.
    pub utilization_percent: f64,
    /// Pin the pod to this node (`kubernetes.io/hostname` node selector).
    pub node: Option<String>,
    /// Hide the pod from the fake exporter (`gpu-ledger.test/no-telemetry`).
    pub no_telemetry: bool,
    /// Annotations on the Notebook CR (e.g. `gpu-ledger.io/cull: "false"`).
    pub annotations: BTreeMap<String, String>,
    /// Finalizer on the pod template (holds the pod Terminating after a stop).
    pub pod_finalizer: Option<String>,
    /// Get the GPU through a claim from this `ResourceClaimTemplate` (DRA) instead of an
    /// `nvidia.com/gpu` limit.
    pub dra_template: Option<String>,
}

impl Notebook {
    /// An idle (0 %) notebook `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            utilization_percent: 0.0,
            node: None,
            no_telemetry: false,
            annotations: BTreeMap::new(),
            pod_finalizer: None,
            dra_template: None,
        }
    }

    #[must_use]
    pub fn dra_template(mut self, template: &str) -> Self {
        self.dra_template = Some(template.to_string());
        self
    }

    #[must_use]
    pub fn utilization(mut self, percent: f64) -> Self {
        self.utilization_percent = percent;
        self
    }

    #[must_use]
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }

    #[must_use]
    pub fn no_telemetry(mut self) -> Self {
        self.no_telemetry = true;
        self
    }

    #[must_use]
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    #[must_use]
    pub fn pod_finalizer(mut self, finalizer: &str) -> Self {
        self.pod_finalizer = Some(finalizer.to_string());
        self
    }

    /// The pod the StatefulSet controller creates.
    pub fn pod_name(&self) -> String {
        format!("{}-0", self.name)
    }

    /// Creates the Notebook and its StatefulSet (namespace created if missing).
    pub async fn create(&self, admin: &kube::Client) -> Result<()> {
        ensure_namespace(admin, &self.namespace).await?;
        let notebooks: Api<DynamicObject> =
            Api::namespaced_with(admin.clone(), &self.namespace, &notebook_resource());
        let mut nb = DynamicObject::new(&self.name, &notebook_resource());
        nb.metadata.annotations = Some(self.annotations.clone());
        nb.data = json!({"spec": {"template": {"spec": {"containers": [{
            "name": self.name, "image": "kubeflownotebookswg/jupyter-pytorch-cuda:v1.9.0",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}});
        let nb = notebooks
            .create(&PostParams::default(), &nb)
            .await
            .with_context(|| format!("creating notebook {}/{}", self.namespace, self.name))?;
        let mut pod_annotations = BTreeMap::from([(
            UTILIZATION_ANNOTATION.to_string(),
            self.utilization_percent.to_string(),
        )]);
        if self.no_telemetry {
            pod_annotations.insert(HIDDEN_ANNOTATION.to_string(), "true".to_string());
        }
        let mut pod_meta = json!({
            "labels": {"statefulset": self.name, "notebook-name": self.name},
            "annotations": pod_annotations,
        });
        if let Some(f) = &self.pod_finalizer {
            pod_meta["finalizers"] = json!([f]);
        }
        let mut pod_spec = json!({
            "containers": [{"name": self.name,
                "image": "kubeflownotebookswg/jupyter-pytorch-cuda:v1.9.0",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "terminationGracePeriodSeconds": 1,
        });
        if let Some(node) = &self.node {
            pod_spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        }
        if let Some(t) = &self.dra_template {
            let (claims, resources) =
                crate::dra::pod_claim_fields(crate::dra::ClaimSource::Template(t));
            pod_spec["resourceClaims"] = claims;
            pod_spec["containers"][0]["resources"] = resources;
        }
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": self.name, "namespace": self.namespace,
                "ownerReferences": [{"apiVersion": "kubeflow.org/v1beta1", "kind": "Notebook",
                    "name": self.name, "uid": nb.metadata.uid, "controller": true,
                    "blockOwnerDeletion": true}]},
            "spec": {"replicas": 1, "serviceName": "",
                "selector": {"matchLabels": {"statefulset": self.name}},
                "template": {"metadata": pod_meta, "spec": pod_spec}}
        }))
        .context("StatefulSet JSON")?;
        Api::<StatefulSet>::namespaced(admin.clone(), &self.namespace)
            .create(&PostParams::default(), &sts)
            .await
            .with_context(|| format!("creating statefulset {}/{}", self.namespace, self.name))?;
        Ok(())
    }
}

/// **Emulates the one rule of Kubeflow's notebook controller that culling relies on**: when a
/// Notebook carries `kubeflow-resource-stopped` (any value), its StatefulSet (same name,
/// controller-owned by the Notebook's uid) is scaled to 0 replicas. Nothing else of the
/// controller is emulated. Polls every 300 ms until the returned task is aborted.
pub fn spawn_notebook_stop_rule(admin: kube::Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let notebooks: Api<DynamicObject> = Api::all_with(admin.clone(), &notebook_resource());
        loop {
            if let Ok(list) = notebooks.list(&ListParams::default()).await {
                for nb in list.items {
                    let stopped = nb
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(STOP_ANNOTATION));
                    let (Some(ns), Some(name), Some(uid)) = (
                        nb.metadata.namespace.as_deref(),
                        nb.metadata.name.as_deref(),
                        nb.metadata.uid.as_deref(),
                    ) else {
                        continue;
                    };
                    if stopped {
                        let _ = scale_owned_statefulset(&admin, ns, name, uid, 0).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Scales StatefulSet `namespace/name` to `replicas` if it is controller-owned by `owner_uid`.
pub async fn scale_owned_statefulset(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    owner_uid: &str,
    replicas: i32,
) -> Result<()> {
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), namespace);
    let Some(sts) = sets.get_opt(name).await? else {
        return Ok(());
    };
    let owned = sts
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid);
    let current = sts.spec.as_ref().and_then(|s| s.replicas);
    if owned && current != Some(replicas) {
        sets.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    }
    Ok(())
}

/// Extras for [`Stack::start_gpu_ledger_with`].
#[derive(Debug, Clone, Default)]
pub struct LedgerOptions {
    /// Instead of the user's kubeconfig for the cluster.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Environment variables to set (e.g. a `GPU_LEDGER_TEST_*` hook).
    pub env: Vec<(String, String)>,
}

/// A running `gpu-ledger serve`; dropping it stops the process (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct GpuLedgerProcess {
    guard: ChildGuard,
    url: String,
    name: String,
    http: reqwest::Client,
}

impl GpuLedgerProcess {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `POD_NAME` of this process (its lease identity).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OS process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.guard.log_tail(n)
    }

    /// Path of its log file.
    pub fn log_path(&self) -> &Path {
        self.guard.log_path()
    }

    /// SIGTERM, wait up to `grace` (blocking), then SIGKILL.
    pub fn terminate(&mut self, grace: Duration) {
        self.guard.terminate(grace);
    }

    /// `Some(status)` once the process has exited.
    pub fn try_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.guard.try_exit_status()
    }

    /// HTTP status of `GET path`.
    pub async fn status(&self, path: &str) -> Result<u16> {
        let r = self.http.get(format!("{}{path}", self.url)).send().await?;
        Ok(r.status().as_u16())
    }

    /// `GET /api/v1/ledger` as JSON.
    pub async fn ledger_json(&self) -> Result<Value> {
        let r = self
            .http
            .get(format!("{}/api/v1/ledger", self.url))
            .send()
            .await?
            .error_for_status()?;
        Ok(r.json().await?)
    }

    /// The ledger row of pod `namespace/pod`, if the ledger lists it (errors read as "not yet").
    pub async fn pod_row(&self, namespace: &str, pod: &str) -> Option<Value> {
        let ledger = self.ledger_json().await.ok()?;
        ledger["pods"]
            .as_array()?
            .iter()
            .find(|p| p["namespace"] == namespace && p["pod"] == pod)
            .cloned()
    }

    /// `GET /metrics` as text.
    pub async fn metrics_text(&self) -> Result<String> {
        let r = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await?
            .error_for_status()?;
        Ok(r.text().await?)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.guard.try_exit_status() {
                bail!(
                    "{} exited ({status}) before /readyz; last 40 log lines:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            if matches!(self.status("/readyz").await, Ok(200)) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} not ready at {}/readyz after {timeout:?}; last 40 log lines:\n{}",
                    self.name,
                    self.url,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The value of the sample of `family` whose labels include all of `labels` (exposition
/// text), or `None`.
pub fn metric_value(text: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            (name == family).then_some((rest, value))
        })
        .find(|(rest, _)| {
            let rest = format!(",{rest}");
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!(",{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
}
