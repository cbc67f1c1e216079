//! Locating the control-plane binaries built by `scripts/build-test-cluster.sh`.
//!
//! Lookup order per binary (same convention as controller-runtime's envtest):
//! 1. `TEST_ASSET_<NAME>` (e.g. `TEST_ASSET_KUBE_APISERVER`, `TEST_ASSET_ETCD`),
//! 2. `$KUBEBUILDER_ASSETS/<name>`,
//! 3. the bin dir recorded in `<cache>/current-bindir` by the build script, where `<cache>` is
//!    `${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}`.
//!
//! A missing binary is a loud error, never a silent skip.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Paths of every binary the harness can run.
#[derive(Debug, Clone)]
pub struct Bins {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
    pub kwok: PathBuf,
    /// Optional: only needed by chart tests.
    pub helm: Option<PathBuf>,
    /// Optional: only built with `scripts/build-test-cluster.sh --with-ksm`.
    pub kube_state_metrics: Option<PathBuf>,
}

/// The gpu-ledger cache root: `${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = non_empty_env("GPU_LEDGER_CACHE") {
        return PathBuf::from(p);
    }
    let base = non_empty_env("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(non_empty_env("HOME").unwrap_or_else(|| "/root".into())).join(".cache"),
        PathBuf::from,
    );
    base.join("gpu-ledger")
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_var_name(name: &str) -> String {
    format!(
        "TEST_ASSET_{}",
        name.to_uppercase().replace(['-', '.'], "_")
    )
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Locates one binary (`etcd`, `kube-apiserver`, `kwok`, ...); see the module docs for the order.
pub fn binary(name: &str) -> Result<PathBuf> {
    let mut tried = Vec::new();
    let var = env_var_name(name);
    if let Some(p) = non_empty_env(&var) {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        bail!(
            "{var}={} is set but is not an executable file; fix it or unset it",
            p.display()
        );
    }
    tried.push(format!("{var} (unset)"));
    if let Some(dir) = non_empty_env("KUBEBUILDER_ASSETS") {
        let p = Path::new(&dir).join(name);
        if is_executable(&p) {
            return Ok(p);
        }
        tried.push(format!("KUBEBUILDER_ASSETS: {}", p.display()));
    } else {
        tried.push("KUBEBUILDER_ASSETS (unset)".into());
    }
    let marker = cache_root().join("current-bindir");
    match std::fs::read_to_string(&marker) {
        Ok(dir) => {
            let p = Path::new(dir.trim()).join(name);
            if is_executable(&p) {
                return Ok(p);
            }
            tried.push(format!("{} -> {}", marker.display(), p.display()));
        }
        Err(_) => tried.push(format!("{} (missing)", marker.display())),
    }
    bail!(
        "test binary `{name}` not found. Run `scripts/build-test-cluster.sh` (then \
         `export KUBEBUILDER_ASSETS=$(scripts/build-test-cluster.sh --print-bindir)`) or set \
         {var}. Looked in: {}",
        tried.join("; ")
    )
}

/// Locates all binaries; errors if any required one is missing (helm and
/// kube-state-metrics are optional).
pub fn binaries() -> Result<Bins> {
    let required = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kwok",
    ];
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for name in required {
        match binary(name) {
            Ok(p) => found.push(p),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    if !errors.is_empty() {
        bail!("missing test binaries:\n  {}", errors.join("\n  "));
    }
    let mut it = found.into_iter();
    let mut next = || it.next().expect("one path per required binary");
    Ok(Bins {
        etcd: next(),
        kube_apiserver: next(),
        kube_controller_manager: next(),
        kube_scheduler: next(),
        kubectl: next(),
        kwok: next(),
        helm: binary("helm").ok(),
        kube_state_metrics: binary("kube-state-metrics").ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert_eq!(env_var_name("kube-apiserver"), "TEST_ASSET_KUBE_APISERVER");
        assert_eq!(env_var_name("etcd"), "TEST_ASSET_ETCD");
        assert_eq!(
            env_var_name("kube-state-metrics"),
            "TEST_ASSET_KUBE_STATE_METRICS"
        );
    }
}
