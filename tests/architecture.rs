//! The import rules of the hub design (DESIGN.md, `src/lib.rs`, docs/architecture.md): the
//! ledger depends on nothing of the crate, sources and sinks depend on it, and a few arrows must
//! never exist. A path that names a module — `crate::…`, `super::…`, `self::…` or a bare path
//! starting with a child module the file declares (`mod x;` then `x::f()`) — counts, in every
//! file of a module, test modules included; and no two files may name each other, in the crate
//! and in testkit.
//!
//! The checker works on (path, source) pairs, so the self-tests below feed it synthetic trees
//! with one breach each and assert the exact violation it reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// (top-level module under `src/`, crate modules it must never name, why).
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "ledger",
        &[
            "app",
            "claims",
            "config",
            "cull",
            "export",
            "k8s",
            "report",
            "spawn",
            "telemetry",
            "test_hooks",
            "usage",
        ],
        "the ledger is the hub: its input model and build depend on nothing else",
    ),
    (
        "telemetry",
        &["config"],
        "telemetry is a floor below config: config may name telemetry's types, never the reverse",
    ),
    (
        "claims",
        &["usage"],
        "the sources claims and usage import neither each other",
    ),
    (
        "usage",
        &["claims"],
        "the sources claims and usage import neither each other",
    ),
    (
        "claims",
        &["cull", "export", "report"],
        "a source imports no sink",
    ),
    (
        "usage",
        &["cull", "export", "report"],
        "a source imports no sink",
    ),
    (
        "export",
        &["claims", "usage"],
        "a sink reads the ledger's types, never a source's",
    ),
    (
        "export",
        &["cull", "report"],
        "no sink depends on another sink (app hands the page's renderer in)",
    ),
    (
        "report",
        &["claims", "usage"],
        "report renders a ledger; where it came from is app's business",
    ),
    (
        "report",
        &["cull", "export"],
        "no sink depends on another sink (culling renders its own plan)",
    ),
    (
        "cull",
        &["claims", "usage"],
        "a sink reads the ledger's types; shared Kubernetes lookups come from k8s",
    ),
    (
        "cull",
        &["export", "report"],
        "no sink depends on another sink",
    ),
    ("config", &["cull"], "config holds flags, no domain logic"),
    (
        "cull",
        &["config"],
        "cull takes its own config, never clap types",
    ),
    (
        "claims",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "usage",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "cull",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "export",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "report",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "k8s",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
    (
        "telemetry",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
];

/// One crate's sources: (path relative to the manifest, text), e.g. (`src/ledger/mod.rs`, …).
type Tree = Vec<(String, String)>;

/// The `.rs` files under `manifest/root`, as a tree. `src/main.rs` is left out: it is the
/// binary's crate root, whose `crate::` is not the library's.
fn load(manifest: &Path, root: &str) -> Tree {
    let mut out = Vec::new();
    let mut stack = vec![manifest.join(root)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source dir") {
            let p = entry.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p
                    .strip_prefix(manifest)
                    .expect("under the manifest")
                    .to_string_lossy()
                    .replace('\\', "/");
                if rel != "src/main.rs" {
                    let text = std::fs::read_to_string(&p).expect("readable source");
                    out.push((rel, text));
                }
            }
        }
    }
    out.sort();
    out
}

/// The text with comments, string, raw string and char literals blanked (newlines kept, so
/// line numbers stay): a path inside a doc comment or a string names nothing.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        let mut end = None;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let mut j = i;
            while j < c.len() && c[j] != '\n' {
                j += 1;
            }
            end = Some(j);
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let (mut j, mut depth) = (i + 2, 1usize);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 1;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 1;
                }
                j += 1;
            }
            end = Some(j);
        } else if !prev_ident && (c[i] == 'r' || (c[i] == 'b' && c.get(i + 1) == Some(&'r'))) {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                j += 1;
                while j < c.len() {
                    if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                end = Some(j);
            }
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() {
                if c[j] == '\\' {
                    j += 2;
                    continue;
                }
                j += 1;
                if c[j - 1] == '"' {
                    break;
                }
            }
            end = Some(j);
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'); anything else is a lifetime or a label.
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                end = Some(j + 1);
            } else if c.get(i + 2) == Some(&'\'') {
                end = Some(i + 3);
            }
        }
        if let Some(j) = end {
            let j = j.min(c.len());
            out.extend(c[i..j].iter().map(|&ch| blank(ch)));
            i = j;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Other(char),
}

/// The tokens of stripped code, each with its 1-based line.
fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1usize, 0usize);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((line, Tok::Ident(c[start..i].iter().collect())));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((line, Tok::PathSep));
            i += 2;
        } else {
            let t = match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                ';' => Tok::Semi,
                other => Tok::Other(other),
            };
            out.push((line, t));
            i += 1;
        }
    }
    out
}

fn is_ident(t: Option<&(usize, Tok)>, name: &str) -> bool {
    matches!(t, Some((_, Tok::Ident(s))) if s == name)
}

/// Every module path the path starting at token `k` names, under `path` (groups expanded);
/// returns the index after the path.
fn expand(
    t: &[(usize, Tok)],
    mut k: usize,
    mut path: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match t.get(k).map(|(_, tok)| tok) {
            Some(Tok::Open) => {
                k += 1;
                loop {
                    match t.get(k).map(|(_, tok)| tok) {
                        None => return k,
                        Some(Tok::Close) => return k + 1,
                        Some(Tok::Comma) => k += 1,
                        Some(Tok::Ident(s)) if s == "self" => {
                            out.push(path.clone());
                            k += 1;
                        }
                        Some(Tok::Ident(s)) if s == "as" => k += 2,
                        Some(Tok::Ident(_) | Tok::Open) => k = expand(t, k, path.clone(), out),
                        Some(_) => {
                            out.push(path.clone());
                            k += 1;
                        }
                    }
                }
            }
            Some(Tok::Ident(s)) if s != "self" => {
                path.push(s.clone());
                k += 1;
                if matches!(t.get(k), Some((_, Tok::PathSep))) {
                    k += 1;
                } else {
                    out.push(path);
                    return k;
                }
            }
            _ => {
                out.push(path);
                return k;
            }
        }
    }
}

/// The module path of a file (`src/claims/dra.rs` under root `src` → `["claims", "dra"]`;
/// `mod.rs` and `lib.rs` are their directory's module).
fn module_of(root: &str, file: &str) -> Vec<String> {
    let rel = file
        .strip_prefix(root)
        .unwrap_or(file)
        .trim_start_matches('/')
        .trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Module paths a file names, each with the line it is named on: `crate::`, `super::` and
/// `self::` paths, and bare paths that start with a child module the file declares (`mod x;`,
/// in the file or in one of its inline modules). Inside an inline module (`mod tests { … }`)
/// `super::` is the file itself.
fn mentions(root: &str, file: &str, text: &str) -> Vec<(usize, Vec<String>)> {
    let t = tokens(&strip(text));
    let own = module_of(root, file);
    // Children declared by `mod x;`, as full module paths.
    let mut children = BTreeSet::new();
    {
        let (mut inline, mut depth): (Vec<(String, usize)>, usize) = (Vec::new(), 0);
        for k in 0..t.len() {
            match &t[k].1 {
                Tok::Open => depth += 1,
                Tok::Close => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(m) if m == "mod" => {
                    if let Some((_, Tok::Ident(name))) = t.get(k + 1) {
                        let mut p = own.clone();
                        p.extend(inline.iter().map(|(n, _)| n.clone()));
                        p.push(name.clone());
                        match t.get(k + 2).map(|(_, tok)| tok) {
                            Some(Tok::Semi) => {
                                children.insert(p);
                            }
                            Some(Tok::Open) => inline.push((name.clone(), depth)),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    let (mut inline, mut depth): (Vec<(String, usize)>, usize) = (Vec::new(), 0);
    let mut k = 0;
    while k < t.len() {
        let (line, tok) = &t[k];
        let prev = k.checked_sub(1).and_then(|p| t.get(p)).map(|(_, tok)| tok);
        // `$crate::` in a macro of this crate is `crate::`.
        let follows_path = matches!(prev, Some(Tok::PathSep));
        let next_is_sep = matches!(t.get(k + 1), Some((_, Tok::PathSep)));
        let mut scope = own.clone();
        scope.extend(inline.iter().map(|(n, _)| n.clone()));
        match tok {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(m) if m == "mod" => {
                if let (Some((_, Tok::Ident(name))), Some((_, Tok::Open))) =
                    (t.get(k + 1), t.get(k + 2))
                {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    k += 3;
                    continue;
                }
            }
            Tok::Ident(s) if next_is_sep && !follows_path => {
                let start = match s.as_str() {
                    "crate" => Some((Vec::new(), k + 2)),
                    "self" => Some((scope.clone(), k + 2)),
                    "super" => {
                        let mut p = scope.clone();
                        let mut j = k;
                        while is_ident(t.get(j), "super")
                            && matches!(t.get(j + 1), Some((_, Tok::PathSep)))
                        {
                            p.pop();
                            j += 2;
                        }
                        Some((p, j))
                    }
                    name => (0..=inline.len())
                        .rev()
                        .map(|n| {
                            let mut p = own.clone();
                            p.extend(inline[..n].iter().map(|(n, _)| n.clone()));
                            p
                        })
                        .find(|p| {
                            let mut c = p.clone();
                            c.push(name.to_string());
                            children.contains(&c)
                        })
                        .map(|p| (p, k)),
                };
                if let Some((prefix, from)) = start {
                    let mut paths = Vec::new();
                    k = expand(&t, from, prefix, &mut paths);
                    out.extend(paths.into_iter().map(|p| (*line, p)));
                    continue;
                }
            }
            _ => {}
        }
        k += 1;
    }
    out
}

/// The file of a tree that defines a module path: the longest prefix of `path` that is a file.
fn file_of<'a>(root: &str, files: &'a BTreeSet<&str>, path: &[String]) -> Option<&'a str> {
    (0..=path.len()).rev().find_map(|n| {
        let dir = path[..n].join("/");
        let candidates = if n == 0 {
            vec![format!("{root}/lib.rs")]
        } else {
            vec![format!("{root}/{dir}.rs"), format!("{root}/{dir}/mod.rs")]
        };
        candidates
            .iter()
            .find_map(|c| files.get(c.as_str()).copied())
    })
}

/// Pairs of files of a crate (`root`: its source dir in the tree) that name each other.
fn circles(root: &str, tree: &Tree) -> Vec<String> {
    let files: BTreeSet<&str> = tree.iter().map(|(p, _)| p.as_str()).collect();
    // (from, to) → the first line of `from` that names `to`.
    let mut edges = BTreeMap::new();
    for (file, text) in tree {
        for (line, path) in mentions(root, file, text) {
            if let Some(target) = file_of(root, &files, &path)
                && target != file
            {
                edges.entry((file.as_str(), target)).or_insert(line);
            }
        }
    }
    edges
        .iter()
        .filter(|((a, b), _)| a < b)
        .filter_map(|((a, b), line)| {
            let back = edges.get(&(*b, *a))?;
            Some(format!("{a}:{line} and {b}:{back} name each other"))
        })
        .collect()
}

/// Breaches of `RULES` in the library's tree (root `src`), one line each.
fn violations(tree: &Tree) -> Vec<String> {
    let mut by_module: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (module, forbidden, why) in RULES {
        for f in *forbidden {
            by_module.entry(module).or_default().push((f, why));
        }
    }
    let mut out = Vec::new();
    for (file, text) in tree {
        let own = module_of("src", file);
        let Some(rules) = own.first().and_then(|m| by_module.get(m.as_str())) else {
            continue;
        };
        let module = &own[0];
        for (line, path) in mentions("src", file, text) {
            let Some(top) = path.first() else { continue };
            for (forbidden, why) in rules {
                let v = format!("{file}:{line}: {module} names crate::{top} ({why})");
                // A group naming two items of one module is one breach.
                if top == forbidden && out.last() != Some(&v) {
                    out.push(v);
                }
            }
        }
        if module == "cull" {
            let t = tokens(&strip(text));
            if let Some(w) = t.windows(2).find(|w| {
                w[0].1 == Tok::Ident("clap".into())
                    && matches!(w[1].1, Tok::PathSep | Tok::Semi | Tok::Open)
            }) {
                out.push(format!(
                    "{file}:{}: cull uses clap (cull takes its own config, never clap types)",
                    w[0].0
                ));
            }
        }
    }
    out
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_two_files_name_each_other() {
    let mut v = circles("src", &load(manifest(), "src"));
    v.extend(circles("testkit/src", &load(manifest(), "testkit/src")));
    assert!(v.is_empty(), "files naming each other:\n{}", v.join("\n"));
}

#[test]
fn import_rules_hold() {
    let tree = load(manifest(), "src");
    for (module, _, _) in RULES {
        assert!(
            tree.iter()
                .any(|(p, _)| module_of("src", p).first().map(String::as_str) == Some(*module)),
            "the rules name module {module}, which src/ no longer has"
        );
    }
    let v = violations(&tree);
    assert!(v.is_empty(), "import rules broken:\n{}", v.join("\n"));
}
/// DCGM metric names are the usage sources' business (`usage::fields`): the ledger sees the
/// `Signal` a device's series were reduced to, never a metric name (issue 29).
#[test]
fn dcgm_field_names_live_in_usage_not_in_the_ledger() {
    let mut found = Vec::new();
    for (file, text) in load(manifest(), "src") {
        if !file.starts_with("src/ledger/") {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains("\"DCGM_FI_") || code.contains("\"dcgm_") {
                found.push(format!("{file}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "DCGM field names in the ledger (they belong in src/usage/fields.rs):\n{}",
        found.join("\n")
    );
}

/// The binary polls no future: release builds share no generic instantiations between crates,
/// so a `block_on` or `.await` in src/main.rs made the binary generate the code of every future
/// the commands await a second time (138 s of a cold 2-core release build; docs/first-build.md).
/// The dispatch lives in `app::run`.
#[test]
fn the_binary_polls_no_future() {
    let text = std::fs::read_to_string(manifest().join("src/main.rs")).expect("readable source");
    let found: Vec<String> = strip(&text)
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("block_on") || l.contains(".await") || l.contains("async "))
        .map(|(i, l)| format!("src/main.rs:{}: {}", i + 1, l.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "async code in the binary crate (move it into the library, e.g. app::run):\n{}",
        found.join("\n")
    );
}

/// A small library tree that keeps every rule: a hub with a child it calls by a bare path and
/// re-exports from, sources and sinks naming only the ledger, a test module file
/// (`pub(crate) mod tests;`) and inline test modules naming their own file, and forbidden paths
/// that appear only in comments, strings, raw strings and after a char literal.
fn clean_tree() -> Tree {
    [
        (
            "src/lib.rs",
            "//! root\npub mod app;\npub mod claims;\npub mod config;\npub mod cull;\npub mod export;\npub mod k8s;\npub mod ledger;\npub mod report;\npub mod telemetry;\npub mod usage;\n",
        ),
        (
            "src/ledger/mod.rs",
            "//! hub\nmod attribution;\npub mod model;\n#[cfg(test)]\nmod tests;\npub use model::PodRow;\npub fn build() -> Vec<PodRow> { attribution::attribute(&[]) }\n",
        ),
        (
            "src/ledger/attribution.rs",
            "//! who\nuse super::model::PodRow;\npub fn attribute(rows: &[PodRow]) -> Vec<PodRow> { rows.to_vec() }\n",
        ),
        ("src/ledger/model.rs", "//! rows\n#[derive(Clone)]\npub struct PodRow;\n"),
        ("src/ledger/tests.rs", "use super::*;\n#[test]\nfn t() { build(); }\n"),
        (
            "src/claims/mod.rs",
            "//! claims\nuse crate::ledger::PodRow;\n// crate::usage in a comment\n/* crate::usage /* nested */ crate::cull */\nconst S: &str = \"crate::usage::x \\\" crate::cull\";\nconst R: &str = r#\"crate::cull \"quoted\" \"#;\nconst C: char = '\"';\nconst Q: char = '\\'';\nfn f<'a>(x: &'a str) -> &'a str { x }\n",
        ),
        (
            "src/usage/mod.rs",
            "//! usage\npub mod prom;\npub use prom::Answer;\nuse crate::ledger::model::PodRow;\n",
        ),
        (
            "src/usage/prom/mod.rs",
            "//! prom\npub mod decode;\nmod error;\npub use decode::Answer;\npub use error::PromError;\n",
        ),
        (
            "src/usage/prom/decode.rs",
            "//! decode\nuse super::error::PromError;\npub struct Answer;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { super::Answer; }\n}\n",
        ),
        ("src/usage/prom/error.rs", "//! errors\npub struct PromError;\n"),
        (
            "src/export/mod.rs",
            "//! export\nuse crate::ledger::{self, PodRow};\nmacro_rules! m { () => { $crate::ledger::build() }; }\n",
        ),
        (
            "src/report/mod.rs",
            "//! report\npub mod table;\nuse crate::ledger::PodRow;\npub fn render() { table::render_table(); }\n",
        ),
        (
            "src/report/table.rs",
            "//! table\nuse crate::ledger::PodRow;\npub fn render_table() {}\n",
        ),
        (
            "src/cull/mod.rs",
            "//! cull\npub mod actuator;\nmod plan;\npub use plan::CullMode;\n#[cfg(test)]\nmod tests;\n",
        ),
        ("src/cull/plan.rs", "//! plan\npub enum CullMode { Off }\n"),
        (
            "src/cull/actuator.rs",
            "//! acts\nuse super::plan::CullMode;\nuse crate::k8s::notebook;\n#[cfg(test)]\npub(crate) mod tests;\n",
        ),
        ("src/cull/actuator/tests.rs", "use super::*;\npub struct FakeApi;\n"),
        (
            "src/cull/tests.rs",
            "use super::actuator::tests::FakeApi;\nuse super::*;\n",
        ),
        (
            "src/app/mod.rs",
            "//! app\nmod error;\nmod hub;\nuse crate::{claims, cull, export, report, usage};\npub use error::AppError;\npub fn run() { hub::run(); }\n",
        ),
        ("src/app/error.rs", "//! errors\npub struct AppError;\n"),
        (
            "src/app/hub.rs",
            "//! hub loop\npub fn run() {}\n#[cfg(test)]\npub(super) mod tests {\n    use super::*;\n    fn t() { super::run(); }\n}\n",
        ),
        ("src/config.rs", "//! flags\nuse crate::ledger::Policy;\nuse crate::telemetry::LogFormat;\n"),
        ("src/k8s.rs", "//! lookups\nuse crate::ledger::PodRow;\n"),
        ("src/telemetry.rs", "//! logs\npub enum LogFormat { Json }\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect()
}

/// The clean tree with `files` added or replaced.
fn with(files: &[(&str, &str)]) -> Tree {
    let mut tree = clean_tree();
    for (path, text) in files {
        tree.retain(|(p, _)| p != path);
        tree.push((path.to_string(), text.to_string()));
    }
    tree.sort();
    tree
}

#[test]
fn a_clean_tree_passes_both_checks() {
    assert_eq!(circles("src", &clean_tree()), Vec::<String>::new());
    assert_eq!(violations(&clean_tree()), Vec::<String>::new());
}

#[test]
fn a_parent_and_a_child_it_calls_by_a_bare_path_are_a_knot() {
    // ledger/mod.rs calls `attribution::attribute(..)` (line 7); the child reaches back up.
    let tree = with(&[(
        "src/ledger/attribution.rs",
        "//! who\nuse super::PodRow;\npub fn attribute(rows: &[PodRow]) -> Vec<PodRow> { rows.to_vec() }\n",
    )]);
    assert_eq!(
        circles("src", &tree),
        ["src/ledger/attribution.rs:2 and src/ledger/mod.rs:7 name each other"]
    );
    // The same knot through `use child::item` and `self::child`, the child naming its parent
    // through `crate::`.
    let tree = with(&[
        (
            "src/ledger/mod.rs",
            "//! hub\nmod attribution;\nuse attribution::attribute;\n",
        ),
        (
            "src/ledger/attribution.rs",
            "//! who\nuse crate::ledger::Policy;\n",
        ),
    ]);
    assert_eq!(
        circles("src", &tree),
        ["src/ledger/attribution.rs:2 and src/ledger/mod.rs:3 name each other"]
    );
    let tree = with(&[
        (
            "src/ledger/mod.rs",
            "//! hub\nmod attribution;\n\npub type A = self::attribution::Attribution;\n",
        ),
        (
            "src/ledger/attribution.rs",
            "//! who\nuse crate::{ledger::{Policy}};\n",
        ),
    ]);
    assert_eq!(
        circles("src", &tree),
        ["src/ledger/attribution.rs:2 and src/ledger/mod.rs:4 name each other"]
    );
}

#[test]
fn two_siblings_naming_each_other_through_super_are_a_knot() {
    let tree = with(&[(
        "src/usage/prom/error.rs",
        "//! errors\npub struct PromError(super::decode::Answer);\n",
    )]);
    assert_eq!(
        circles("src", &tree),
        ["src/usage/prom/decode.rs:2 and src/usage/prom/error.rs:2 name each other"]
    );
}

#[test]
fn test_modules_are_files_like_any_other() {
    // A `pub(crate) mod tests;` file naming the parent's test file, which names it back.
    let tree = with(&[(
        "src/cull/actuator/tests.rs",
        "use super::*;\nuse crate::cull::tests::now;\npub struct FakeApi;\n",
    )]);
    assert_eq!(
        circles("src", &tree),
        ["src/cull/actuator/tests.rs:2 and src/cull/tests.rs:1 name each other"]
    );
    // An inline `pub(super) mod tests { … }` counts for its file; its `super::super::` is the
    // file's parent's module, here the sibling error.rs.
    let tree = with(&[
        (
            "src/app/hub.rs",
            "//! hub loop\npub fn run() {}\n#[cfg(test)]\npub(super) mod tests {\n    use super::super::error::AppError;\n}\n",
        ),
        (
            "src/app/error.rs",
            "//! errors\npub struct AppError;\nfn f() { super::hub::run(); }\n",
        ),
    ]);
    assert_eq!(
        circles("src", &tree),
        ["src/app/error.rs:3 and src/app/hub.rs:5 name each other"]
    );
}

#[test]
fn a_mod_declaration_is_no_naming() {
    // The parent only declares the child; the child names the parent: one direction.
    let tree = with(&[(
        "src/report/table.rs",
        "//! table\nuse super::render;\npub fn render_table() {}\n",
    )]);
    assert_eq!(
        circles("src", &tree),
        ["src/report/mod.rs:4 and src/report/table.rs:2 name each other"],
        "render() calls table::render_table(), so this one is a knot"
    );
    let tree = with(&[
        (
            "src/report/mod.rs",
            "//! report\npub mod table;\npub fn render() {}\n",
        ),
        ("src/report/table.rs", "//! table\nuse super::render;\n"),
    ]);
    assert_eq!(circles("src", &tree), Vec::<String>::new());
}

/// Every rule, in three spellings (`crate::` path, nested group, `super::` chain), reports
/// exactly the one breach planted in the clean tree.
#[test]
fn every_rule_reports_exactly_its_breach() {
    let mut checked = 0;
    for (module, forbidden, why) in RULES {
        let dir = format!("src/{module}/mod.rs");
        let nested = clean_tree().iter().any(|(p, _)| *p == dir);
        let file = if nested {
            format!("src/{module}/breach.rs")
        } else {
            format!("src/{module}.rs")
        };
        let up = if nested { "super::super::" } else { "super::" };
        for f in *forbidden {
            for spelling in [
                format!("//! breach\nuse crate::{f}::Thing;\n"),
                format!("//! breach\nuse crate::{{ledger, {f}::{{self, Thing}}}};\n"),
                format!("//! breach\nfn g() {{ {up}{f}::thing(); }}\n"),
            ] {
                let tree = with(&[(&file, &spelling)]);
                assert_eq!(
                    violations(&tree),
                    [format!("{file}:2: {module} names crate::{f} ({why})")],
                    "{spelling}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 3 * 30, "{checked} breaches checked");
}

/// The three rules issue 38 added, test modules included: claims ↔ usage, export → usage,
/// report → usage.
#[test]
fn sources_do_not_name_each_other_and_sinks_do_not_name_usage() {
    let cases = [
        (
            "src/claims/mod.rs",
            "//! claims\nuse crate::ledger::PodRow;\n#[cfg(test)]\nmod tests {\n    use crate::usage::Answer;\n}\n",
            "src/claims/mod.rs:5: claims names crate::usage (the sources claims and usage import neither each other)",
        ),
        (
            "src/usage/prom/decode.rs",
            "//! decode\nuse super::error::PromError;\nfn f() { super::super::super::claims::watch(); }\n",
            "src/usage/prom/decode.rs:3: usage names crate::claims (the sources claims and usage import neither each other)",
        ),
        (
            "src/export/tests.rs",
            "use super::*;\nuse crate::usage::series::Labels;\n",
            "src/export/tests.rs:2: export names crate::usage (a sink reads the ledger's types, never a source's)",
        ),
        (
            "src/report/table.rs",
            "//! table\npub fn render_table() {}\n#[cfg(test)]\nmod tests {\n    fn t() { crate::usage::prom::decode::Answer; }\n}\n",
            "src/report/table.rs:5: report names crate::usage (report renders a ledger; where it came from is app's business)",
        ),
    ];
    for (file, text, expected) in cases {
        assert_eq!(violations(&with(&[(file, text)])), [expected]);
    }
}

#[test]
fn cull_never_names_clap() {
    let tree = with(&[("src/cull/flags.rs", "//! flags\nuse clap::Args;\n")]);
    assert_eq!(
        violations(&tree),
        ["src/cull/flags.rs:2: cull uses clap (cull takes its own config, never clap types)"]
    );
}

#[test]
fn a_char_literal_hides_no_path() {
    // A stripper that took '"' for the start of a string would blank the breach after it.
    let tree = with(&[(
        "src/ledger/model.rs",
        "//! rows\nconst Q: char = '\"'; use crate::usage::Answer;\nconst S: &str = r#\"\"#; fn f() { crate::cull::plan(); }\n",
    )]);
    let why = "the ledger is the hub: its input model and build depend on nothing else";
    assert_eq!(
        violations(&tree),
        [
            format!("src/ledger/model.rs:2: ledger names crate::usage ({why})"),
            format!("src/ledger/model.rs:3: ledger names crate::cull ({why})"),
        ]
    );
}
