//! Build script: records the git revision and the compiler version for `--version` and
//! `gpu_ledger_build_info{revision,rustc}`.
//!
//! The revision is `git rev-parse --short=12 HEAD` (uncommitted changes are not marked: the
//! script reruns only when HEAD moves); outside a git checkout (a source tarball, a Docker build
//! context without `.git`) it is `GPU_LEDGER_REVISION` from the environment, else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPU_LEDGER_REVISION");
    let revision = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            // Rebuild when HEAD moves: HEAD itself, the branch it points to, and packed refs
            // (paths from git, so worktrees work too).
            for path in ["HEAD", "packed-refs"] {
                if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(p) = git(&["rev-parse", "--git-path", &branch])
            {
                println!("cargo:rerun-if-changed={p}");
            }
            rev
        }
        None => std::env::var("GPU_LEDGER_REVISION")
            .ok()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=GPU_LEDGER_REVISION={revision}");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GPU_LEDGER_RUSTC_VERSION={version}");
}
