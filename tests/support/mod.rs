//! Shared helpers for the control-plane integration tests (tiers A and B).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;

/// The read-only ClusterRole gpu-ledger ships (deploy/kustomize/base), so tests prove the shipped
/// RBAC is enough, not a test-only one.
pub fn shipped_cluster_roles() -> Vec<ClusterRole> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kustomize/base");
    let mut roles = Vec::new();
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read yaml");
        for doc in text.split("\n---") {
            let value: serde_json::Value = match serde_norway::from_str(doc) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if value.get("kind").and_then(|k| k.as_str()) == Some("ClusterRole") {
                roles.push(serde_json::from_value(value).expect("ClusterRole"));
            }
        }
    }
    assert!(
        !roles.is_empty(),
        "no ClusterRole found in {}",
        dir.display()
    );
    roles
}

/// Binds every shipped read-only ClusterRole to the token user `gpu-ledger`.
pub async fn grant_shipped_read_only(admin: &kube::Client) {
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    for role in shipped_cluster_roles() {
        let name = role.metadata.name.clone().expect("role name");
        // Only the read-only role: culling roles are bound separately when culling is on.
        if name.contains("cull") {
            continue;
        }
        roles
            .create(&PostParams::default(), &role)
            .await
            .expect("create role");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-test")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpu-ledger"}]
        }))
        .expect("binding");
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .expect("create binding");
    }
}

pub async fn namespace(admin: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let ns: Api<Namespace> = Api::all(admin.clone());
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let obj: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("ns");
    ns.create(&PostParams::default(), &obj)
        .await
        .expect("create namespace");
}

/// A pod asking for `gpus` × `nvidia.com/gpu`; `node` binds it directly (no scheduler needed).
pub fn gpu_pod(name: &str, gpus: u32, node: Option<&str>) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
        "terminationGracePeriodSeconds": 1
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
