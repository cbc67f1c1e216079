//! Offline claims: `kubectl get <kind> -A -o json|yaml` dumps, read into the same projections as
//! the live watches.
//!
//! Dumps are outside input: each file is bounded in size ([`DumpLimits::max_bytes`], checked
//! before parsing) and in nesting depth ([`MAX_DEPTH`], enforced while parsing), so a hostile file
//! is rejected early with an error naming the file and the limit (docs/security.md).

use std::io::Read as _;
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

/// Deepest nesting of arrays and objects accepted in a dump, JSON or YAML. serde_json's recursion
/// limit (128, fixed) rejects the 128th level; YAML is held to the same bound. Kubernetes objects
/// nest about 15 levels (managedFields included), Notebooks with their pod template about 25.
pub const MAX_DEPTH: usize = 127;

/// Default [`DumpLimits::max_bytes`]: 1 GiB, about 350,000 pods in `kubectl get pods -A -o json`
/// (the same default as the DCGM dump's, `usage::dump::DEFAULT_MAX_DUMP_BYTES`).
pub const DEFAULT_MAX_DUMP_BYTES: u64 = 1 << 30;

/// Bounds on each dump file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpLimits {
    /// Largest file accepted, in bytes (`report --max-dump-size`).
    pub max_bytes: u64,
}

impl Default for DumpLimits {
    fn default() -> Self {
        DumpLimits {
            max_bytes: DEFAULT_MAX_DUMP_BYTES,
        }
    }
}

/// Why a dump file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: larger than the dump size limit of {limit} bytes (raise it with --max-dump-size)"
    )]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path}: {format} nested deeper than the limit of {limit} levels")]
    TooDeep {
        path: PathBuf,
        format: &'static str,
        limit: usize,
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

/// Reads at most `max_bytes` of `path` as UTF-8; a longer file is [`FileError::TooLarge`].
/// The length is checked before reading (regular files) and while reading (pipes, growing files).
pub(crate) fn read_bounded(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    let read_err = |source| FileError::Read {
        path: path.into(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let too_large = || FileError::TooLarge {
        path: path.into(),
        limit: max_bytes,
    };
    let len = file.metadata().map_err(read_err)?.len();
    if len > max_bytes {
        return Err(too_large());
    }
    let mut text = String::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(text)
}

/// YAML parser settings: [`MAX_DEPTH`], YAML 1.2 booleans (only `true`/`false`, as Kubernetes'
/// own YAML reader), one-line errors. Counts of nodes, events and scalar bytes are bounded by
/// the file size instead of serde-saphyr's defaults, which are sized for configuration files
/// (250,000 nodes is about 1,000 pods).
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_events = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    budget.max_reader_input_bytes = None;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.strict_booleans = true;
    if let Some(b) = options.budget.as_mut() {
        b.flow_nesting_limit = MAX_DEPTH;
    }
    options.with_snippet = false;
    options
}

/// The depth budget, or the parser's flow-nesting limit (also [`MAX_DEPTH`]), was exceeded.
fn yaml_too_deep(e: &serde_saphyr::Error) -> bool {
    use serde_saphyr::granit_parser::ErrorKind;
    match e {
        serde_saphyr::Error::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Depth { .. },
            ..
        } => true,
        serde_saphyr::Error::ExternalMessage { source, .. } => matches!(
            source.as_ref(),
            serde_saphyr::ExternalMessageSource::Parser(scan)
                if matches!(scan.kind(), ErrorKind::RecursionLimitExceeded)
        ),
        _ => false,
    }
}

/// Stack for parsing one dump. Both parsers (and serde's conversion and drop of the parsed value)
/// recurse once per nesting level: about 25 KiB per level in a debug build, so [`MAX_DEPTH`]
/// levels need more than a test thread's 2 MiB. Virtual memory only: pages are touched as used.
const PARSER_STACK_BYTES: usize = 64 << 20;

/// Runs `f` on a scoped thread with [`PARSER_STACK_BYTES`] of stack (an error when no thread
/// can be started).
fn on_parser_stack<T: Send>(f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("dump-parser".into())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(s, f)?;
        Ok(handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

/// Reads a file as JSON or YAML (decided by the first non-blank character) into a generic value.
fn read_value(path: &Path, limits: DumpLimits) -> Result<serde_json::Value, FileError> {
    let text = read_bounded(path, limits.max_bytes)?;
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(&text).map_err(|e| {
            // serde_json reports its (fixed, 128) recursion limit only in the message.
            if e.to_string().starts_with("recursion limit exceeded") {
                FileError::TooDeep {
                    path: path.into(),
                    format: "JSON",
                    limit: MAX_DEPTH,
                }
            } else {
                FileError::Syntax {
                    path: path.into(),
                    format: "JSON",
                    message: e.to_string(),
                }
            }
        })
    } else {
        serde_saphyr::from_str_with_options(&text, yaml_options()).map_err(|e| {
            if yaml_too_deep(&e) {
                FileError::TooDeep {
                    path: path.into(),
                    format: "YAML",
                    limit: MAX_DEPTH,
                }
            } else {
                FileError::Syntax {
                    path: path.into(),
                    format: "YAML",
                    message: e.to_string(),
                }
            }
        })
    }
}

/// Items of a `List` whose items are all of `kind`.
fn read_list<T: DeserializeOwned + Send>(
    path: &Path,
    kind: &'static str,
    plural: &'static str,
    limits: DumpLimits,
) -> Result<Vec<T>, FileError> {
    on_parser_stack(|| read_list_here(path, kind, plural, limits)).map_err(|source| {
        FileError::Read {
            path: path.into(),
            source,
        }
    })?
}

/// [`read_list`] on the current thread.
fn read_list_here<T: DeserializeOwned>(
    path: &Path,
    kind: &'static str,
    plural: &'static str,
    limits: DumpLimits,
) -> Result<Vec<T>, FileError> {
    let value = read_value(path, limits)?;
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

/// Loads every dump and projects it, with the default [`DumpLimits`].
pub fn load(paths: &DumpPaths, names: &ResourceNames) -> Result<Claims, FileError> {
    load_with_limits(paths, names, DumpLimits::default())
}

/// Loads every dump and projects it; each file must stay within `limits`.
pub fn load_with_limits(
    paths: &DumpPaths,
    names: &ResourceNames,
    limits: DumpLimits,
) -> Result<Claims, FileError> {
    fn q(path: &Path) -> impl Fn(ProjectError) -> FileError + '_ {
        move |source| FileError::Quantity {
            path: path.into(),
            source,
        }
    }
    let pods: Vec<Pod> = read_list(&paths.pods, "Pod", "pods", limits)?;
    let nodes: Vec<Node> = read_list(&paths.nodes, "Node", "nodes", limits)?;
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
        let quotas: Vec<ResourceQuota> =
            read_list(path, "ResourceQuota", "resourcequotas", limits)?;
        for rq in &quotas {
            if let Some(info) = project::quota(names, rq).map_err(q(path))? {
                claims.quotas.push(info);
            }
        }
    }
    if let Some(path) = &paths.notebooks {
        let notebooks: Vec<MetaOnly> =
            read_list(path, "Notebook", "notebooks.kubeflow.org", limits)?;
        claims.notebooks = notebooks
            .iter()
            .map(|n| project::notebook(&n.metadata))
            .collect();
        claims.notebooks_enabled = true;
    }
    if let Some(path) = &paths.statefulsets {
        let sets: Vec<StatefulSet> = read_list(path, "StatefulSet", "statefulsets", limits)?;
        claims.statefulsets = sets.iter().map(project::statefulset).collect();
    }
    if let Some(path) = &paths.resource_claims {
        let list: Vec<ResourceClaim> = read_list(path, "ResourceClaim", "resourceclaims", limits)?;
        claims.resource_claims = list
            .iter()
            .filter_map(|rc| dra::resource_claim(names, rc))
            .collect();
        claims.dra_enabled = true;
    }
    if let Some(path) = &paths.resource_slices {
        let list: Vec<ResourceSlice> = read_list(path, "ResourceSlice", "resourceslices", limits)?;
        claims.dra_devices = list
            .iter()
            .filter_map(|s| dra::slice_devices(names, s))
            .flatten()
            .collect();
        claims.dra_enabled = true;
    }
    if let Some(path) = &paths.device_classes {
        let list: Vec<DeviceClass> = read_list(path, "DeviceClass", "deviceclasses", limits)?;
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
        let err =
            read_list::<Pod>(&p, "Pod", "pods", DumpLimits::default()).expect_err("not a list");
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
        let msg = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default())
            .expect_err("wrong item")
            .to_string();
        assert!(msg.contains("item 0") && msg.contains("found Pod"), "{msg}");
        let p = write(dir.path(), "bad.json", "{ nope");
        let msg = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default())
            .expect_err("syntax")
            .to_string();
        assert!(msg.contains("not valid JSON"), "{msg}");
    }

    /// Nesting shapes that made serde_norway's parser crawl (400 KB: 79 s), each one level over
    /// the limit and then padded to 400 KB: rejected as too deep, naming the file and the limit.
    #[test]
    fn deep_nesting_is_rejected_with_the_limit() {
        let dir = tempfile::tempdir().expect("tmp");
        let depth = MAX_DEPTH * 8;
        let block_maps = (0..depth).fold(String::new(), |mut s, i| {
            s.push_str(&" ".repeat(i));
            s.push_str("a:\n");
            s
        });
        let block_seqs = format!("kind: List\nitems:\n{}1\n", "- ".repeat(depth));
        let flow = format!("kind: List\nitems: {}", "[".repeat(400 * 1024));
        let json = format!("{{\"kind\":\"List\",\"items\":{}", "[".repeat(400 * 1024));
        for (name, text, format) in [
            ("maps.yaml", block_maps, "YAML"),
            ("seqs.yaml", block_seqs, "YAML"),
            ("flow.yaml", flow, "YAML"),
            ("deep.json", json, "JSON"),
        ] {
            let p = write(dir.path(), name, &text);
            let err =
                read_list::<Pod>(&p, "Pod", "pods", DumpLimits::default()).expect_err("too deep");
            assert!(
                matches!(&err, FileError::TooDeep { format: f, limit, .. } if *f == format && *limit == MAX_DEPTH),
                "{name}: {err:?}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains(name) && msg.contains("deeper than the limit of 127 levels"),
                "{msg}"
            );
        }
    }

    #[test]
    fn depth_at_the_limit_is_accepted() {
        let dir = tempfile::tempdir().expect("tmp");
        // The list (1), items (2), the node (3) and field `x` (4) hold `depth - 4` nested arrays.
        let files = |depth: usize| {
            let inner = depth - 4;
            let nested = format!("{}1{}", "[".repeat(inner), "]".repeat(inner));
            let json = format!(
                r#"{{"kind":"List","items":[{{"kind":"Node","metadata":{{"name":"n"}},"x":{{"y":{nested}}}}}]}}"#
            );
            let yaml = format!(
                "kind: List\nitems:\n- kind: Node\n  metadata:\n    name: n\n  x:\n    y: {nested}\n"
            );
            [
                write(dir.path(), &format!("{depth}.json"), &json),
                write(dir.path(), &format!("{depth}.yaml"), &yaml),
            ]
        };
        for p in files(MAX_DEPTH) {
            let nodes: Vec<Node> = read_list(&p, "Node", "nodes", DumpLimits::default())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert_eq!(nodes.len(), 1);
        }
        for p in files(MAX_DEPTH + 1) {
            let err = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default())
                .expect_err("one level over");
            assert!(
                matches!(err, FileError::TooDeep { .. }),
                "{}: {err}",
                p.display()
            );
        }
    }

    #[test]
    fn oversize_files_are_rejected_before_parsing() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(dir.path(), "pods.json", r#"{"kind":"List","items":[]}"#);
        let limits = DumpLimits { max_bytes: 10 };
        let err = read_list::<Pod>(&p, "Pod", "pods", limits).expect_err("too large");
        assert!(
            matches!(err, FileError::TooLarge { limit: 10, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("pods.json")
                && msg.contains("10 bytes")
                && msg.contains("--max-dump-size"),
            "{msg}"
        );
        let exact = DumpLimits { max_bytes: 26 };
        assert!(
            read_list::<Pod>(&p, "Pod", "pods", exact).is_ok(),
            "a file at the limit is read"
        );
    }

    /// Kubernetes reads YAML 1.2: `on`, `yes`, `off` are strings, not booleans.
    #[test]
    fn yaml_1_1_booleans_stay_strings() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "nodes.yaml",
            "kind: List\nitems:\n- kind: Node\n  metadata:\n    name: n\n    labels:\n      a: on\n      b: yes\n      c: off\n",
        );
        let nodes: Vec<Node> = read_list(&p, "Node", "nodes", DumpLimits::default()).expect("yaml");
        let labels = nodes[0].metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("a").map(String::as_str), Some("on"));
        assert_eq!(labels.get("b").map(String::as_str), Some("yes"));
    }

    #[test]
    fn reads_yaml_lists() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "nodes.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n  status:\n    allocatable:\n      nvidia.com/gpu: \"1\"\n",
        );
        let nodes: Vec<Node> =
            read_list(&p, "Node", "nodes", DumpLimits::default()).expect("yaml list");
        assert_eq!(nodes.len(), 1);
        let p = write(dir.path(), "bad.yaml", "kind: List\nitems: [\n");
        let msg = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default())
            .expect_err("syntax")
            .to_string();
        assert!(msg.contains("not valid YAML"), "{msg}");
    }
}
