//! The runtime edges, one file per mode: `serve` (sources → ledger hub → sinks, each on its own
//! task; the hub loop in `hub`, the task supervisor in `tasks`), `report` (one ledger from a live cluster or from dump files, `offline`), `capture`
//! (the live inputs written as the files `offline` reads). Everything here is I/O and wiring;
//! decisions live in `ledger` and `cull`.

mod capture;
mod hub;
pub mod offline;
pub mod page;
mod recheck;
mod report;
mod serve;
mod showback;
pub mod tasks;

use std::sync::Arc;

use crate::config::{
    CullArgs, CullModeFlag, CullPolicyArgs, CullWhenFlag, KubeArgs, LedgerArgs, PrometheusArgs,
    WebhookFormatFlag,
};
use crate::cull::{CullConfig, CullMode, CullPolicy, CullWhen};
use crate::ledger::Policy;
use crate::ledger::usage::Window;
use crate::usage::live::LiveSettings;
use crate::usage::prom::{PromClient, PromConfig, PromError};

pub use capture::capture;
pub use report::report;
pub use serve::serve;
pub use showback::{prometheus_history, showback};

/// Why the process could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("connecting to the Kubernetes API (kubeconfig or in-cluster)")]
    Kube(#[source] kube::Error),
    #[error("{0}")]
    KubeConfig(String, #[source] kube::config::KubeconfigError),
    #[error(transparent)]
    Capture(#[from] capture::CaptureError),
    #[error(transparent)]
    List(#[from] crate::claims::list::ListError),
    #[error("binding {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("http server")]
    Serve(#[source] std::io::Error),
    #[error("prometheus")]
    Prometheus(#[source] PromError),
    /// `report` was written without utilisation (every pod's shows as unknown).
    #[error("prometheus could not be used; the report shows claims only, utilisation unknown")]
    UsageUnavailable(#[source] PromError),
    #[error("registering metrics")]
    Metrics(#[source] prometheus::Error),
    #[error(transparent)]
    Offline(#[from] offline::OfflineError),
    #[error("writing output")]
    Output(#[source] std::io::Error),
    #[error("writing {0}")]
    OutputFile(String, #[source] std::io::Error),
    #[error("culling")]
    Cull(#[source] crate::cull::CullError),
    #[error("task {0} ended unexpectedly")]
    TaskEnded(String),
    #[error("invalid configuration")]
    Tls(#[from] crate::export::tls::TlsError),
    #[error("invalid configuration")]
    ApiAuth(#[from] crate::export::auth::AuthError),
    /// Bad input named by the message (e.g. a `--from` directory that does not exist).
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Discover(#[from] crate::usage::discover::DiscoverError),
    /// `showback` wrote its result, but it covers less of the period than asked for.
    #[error("{0}")]
    Partial(String),
}

impl AppError {
    /// Exit code (`config::EXIT_CODES` documents them): 2 for bad input or configuration, 3 when
    /// the Kubernetes API or Prometheus could not be reached (a script may retry), 4 for a
    /// partial showback (`config::SHOWBACK_EXIT_CODES`), 1 for every other runtime failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_)
            | Self::Offline(_)
            | Self::KubeConfig(..)
            | Self::Tls(_)
            | Self::ApiAuth(_)
            | Self::Input(_) => 2,
            Self::Partial(_) => 4,
            _ if self.is_unreachable() => 3,
            _ => 1,
        }
    }

    /// Whether a server could not be reached: Prometheus' transport failed or timed out, or a
    /// cause in the chain is a refused, reset or timed-out connection, an unreachable network,
    /// a name that does not resolve, a failed TLS handshake, or one of our own call timeouts.
    fn is_unreachable(&self) -> bool {
        if matches!(
            self,
            Self::Prometheus(PromError::Transport(_) | PromError::Timeout)
                | Self::UsageUnavailable(PromError::Transport(_) | PromError::Timeout)
        ) {
            return true;
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind as K;
                if matches!(
                    io.kind(),
                    K::ConnectionRefused
                        | K::ConnectionReset
                        | K::ConnectionAborted
                        | K::NotConnected
                        | K::TimedOut
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::AddrNotAvailable
                ) {
                    return true;
                }
                // The TLS handshake failed (an untrusted or expired certificate, a name that
                // does not match): rustls' error travels inside an io::Error.
                if io
                    .get_ref()
                    .is_some_and(<dyn std::error::Error + Send + Sync>::is::<rustls::Error>)
                {
                    return true;
                }
            }
            if e.is::<rustls::Error>()
                // kube's HTTP client could not connect: refused, unresolved, or the TLS
                // handshake failed (rustls' error sits under it in a form not downcast here).
                || e.downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(hyper_util::client::legacy::Error::is_connect)
                || e.downcast_ref::<reqwest::Error>()
                .is_some_and(|r| r.is_connect() || r.is_timeout())
                || e.is::<tokio::time::error::Elapsed>()
                // hyper-util's connector names a failed lookup only in its text (its io::Error
                // from getaddrinfo has kind Other).
                || e.to_string() == "dns error"
            {
                return true;
            }
            cause = e.source();
        }
        false
    }
}

/// The idle window of the live paths (`interval`: the DCGM sample spacing assumed where the samples
/// cannot show theirs, `--scrape-interval`).
fn window_of(args: &LedgerArgs, interval: chrono::Duration) -> Window {
    Window {
        length: args.window,
        interval,
        idle_threshold: args.idle_threshold,
        max_staleness: args.max_staleness,
    }
}

/// Settings of the live usage source.
fn live_settings(args: &LedgerArgs) -> LiveSettings {
    let interval = args
        .scrape_interval
        .unwrap_or(chrono::Duration::seconds(30));
    LiveSettings {
        scheme: args.label_scheme,
        window: window_of(args, interval),
        history_lookback: args.history_lookback,
        min_coverage: args.min_coverage,
    }
}

/// Connect timeout of every Kubernetes client.
const KUBE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Every response of a non-watch client must start within this.
const KUBE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A client for one-shot calls (`report`, `capture`) on the cluster `args` names, bounded by
/// [`KUBE_CONNECT_TIMEOUT`] and [`KUBE_READ_TIMEOUT`].
async fn kube_client(args: &KubeArgs) -> Result<kube::Client, AppError> {
    let mut config = kube_config(args).await?;
    config.connect_timeout = Some(KUBE_CONNECT_TIMEOUT);
    config.read_timeout = Some(KUBE_READ_TIMEOUT);
    kube::Client::try_from(config).map_err(AppError::Kube)
}

/// The client configuration for the cluster `args` names: `--kubeconfig` and `--context` when
/// given, else the default chain (`$KUBECONFIG`, `~/.kube/config`, in-cluster service account).
async fn kube_config(args: &KubeArgs) -> Result<kube::Config, AppError> {
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

fn prom_client(args: &LedgerArgs) -> Result<Option<Arc<PromClient>>, AppError> {
    prometheus_client(&args.prometheus)
}

fn prometheus_client(args: &PrometheusArgs) -> Result<Option<Arc<PromClient>>, AppError> {
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
fn check_credentials_transport(url: &reqwest::Url, args: &PrometheusArgs) -> Result<(), AppError> {
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

fn cull_mode(flag: CullModeFlag) -> CullMode {
    match flag {
        CullModeFlag::Off => CullMode::Off,
        CullModeFlag::DryRun => CullMode::DryRun,
        CullModeFlag::On => CullMode::On,
    }
}

/// The culling rules from the command line, with coverage and staleness from the ledger policy.
fn cull_policy(args: &CullPolicyArgs, ledger: &Policy) -> CullPolicy {
    let listed = |v: &[String]| v.iter().filter(|s| !s.is_empty()).cloned().collect();
    CullPolicy {
        idle_after: args.cull_idle_after,
        min_runtime: args.cull_min_runtime,
        min_coverage: ledger.min_coverage,
        max_staleness: ledger.max_staleness,
        max_per_cycle: args.cull_max_per_cycle,
        namespaces: listed(&args.cull_namespaces),
        exclude_namespaces: listed(&args.cull_exclude_namespaces),
        notice: args.cull_notice,
        max_snooze: args.cull_max_snooze,
        when: match args.cull_when {
            CullWhenFlag::Idle => CullWhen::Idle,
            CullWhenFlag::Demand => CullWhen::Demand,
        },
        ..CullPolicy::default()
    }
}

/// The culling configuration from the command line.
fn cull_config(args: &CullArgs, ledger: &Policy) -> CullConfig {
    // Resolved once: the Lease and a kill switch named without a namespace live here.
    let lease_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(crate::cull::own_namespace);
    CullConfig {
        mode: cull_mode(args.mode),
        policy: cull_policy(&args.policy, ledger),
        namespace_selector: args
            .cull_namespace_selector
            .clone()
            .filter(|s| !s.trim().is_empty()),
        lease_name: args.lease_name.clone(),
        kill_switch: args
            .cull_kill_switch
            .as_ref()
            .map(|k| k.resolve(&lease_namespace)),
        lease_namespace: Some(lease_namespace),
        notice_webhook: args.cull_notice_webhook_url_file.clone().map(|file| {
            let format = match args.cull_notice_webhook_format {
                WebhookFormatFlag::Alertmanager => {
                    crate::cull::webhook::WebhookFormat::Alertmanager
                }
                WebhookFormatFlag::Slack => crate::cull::webhook::WebhookFormat::Slack,
            };
            (file, format)
        }),
        ..CullConfig::default()
    }
}
