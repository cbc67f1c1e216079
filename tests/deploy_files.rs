//! Deployment files that need no cluster and no helm: the chart's copies of the alert rules and
//! the Grafana dashboard must equal their sources, and the Dockerfile's build line must be one
//! that works on this tree.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{} is missing or unreadable ({e}); it is required by the Helm chart \
             (deploy/helm/gpu-ledger) and must exist before the chart can ship",
            p.display()
        )
    })
}

/// The chart embeds a copy (Helm's `.Files.Get` cannot reach outside the chart directory).
fn assert_copy(source: &str, copy: &str) {
    let src = read(source);
    let cp = read(copy);
    assert!(
        src == cp,
        "{copy} differs from {source}; refresh the chart's copy with\n    cp {source} {copy}"
    );
}

#[test]
fn chart_rules_copy_matches_alerts_source() {
    assert_copy(
        "alerts/gpu-ledger.rules.yaml",
        "deploy/helm/gpu-ledger/files/gpu-ledger.rules.yaml",
    );
}

#[test]
fn chart_dashboard_copy_matches_dashboards_source() {
    assert_copy(
        "dashboards/gpu-ledger.json",
        "deploy/helm/gpu-ledger/files/gpu-ledger.json",
    );
}

/// The `cargo build` invocation of the builder stage, with backslash continuations joined.
fn dockerfile_cargo_line(dockerfile: &str) -> String {
    let joined = dockerfile.replace("\\\n", " ");
    let lines: Vec<&str> = joined
        .lines()
        .filter(|l| l.contains("cargo build"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one `cargo build` line in the Dockerfile, found {lines:?}"
    );
    let line = lines[0];
    let start = line.find("cargo build").expect("filtered on it");
    let rest = &line[start..];
    rest.split("&&").next().unwrap_or(rest).trim().to_string()
}

#[test]
fn dockerfile_builds_release_locked_on_pinned_images() {
    let df = read("Dockerfile");
    let cargo = dockerfile_cargo_line(&df);
    let words: Vec<&str> = cargo.split_whitespace().collect();
    for flag in ["--release", "--locked"] {
        assert!(
            words.contains(&flag),
            "Dockerfile cargo line `{cargo}` lacks {flag}"
        );
    }
    // --bin must name a binary the manifest declares.
    if let Some(i) = words.iter().position(|w| *w == "--bin") {
        let bin = words.get(i + 1).expect("--bin needs a value");
        let manifest = read("Cargo.toml");
        assert!(
            manifest.contains(&format!("name = \"{bin}\"")),
            "Dockerfile builds --bin {bin}, which Cargo.toml does not declare"
        );
        assert!(
            df.contains(&format!("target/release/{bin}")),
            "Dockerfile does not copy target/release/{bin} out of the builder"
        );
    }
    // Every flag must be one cargo build accepts (checked against this cargo's own help).
    let help = Command::new(env!("CARGO"))
        .args(["build", "--help"])
        .output()
        .expect("running cargo build --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for w in words.iter().filter(|w| w.starts_with("--")) {
        assert!(
            help.contains(*w),
            "cargo build does not know the Dockerfile's flag {w}"
        );
    }

    let from: Vec<&str> = df
        .lines()
        .filter(|l| l.trim_start().starts_with("FROM "))
        .collect();
    assert_eq!(
        from.len(),
        2,
        "multi-stage: builder + runtime, got {from:?}"
    );
    assert!(
        from[0].contains("rust:1.95-bookworm"),
        "builder: {}",
        from[0]
    );
    assert!(
        from[1].contains("gcr.io/distroless/cc-debian12:nonroot")
            || from[1].contains("gcr.io/distroless/static-debian12:nonroot"),
        "runtime: {}",
        from[1]
    );
    assert!(
        df.lines().any(|l| l.trim() == "USER 65532:65532"),
        "the runtime must run as 65532 (numeric, so runAsNonRoot can verify it)"
    );
    assert!(
        df.contains("org.opencontainers.image.version=\"${GPU_LEDGER_VERSION}\""),
        "the image must carry its version label"
    );
    // A static runtime needs a musl build.
    if from[1].contains("static-debian12") {
        assert!(
            cargo.contains("x86_64-unknown-linux-musl"),
            "distroless/static needs a static (musl) binary"
        );
    }
}

/// `--locked` fails the image build if Cargo.lock is stale: check the lock file resolves as is.
#[test]
fn cargo_lock_is_current_for_locked_builds() {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["metadata", "--locked", "--format-version", "1"])
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "`cargo metadata --locked` failed, so the Dockerfile's `cargo build --locked` would \
         too (Cargo.lock out of date?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dockerignore_keeps_build_inputs() {
    let di = read(".dockerignore");
    let ignored: Vec<&str> = di
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in ["Cargo.toml", "Cargo.lock", "src", "testkit"] {
        assert!(
            !ignored.contains(&needed),
            ".dockerignore drops {needed}, which the build needs"
        );
        assert!(Path::new(&root().join(needed)).exists(), "{needed} missing");
    }
    for junk in [".git", "target"] {
        assert!(ignored.contains(&junk), ".dockerignore should drop {junk}");
    }
}

/// Leaf paths of values.yaml (maps are descended, lists and scalars are leaves).
fn value_paths(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                value_paths(&p, child, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

/// docs/install.md has a values table: every value of the chart, or a parent of it, is there.
#[test]
fn install_doc_lists_every_chart_value() {
    let values: serde_json::Value =
        serde_norway::from_str(&read("deploy/helm/gpu-ledger/values.yaml")).expect("values.yaml");
    let doc = read("docs/install.md");
    let mut paths = Vec::new();
    value_paths("", &values, &mut paths);
    assert!(
        paths.len() > 40,
        "values.yaml parsed to {} paths",
        paths.len()
    );
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            // The path or one of its parents, in backticks, in a table row.
            let parts: Vec<&str> = p.split('.').collect();
            !(1..=parts.len()).any(|n| {
                let needle = format!("`{}`", parts[..n].join("."));
                doc.lines()
                    .any(|l| l.starts_with("| ") && l.contains(&needle))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/install.md's values table lacks {missing:?}"
    );
}
