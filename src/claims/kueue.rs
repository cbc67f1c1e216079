//! Kueue sources: ResourceFlavors, ClusterQueues, LocalQueues and Workloads of
//! `kueue.x-k8s.io/v1beta2` (the version Kueue v0.17.0 stores), projected into
//! [`crate::ledger::kueue`] from dynamic objects (live watches, lists and dump files alike).
//!
//! Kueue is optional, as DRA is: when the group or one of the kinds is not served, or not
//! readable, one info line says "Kueue not found" and everything else works.
//!
//! Field names follow Kueue's Go types (`apis/kueue/v1beta2` of `sigs.k8s.io/kueue` v0.17.0:
//! `clusterqueue_types.go`, `localqueue_types.go`, `resourceflavor_types.go`,
//! `workload_types.go`). Every value is untrusted: lists are bounded, quantities that are not
//! whole, sane units are unknown (`None`), never guessed.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec};
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, info, warn};

use super::project;
use super::quantity::parse_units;
use crate::k8s;
use crate::ledger::kueue::{
    Admission, ClusterQueueInfo, DeviceClassMapping, FlavorQuota, FlavorUsage, LocalQueueInfo,
    PodSetAssignment, PodSetInfo, ResourceFlavorInfo, WorkloadInfo, WorkloadOwner,
};
use crate::ledger::units::ResourceNames;

pub const GROUP: &str = "kueue.x-k8s.io";
pub const VERSION: &str = "v1beta2";
/// A kind read from Kueue: its `kind`, its plural resource name and whether it is namespaced
/// (the callers pass the kinds table's Kueue kinds: this file cannot name the table, which
/// names it).
pub type KindRef = (&'static str, &'static str, bool);

/// Bound of discovery and of the list probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Most entries kept of any list inside one object (resource groups, flavors, resources, pod
/// sets, owners, labels): Kueue's own CRDs cap these far lower (16 flavors, 16 resources,
/// 8 pod sets).
const MAX_ENTRIES: usize = 64;

/// The [`ApiResource`] of a Kueue kind at [`VERSION`].
pub fn api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A quantity (a string, as the API writes it, or a bare number in a hand-written dump) in
/// whole units; `None` when absent or not a whole, non-negative count.
fn units(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::String(s) => parse_units(s).ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

fn text(v: &Value, field: &str) -> Option<String> {
    v.get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn array<'v>(v: &'v Value, field: &str) -> impl Iterator<Item = &'v Value> {
    v.get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .take(MAX_ENTRIES)
}

/// A ResourceFlavor.
pub fn resource_flavor(o: &DynamicObject) -> ResourceFlavorInfo {
    let node_labels = o.data["spec"]["nodeLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .take(MAX_ENTRIES)
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    ResourceFlavorInfo {
        name: o.name_any(),
        node_labels,
    }
}

fn flavor_usage(list: &Value) -> Vec<FlavorUsage> {
    list.as_array()
        .into_iter()
        .flatten()
        .take(MAX_ENTRIES)
        .flat_map(|f| {
            let flavor = text(f, "name").unwrap_or_default();
            array(f, "resources")
                .map(|r| FlavorUsage {
                    flavor: flavor.clone(),
                    resource: text(r, "name").unwrap_or_default(),
                    total: units(r.get("total")).or_else(|| r.get("total").is_none().then_some(0)),
                    borrowed: units(r.get("borrowed")),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A ClusterQueue: GPU and other quotas of every flavor, and its status usage.
pub fn cluster_queue(o: &DynamicObject) -> ClusterQueueInfo {
    let spec = &o.data["spec"];
    let mut quotas = Vec::new();
    for group in array(spec, "resourceGroups") {
        for f in array(group, "flavors") {
            let flavor = text(f, "name").unwrap_or_default();
            for r in array(f, "resources") {
                quotas.push(FlavorQuota {
                    flavor: flavor.clone(),
                    resource: text(r, "name").unwrap_or_default(),
                    nominal: units(r.get("nominalQuota")),
                    borrowing_limit: units(r.get("borrowingLimit")),
                    lending_limit: units(r.get("lendingLimit")),
                });
            }
        }
    }
    let status = &o.data["status"];
    ClusterQueueInfo {
        name: o.name_any(),
        // v1beta2 `cohortName`; v1beta1 wrote `cohort` (an older dump).
        cohort: text(spec, "cohortName").or_else(|| text(spec, "cohort")),
        quotas,
        usage: flavor_usage(&status["flavorsUsage"]),
        reservation: flavor_usage(&status["flavorsReservation"]),
        usage_reported: status.get("flavorsUsage").is_some()
            || status.get("admittedWorkloads").is_some(),
    }
}

/// A LocalQueue.
pub fn local_queue(o: &DynamicObject) -> LocalQueueInfo {
    LocalQueueInfo {
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        cluster_queue: text(&o.data["spec"], "clusterQueue").unwrap_or_default(),
    }
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(rename = "lastTransitionTime", default)]
    last_transition_time: Option<String>,
}

/// Whether condition `kind` is True, and since when (when its time parses).
fn condition(conditions: &[Condition], kind: &str) -> (bool, Option<DateTime<Utc>>) {
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .filter(|c| c.status == "True")
        .map_or((false, None), |c| {
            (
                true,
                c.last_transition_time
                    .as_deref()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.with_timezone(&Utc)),
            )
        })
}

/// GPU units one pod of a pod set asks for, from its template (the pod claim rules).
fn template_gpus(names: &ResourceNames, template: Option<&Value>) -> BTreeMap<String, u64> {
    let Some(t) = template.and_then(|t| serde_json::from_value::<PodTemplateSpec>(t.clone()).ok())
    else {
        return BTreeMap::new();
    };
    let pod = Pod {
        spec: t.spec,
        ..Pod::default()
    };
    match project::pod(names, &pod) {
        Ok(Some(c)) => c.resources.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// A Workload: its queue, owners, pod sets, admission and conditions.
pub fn workload(names: &ResourceNames, o: &DynamicObject) -> WorkloadInfo {
    let spec = &o.data["spec"];
    let status = &o.data["status"];
    let pod_sets = array(spec, "podSets")
        .map(|s| PodSetInfo {
            name: text(s, "name").unwrap_or_default(),
            count: s.get("count").and_then(Value::as_u64).unwrap_or(1),
            gpu_per_pod: template_gpus(names, s.get("template")),
        })
        .collect();
    let admission = status.get("admission").and_then(|a| {
        Some(Admission {
            cluster_queue: text(a, "clusterQueue")?,
            assignments: array(a, "podSetAssignments")
                .map(|p| PodSetAssignment {
                    name: text(p, "name").unwrap_or_default(),
                    flavors: p["flavors"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .take(MAX_ENTRIES)
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                        .collect(),
                    count: p.get("count").and_then(Value::as_u64),
                })
                .collect(),
        })
    });
    let conditions: Vec<Condition> = array(status, "conditions")
        .filter_map(|c| serde_json::from_value(c.clone()).ok())
        .collect();
    let (_, quota_reserved_since) = condition(&conditions, "QuotaReserved");
    let (admitted, admitted_since) = condition(&conditions, "Admitted");
    let (finished, finished_since) = condition(&conditions, "Finished");
    let owners = o
        .metadata
        .owner_references
        .iter()
        .flatten()
        .take(MAX_ENTRIES)
        .map(|r| WorkloadOwner {
            group: r
                .api_version
                .rsplit_once('/')
                .map_or("", |(g, _)| g)
                .to_string(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect();
    WorkloadInfo {
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        uid: o.metadata.uid.clone().unwrap_or_default(),
        queue_name: text(spec, "queueName"),
        created_at: o
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| k8s::to_chrono(t.0)),
        owners,
        pod_sets,
        admission,
        quota_reserved_since,
        admitted_since,
        finished_since,
        admitted,
        finished,
        deactivated: spec.get("active").and_then(Value::as_bool) == Some(false),
    }
}

// ---------------------------------------------------------------------------------------------
// Kueue's Configuration: `resources.deviceClassMappings`.

/// The key of Kueue's Configuration in its manager's ConfigMap (`config/components/manager/
/// kustomization.yaml` of `sigs.k8s.io/kueue` v0.17.0, and its Helm chart's
/// `templates/manager/manager-config.yaml`).
pub const CONFIG_KEY: &str = "controller_manager_config.yaml";
/// File stem of Kueue's ConfigMap in a capture directory (a list of at most one ConfigMap).
pub const CONFIG_STEM: &str = "kueueconfig";
/// Largest Configuration read: the apiserver's limit on a ConfigMap's data.
const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// Kueue's own bounds (`pkg/config/validation.go`, `validateDeviceClassMappings`): it refuses
/// to start with more mappings, or more classes in one.
const MAX_MAPPINGS: usize = 16;
const MAX_CLASSES_PER_MAPPING: usize = 8;
/// Longest resource or DeviceClass name Kueue accepts in a mapping.
const MAX_MAPPING_NAME_BYTES: usize = 253;

/// Why Kueue's Configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KueueConfigError {
    #[error("ConfigMap {config_map}: no key {CONFIG_KEY}")]
    NoKey { config_map: String },
    #[error("ConfigMap {config_map}: {CONFIG_KEY} is {bytes} bytes, more than {MAX_CONFIG_BYTES}")]
    TooLarge { config_map: String, bytes: usize },
    #[error("ConfigMap {config_map}: {CONFIG_KEY} is no Kueue Configuration")]
    Parse {
        config_map: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("ConfigMap {config_map}: resources.deviceClassMappings: {problem}")]
    Invalid { config_map: String, problem: String },
}

#[derive(Deserialize, Default)]
struct Configuration {
    #[serde(default)]
    resources: Option<ResourcesConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ResourcesConfig {
    #[serde(default)]
    device_class_mappings: Vec<MappingConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MappingConfig {
    #[serde(default)]
    name: String,
    #[serde(default)]
    device_class_names: Vec<String>,
}

/// Kueue's `resources.deviceClassMappings` from its manager's ConfigMap (`config_map` names it
/// in errors). Bounded and checked as Kueue checks them at start (a Configuration Kueue would
/// refuse is no Configuration it runs with): at most 16 mappings of 1 to 8 DeviceClasses,
/// names non-empty and at most 253 bytes.
pub fn device_class_mappings(
    config_map: &str,
    data: &BTreeMap<String, String>,
) -> Result<Vec<DeviceClassMapping>, KueueConfigError> {
    let text = data
        .get(CONFIG_KEY)
        .ok_or_else(|| KueueConfigError::NoKey {
            config_map: config_map.to_string(),
        })?;
    if text.len() > MAX_CONFIG_BYTES {
        return Err(KueueConfigError::TooLarge {
            config_map: config_map.to_string(),
            bytes: text.len(),
        });
    }
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    let config: Configuration =
        serde_saphyr::from_str_with_options(text, options).map_err(|source| {
            KueueConfigError::Parse {
                config_map: config_map.to_string(),
                source: Box::new(source),
            }
        })?;
    let mappings = config.resources.unwrap_or_default().device_class_mappings;
    let invalid = |problem: String| KueueConfigError::Invalid {
        config_map: config_map.to_string(),
        problem,
    };
    if mappings.len() > MAX_MAPPINGS {
        return Err(invalid(format!(
            "{} mappings, more than {MAX_MAPPINGS}",
            mappings.len()
        )));
    }
    let name_ok = |n: &str| !n.is_empty() && n.len() <= MAX_MAPPING_NAME_BYTES;
    mappings
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            if !name_ok(&m.name) {
                return Err(invalid(format!("[{i}].name is empty or too long")));
            }
            let classes = m.device_class_names.len();
            if classes == 0 || classes > MAX_CLASSES_PER_MAPPING {
                return Err(invalid(format!(
                    "[{i}] ({:?}) names {classes} DeviceClasses, not 1 to {MAX_CLASSES_PER_MAPPING}",
                    m.name
                )));
            }
            if let Some(bad) = m.device_class_names.iter().position(|c| !name_ok(c)) {
                return Err(invalid(format!(
                    "[{i}].deviceClassNames[{bad}] is empty or too long"
                )));
            }
            Ok(DeviceClassMapping {
                name: m.name,
                device_classes: m.device_class_names,
            })
        })
        .collect()
}

/// Kueue's mappings from its ConfigMap object.
pub fn mappings_of(cm: &ConfigMap) -> Result<Vec<DeviceClassMapping>, KueueConfigError> {
    let name = format!(
        "{}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.metadata.name.as_deref().unwrap_or_default()
    );
    device_class_mappings(&name, cm.data.as_ref().unwrap_or(&BTreeMap::new()))
}

/// Kueue's manager ConfigMap `namespace/name`: `Ok(None)` when it does not exist.
pub async fn get_config_map(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<ConfigMap>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match tokio::time::timeout(PROBE_TIMEOUT, api.get_opt(name)).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("getting ConfigMap {namespace}/{name} timed out").into(),
        )),
    }
}

/// Kueue's `deviceClassMappings`, read from its ConfigMap `namespace/name`: none when the
/// ConfigMap does not exist (Kueue then runs with its defaults, which map nothing), `None`
/// (unknown) when it cannot be read or is no Configuration Kueue would run with. The outcome
/// is logged at info on the `first_look`, at debug afterwards.
pub async fn read_mappings(
    client: &Client,
    namespace: &str,
    name: &str,
    first_look: bool,
) -> Option<Vec<DeviceClassMapping>> {
    let config_map = format!("{namespace}/{name}");
    match get_config_map(client, namespace, name).await {
        Ok(Some(cm)) => match mappings_of(&cm) {
            Ok(m) => {
                let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
                if first_look {
                    info!(config_map, mappings = ?names, "read Kueue's deviceClassMappings");
                } else {
                    debug!(config_map, mappings = ?names, "read Kueue's deviceClassMappings");
                }
                Some(m)
            }
            Err(e) => {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "Kueue's deviceClassMappings unknown"
                );
                None
            }
        },
        Ok(None) => {
            if first_look {
                info!(
                    config_map,
                    "Kueue's ConfigMap not found: no deviceClassMappings"
                );
            } else {
                debug!(
                    config_map,
                    "Kueue's ConfigMap not found: no deviceClassMappings"
                );
            }
            Some(Vec::new())
        }
        Err(e) => {
            warn!(
                config_map,
                error = &e as &dyn std::error::Error,
                "cannot read Kueue's ConfigMap (RBAC?): its deviceClassMappings are unknown"
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Live sources.

/// Why Kueue is not read: an info line on the first look, debug on the background re-looks
/// (which would otherwise repeat it every few minutes).
fn not_found(reason: &str, first_look: bool) {
    if first_look {
        info!(reason, group = GROUP, version = VERSION, "Kueue not found");
    } else {
        debug!(reason, group = GROUP, version = VERSION, "Kueue not found");
    }
}

/// Whether `kueue.x-k8s.io/v1beta2` serves `kinds` and they are readable by us (probed in
/// `scopes` for the namespaced ones); `false` after one info line "Kueue not found" with the
/// reason when not (at debug level unless `first_look`): queue rows are then off.
pub async fn available(
    client: &Client,
    scopes: &[Option<String>],
    kinds: &[KindRef],
    first_look: bool,
) -> bool {
    let group = tokio::time::timeout(PROBE_TIMEOUT, kube::discovery::group(client, GROUP)).await;
    let group = match group {
        Ok(Ok(g)) => g,
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
            not_found("group not served", first_look);
            return false;
        }
        Ok(Err(kube::Error::Discovery(_))) => {
            not_found("group not served", first_look);
            return false;
        }
        Ok(Err(e)) => {
            warn!(
                error = &e as &dyn std::error::Error,
                "discovering kueue.x-k8s.io failed"
            );
            not_found("discovery failed", first_look);
            return false;
        }
        Err(_) => {
            not_found("discovery timed out", first_look);
            return false;
        }
    };
    let served = group.versioned_resources(VERSION);
    if kinds
        .iter()
        .any(|(kind, _, _)| !served.iter().any(|(ar, _)| ar.kind == *kind))
    {
        not_found(&not_all_served(kinds), first_look);
        return false;
    }
    // A watch we may not list would restart forever and keep the service unready: probe first.
    let lp = ListParams::default().limit(1);
    for &(kind, plural, namespaced) in kinds {
        let ar = api_resource(kind, plural);
        let apis = apis(client, scopes, &ar, namespaced);
        for api in apis {
            let probe = tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&lp)).await;
            match probe {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    warn!(
                        resource = plural,
                        error = &e as &dyn std::error::Error,
                        "cannot list a Kueue resource (RBAC?)"
                    );
                    not_found("a resource is not readable", first_look);
                    return false;
                }
                Err(_) => {
                    not_found("listing timed out", first_look);
                    return false;
                }
            }
        }
    }
    true
}

/// The APIs one kind is read through: one per scope when it is namespaced, else the cluster's.
fn apis(
    client: &Client,
    scopes: &[Option<String>],
    ar: &ApiResource,
    namespaced: bool,
) -> Vec<Api<DynamicObject>> {
    if namespaced {
        scopes
            .iter()
            .map(|ns| k8s::scoped_dynamic(client, ns.as_deref(), ar))
            .collect()
    } else {
        vec![Api::all_with(client.clone(), ar)]
    }
}

/// The reason [`available`] gives when the version lacks one of `kinds`: "v1beta2 does not
/// serve ResourceFlavor, ClusterQueue, LocalQueue and Workload".
pub fn not_all_served(kinds: &[KindRef]) -> String {
    let names: Vec<&str> = kinds.iter().map(|(kind, _, _)| *kind).collect();
    let listed = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    };
    format!("{VERSION} does not serve {listed}")
}

#[cfg(test)]
mod tests;
