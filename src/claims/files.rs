//! Offline claims: `kubectl get <kind> -A -o json|yaml` dumps, read into the same projections as
//! the live watches.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::dra;
use super::project::{self, ProjectError};
use crate::ledger::claims::{Claims, ResourceNames};

/// Why a dump file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid {format}: {message}")]
    Syntax {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error(
        "{path}: expected a List of {expected} (as `kubectl get {plural} -A -o json` prints), found {found}"
    )]
    WrongKind {
        path: PathBuf,
        expected: &'static str,
        plural: &'static str,
        found: String,
    },
    #[error("{path}: item {index}: {message}")]
    Item {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}")]
    Quantity {
        path: PathBuf,
        #[source]
        source: ProjectError,
    },
}

/// Where each dump lives.
#[derive(Debug, Clone)]
pub struct DumpPaths {
    pub pods: PathBuf,
    pub nodes: PathBuf,
    pub notebooks: Option<PathBuf>,
    pub quotas: Option<PathBuf>,
    pub statefulsets: Option<PathBuf>,
    /// DRA dumps (`kubectl get resourceclaims|resourceslices|deviceclasses -A -o json`).
    pub resource_claims: Option<PathBuf>,
    pub resource_slices: Option<PathBuf>,
    pub device_classes: Option<PathBuf>,
}

impl DumpPaths {
    /// `DIR/{pods,nodes,notebooks,quotas,statefulsets,resourceclaims,resourceslices,
    /// deviceclasses}.{json,yaml,yml}`; pods and nodes are required.
    pub fn from_dir(dir: &Path) -> Self {
        let find = |stem: &str| -> Option<PathBuf> {
            ["json", "yaml", "yml"]
                .iter()
                .map(|ext| dir.join(format!("{stem}.{ext}")))
                .find(|p| p.is_file())
        };
        DumpPaths {
            pods: find("pods").unwrap_or_else(|| dir.join("pods.json")),
            nodes: find("nodes").unwrap_or_else(|| dir.join("nodes.json")),
            notebooks: find("notebooks"),
            quotas: find("quotas").or_else(|| find("resourcequotas")),
            statefulsets: find("statefulsets"),
            resource_claims: find("resourceclaims"),
            resource_slices: find("resourceslices"),
            device_classes: find("deviceclasses"),
        }
    }
}

#[derive(Deserialize)]
struct RawList {
    kind: Option<String>,
    items: Option<Vec<serde_json::Value>>,
}

/// Reads a file as JSON or YAML (decided by the first non-blank character) into a generic value.
fn read_value(path: &Path) -> Result<serde_json::Value, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.into(),
        source,
    })?;
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(&text).map_err(|e| FileError::Syntax {
            path: path.into(),
            format: "JSON",
            message: e.to_string(),
        })
    } else {
        serde_norway::from_str(&text).map_err(|e| FileError::Syntax {
            path: path.into(),
            format: "YAML",
            message: e.to_string(),
        })
    }
}

/// Items of a `List` whose items are all of `kind`.
fn read_list<T: DeserializeOwned>(
    path: &Path,
    kind: &'static str,
    plural: &'static str,
) -> Result<Vec<T>, FileError> {
    let value = read_value(path)?;
    let found = describe(&value);
    let list: RawList = serde_json::from_value(value).map_err(|_| FileError::WrongKind {
        path: path.into(),
        expected: kind,
        plural,
        found: found.clone(),
    })?;
    let list_kind_ok = matches!(list.kind.as_deref(), Some("List"))
        || list.kind.as_deref() == Some(&format!("{kind}List"));
    let Some(items) = list.items.filter(|_| list_kind_ok) else {
        return Err(FileError::WrongKind {
            path: path.into(),
            expected: kind,
            plural,
            found,
        });
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let item_kind = item
                .get("kind")
                .and_then(|k| k.as_str())
                .map(str::to_string);
            if let Some(k) = item_kind.as_deref().filter(|k| *k != kind) {
                return Err(FileError::Item {
                    path: path.into(),
                    index,
                    message: format!("expected kind {kind}, found {k}"),
                });
            }
            serde_json::from_value(item).map_err(|e| FileError::Item {
                path: path.into(),
                index,
                message: e.to_string(),
            })
        })
        .collect()
}

fn describe(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => match m.get("kind").and_then(|k| k.as_str()) {
            Some(k) => format!("kind {k}"),
            None => "an object without kind".into(),
        },
        serde_json::Value::Array(_) => "a bare array".into(),
        serde_json::Value::Null => "an empty document".into(),
        other => format!("a {}", type_name(other)),
    }
}

fn type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        _ => "value",
    }
}

#[derive(Deserialize)]
struct MetaOnly {
    metadata: ObjectMeta,
}

/// Loads every dump and projects it.
pub fn load(paths: &DumpPaths, names: &ResourceNames) -> Result<Claims, FileError> {
    fn q(path: &Path) -> impl Fn(ProjectError) -> FileError + '_ {
        move |source| FileError::Quantity {
            path: path.into(),
            source,
        }
    }
    let pods: Vec<Pod> = read_list(&paths.pods, "Pod", "pods")?;
    let nodes: Vec<Node> = read_list(&paths.nodes, "Node", "nodes")?;
    let mut claims = Claims::default();
    for p in &pods {
        match project::pod(names, p).map_err(q(&paths.pods))? {
            Some(c) => {
                // A pod kept only for its ResourceClaims may still be a DaemonSet's.
                if c.resources.is_empty() {
                    claims.daemon_pods.extend(project::daemon_pod(p));
                }
                claims.pods.push(c);
            }
            None => claims.daemon_pods.extend(project::daemon_pod(p)),
        }
    }
    for n in &nodes {
        claims
            .nodes
            .push(project::node(names, n).map_err(q(&paths.nodes))?);
    }
    if let Some(path) = &paths.quotas {
        let quotas: Vec<ResourceQuota> = read_list(path, "ResourceQuota", "resourcequotas")?;
        for rq in &quotas {
            if let Some(info) = project::quota(names, rq).map_err(q(path))? {
                claims.quotas.push(info);
            }
        }
    }
    if let Some(path) = &paths.notebooks {
        let notebooks: Vec<MetaOnly> = read_list(path, "Notebook", "notebooks.kubeflow.org")?;
        claims.notebooks = notebooks
            .iter()
            .map(|n| project::notebook(&n.metadata))
            .collect();
        claims.notebooks_enabled = true;
    }
    if let Some(path) = &paths.statefulsets {
        let sets: Vec<StatefulSet> = read_list(path, "StatefulSet", "statefulsets")?;
        claims.statefulsets = sets.iter().map(project::statefulset).collect();
    }
    if let Some(path) = &paths.resource_claims {
        let list: Vec<ResourceClaim> = read_list(path, "ResourceClaim", "resourceclaims")?;
        claims.resource_claims = list
            .iter()
            .filter_map(|rc| dra::resource_claim(names, rc))
            .collect();
        claims.dra_enabled = true;
    }
    if let Some(path) = &paths.resource_slices {
        let list: Vec<ResourceSlice> = read_list(path, "ResourceSlice", "resourceslices")?;
        claims.dra_devices = list
            .iter()
            .filter_map(|s| dra::slice_devices(names, s))
            .flatten()
            .collect();
        claims.dra_enabled = true;
    }
    if let Some(path) = &paths.device_classes {
        let list: Vec<DeviceClass> = read_list(path, "DeviceClass", "deviceclasses")?;
        claims.device_classes = list.iter().map(dra::device_class).collect();
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        let mut f = std::fs::File::create(&p).expect("create");
        f.write_all(text.as_bytes()).expect("write");
        p
    }

    #[test]
    fn rejects_non_lists_with_file_name() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "pods.json",
            r#"{"kind":"Pod","metadata":{"name":"x"}}"#,
        );
        let err = read_list::<Pod>(&p, "Pod", "pods").expect_err("not a list");
        let msg = err.to_string();
        assert!(
            msg.contains("pods.json") && msg.contains("expected a List of Pod"),
            "{msg}"
        );
        let p = write(
            dir.path(),
            "nodes.json",
            r#"{"kind":"List","items":[{"kind":"Pod"}]}"#,
        );
        let msg = read_list::<Node>(&p, "Node", "nodes")
            .expect_err("wrong item")
            .to_string();
        assert!(msg.contains("item 0") && msg.contains("found Pod"), "{msg}");
        let p = write(dir.path(), "bad.json", "{ nope");
        let msg = read_list::<Node>(&p, "Node", "nodes")
            .expect_err("syntax")
            .to_string();
        assert!(msg.contains("not valid JSON"), "{msg}");
    }

    #[test]
    fn reads_yaml_lists() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "nodes.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n  status:\n    allocatable:\n      nvidia.com/gpu: \"1\"\n",
        );
        let nodes: Vec<Node> = read_list(&p, "Node", "nodes").expect("yaml list");
        assert_eq!(nodes.len(), 1);
        let p = write(dir.path(), "bad.yaml", "kind: List\nitems: [\n");
        let msg = read_list::<Node>(&p, "Node", "nodes")
            .expect_err("syntax")
            .to_string();
        assert!(msg.contains("not valid YAML"), "{msg}");
    }
}
