//! One tier-A control plane shared by several tests of this binary (`ControlPlane::shared`),
//! each test in its own namespace; the cluster is stopped at process exit.

use anyhow::Result;
use gpu_ledger_testkit::ControlPlane;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};

async fn roundtrip(ns: &str) -> Result<String> {
    let cp = ControlPlane::shared(false)?;
    let client = cp.client("admin").await?;
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe"}, "data": {"ns": ns}
    }))?;
    let cms: Api<ConfigMap> = Api::namespaced(client, ns);
    cms.create(&PostParams::default(), &cm).await?;
    assert_eq!(cms.get("probe").await?.data.unwrap_or_default()["ns"], ns);
    Ok(cp.server_url().to_string())
}

#[tokio::test]
async fn shared_first() -> Result<()> {
    let url = roundtrip("shared-first").await?;
    assert_eq!(url, ControlPlane::shared(false)?.server_url());
    Ok(())
}

#[tokio::test]
async fn shared_second() -> Result<()> {
    let url = roundtrip("shared-second").await?;
    assert_eq!(url, ControlPlane::shared(false)?.server_url());
    Ok(())
}
