//! Why a mode of the binary could not run, and the exit code each reason maps to.

use crate::usage::prom::PromError;

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
    Capture(#[from] super::capture_error::CaptureError),
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
    Offline(#[from] super::offline::OfflineError),
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
