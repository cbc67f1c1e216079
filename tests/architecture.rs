//! The import rules of the hub design (docs and `src/lib.rs`): the ledger depends on nothing of
//! the crate, sources and sinks depend on it, and a few arrows must never exist. A violating
//! `use crate::…` or `crate::…::` path anywhere in a module's files fails this test, and so does
//! any pair of files that name each other (`crate::` or `super::` paths), in the crate and in
//! testkit.

use std::path::{Path, PathBuf};

/// (module path under `src/`, crate modules it must never name, why).
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "ledger",
        &[
            "app",
            "claims",
            "config",
            "cull",
            "export",
            "report",
            "telemetry",
            "usage",
        ],
        "the ledger is the hub: its input model and build depend on nothing else",
    ),
    ("export", &["cull"], "no sink depends on another sink"),
    (
        "report",
        &["claims"],
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
    (
        "export",
        &["claims", "report"],
        "no sink depends on another sink (app hands the page's renderer in)",
    ),
    (
        "config.rs",
        &["cull"],
        "config holds flags, no domain logic",
    ),
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
        "k8s.rs",
        &["app"],
        "only app wires everything; nothing it wires names it",
    ),
];

fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source dir") {
            let p = entry.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Crate modules a source text names through `crate::<module>`, outside comments, with the
/// 1-based line of each mention.
fn named_modules(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` names several modules.
            if name.is_empty() && tail.starts_with('{') {
                let inner = tail[1..].split('}').next().unwrap_or("");
                for part in inner.split(',') {
                    let m: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !m.is_empty() {
                        found.push((i + 1, m));
                    }
                }
            } else if !name.is_empty() {
                found.push((i + 1, name));
            }
            rest = tail;
        }
    }
    found
}

fn violations(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (module, forbidden, why) in RULES {
        let path = root.join(module);
        assert!(path.exists(), "{} is missing", path.display());
        for file in rust_files(&path) {
            let text = std::fs::read_to_string(&file).expect("readable source");
            for (line, name) in named_modules(&text) {
                if forbidden.contains(&name.as_str()) {
                    out.push(format!(
                        "{}:{line}: {module} names crate::{name} ({why})",
                        file.display()
                    ));
                }
            }
            if *module == "cull"
                && text
                    .lines()
                    .any(|l| l.split("//").next().unwrap_or("").contains("clap::"))
            {
                out.push(format!("{}: cull uses clap ({why})", file.display()));
            }
        }
    }
    out
}

/// Code of a file without comments, string literals and inline test modules: a `super::` inside
/// `mod tests { … }` names the file itself, not its parent.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("mod tests {") || t.starts_with("pub mod tests {") {
            break;
        }
        let mut code = String::new();
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' { ' ' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
                prev = ' ';
                continue;
            }
            code.push(c);
        }
        out.push_str(&code);
        out.push('\n');
    }
    out
}

/// The module path of a file under `root` (`claims/dra.rs` → `["claims", "dra"]`; `mod.rs` and
/// `lib.rs` are their directory's module).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file that defines a module path: the longest prefix of `path` that is a file.
fn file_of(root: &Path, path: &[String]) -> Option<PathBuf> {
    for n in (0..=path.len()).rev() {
        let dir: PathBuf = path[..n].iter().collect();
        let candidates = if n == 0 {
            vec![root.join("lib.rs")]
        } else {
            vec![
                root.join(&dir).with_extension("rs"),
                root.join(&dir).join("mod.rs"),
            ]
        };
        if let Some(f) = candidates.into_iter().find(|f| f.is_file()) {
            return Some(f);
        }
    }
    None
}

/// Splits a `{a, b::{c, d}}` group body at its top-level commas.
fn group_items(body: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0usize, 0usize, Vec::new());
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    items
}

/// Every module path a `prefix::…` path starting at `tail` names (groups expanded).
fn expand(prefix: &[String], tail: &str, out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = tail.trim_start();
    loop {
        if let Some(body) = rest.strip_prefix('{') {
            // The matching brace.
            let mut depth = 1usize;
            let end = body
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(body.len(), |(i, _)| i);
            for item in group_items(&body[..end]) {
                let item = item.trim();
                if item.is_empty() {
                    continue;
                }
                if item == "self" || item.starts_with("self ") {
                    out.push(path.clone());
                } else {
                    expand(&path, item, out);
                }
            }
            return;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || name == "self" {
            out.push(path);
            return;
        }
        rest = rest[name.len()..].trim_start();
        path.push(name);
        let Some(r) = rest.strip_prefix("::") else {
            out.push(path);
            return;
        };
        rest = r.trim_start();
    }
}

/// The files of the crate under `root` that `file` names by `crate::` or `super::` paths.
fn named_files(root: &Path, file: &Path, text: &str) -> Vec<PathBuf> {
    let code = code_of(text);
    let own = module_of(root, file);
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let hit = ["crate::", "super::"]
            .iter()
            .filter_map(|k| rest.find(k).map(|i| (i, *k)))
            .min();
        let Some((i, kind)) = hit else { break };
        let start = at + i;
        at = start + kind.len();
        // `$crate::` and `foo_crate::` are no paths of this crate.
        if start > 0 {
            let before = bytes[start - 1] as char;
            if before.is_ascii_alphanumeric() || before == '_' || before == '$' || before == ':' {
                continue;
            }
        }
        let mut prefix = if kind == "crate::" {
            Vec::new()
        } else {
            // `super` of `a/b.rs` and of `a/b/mod.rs` (both module a::b) is `a`.
            let mut p = own.clone();
            p.pop();
            p
        };
        let mut tail = &code[at..];
        while let Some(t) = tail.strip_prefix("super::") {
            prefix.pop();
            tail = t;
            at += "super::".len();
        }
        expand(&prefix, tail, &mut paths);
    }
    let mut files: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| file_of(root, p))
        .filter(|f| f != file)
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Pairs of files under `root` that name each other.
fn circles(root: &Path) -> Vec<String> {
    let files = rust_files(root);
    let mut edges = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        for target in named_files(root, file, &text) {
            edges.insert((file.clone(), target));
        }
    }
    edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{} and {} name each other", a.display(), b.display()))
        .collect()
}

#[test]
fn no_two_files_import_each_other() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = circles(&manifest.join("src"));
    v.extend(circles(&manifest.join("testkit").join("src")));
    assert!(v.is_empty(), "import circles:\n{}", v.join("\n"));
}

#[test]
fn the_circle_checker_resolves_crate_and_super_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "//! root\npub mod a;\n").expect("write");
    std::fs::write(
        src.join("a").join("mod.rs"),
        "//! a\npub mod b;\npub mod c;\n",
    )
    .expect("write");
    // b names c through a group; c names b through `super::`; the inline tests of c naming
    // `super::*` (c itself) and a string or comment naming b do not count.
    std::fs::write(
        src.join("a").join("b.rs"),
        "use crate::{a::{c::{self, X}}};\n",
    )
    .expect("write");
    std::fs::write(
        src.join("a").join("c.rs"),
        "// super::b in a comment\nfn f() { let _ = \"super::b\"; }\n",
    )
    .expect("write");
    assert!(circles(src).is_empty(), "one direction is no circle");
    std::fs::write(
        src.join("a").join("c.rs"),
        "fn f() { super::b::g(); }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    )
    .expect("write");
    let v = circles(src).join("\n");
    assert!(
        v.contains("b.rs and") && v.contains("c.rs name each other"),
        "{v}"
    );
}

#[test]
fn import_rules_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let v = violations(&root);
    assert!(v.is_empty(), "import rules broken:\n{}", v.join("\n"));
}

#[test]
fn the_checker_sees_every_spelling_of_a_forbidden_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    for m in ["ledger", "export", "report", "cull", "claims", "usage"] {
        std::fs::create_dir_all(src.join(m)).expect("mkdir");
        std::fs::write(src.join(m).join("mod.rs"), "//! clean\n").expect("write");
    }
    std::fs::write(src.join("config.rs"), "use crate::ledger::Policy;\n").expect("write");
    std::fs::write(src.join("k8s.rs"), "//! clean\n").expect("write");
    assert!(violations(src).is_empty(), "a clean tree passes");

    std::fs::write(
        src.join("ledger").join("mod.rs"),
        "// crate::usage in a comment is fine\nuse crate::{claims, export};\n",
    )
    .expect("write");
    std::fs::write(
        src.join("export").join("x.rs"),
        "fn f() { crate::cull::plan(); }\n",
    )
    .expect("write");
    std::fs::write(src.join("cull").join("y.rs"), "use clap::Args;\n").expect("write");
    std::fs::write(src.join("config.rs"), "use crate::cull::CullMode;\n").expect("write");
    std::fs::write(
        src.join("report").join("z.rs"),
        "use crate::cull::plan::Plan;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("cull").join("w.rs"),
        "fn f() { crate::claims::project::to_chrono(t); }\n",
    )
    .expect("write");
    std::fs::write(
        src.join("export").join("server.rs"),
        "use crate::report::html;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("export").join("v.rs"),
        "use crate::report::html;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("claims").join("watch.rs"),
        "use crate::app::tasks::Spawn;\n",
    )
    .expect("write");
    let v = violations(src).join("\n");
    assert!(
        v.contains("claims names crate::app"),
        "a source naming app is caught:\n{v}"
    );
    assert!(
        v.contains("export/server.rs:1: export names crate::report"),
        "no exception: the page's renderer is handed in by app:\n{v}"
    );
    for expected in [
        "report names crate::cull",
        "cull names crate::claims",
        "export names crate::report",
        "ledger names crate::claims",
        "ledger names crate::export",
        "export names crate::cull",
        "cull uses clap",
        "config.rs names crate::cull",
    ] {
        assert!(v.contains(expected), "missing {expected:?} in:\n{v}");
    }
    assert!(!v.contains("crate::usage"), "comments are ignored:\n{v}");
}

/// DCGM metric names are the usage sources' business (`usage::fields`): the ledger sees the
/// `Signal` a device's series were reduced to, never a metric name (issue 29).
#[test]
fn dcgm_field_names_live_in_usage_not_in_the_ledger() {
    let ledger = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("ledger");
    let mut found = Vec::new();
    for file in rust_files(&ledger) {
        let text = std::fs::read_to_string(&file).expect("readable source");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains("\"DCGM_FI_") || code.contains("\"dcgm_") {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "DCGM field names in the ledger (they belong in src/usage/fields.rs):\n{}",
        found.join("\n")
    );
}
