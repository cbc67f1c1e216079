//! Offline claims: `kubectl get <kind> -A -o json|yaml` dumps, read into the same projections as
//! the live watches.
//!
//! Dumps are outside input: each file must be a regular file (a FIFO or `/dev/zero` is refused
//! unread), is bounded in size ([`DumpLimits::max_bytes`], checked before parsing), in nesting
//! depth ([`MAX_DEPTH`], enforced while parsing) and, in YAML, may hold no alias (an alias
//! copies its anchor again: 20,000 of a 1 MiB scalar took 5.7 GB), so a hostile file is rejected
//! early with an error naming the file and the limit (docs/security.md).
//!
//! A dump can hold what the API server never stores: every object's name must be a DNS-1123
//! subdomain and its namespace a DNS-1123 label (else the file is refused, naming the item: a
//! pod named `--all` became a flag in a suggested command), and an object listed twice (same
//! namespace and name, or same uid) is kept once, with a warning.

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::kinds::{self, Kind, Visit, Watched};
use super::kueue;
use super::project::{self, ProjectError};
use crate::ledger::claims::Claims;
use crate::ledger::names::{is_dns1123_label, is_dns1123_subdomain};
use crate::ledger::units::ResourceNames;

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
    #[error(
        "{path}: not a regular file ({kind}); a dump is a file `kubectl get … -o json|yaml` wrote"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path}: YAML alias{at}: over the limit of 0 aliases in a dump (kubectl never writes \
         anchors or aliases, and each alias copies its anchored value again)"
    )]
    Alias { path: PathBuf, at: String },
    #[error(
        "{path}: item {index}: {kind} {field} {value} is not a valid Kubernetes name (a DNS-1123 \
         {rule}); the API server refuses it, so kubectl cannot have written it"
    )]
    Name {
        path: PathBuf,
        index: usize,
        kind: &'static str,
        field: &'static str,
        value: String,
        rule: &'static str,
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

/// Where each dump lives, by claim kind ([`kinds::KINDS`]): `kubectl get <kind> -A -o json|yaml`
/// as `capture` writes it. With any Kueue dump, Kueue counts as served; Kueue's ConfigMap
/// ([`kinds::KUEUE_CONFIG`]) as a list of none is "no ConfigMap" (no mappings), no file
/// "unknown".
#[derive(Debug, Clone, Default)]
pub struct DumpPaths {
    /// By [`Kind::stem`].
    files: BTreeMap<&'static str, PathBuf>,
}

impl DumpPaths {
    /// `DIR/<stem>.{json,yaml,yml}` for every kind of [`kinds::KINDS`] (its main stem first,
    /// then its aliases); pods and nodes are required (`DIR/pods.json`, `DIR/nodes.json` when
    /// absent, so the error names them).
    pub fn from_dir(dir: &Path) -> Self {
        // Any entry, not only regular files: a FIFO or a link to a device is then refused by
        // name when read, instead of skipped without a word.
        let find = |stem: &str| -> Option<PathBuf> {
            ["json", "yaml", "yml"]
                .iter()
                .map(|ext| dir.join(format!("{stem}.{ext}")))
                .find(|p| p.symlink_metadata().is_ok())
        };
        let mut paths = DumpPaths::default();
        for kind in kinds::KINDS {
            let found = kind.stems().find_map(find);
            let path = found.or_else(|| {
                kind.required
                    .then(|| dir.join(format!("{}.json", kind.stem)))
            });
            paths = paths.with(kind, path);
        }
        paths
    }

    /// These paths with `kind`'s dump at `path` (`None`: no dump of it).
    #[must_use]
    pub fn with(mut self, kind: &'static Kind, path: Option<PathBuf>) -> Self {
        match path {
            Some(p) => self.files.insert(kind.stem, p),
            None => self.files.remove(kind.stem),
        };
        self
    }

    /// Where `kind`'s dump is, if there is one.
    pub fn get(&self, kind: &Kind) -> Option<&Path> {
        self.files.get(kind.stem).map(PathBuf::as_path)
    }
}

#[derive(Deserialize)]
struct RawList {
    kind: Option<String>,
    items: Option<Vec<serde_json::Value>>,
}

/// What a file that is not a regular file is, for [`FileError::NotRegular`]; `None` for a
/// regular file.
fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

/// Reads at most `max_bytes` of `path` as UTF-8; a longer file is [`FileError::TooLarge`], and
/// anything but a regular file (after links) is [`FileError::NotRegular`], unread.
/// The length is checked before reading and while reading (a growing file).
pub(crate) fn read_bounded(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    let read_err = |source| FileError::Read {
        path: path.into(),
        source,
    };
    let refuse = |kind| FileError::NotRegular {
        path: path.into(),
        kind,
    };
    // Before opening: opening a FIFO waits for a writer, and a device never ends.
    if let Some(kind) = not_regular(&std::fs::metadata(path).map_err(read_err)?) {
        return Err(refuse(kind));
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    let too_large = || FileError::TooLarge {
        path: path.into(),
        limit: max_bytes,
    };
    // Again on what was opened, in case the path was swapped in between.
    let meta = file.metadata().map_err(read_err)?;
    if let Some(kind) = not_regular(&meta) {
        return Err(refuse(kind));
    }
    let len = meta.len();
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
///
/// No aliases at all: serde-saphyr bounds how many events aliases replay, not how many bytes,
/// so one anchored 1 MiB scalar referenced 20,000 times expanded to 20 GB (issue 22). kubectl
/// never writes anchors or aliases (its YAML is its JSON, re-encoded), so with none the parsed
/// value is never larger than the file, which [`DumpLimits::max_bytes`] bounds.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_aliases = 0;
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

/// Where the first alias is, when the alias budget (0) stopped the parser.
fn yaml_alias(e: &serde_saphyr::Error) -> Option<String> {
    match e {
        serde_saphyr::Error::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Aliases { .. },
            location,
        } => Some(if location.line() > 0 {
            format!(" at line {}", location.line())
        } else {
            String::new()
        }),
        _ => None,
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
            if let Some(at) = yaml_alias(&e) {
                FileError::Alias {
                    path: path.into(),
                    at,
                }
            } else if yaml_too_deep(&e) {
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

/// Items of a `List` whose items are all of `kind`, each with a valid name, each object once;
/// with a warning per duplicate dropped.
fn read_list<T: DeserializeOwned + Send>(
    path: &Path,
    kind: &'static str,
    plural: &'static str,
    limits: DumpLimits,
) -> Result<(Vec<T>, Vec<String>), FileError> {
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
) -> Result<(Vec<T>, Vec<String>), FileError> {
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
    let mut checked = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        if let Some(k) = item
            .get("kind")
            .and_then(|k| k.as_str())
            .filter(|k| *k != kind)
        {
            return Err(FileError::Item {
                path: path.into(),
                index,
                message: format!("expected kind {kind}, found {}", shown_kind(k)),
            });
        }
        check_names(path, index, kind, &item)?;
        checked.push((index, item));
    }
    let (unique, warnings) = dedupe(path, kind, checked);
    let items = unique
        .into_iter()
        .map(|(index, item)| {
            serde_json::from_value(item).map_err(|e| FileError::Item {
                path: path.into(),
                index,
                message: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((items, warnings))
}

/// Longest part of a value echoed in a message, in characters.
const SHOWN_CHARS: usize = 64;

/// `s` quoted with control characters escaped (`"a\n"`), cut after [`SHOWN_CHARS`]
/// characters: a name from a dump may be megabytes of anything.
fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// A kind as is when it looks like one (`Node`), else [`shown`].
fn shown_kind(k: &str) -> String {
    if k.len() <= SHOWN_CHARS && k.bytes().all(|b| b.is_ascii_alphanumeric()) {
        k.to_string()
    } else {
        shown(k)
    }
}

/// The item's `metadata.name` (required), `metadata.namespace` and, for a pod, `spec.nodeName`
/// are names the API server would have accepted.
fn check_names(
    path: &Path,
    index: usize,
    kind: &'static str,
    item: &serde_json::Value,
) -> Result<(), FileError> {
    let refuse = |field, value: Option<&serde_json::Value>, rule| FileError::Name {
        path: path.into(),
        index,
        kind,
        field,
        value: match value {
            None => "(missing)".into(),
            Some(serde_json::Value::String(s)) => shown(s),
            Some(other) => shown(&other.to_string()),
        },
        rule,
    };
    let meta = item.get("metadata");
    let name = meta.and_then(|m| m.get("name"));
    if !name
        .and_then(serde_json::Value::as_str)
        .is_some_and(is_dns1123_subdomain)
    {
        return Err(refuse("name", name, "subdomain"));
    }
    // Absent (or null) for cluster-scoped objects.
    if let Some(ns) = meta
        .and_then(|m| m.get("namespace"))
        .filter(|v| !v.is_null())
        && !ns.as_str().is_some_and(is_dns1123_label)
    {
        return Err(refuse("namespace", Some(ns), "label"));
    }
    // Empty or absent while the pod is not scheduled.
    if kind == "Pod"
        && let Some(node) = item
            .get("spec")
            .and_then(|s| s.get("nodeName"))
            .filter(|v| !v.is_null() && v.as_str() != Some(""))
        && !node.as_str().is_some_and(is_dns1123_subdomain)
    {
        return Err(refuse("spec.nodeName", Some(node), "subdomain"));
    }
    Ok(())
}

/// The items with each object once: a later item with the namespace and name, or the uid, of
/// an earlier one is dropped, with a warning naming the file and both items (names are valid
/// by now; uids are echoed escaped).
fn dedupe(
    path: &Path,
    kind: &str,
    items: Vec<(usize, serde_json::Value)>,
) -> (Vec<(usize, serde_json::Value)>, Vec<String>) {
    let field = |item: &serde_json::Value, key: &str| -> String {
        item.get("metadata")
            .and_then(|m| m.get(key))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let what = kind.to_lowercase();
    let mut by_name: HashMap<(String, String), usize> = HashMap::new();
    let mut by_uid: HashMap<String, usize> = HashMap::new();
    let mut kept = Vec::with_capacity(items.len());
    let mut warnings = Vec::new();
    for (index, item) in items {
        let (ns, name, uid) = (
            field(&item, "namespace"),
            field(&item, "name"),
            field(&item, "uid"),
        );
        let object = |ns: &str, name: &str| {
            if ns.is_empty() {
                format!("{what} {name}")
            } else {
                format!("{what} {ns}/{name}")
            }
        };
        let same_name = by_name.get(&(ns.clone(), name.clone())).copied();
        let same_uid = (!uid.is_empty())
            .then(|| by_uid.get(&uid).copied())
            .flatten();
        if let Some(first) = same_name.or(same_uid) {
            let why = if same_name.is_some() {
                "the same namespace and name"
            } else {
                "the same uid"
            };
            warnings.push(format!(
                "{}: item {index} ({}, uid {}) is a duplicate of item {first} ({why}): kept item {first}, ignored item {index}",
                path.display(),
                object(&ns, &name),
                shown(&uid),
            ));
            continue;
        }
        by_name.insert((ns, name), index);
        if !uid.is_empty() {
            by_uid.insert(uid, index);
        }
        kept.push((index, item));
    }
    (kept, warnings)
}

fn describe(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => match m.get("kind").and_then(|k| k.as_str()) {
            Some(k) => format!("kind {}", shown_kind(k)),
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

/// Claims read from dumps, and what the reader should be told.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub claims: Claims,
    /// Non-fatal problems, each naming the file (duplicate objects dropped).
    pub warnings: Vec<String>,
    /// The namespace of every namespaced object read (pods without GPUs included), so a caller
    /// can tell a namespace without GPU pods from one the dump does not have.
    pub namespaces: std::collections::BTreeSet<String>,
}

/// Loads every dump and projects it, with the default [`DumpLimits`]; warnings are dropped
/// (the fuzzer's and the corpus tests' entry: `report` uses [`load_with_limits`]).
pub fn load(paths: &DumpPaths, names: &ResourceNames) -> Result<Claims, FileError> {
    load_with_limits(paths, names, DumpLimits::default()).map(|l| l.claims)
}

/// Reads the dumps of [`DumpPaths`] within `limits`, collecting the warnings.
struct Reader<'a> {
    paths: &'a DumpPaths,
    limits: DumpLimits,
    warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    /// The items of `kind`'s dump, with its path; `None` when it has none.
    fn list<T: DeserializeOwned + Send>(
        &mut self,
        kind: &'static Kind,
    ) -> Result<Option<(&'a Path, Vec<T>)>, FileError> {
        let Some(path) = self.paths.get(kind) else {
            return Ok(None);
        };
        let (items, w) = read_list(path, kind.object, kind.kubectl, self.limits)?;
        self.warnings.extend(w);
        Ok(Some((path, items)))
    }

    /// The items of a required dump (pods, nodes); an unset path is read as `""` and refused
    /// by name.
    fn required<T: DeserializeOwned + Send>(
        &mut self,
        kind: &'static Kind,
    ) -> Result<(&'a Path, Vec<T>), FileError> {
        let path = self.paths.get(kind).unwrap_or(Path::new(""));
        let (items, w) = read_list(path, kind.object, kind.kubectl, self.limits)?;
        self.warnings.extend(w);
        Ok((path, items))
    }
}

/// The error of a projection, naming the dump.
fn q(path: &Path) -> impl Fn(ProjectError) -> FileError + '_ {
    move |source| FileError::Quantity {
        path: path.into(),
        source,
    }
}

/// The projections of `objects` (read from `path`) as kind `K`'s watch keeps them.
fn rows<K: Watched>(
    names: &ResourceNames,
    path: &Path,
    objects: &[K::Object],
) -> Result<Vec<K::Row>, FileError> {
    objects
        .iter()
        .filter_map(|o| K::project(names, o).map_err(q(path)).transpose())
        .collect()
}

/// Loads every dump and projects it; each file must stay within `limits`. Pods and nodes are
/// read before either is projected; every other kind is read and projected in
/// [`kinds::KINDS`] order, a watched kind through its [`Watched`] binding ([`LoadKind`]).
pub fn load_with_limits(
    paths: &DumpPaths,
    names: &ResourceNames,
    limits: DumpLimits,
) -> Result<Loaded, FileError> {
    let mut r = Reader {
        paths,
        limits,
        warnings: Vec::new(),
    };
    // Explicit, not through the table's loop: both are required, both are read before either
    // is projected (a missing nodes dump is reported before a bad pod), and a pod may also be
    // a DaemonSet's, which no table kind is.
    let (pods_path, pods): (_, Vec<Pod>) = r.required(&kinds::PODS)?;
    let (nodes_path, nodes): (_, Vec<Node>) = r.required(&kinds::NODES)?;
    let mut claims = Claims::default();
    let mut namespaces = std::collections::BTreeSet::new();
    for p in &pods {
        seen(&mut namespaces, &p.metadata);
        match project::pod(names, p).map_err(q(pods_path))? {
            Some(c) => {
                // A pod kept only for its ResourceClaims may still be a DaemonSet's.
                if c.resources.is_empty() {
                    claims.daemon_pods.extend(project::daemon_pod(p));
                }
                claims.pods.push(c.into());
            }
            None => claims.daemon_pods.extend(project::daemon_pod(p)),
        }
    }
    kinds::Nodes::store(
        &mut claims,
        rows::<kinds::Nodes>(names, nodes_path, &nodes)?,
    );
    for kind in kinds::KINDS {
        if kind == &kinds::PODS || kind == &kinds::NODES {
            continue;
        }
        if kind == &kinds::NOTEBOOKS {
            // Explicit: a Notebook is read for its metadata only (its spec, a whole pod
            // template, is never kept).
            if let Some((_, notebooks)) = r.list::<MetaOnly>(kind)? {
                for n in &notebooks {
                    seen(&mut namespaces, &n.metadata);
                }
                claims.notebooks = notebooks
                    .iter()
                    .map(|n| crate::k8s::notebook(&n.metadata))
                    .collect();
                kinds::Notebooks::served(&mut claims);
            }
        } else if kind == &kinds::STATEFULSETS {
            // Explicit: no watched kind (fetched one by one while serving).
            if let Some((_, sets)) = r.list::<StatefulSet>(kind)? {
                for set in &sets {
                    seen(&mut namespaces, &set.metadata);
                }
                claims.statefulsets = sets.iter().map(project::statefulset).collect();
            }
        } else if kind == &kinds::KUEUE_CONFIG {
            // Explicit: no watched kind (polled while serving); read only with Kueue's kinds.
            if claims.kueue.enabled {
                load_kueue_config(&mut r, &mut claims)?;
            }
        } else {
            let mut load = LoadKind {
                r: &mut r,
                names,
                claims: &mut claims,
                namespaces: &mut namespaces,
                result: Ok(()),
            };
            kinds::visit_kind(kind, &mut load);
            load.result?;
        }
    }
    Ok(Loaded {
        claims,
        warnings: r.warnings,
        namespaces,
    })
}

/// Notes the namespace of an object read (see [`Loaded::namespaces`]).
fn seen(namespaces: &mut std::collections::BTreeSet<String>, meta: &ObjectMeta) {
    if let Some(ns) = &meta.namespace {
        namespaces.insert(ns.clone());
    }
}

/// Loads one watched kind's dump, when there is one, into the claims through its [`Watched`]
/// binding: read, its namespaces noted ([`Watched::COUNTS_NAMESPACES`]), projected as its
/// watch projects, stored, its API marked served.
struct LoadKind<'r, 'a> {
    r: &'r mut Reader<'a>,
    names: &'r ResourceNames,
    claims: &'r mut Claims,
    namespaces: &'r mut std::collections::BTreeSet<String>,
    result: Result<(), FileError>,
}

impl Visit for LoadKind<'_, '_> {
    fn visit<K: Watched>(&mut self) {
        self.result = self.load::<K>();
    }
}

impl LoadKind<'_, '_> {
    fn load<K: Watched>(&mut self) -> Result<(), FileError> {
        let Some((path, items)) = self.r.list::<K::Object>(K::KIND)? else {
            return Ok(());
        };
        if K::COUNTS_NAMESPACES {
            for o in &items {
                seen(self.namespaces, o.meta());
            }
        }
        K::store(self.claims, rows::<K>(self.names, path, &items)?);
        K::served(self.claims);
        Ok(())
    }
}

/// Kueue's `deviceClassMappings` from its captured ConfigMap ([`kinds::KUEUE_CONFIG`]): a list
/// of none is "no mappings", no file leaves them unknown, a Configuration Kueue would refuse is
/// a warning (naming the file) and unknown.
fn load_kueue_config(r: &mut Reader<'_>, claims: &mut Claims) -> Result<(), FileError> {
    if let Some((path, items)) = r.list::<ConfigMap>(&kinds::KUEUE_CONFIG)? {
        claims.kueue.device_class_mappings = match items.first().map(kueue::mappings_of) {
            None => Some(Vec::new()),
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                r.warnings.push(format!(
                    "{}: {}; Kueue's deviceClassMappings are unknown",
                    path.display(),
                    crate::telemetry::error_chain(&e)
                ));
                None
            }
        };
    }
    Ok(())
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

    /// `kueueconfig.json` as `capture` writes it: the ConfigMap's mappings; an empty list (no
    /// ConfigMap) is no mappings; no file leaves them unknown; a Configuration Kueue would refuse
    /// is a warning and unknown.
    #[test]
    fn kueue_device_class_mappings_come_from_the_captured_config_map() {
        let dir = tempfile::tempdir().expect("tmp");
        write(dir.path(), "pods.json", r#"{"kind":"List","items":[]}"#);
        write(dir.path(), "nodes.json", r#"{"kind":"List","items":[]}"#);
        write(
            dir.path(),
            "clusterqueues.json",
            r#"{"kind":"List","items":[]}"#,
        );
        let load = || {
            load_with_limits(
                &DumpPaths::from_dir(dir.path()),
                &ResourceNames::default(),
                DumpLimits::default(),
            )
            .expect("load")
        };
        assert_eq!(load().claims.kueue.device_class_mappings, None, "no file");
        let config = "resources:\n  deviceClassMappings:\n  - name: gpu\n    deviceClassNames: [gpu.example.com]\n";
        let cm = serde_json::json!({"kind": "List", "items": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
            "data": {"controller_manager_config.yaml": config}
        }]});
        write(dir.path(), "kueueconfig.json", &cm.to_string());
        let m = load().claims.kueue.device_class_mappings.expect("read");
        assert_eq!(
            (m[0].name.as_str(), m[0].device_classes.as_slice()),
            ("gpu", ["gpu.example.com".to_string()].as_slice())
        );
        write(
            dir.path(),
            "kueueconfig.json",
            r#"{"kind":"List","items":[]}"#,
        );
        assert_eq!(load().claims.kueue.device_class_mappings, Some(vec![]));
        let bad = serde_json::json!({"kind": "List", "items": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
            "data": {"controller_manager_config.yaml": "resources:\n  deviceClassMappings:\n  - name: gpu\n"}
        }]});
        write(dir.path(), "kueueconfig.json", &bad.to_string());
        let loaded = load();
        assert_eq!(loaded.claims.kueue.device_class_mappings, None);
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.contains("kueueconfig.json")
                    && w.contains("kueue-system/kueue-manager-config")),
            "{:?}",
            loaded.warnings
        );
    }

    /// Every watched kind's dump is read through the table alone ([`kinds::for_each_watched`]):
    /// found by its stem, refused by its object kind naming the file, and once valid, marks
    /// its API served as its binding says. A kind added to the table and the list is loaded
    /// without a line here.
    #[test]
    fn every_watched_kind_is_loaded_through_its_binding() {
        struct Check(Vec<&'static str>);
        impl Visit for Check {
            fn visit<K: Watched>(&mut self) {
                let stem = K::KIND.stem;
                let dir = tempfile::tempdir().expect("tmp");
                write(dir.path(), "pods.json", r#"{"kind":"List","items":[]}"#);
                write(dir.path(), "nodes.json", r#"{"kind":"List","items":[]}"#);
                let file = format!("{stem}.json");
                write(
                    dir.path(),
                    &file,
                    r#"{"kind":"List","items":[{"kind":"Wrong","metadata":{"name":"a"}}]}"#,
                );
                let load = || {
                    load_with_limits(
                        &DumpPaths::from_dir(dir.path()),
                        &ResourceNames::default(),
                        DumpLimits::default(),
                    )
                };
                let err = load().expect_err("wrong kind").to_string();
                let want = format!("{file}: item 0: expected kind {}", K::KIND.object);
                assert!(err.contains(&want), "{stem}: {err}");
                write(dir.path(), &file, r#"{"kind":"List","items":[]}"#);
                let claims = load().expect("empty list").claims;
                let mut expected = Claims::default();
                K::served(&mut expected);
                assert_eq!(
                    (
                        claims.notebooks_enabled,
                        claims.dra_enabled,
                        claims.kueue.enabled,
                        claims.rayclusters_enabled
                    ),
                    (
                        expected.notebooks_enabled,
                        expected.dra_enabled,
                        expected.kueue.enabled,
                        expected.rayclusters_enabled
                    ),
                    "{stem}"
                );
                self.0.push(stem);
            }
        }
        let mut checked = Check(Vec::new());
        kinds::for_each_watched(&mut checked);
        let watched = kinds::KINDS
            .iter()
            .filter(|k| k.live == kinds::Live::Watched);
        assert_eq!(checked.0.len(), watched.count(), "{:?}", checked.0);
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
            let (nodes, _): (Vec<Node>, _) = read_list(&p, "Node", "nodes", DumpLimits::default())
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
        let (nodes, _): (Vec<Node>, _) =
            read_list(&p, "Node", "nodes", DumpLimits::default()).expect("yaml");
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
        let (nodes, _): (Vec<Node>, _) =
            read_list(&p, "Node", "nodes", DumpLimits::default()).expect("yaml list");
        assert_eq!(nodes.len(), 1);
        let p = write(dir.path(), "bad.yaml", "kind: List\nitems: [\n");
        let msg = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default())
            .expect_err("syntax")
            .to_string();
        assert!(msg.contains("not valid YAML"), "{msg}");
    }

    /// Issue 22: names the API server refuses, per field, are refused with the item, the field
    /// and the value escaped; names it accepts pass.
    #[test]
    fn invalid_names_are_refused_naming_item_and_field() {
        let dir = tempfile::tempdir().expect("tmp");
        let list = |kind: &str, item: serde_json::Value| {
            serde_json::json!({"kind": "List", "items": [
                {"kind": kind, "metadata": {"name": "ok-0", "namespace": "team-ml"}, "spec": {"nodeName": "lab-1.example"}},
                item
            ]})
            .to_string()
        };
        let cases = [
            (
                "Pod",
                serde_json::json!({"kind": "Pod", "metadata": {"name": "--all", "namespace": "ns"}}),
                "name \"--all\"",
                "subdomain",
            ),
            (
                "Pod",
                serde_json::json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "-n"}}),
                "namespace \"-n\"",
                "label",
            ),
            (
                "Pod",
                serde_json::json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "a.b"}}),
                "namespace \"a.b\"",
                "label",
            ),
            (
                "Pod",
                serde_json::json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "-x"}}),
                "spec.nodeName \"-x\"",
                "subdomain",
            ),
            (
                "Pod",
                serde_json::json!({"kind": "Pod", "metadata": {"namespace": "ns"}}),
                "name (missing)",
                "subdomain",
            ),
            (
                "Node",
                serde_json::json!({"kind": "Node", "metadata": {"name": "Lab"}}),
                "name \"Lab\"",
                "subdomain",
            ),
            (
                "Notebook",
                serde_json::json!({"kind": "Notebook", "metadata": {"name": "-all", "namespace": "ns"}}),
                "name \"-all\"",
                "subdomain",
            ),
            (
                "Notebook",
                serde_json::json!({"kind": "Notebook", "metadata": {"name": 7, "namespace": "ns"}}),
                "name \"7\"",
                "subdomain",
            ),
        ];
        for (kind, item, needle, rule) in cases {
            let p = write(dir.path(), "dump.json", &list(kind, item));
            let err = match kind {
                "Pod" => read_list::<Pod>(&p, "Pod", "pods", DumpLimits::default()).map(|_| ()),
                "Node" => read_list::<Node>(&p, "Node", "nodes", DumpLimits::default()).map(|_| ()),
                _ => read_list::<MetaOnly>(&p, "Notebook", "notebooks", DumpLimits::default())
                    .map(|_| ()),
            }
            .expect_err(needle);
            assert!(matches!(err, FileError::Name { index: 1, .. }), "{err:?}");
            let msg = err.to_string();
            assert!(
                msg.contains("dump.json: item 1")
                    && msg.contains(needle)
                    && msg.contains(&format!("DNS-1123 {rule}")),
                "{msg}"
            );
        }
        // Cluster-scoped objects have no namespace; an unscheduled pod no node.
        let p = write(
            dir.path(),
            "ok.json",
            r#"{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a.b-1","namespace":"x"},"spec":{"nodeName":""}},{"kind":"Pod","metadata":{"name":"c","namespace":null}}]}"#,
        );
        let (pods, warnings): (Vec<Pod>, _) =
            read_list(&p, "Pod", "pods", DumpLimits::default()).expect("valid names");
        assert_eq!((pods.len(), warnings.len()), (2, 0));
    }

    #[test]
    fn dns1123_names() {
        assert!(is_dns1123_label("team-ml") && is_dns1123_label("0a"));
        assert!(!is_dns1123_label("a.b") && !is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c.d") && is_dns1123_subdomain(&"a".repeat(253)));
        for bad in [
            "", "-a", "a-", "--all", "a..b", ".a", "a.", "A", "a_b", "a b", "a.-b",
        ] {
            assert!(
                !is_dns1123_subdomain(bad) && !is_dns1123_label(bad),
                "{bad:?}"
            );
        }
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }

    #[test]
    fn echoed_values_are_escaped_and_cut() {
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        let long = format!("\u{1b}{}", "x".repeat(10_000));
        let s = shown(&long);
        assert!(
            s.starts_with("\"\\u{1b}xxx") && s.ends_with("… (10001 bytes)"),
            "{s}"
        );
        assert!(s.len() < 100, "{s}");
    }

    /// The same object twice: by namespace and name, or by uid; the first is kept.
    #[test]
    fn duplicates_are_dropped_with_a_warning() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "pods.json",
            r#"{"kind":"List","items":[
                {"kind":"Pod","metadata":{"name":"a","namespace":"ns","uid":"u1"}},
                {"kind":"Pod","metadata":{"name":"b","namespace":"ns","uid":"u2"}},
                {"kind":"Pod","metadata":{"name":"a","namespace":"ns","uid":"u3"}},
                {"kind":"Pod","metadata":{"name":"c","namespace":"ns","uid":"u2"}},
                {"kind":"Pod","metadata":{"name":"a","namespace":"other","uid":"u4"}},
                {"kind":"Pod","metadata":{"name":"d","namespace":"ns"}},
                {"kind":"Pod","metadata":{"name":"e","namespace":"ns"}}
            ]}"#,
        );
        let (pods, warnings): (Vec<Pod>, _) =
            read_list(&p, "Pod", "pods", DumpLimits::default()).expect("pods");
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            ["u1", "u2", "u4", "", ""],
            "no uid is not a shared uid"
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("pods.json: item 2 (pod ns/a, uid \"u3\") is a duplicate of item 0 (the same namespace and name): kept item 0, ignored item 2"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1]
                .contains("item 3 (pod ns/c, uid \"u2\") is a duplicate of item 1 (the same uid)"),
            "{}",
            warnings[1]
        );
    }

    /// Issue 22: kubectl never writes aliases, and serde-saphyr bounds replayed events, not
    /// bytes: any alias is refused, naming the file and the limit.
    #[test]
    fn yaml_aliases_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = write(
            dir.path(),
            "nodes.yaml",
            "kind: List\nx: &a big\nitems:\n- kind: Node\n  metadata:\n    name: n\n    labels:\n      l: *a\n",
        );
        let err = read_list::<Node>(&p, "Node", "nodes", DumpLimits::default()).expect_err("alias");
        assert!(matches!(err, FileError::Alias { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("nodes.yaml: YAML alias at line 8") && msg.contains("limit of 0 aliases"),
            "{msg}"
        );
        // Anchors alone are harmless.
        let p = write(
            dir.path(),
            "anchors.yaml",
            "kind: List\nx: &a big\nitems: []\n",
        );
        assert!(read_list::<Node>(&p, "Node", "nodes", DumpLimits::default()).is_ok());
    }

    /// Issue 22: a FIFO, a device or a directory is refused before it is opened.
    #[test]
    fn non_regular_files_are_refused_unread() {
        let dir = tempfile::tempdir().expect("tmp");
        let zero = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let err = read_bounded(&zero, DEFAULT_MAX_DUMP_BYTES).expect_err("device");
        assert!(
            matches!(
                err,
                FileError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("zero.json: not a regular file"),
            "{err}"
        );
        let err = read_bounded(dir.path(), DEFAULT_MAX_DUMP_BYTES).expect_err("dir");
        assert!(
            matches!(
                err,
                FileError::NotRegular {
                    kind: "a directory",
                    ..
                }
            ),
            "{err:?}"
        );
        // Listed by from_dir, not skipped: the reader then refuses it by name.
        std::os::unix::fs::symlink("/dev/null", dir.path().join("notebooks.json"))
            .expect("symlink");
        let paths = DumpPaths::from_dir(dir.path());
        assert_eq!(
            paths.get(&kinds::NOTEBOOKS),
            Some(dir.path().join("notebooks.json").as_path())
        );
    }
}
