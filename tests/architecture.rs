//! The import rules of the hub design (docs and `src/lib.rs`): the ledger depends on nothing of
//! the crate, sources and sinks depend on it, and a few arrows must never exist. A violating
//! `use crate::…` or `crate::…::` path anywhere in a module's files fails this test.

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
        "config.rs",
        &["cull"],
        "config holds flags, no domain logic",
    ),
    (
        "cull",
        &["config"],
        "cull takes its own config, never clap types",
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
    for m in ["ledger", "export", "report", "cull"] {
        std::fs::create_dir_all(src.join(m)).expect("mkdir");
        std::fs::write(src.join(m).join("mod.rs"), "//! clean\n").expect("write");
    }
    std::fs::write(src.join("config.rs"), "use crate::ledger::Policy;\n").expect("write");
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
    let v = violations(src).join("\n");
    for expected in [
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
