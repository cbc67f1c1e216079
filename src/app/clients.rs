//! The clients of the one-shot modes and `serve`, from the flags: the Kubernetes API (bounded
//! connect and read timeouts, `--kubeconfig`/`--context`) and Prometheus (credentials never over
//! plain http unless allowed).

use std::sync::Arc;

use super::error::AppError;
use crate::config::{KubeArgs, LedgerArgs, PrometheusArgs};
use crate::usage::prom::{PromClient, PromConfig};

/// Connect timeout of every Kubernetes client.
pub(super) const KUBE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Every response of a non-watch client must start within this.
pub(super) const KUBE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A client for one-shot calls (`report`, `capture`) on the cluster `args` names, bounded by
/// [`KUBE_CONNECT_TIMEOUT`] and [`KUBE_READ_TIMEOUT`].
pub(super) async fn kube_client(args: &KubeArgs) -> Result<kube::Client, AppError> {
    let mut config = kube_config(args).await?;
    config.connect_timeout = Some(KUBE_CONNECT_TIMEOUT);
    config.read_timeout = Some(KUBE_READ_TIMEOUT);
    kube::Client::try_from(config).map_err(AppError::Kube)
}

/// The client configuration for the cluster `args` names: `--kubeconfig` and `--context` when
/// given, else the default chain (`$KUBECONFIG`, `~/.kube/config`, in-cluster service account).
pub(super) async fn kube_config(args: &KubeArgs) -> Result<kube::Config, AppError> {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    if args.kubeconfig.is_none() && args.context.is_none() {
        return Config::infer()
            .await
            .map_err(|e| AppError::Kube(kube::Error::InferConfig(e)));
    }
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let source = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => format!("kubeconfig {}", path.display()),
        (None, Some(ctx)) => format!("context {ctx:?} of the default kubeconfig"),
        (None, None) => "the default kubeconfig".into(),
    };
    match &args.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| AppError::KubeConfig(format!("reading {source}"), e))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| AppError::KubeConfig(format!("loading {source}"), e))
}

pub(super) fn prom_client(args: &LedgerArgs) -> Result<Option<Arc<PromClient>>, AppError> {
    prometheus_client(&args.prometheus)
}

pub(super) fn prometheus_client(
    args: &PrometheusArgs,
) -> Result<Option<Arc<PromClient>>, AppError> {
    let Some(url) = args.prometheus_url.clone() else {
        return Ok(None);
    };
    check_credentials_transport(&url, args)?;
    let cfg = PromConfig {
        url,
        bearer_token_file: args.prometheus_bearer_token_file.clone(),
        ca_file: args.prometheus_ca_file.clone(),
        insecure_skip_verify: args.prometheus_insecure_skip_verify,
        timeout: args
            .prometheus_timeout
            .to_std()
            .map_err(|e| AppError::Config(format!("--prometheus-timeout: {e}")))?,
        selector: args.prometheus_selector.clone(),
        headers: args.prometheus_header.clone(),
    };
    PromClient::new(cfg)
        .map(|c| Some(Arc::new(c)))
        .map_err(AppError::Prometheus)
}

/// Refuses to send credentials (a bearer token file, or user and password in the URL) to a
/// plain-`http` Prometheus, where anyone on the path can read and replay them, unless
/// `--prometheus-allow-insecure-token` says so.
pub(super) fn check_credentials_transport(
    url: &reqwest::Url,
    args: &PrometheusArgs,
) -> Result<(), AppError> {
    let credentials = if args.prometheus_bearer_token_file.is_some() {
        "--prometheus-bearer-token-file"
    } else if !url.username().is_empty() || url.password().is_some() {
        "credentials in --prometheus-url"
    } else {
        return Ok(());
    };
    if url.scheme() != "http" {
        return Ok(());
    }
    if args.prometheus_allow_insecure_token {
        tracing::warn!(
            "sending Prometheus credentials over plain http (--prometheus-allow-insecure-token)"
        );
        return Ok(());
    }
    Err(AppError::Config(format!(
        "{credentials} with an http:// --prometheus-url would send the credentials unencrypted; \
         use an https:// URL, or pass --prometheus-allow-insecure-token \
         (GPU_LEDGER_PROMETHEUS_ALLOW_INSECURE_TOKEN=true) to accept that"
    )))
}
