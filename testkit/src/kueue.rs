//! Kueue's controller manager as a local process against a test control plane.
//!
//! The binary is built from Kueue's Go module at a pinned release by `scripts/build-kueue.sh`
//! (`KUEUE_BIN` overrides); everything Kueue is installed with comes from that module's own
//! `config/components`: the CRDs (`crd/bases`), the CRD conversion webhooks
//! (`crd/patches/webhook_in_*.yaml`, the ones `crd/kustomization.yaml` applies) and the
//! admission webhooks (`webhook/manifests.yaml` with the namespace selectors of
//! `webhook/kustomization.yaml`), each rewritten from the in-cluster Service to
//! `url: https://127.0.0.1:<port>/<path>` with the `caBundle` of a loopback certificate
//! ([`crate::certs::LoopbackTls`]).
//!
//! How it runs, and why:
//! * As the control plane's `admin` user (`system:masters`), so Kueue's ClusterRole is not
//!   installed: no test here is about Kueue's own permissions.
//! * Leader election off, internal certificate management off (that mode writes certificates
//!   for `<service>.<namespace>.svc`, a name the apiserver cannot reach here); the webhook
//!   server reads our certificate from `webhook.certDir` and binds 127.0.0.1 only, as do the
//!   health probes and the metrics server.
//! * With internal certificate management off Kueue v0.17 reads its metrics server certificate
//!   from the fixed path `/etc/kueue/metrics/certs` (a cert-manager Secret mounted into its pod).
//!   The process gets the same: a private mount namespace (`unshare --mount`) where `/etc` is an
//!   overlay whose upper layer (a tmpfs) adds only `kueue/metrics/certs`; the host's `/etc` is
//!   untouched. As root that is all; otherwise a user namespace is added (`--map-root-user`).
//! * The visibility API server (an aggregated API, on by default since v0.9) is switched off
//!   (`VisibilityOnDemand: false`): nothing here reads it, and it would bind all interfaces.
//! * The `batch/job`, `jobset.x-k8s.io/jobset` and `ray.io/rayjob` integrations are enabled;
//!   the webhooks of the others answer as Kueue's no-op webhooks do for disabled integrations.
//!   The JobSet, RayJob and RayCluster CRDs are the real ones, from the `sigs.k8s.io/jobset`
//!   and `github.com/ray-project/kuberay/ray-operator` modules at the versions Kueue's go.mod
//!   pins ([`install_jobset_crd`], [`install_kuberay_crds`]). Their controllers do not run here
//!   (separate operators with their own webhooks and certificates): [`jobset_child_job`] makes
//!   a JobSet's Jobs, [`rayjob_cluster`] and [`raycluster_pod`] a RayJob's RayCluster and its
//!   pods, the way they would.
//!
//! Jobs need kube-controller-manager's Job controller: start the control plane with
//! [`tier_b_options`]. The process is killed when the [`Kueue`] value is dropped; if that
//! happens while a test panics, the last lines of its log are printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::certs::LoopbackTls;
use crate::process::ChildGuard;
use crate::util::{free_ports, poll_until, ready_answer};
use crate::{ControlPlane, TierBOptions};

/// The pinned Kueue release (`scripts/build-kueue.sh`).
pub const VERSION: &str = "v0.17.0";
/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The API version Kueue v0.17 stores and its controllers use.
pub const API_VERSION: &str = "v1beta2";
/// The label naming a Job's LocalQueue.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The namespace Kueue "runs in" (`Configuration.namespace`).
pub const NAMESPACE: &str = "kueue-system";
/// Prefix of the webhook configurations' names, as `config/default`'s `namePrefix` gives them.
const NAME_PREFIX: &str = "kueue-";

/// Name of the resource the test Configuration maps DeviceClass `gpu.nvidia.com` to
/// (`resources.deviceClassMappings`; Kueue's DRA gate stays off, so only gpu-ledger reads it).
pub const DEVICE_CLASS_MAPPING: &str = "example.com/gpu";
/// Kueue's manager ConfigMap, as its manifests name it, and the key of its Configuration.
pub const CONFIG_MAP: &str = "kueue-manager-config";
pub const CONFIG_KEY: &str = "controller_manager_config.yaml";

/// Creates (or replaces) the ConfigMap [`CONFIG_MAP`] in [`NAMESPACE`] holding `config`.
async fn put_config_map(cp: &ControlPlane, config: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let admin = cp.client("admin").await?;
    crate::stack::ensure_namespace(&admin, NAMESPACE).await?;
    let api: Api<ConfigMap> = Api::namespaced(admin, NAMESPACE);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {CONFIG_KEY: config},
    }))
    .context("ConfigMap")?;
    api.patch(
        CONFIG_MAP,
        &PatchParams::apply("gpu-ledger-testkit").force(),
        &Patch::Apply(&cm),
    )
    .await
    .with_context(|| format!("applying ConfigMap {NAMESPACE}/{CONFIG_MAP}"))?;
    Ok(())
}

/// Mounts the metrics certificate where Kueue reads it, inside the process's own mount
/// namespace: `$1` an empty directory for the tmpfs, `$2` the directory holding `tls.crt` and
/// `tls.key`, then the command. `exec` keeps the PID, so the guard stops Kueue itself.
const MOUNT_SCRIPT: &str = r#"set -eu
mount -t tmpfs -o mode=0700 tmpfs "$1"
mkdir -p "$1/upper/kueue/metrics/certs" "$1/work"
cp "$2/tls.crt" "$2/tls.key" "$1/upper/kueue/metrics/certs/"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
shift 2
exec "$@"
"#;

/// Pod annotation (`"true"`) that keeps a Job's pod Running for a day on kwok instead of
/// completing it at once (the tier-B `pod-complete` stage): a training run or a notebook-like
/// workload that holds its GPU. See [`LONG_RUNNING_STAGE`].
pub const LONG_RUNNING_ANNOTATION: &str = "gpu-ledger.test/long-running";

/// A kwok Stage for Running Job pods carrying [`LONG_RUNNING_ANNOTATION`]: they complete after
/// 24 h. It matches where `pod-complete` does; kwok picks among matching stages by weight and
/// drops those without one once any has a positive weight, the way kwok's own chaos stages
/// (`kustomize/stage/node/chaos`, weight 10000) take over from the default ones.
pub const LONG_RUNNING_STAGE: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete-after-a-day
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.annotations["gpu-ledger.test/long-running"]'
      operator: 'In'
      values:
      - 'true'
  weight: 1
  delay:
    durationMilliseconds: 86400000
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"#;

/// Tier-B options with what Kueue's tests need beside the defaults: kube-controller-manager's
/// Job controller (an admitted Job is unsuspended by Kueue; the Job controller creates its
/// pods) and [`LONG_RUNNING_STAGE`].
pub fn tier_b_options() -> TierBOptions {
    TierBOptions {
        extra_controllers: vec!["job-controller".to_string()],
        extra_kwok_configs: vec![LONG_RUNNING_STAGE.to_string()],
        ..TierBOptions::default()
    }
}

/// The `kueue.x-k8s.io/v1beta2` resource of `kind` (`ClusterQueue`, `LocalQueue`,
/// `ResourceFlavor`, `Workload`, `Cohort`).
pub fn resource(kind: &str) -> ApiResource {
    resource_at(API_VERSION, kind)
}

/// [`resource`] at another served version (`v1beta1`, converted by Kueue's webhook).
pub fn resource_at(version: &str, kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), &plural)
}

/// The Kueue binary: `$KUEUE_BIN`, else `scripts/build-kueue.sh`'s cache entry.
pub fn kueue_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUEUE_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("KUEUE_BIN={} is not a file", p.display());
    }
    let p = crate::bins::cache_root()
        .join(format!("kueue-{}", VERSION.trim_start_matches('v')))
        .join("bin/kueue");
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found: run scripts/build-kueue.sh (the README's test command does) or set \
             KUEUE_BIN",
            p.display()
        )
    }
}

/// The JobSet module; its version is the one Kueue's go.mod pins (v0.11.1 for Kueue v0.17.0).
pub const JOBSET_MODULE: &str = "sigs.k8s.io/jobset";
/// JobSet's API group and the version JobSet v0.11 serves.
pub const JOBSET_GROUP: &str = "jobset.x-k8s.io";
pub const JOBSET_VERSION: &str = "v1alpha2";

/// The directory of `module` at the version Kueue's go.mod requires (`scripts/build-kueue.sh
/// --print-dependency=MODULE`: `go mod download` fetches it once, and `go install` of Kueue
/// already has).
pub fn dependency_dir(module: &str) -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-kueue.sh");
    let mut cmd = Command::new(&script);
    cmd.arg(format!("--print-dependency={module}"));
    let out = crate::process::run_ok(cmd, None)
        .with_context(|| format!("asking {} for module {module}", script.display()))?;
    Ok(PathBuf::from(out.trim()))
}

/// The `jobset.x-k8s.io/v1alpha2` JobSet resource.
pub fn jobset_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(JOBSET_GROUP, JOBSET_VERSION, "JobSet"),
        "jobsets",
    )
}

/// Installs JobSet's CRD from its module (`config/components/crd/bases/
/// jobset.x-k8s.io_jobsets.yaml`) and waits until it is Established.
pub async fn install_jobset_crd(cp: &ControlPlane) -> Result<()> {
    let file = dependency_dir(JOBSET_MODULE)?
        .join("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml");
    let crd: CustomResourceDefinition = serde_norway::from_str(&read(&file)?)
        .with_context(|| format!("parsing CRD {}", file.display()))?;
    cp.install_crd(&crd).await?;
    Ok(())
}

/// Job `job_index` of replicated job `rjob_index` of a JobSet, as JobSet v0.11.1's controller
/// makes it (`pkg/controllers/jobset_controller.go`: `constructJob` and
/// `labelAndAnnotateObject`; `pkg/util/placement`'s `GenJobName`): named
/// `<jobset>-<replicated job>-<index>`, the replicated job's template with JobSet's labels and
/// the same annotations on the Job and on its pod template, suspended as the JobSet is, and
/// controlled by the JobSet (`ctrl.SetControllerReference`: controller and
/// blockOwnerDeletion). Options that add more (DNS hostnames, exclusive placement, a
/// coordinator, volume claim policies) are not emulated: the caller's JobSet must not use them.
pub fn jobset_child_job(js: &DynamicObject, rjob_index: usize, job_index: u32) -> Result<Job> {
    let name = js
        .metadata
        .name
        .as_deref()
        .context("JobSet without a name")?;
    let namespace = js
        .metadata
        .namespace
        .as_deref()
        .context("JobSet without a namespace")?;
    let uid = js.metadata.uid.as_deref().context("JobSet without a uid")?;
    let rjobs = js.data["spec"]["replicatedJobs"]
        .as_array()
        .context("JobSet without spec.replicatedJobs")?;
    let rjob = rjobs
        .get(rjob_index)
        .with_context(|| format!("JobSet {name} has no replicated job {rjob_index}"))?;
    let rjob_name = rjob["name"]
        .as_str()
        .context("replicated job without a name")?;
    let replicas = |r: &Value| r["replicas"].as_u64().unwrap_or(1);
    // The webhook JobSet would run defaults an empty group name to "default".
    let group = |r: &Value| r["groupName"].as_str().unwrap_or("default").to_string();
    let job_name = format!("{name}-{rjob_name}-{job_index}");
    let global_replicas: u64 = rjobs.iter().map(replicas).sum();
    let global_index: u64 = rjobs
        .iter()
        .take_while(|r| r["name"] != rjob_name)
        .map(replicas)
        .sum::<u64>()
        + u64::from(job_index);
    let my_group = group(rjob);
    let in_group = || rjobs.iter().filter(|r| group(r) == my_group);
    let group_replicas: u64 = in_group().map(replicas).sum();
    let group_index: u64 = in_group()
        .take_while(|r| r["name"] != rjob_name)
        .map(replicas)
        .sum::<u64>()
        + u64::from(job_index);
    let restarts = js.data["status"]["restarts"].as_u64().unwrap_or(0);
    let keys: [(&str, String); 12] = [
        ("jobset.sigs.k8s.io/jobset-name", name.to_string()),
        ("jobset.sigs.k8s.io/jobset-uid", uid.to_string()),
        (
            "jobset.sigs.k8s.io/replicatedjob-name",
            rjob_name.to_string(),
        ),
        ("jobset.sigs.k8s.io/restart-attempt", restarts.to_string()),
        (
            "jobset.sigs.k8s.io/replicatedjob-replicas",
            replicas(rjob).to_string(),
        ),
        (
            "jobset.sigs.k8s.io/global-replicas",
            global_replicas.to_string(),
        ),
        ("jobset.sigs.k8s.io/job-index", job_index.to_string()),
        (
            "jobset.sigs.k8s.io/job-key",
            sha1_hex(&format!("{namespace}/{job_name}"))?,
        ),
        (
            "jobset.sigs.k8s.io/job-global-index",
            global_index.to_string(),
        ),
        ("jobset.sigs.k8s.io/group-name", my_group.clone()),
        (
            "jobset.sigs.k8s.io/group-replicas",
            group_replicas.to_string(),
        ),
        (
            "jobset.sigs.k8s.io/job-group-index",
            group_index.to_string(),
        ),
    ];
    let label = |meta: &mut Value| {
        for field in ["labels", "annotations"] {
            if !meta[field].is_object() {
                meta[field] = json!({});
            }
            for (k, v) in &keys {
                meta[field][*k] = json!(v);
            }
        }
    };
    let template = &rjob["template"];
    let mut meta = json!({
        "name": job_name,
        "namespace": namespace,
        "labels": template["metadata"]["labels"].clone(),
        "annotations": template["metadata"]["annotations"].clone(),
        "ownerReferences": [{
            "apiVersion": format!("{JOBSET_GROUP}/{JOBSET_VERSION}"),
            "kind": "JobSet",
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    label(&mut meta);
    let mut spec = template["spec"].clone();
    if !spec["template"]["metadata"].is_object() {
        spec["template"]["metadata"] = json!({});
    }
    label(&mut spec["template"]["metadata"]);
    spec["suspend"] = json!(js.data["spec"]["suspend"].as_bool().unwrap_or(false));
    serde_json::from_value(json!({"metadata": meta, "spec": spec}))
        .with_context(|| format!("Job {job_name} of JobSet {name}"))
}

/// KubeRay's operator module; its version is the one Kueue's go.mod pins (v1.6.0 for Kueue
/// v0.17.0).
pub const KUBERAY_MODULE: &str = "github.com/ray-project/kuberay/ray-operator";
/// KubeRay's API group and the version KubeRay v1.6 serves.
pub const RAY_GROUP: &str = "ray.io";
pub const RAY_VERSION: &str = "v1";

/// The `ray.io/v1` RayJob resource.
pub fn rayjob_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(RAY_GROUP, RAY_VERSION, "RayJob"),
        "rayjobs",
    )
}

/// The `ray.io/v1` RayCluster resource.
pub fn raycluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(RAY_GROUP, RAY_VERSION, "RayCluster"),
        "rayclusters",
    )
}

/// Installs KubeRay's RayJob and RayCluster CRDs from its module (`config/crd/bases`) and waits
/// until they are Established. Kueue's `ray.io/rayjob` integration needs both: it watches
/// RayJobs and the RayClusters they own.
pub async fn install_kuberay_crds(cp: &ControlPlane) -> Result<()> {
    let bases = dependency_dir(KUBERAY_MODULE)?.join("config/crd/bases");
    for file in ["ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"] {
        let file = bases.join(file);
        let crd: CustomResourceDefinition = serde_norway::from_str(&read(&file)?)
            .with_context(|| format!("parsing CRD {}", file.display()))?;
        cp.install_crd(&crd).await?;
    }
    Ok(())
}

/// The name, namespace and uid of a `kind` object.
fn identity(obj: &DynamicObject, kind: &str) -> Result<(String, String, String)> {
    let m = &obj.metadata;
    Ok((
        m.name
            .clone()
            .with_context(|| format!("{kind} without a name"))?,
        m.namespace
            .clone()
            .with_context(|| format!("{kind} without a namespace"))?,
        m.uid
            .clone()
            .with_context(|| format!("{kind} without a uid"))?,
    ))
}

/// The RayCluster KubeRay v1.6.0's RayJob controller makes for a RayJob
/// (`controllers/ray/rayjob_controller.go`: `constructRayClusterForRayJob`): named
/// `status.rayClusterName`, which `initRayJobStatusIfNeed` sets to
/// `utils.GenerateRayClusterName(name)` = `<rayjob>-<rand.String(5)>` (here `<rayjob>-<suffix>`,
/// `suffix` five characters of Kubernetes' random alphabet); the RayJob's labels plus
/// `ray.io/originated-from-cr-name`, `ray.io/originated-from-crd` and
/// `ray.io/job-submission-mode`; its annotations; its `spec.rayClusterSpec` as Kueue left it
/// (`ctrl.SetControllerReference`: controlled by the RayJob). Sidecar mode's submitter container
/// is not emulated: the caller's RayJob must use `HTTPMode` or `K8sJobMode`.
pub fn rayjob_cluster(rayjob: &DynamicObject, suffix: &str) -> Result<DynamicObject> {
    let (name, namespace, uid) = identity(rayjob, "RayJob")?;
    let spec = &rayjob.data["spec"];
    let mode = spec["submissionMode"].as_str().unwrap_or("K8sJobMode");
    if mode == "SidecarMode" {
        bail!("RayJob {name}: SidecarMode's submitter container is not emulated");
    }
    let mut labels = json!(rayjob.metadata.labels.clone().unwrap_or_default());
    labels["ray.io/originated-from-cr-name"] = json!(name);
    labels["ray.io/originated-from-crd"] = json!("RayJob");
    labels["ray.io/job-submission-mode"] = json!(mode);
    let cluster_spec = spec["rayClusterSpec"].clone();
    if !cluster_spec.is_object() {
        bail!("RayJob {name} without spec.rayClusterSpec");
    }
    serde_json::from_value(json!({
        "apiVersion": format!("{RAY_GROUP}/{RAY_VERSION}"),
        "kind": "RayCluster",
        "metadata": {
            "name": format!("{name}-{suffix}"),
            "namespace": namespace,
            "labels": labels,
            "annotations": rayjob.metadata.annotations.clone().unwrap_or_default(),
            "ownerReferences": [{
                "apiVersion": format!("{RAY_GROUP}/{RAY_VERSION}"),
                "kind": "RayJob",
                "name": name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": cluster_spec,
    }))
    .with_context(|| format!("RayCluster of RayJob {name}"))
}

/// A pod of a RayCluster as KubeRay v1.6.0's RayCluster controller makes it
/// (`controllers/ray/raycluster_controller.go`: `createHeadPod` / `createWorkerPod` with
/// `utils.PodName`; `controllers/ray/common/pod.go`: `DefaultHeadPodTemplate`,
/// `DefaultWorkerPodTemplate`, `labelPod`): the group's pod template with its annotations
/// (where Kueue's `kueue.x-k8s.io/workload` annotation and `kueue.x-k8s.io/podset` label
/// arrive), `generateName` `<cluster>-head-` or `<cluster>-<group>-worker-`, KubeRay's labels
/// `ray.io/is-ray-node`, `ray.io/cluster`, `ray.io/node-type`, `ray.io/group`,
/// `ray.io/identifier`, `app.kubernetes.io/name` and `app.kubernetes.io/created-by` over the
/// template's, the head's `ray.io/ft-enabled` annotation, and controlled by the RayCluster.
/// `worker_group` `None` is the head. The `ray start` command, ports, `/dev/shm` volume and
/// the workers' wait-for-GCS init container are not emulated (kwok runs no container; the
/// init container asks for CPU and memory only).
pub fn raycluster_pod(
    cluster: &DynamicObject,
    worker_group: Option<usize>,
) -> Result<k8s_openapi::api::core::v1::Pod> {
    let (name, namespace, uid) = identity(cluster, "RayCluster")?;
    let spec = &cluster.data["spec"];
    let (template, node_type, group, prefix) = match worker_group {
        None => (
            &spec["headGroupSpec"]["template"],
            "head",
            "headgroup".to_string(),
            name.clone(),
        ),
        Some(i) => {
            let g = &spec["workerGroupSpecs"][i];
            let group = g["groupName"]
                .as_str()
                .with_context(|| format!("RayCluster {name} has no worker group {i}"))?;
            (
                &g["template"],
                "worker",
                group.to_string(),
                format!("{name}-{group}"),
            )
        }
    };
    if !template.is_object() {
        bail!("RayCluster {name}: no pod template for the {node_type} group {group}");
    }
    // `utils.PodName`: the prefix clipped to 50 characters, lower-cased.
    let prefix: String = prefix.chars().take(50).collect();
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    let mut labels = meta["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    // `labelPod`: these win over the template's (node type, group and cluster are not
    // overridable; the others are defaults a template may override, kept here when present).
    for (k, v) in [
        ("ray.io/is-ray-node", "yes".to_string()),
        ("ray.io/identifier", format!("{name}-{node_type}")),
        ("app.kubernetes.io/name", "kuberay".to_string()),
        (
            "app.kubernetes.io/created-by",
            "kuberay-operator".to_string(),
        ),
    ] {
        if labels.get(k).is_none() {
            labels[k] = json!(v);
        }
    }
    labels["ray.io/cluster"] = json!(name);
    labels["ray.io/node-type"] = json!(node_type);
    labels["ray.io/group"] = json!(group);
    meta["labels"] = labels;
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    if node_type == "head" {
        meta["annotations"]["ray.io/ft-enabled"] = json!("false");
    }
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
    }
    meta["generateName"] = json!(format!("{}-{node_type}-", prefix.to_lowercase()));
    meta["namespace"] = json!(namespace);
    meta["ownerReferences"] = json!([{
        "apiVersion": format!("{RAY_GROUP}/{RAY_VERSION}"),
        "kind": "RayCluster",
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    serde_json::from_value(json!({"metadata": meta, "spec": template["spec"].clone()}))
        .with_context(|| format!("{node_type} pod of RayCluster {name}"))
}

/// The hex SHA-1 of `s` (JobSet's `sha1Hash`), by coreutils' `sha1sum`.
fn sha1_hex(s: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("sha1sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running sha1sum")?;
    child
        .stdin
        .take()
        .context("sha1sum's stdin")?
        .write_all(s.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8(out.stdout)?;
    text.split_whitespace()
        .next()
        .filter(|h| h.len() == 40)
        .map(str::to_string)
        .with_context(|| format!("sha1sum answered {text:?}"))
}

/// Kueue's module directory: `$KUEUE_MODULE_DIR`, else `scripts/build-kueue.sh --print-module`
/// (the Go module cache; `go mod download` fetches it once).
pub fn module_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUEUE_MODULE_DIR").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-kueue.sh");
    let mut cmd = Command::new(&script);
    cmd.arg("--print-module");
    let out = crate::process::run_ok(cmd, None)
        .with_context(|| format!("asking {} for Kueue's module", script.display()))?;
    Ok(PathBuf::from(out.trim()))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// The non-empty documents of a multi-document YAML file.
fn yaml_docs(text: &str, origin: &Path) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in text.split("\n---") {
        let v: Value = serde_norway::from_str(doc)
            .with_context(|| format!("parsing a YAML document of {}", origin.display()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Installs Kueue's own CRDs from the module (every file of `config/components/crd/bases`) and
/// waits until each is Established. Conversion webhooks are added by [`Kueue::start`] once
/// Kueue serves them.
pub async fn install_crds(cp: &ControlPlane) -> Result<Vec<String>> {
    let bases = module_dir()?.join("config/components/crd/bases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&bases)
        .with_context(|| format!("listing {}", bases.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|f| f.extension().is_some_and(|x| x == "yaml"));
    files.sort();
    if files.is_empty() {
        bail!("no CRD manifests under {}", bases.display());
    }
    let mut names = Vec::new();
    for f in files {
        let crd: CustomResourceDefinition = serde_norway::from_str(&read(&f)?)
            .with_context(|| format!("parsing CRD {}", f.display()))?;
        let crd = cp.install_crd(&crd).await?;
        names.push(crd.metadata.name.unwrap_or_default());
    }
    Ok(names)
}

/// A running Kueue controller manager; dropping it stops the process.
#[derive(Debug)]
pub struct Kueue {
    guard: ChildGuard,
    health_url: String,
    webhook_port: u16,
    metrics_port: u16,
}

impl Kueue {
    /// Installs the CRDs (unless present), starts Kueue as `admin`, waits for its `/readyz`,
    /// then registers its conversion and admission webhooks on loopback and waits until a Job
    /// carrying [`QUEUE_LABEL`] comes back from a dry-run create suspended (Kueue's Job webhook
    /// answered through the apiserver). Generous timeouts: minutes on a busy machine.
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        install_crds(cp).await?;
        // Before Kueue starts: it sets up an integration only when its CRD is served.
        install_jobset_crd(cp).await?;
        install_kuberay_crds(cp).await?;
        let module = module_dir()?;
        let bin = kueue_bin()?;
        let dir = cp.dir().join("kueue");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let tls = LoopbackTls::generate("kueue-webhook")?;
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs)?;
        write(&certs.join("tls.crt"), &tls.cert_pem)?;
        write(&certs.join("tls.key"), &tls.key_pem)?;
        let admin = cp.client("admin").await?;
        crate::stack::ensure_namespace(&admin, NAMESPACE).await?;

        // Ports are probed free, then bound by Kueue: a parallel test can take one in between,
        // so such a start is retried on new ports (nothing names a port before Kueue is ready).
        let mut attempt = 0;
        let kueue = loop {
            attempt += 1;
            match Self::spawn(cp, &bin, &dir, attempt).await {
                Err(e) if attempt < 4 && format!("{e:#}").contains("address already in use") => {}
                other => break other?,
            }
        };
        kueue.register_webhooks(&admin, &module, &tls).await?;
        kueue.wait_job_webhook(&admin).await?;
        Ok(kueue)
    }

    async fn spawn(cp: &ControlPlane, bin: &Path, dir: &Path, attempt: u32) -> Result<Self> {
        let ports = free_ports(3)?;
        let (health_port, metrics_port, webhook_port) = (ports[0], ports[1], ports[2]);
        let certs = dir.join("certs");
        let config = format!(
            "apiVersion: config.kueue.x-k8s.io/{API_VERSION}
kind: Configuration
namespace: {NAMESPACE}
health:
  healthProbeBindAddress: 127.0.0.1:{health_port}
metrics:
  bindAddress: 127.0.0.1:{metrics_port}
webhook:
  host: 127.0.0.1
  port: {webhook_port}
  certDir: {certs}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
integrations:
  frameworks:
  - batch/job
  - jobset.x-k8s.io/jobset
  - ray.io/rayjob
featureGates:
  VisibilityOnDemand: false
resources:
  deviceClassMappings:
  - name: {DEVICE_CLASS_MAPPING}
    deviceClassNames:
    - gpu.nvidia.com
",
            certs = certs.display()
        );
        let config_path = dir.join("config.yaml");
        write(&config_path, &config)?;
        // Where Kueue's manifests install its Configuration (`config/components/manager`,
        // namePrefix `kueue-`): gpu-ledger reads its deviceClassMappings from there. The
        // process itself reads the file, as the manifests' mount does.
        put_config_map(cp, &config).await?;
        let mount_dir = dir.join(format!("etc-overlay-{attempt}"));
        std::fs::create_dir_all(&mount_dir)?;

        let mut cmd = Command::new("unshare");
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            cmd.args(["--user", "--map-root-user"]);
        }
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(MOUNT_SCRIPT)
            .arg("kueue-mounts")
            .arg(&mount_dir)
            .arg(&certs)
            .arg(bin)
            .arg(format!("--config={}", config_path.display()))
            .arg(format!(
                "--kubeconfig={}",
                cp.kubeconfig_path("admin")?.display()
            ));
        let log = cp.log_path("kueue");
        if attempt > 1 && log.exists() {
            std::fs::rename(&log, cp.log_path(&format!("kueue.{}", attempt - 1)))?;
        }
        let guard = ChildGuard::spawn("kueue", cmd, &log)?;
        let mut k = Self {
            guard,
            health_url: format!("http://127.0.0.1:{health_port}"),
            webhook_port,
            metrics_port,
        };
        k.wait_ready(Duration::from_secs(300)).await?;
        Ok(k)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let url = format!("{}/readyz", self.health_url);
        let start = Instant::now();
        loop {
            if let Some(status) = self.guard.try_exit_status() {
                bail!(
                    "kueue exited ({status}) before becoming ready at {url}; last 40 lines of {}:\n{}",
                    self.guard.log_path().display(),
                    self.guard.log_tail(40)
                );
            }
            // controller-runtime's probe answers exactly `ok` (see `util::ready_answer`).
            let last = match ready_answer(&http, &url, "ok").await {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            if start.elapsed() >= timeout {
                bail!(
                    "kueue not ready at {url} after {timeout:?} (last answer: {last}); last 40 \
                     lines of {}:\n{}",
                    self.guard.log_path().display(),
                    self.guard.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn client_config(&self, path: &str, tls: &LoopbackTls) -> Value {
        json!({
            "url": format!("https://127.0.0.1:{}{path}", self.webhook_port),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&tls.ca_cert_pem),
        })
    }

    /// Conversion webhooks on the CRDs `crd/kustomization.yaml` patches, then the admission
    /// webhooks of `webhook/manifests.yaml` with `webhook/kustomization.yaml`'s patches.
    async fn register_webhooks(
        &self,
        admin: &kube::Client,
        module: &Path,
        tls: &LoopbackTls,
    ) -> Result<()> {
        let crd_dir = module.join("config/components/crd");
        let kustomization = crd_dir.join("kustomization.yaml");
        let k: Value = serde_norway::from_str(&read(&kustomization)?)
            .with_context(|| format!("parsing {}", kustomization.display()))?;
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        let mut converted = 0;
        for patch in k["patches"].as_array().into_iter().flatten() {
            let Some(rel) = patch["path"].as_str() else {
                continue;
            };
            let file = crd_dir.join(rel);
            let p: Value = serde_norway::from_str(&read(&file)?)
                .with_context(|| format!("parsing {}", file.display()))?;
            let mut conversion = p["spec"]["conversion"].clone();
            if conversion["strategy"] != "Webhook" {
                continue;
            }
            let path = conversion["webhook"]["clientConfig"]["service"]["path"]
                .as_str()
                .with_context(|| format!("no clientConfig.service.path in {}", file.display()))?
                .to_string();
            conversion["webhook"]["clientConfig"] = self.client_config(&path, tls);
            let name = p["metadata"]["name"]
                .as_str()
                .with_context(|| format!("no metadata.name in {}", file.display()))?;
            crds.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"conversion": conversion}})),
            )
            .await
            .with_context(|| format!("adding the conversion webhook to CRD {name}"))?;
            converted += 1;
        }
        if converted == 0 {
            bail!(
                "no conversion webhook patch found through {}",
                kustomization.display()
            );
        }

        let webhook_dir = module.join("config/components/webhook");
        let manifests = webhook_dir.join("manifests.yaml");
        let wk = webhook_dir.join("kustomization.yaml");
        let wk: Value = serde_norway::from_str(&read(&wk)?)
            .with_context(|| format!("parsing {}", wk.display()))?;
        let mut patches = Vec::new();
        for p in wk["patches"].as_array().into_iter().flatten() {
            if let Some(text) = p["patch"].as_str() {
                patches.push(serde_norway::from_str::<Value>(text).context("webhook patch")?);
            }
        }
        let mut registered = 0;
        for mut config in yaml_docs(&read(&manifests)?, &manifests)? {
            let kind = config["kind"].as_str().unwrap_or_default().to_string();
            let plural = match kind.as_str() {
                "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
                "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
                _ => continue,
            };
            let name = config["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for patch in patches
                .iter()
                .filter(|p| p["kind"] == kind.as_str() && p["metadata"]["name"] == name.as_str())
            {
                merge_webhooks(&mut config, patch);
            }
            for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
                let path = hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .with_context(|| format!("webhook {} without a service path", hook["name"]))?
                    .to_string();
                hook["clientConfig"] = self.client_config(&path, tls);
            }
            config["metadata"]["name"] = json!(format!("{NAME_PREFIX}{name}"));
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind),
                plural,
            );
            let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
            let obj: DynamicObject = serde_json::from_value(config).context("webhook config")?;
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {kind} {NAME_PREFIX}{name}"))?;
            registered += 1;
        }
        if registered == 0 {
            bail!("no webhook configuration in {}", manifests.display());
        }
        Ok(())
    }

    /// Polls a dry-run create of a Job with [`QUEUE_LABEL`] until it comes back suspended:
    /// webhook configurations take effect in the apiserver a moment after they are created.
    async fn wait_job_webhook(&self, admin: &kube::Client) -> Result<()> {
        crate::stack::ensure_namespace(admin, "default").await?;
        let jobs: Api<Job> = Api::namespaced(admin.clone(), "default");
        let probe: Job = serde_json::from_value(json!({
            "metadata": {"name": "kueue-webhook-probe", "labels": {QUEUE_LABEL: "probe"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "registry.invalid/probe"}]}}}
        }))
        .context("probe Job")?;
        let pp = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let res = poll_until(
            "Kueue's Job webhook to suspend a queued Job",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || async {
                let j = jobs.create(&pp, &probe).await?;
                Ok((j.spec.and_then(|s| s.suspend) == Some(true)).then_some(()))
            },
        )
        .await;
        res.with_context(|| format!("last 40 lines of kueue's log:\n{}", self.log_tail(40)))
    }

    /// Last `n` lines of Kueue's log.
    pub fn log_tail(&self, n: usize) -> String {
        self.guard.log_tail(n)
    }

    /// Path of Kueue's log (`<control-plane dir>/kueue.log`).
    pub fn log_path(&self) -> &Path {
        self.guard.log_path()
    }

    /// `http://127.0.0.1:<port>` of the health probes (`/healthz`, `/readyz`).
    pub fn health_url(&self) -> &str {
        &self.health_url
    }

    /// Port of Kueue's metrics server (HTTPS, authenticated by the apiserver's TokenReview).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// `Some(status)` if Kueue has exited.
    pub fn try_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.guard.try_exit_status()
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kueue: last 60 lines of {}:\n{}",
                self.guard.log_path().display(),
                self.guard.log_tail(60)
            );
        }
    }
}

/// Merges a strategic-merge patch of a webhook configuration the way kustomize does for the
/// `webhooks` list: entries are matched by `name`, and the patch's fields replace the entry's.
fn merge_webhooks(config: &mut Value, patch: &Value) {
    let Some(hooks) = config["webhooks"].as_array_mut() else {
        return;
    };
    for p in patch["webhooks"].as_array().into_iter().flatten() {
        let Some(hook) = hooks.iter_mut().find(|h| h["name"] == p["name"]) else {
            continue;
        };
        if let (Some(h), Some(fields)) = (hook.as_object_mut(), p.as_object()) {
            for (k, v) in fields {
                h.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_match_webhooks_by_name() {
        let mut config = json!({"webhooks": [
            {"name": "mpod.kb.io", "failurePolicy": "Fail"},
            {"name": "mjob.kb.io"}]});
        let patch = json!({"webhooks": [{"name": "mpod.kb.io",
            "namespaceSelector": {"matchLabels": {"a": "b"}}}]});
        merge_webhooks(&mut config, &patch);
        assert_eq!(config["webhooks"][0]["failurePolicy"], "Fail");
        assert_eq!(
            config["webhooks"][0]["namespaceSelector"]["matchLabels"]["a"],
            "b"
        );
        assert!(config["webhooks"][1].get("namespaceSelector").is_none());
    }

    #[test]
    fn a_jobset_child_job_carries_jobsets_labels_and_owner() {
        // job-key is JobSet's `jobHashKey`: the SHA-1 of "<namespace>/<job name>".
        let js: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ns", "uid": "js-uid"},
            "spec": {"suspend": false, "replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"template": {"spec": {}}}}},
                {"name": "workers", "replicas": 2, "template": {
                    "metadata": {"labels": {"mine": "kept"}},
                    "spec": {"template": {"metadata": {"annotations": {"a": "b"}}, "spec": {}}}}}
            ]}
        }))
        .expect("JobSet");
        let job = jobset_child_job(&js, 1, 1).expect("job");
        let meta = &job.metadata;
        assert_eq!(meta.name.as_deref(), Some("js-workers-1"));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(labels["mine"], "kept");
        assert_eq!(labels["jobset.sigs.k8s.io/jobset-uid"], "js-uid");
        assert_eq!(labels["jobset.sigs.k8s.io/job-global-index"], "2");
        assert_eq!(labels["jobset.sigs.k8s.io/global-replicas"], "3");
        assert_eq!(
            labels["jobset.sigs.k8s.io/job-key"],
            sha1_hex("ns/js-workers-1").expect("sha1")
        );
        let owner = &meta.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("JobSet", Some(true))
        );
        let spec = job.spec.expect("spec");
        assert_eq!(spec.suspend, Some(false));
        let pod_meta = spec.template.metadata.expect("pod metadata");
        assert_eq!(pod_meta.annotations.unwrap_or_default()["a"], "b");
        assert_eq!(
            pod_meta.labels.unwrap_or_default()["jobset.sigs.k8s.io/jobset-name"],
            "js"
        );
        assert_eq!(
            sha1_hex("abc").expect("sha1"),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn a_rayjobs_cluster_and_pods_carry_kuberays_names_labels_and_owners() {
        let rj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "rj", "namespace": "ns", "uid": "rj-uid",
                "labels": {"kueue.x-k8s.io/queue-name": "q"}},
            "spec": {"submissionMode": "HTTPMode", "rayClusterSpec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h"}]}}},
                "workerGroupSpecs": [{"groupName": "gpu", "minReplicas": 1, "maxReplicas": 1,
                    "template": {"metadata": {"name": "ignored",
                        "labels": {"ray.io/cluster": "spoofed", "mine": "kept"},
                        "annotations": {"kueue.x-k8s.io/workload": "wl"}},
                    "spec": {"containers": [{"name": "w"}]}}}]}}
        }))
        .expect("RayJob");
        let mut cluster = rayjob_cluster(&rj, "x7k2p").expect("cluster");
        assert_eq!(cluster.metadata.name.as_deref(), Some("rj-x7k2p"));
        let labels = cluster.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["kueue.x-k8s.io/queue-name"], "q");
        assert_eq!(labels["ray.io/originated-from-cr-name"], "rj");
        assert_eq!(labels["ray.io/job-submission-mode"], "HTTPMode");
        let owner = &cluster.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("RayJob", "rj-uid")
        );
        cluster.metadata.uid = Some("rc-uid".to_string());

        let worker = raycluster_pod(&cluster, Some(0)).expect("worker");
        let meta = &worker.metadata;
        assert_eq!(meta.name, None);
        assert_eq!(meta.generate_name.as_deref(), Some("rj-x7k2p-gpu-worker-"));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(labels["ray.io/cluster"], "rj-x7k2p", "not overridable");
        assert_eq!(labels["ray.io/node-type"], "worker");
        assert_eq!(labels["ray.io/group"], "gpu");
        assert_eq!(labels["mine"], "kept");
        assert_eq!(
            meta.annotations.clone().unwrap_or_default()["kueue.x-k8s.io/workload"],
            "wl"
        );
        let owner = &meta.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("RayCluster", "rc-uid", Some(true))
        );
        let head = raycluster_pod(&cluster, None).expect("head");
        assert_eq!(
            head.metadata.generate_name.as_deref(),
            Some("rj-x7k2p-head-")
        );
        assert_eq!(
            head.metadata.labels.unwrap_or_default()["ray.io/group"],
            "headgroup"
        );
        assert!(raycluster_pod(&cluster, Some(1)).is_err());
    }

    #[test]
    fn resources_are_plural_lowercase() {
        assert_eq!(resource("ClusterQueue").plural, "clusterqueues");
        assert_eq!(resource("Workload").api_version, "kueue.x-k8s.io/v1beta2");
        assert_eq!(resource_at("v1beta1", "LocalQueue").plural, "localqueues");
    }
}
