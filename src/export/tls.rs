//! TLS for the admin server: a certificate and key from PEM files, reloaded when the files
//! change (checked at most once per [`RELOAD_CHECK`] on a handshake), and the serve loop for
//! plain HTTP or HTTPS with graceful shutdown.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// Shortest time between two checks of the files for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// Longest a client may take to finish the TLS handshake, or to send request headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for open connections to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found ({message})")]
    Certificate { path: PathBuf, message: String },
    #[error("{path}: no usable PEM private key ({message})")]
    Key { path: PathBuf, message: String },
    #[error("{cert} and {key} do not form a usable pair: {message}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Where the serving certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Modification time and length of both files: a change of either means "reload".
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(files: &TlsFiles) -> Stamp {
    let one = |p: &Path| std::fs::metadata(p).map_or((None, 0), |m| (m.modified().ok(), m.len()));
    [one(&files.cert), one(&files.key)]
}

/// Reads and checks the pair: the key must match the first certificate.
fn load(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate {
            path: files.cert.clone(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Certificate {
            path: files.cert.clone(),
            message: "the file holds no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Key {
        path: files.key.clone(),
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        message: e.to_string(),
    })
}

/// Serves the current pair and swaps in a new one when the files change. A pair that fails to
/// load (half-written files during a rotation) keeps the previous one and is retried.
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// When the files were last looked at, and what they looked like when last loaded.
    checked: Mutex<(Instant, Stamp)>,
}

impl ReloadingCert {
    /// Loads the pair now: a bad pair at start-up is an error.
    pub fn new(files: TlsFiles, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let seen = stamp(&files);
        let key = load(&files, &provider)?;
        Ok(ReloadingCert {
            files,
            provider,
            current: ArcSwap::from_pointee(key),
            checked: Mutex::new((Instant::now(), seen)),
        })
    }

    /// Reloads if the files changed since the last load (at most one look per [`RELOAD_CHECK`]).
    fn refresh(&self) {
        let mut checked = self
            .checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if checked.0.elapsed() < RELOAD_CHECK {
            return;
        }
        checked.0 = Instant::now();
        let now = stamp(&self.files);
        if now == checked.1 {
            return;
        }
        match load(&self.files, &self.provider) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                checked.1 = now;
                info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => warn!(
                error = &e as &dyn std::error::Error,
                "TLS files changed but cannot be loaded; serving the previous certificate"
            ),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        Some(self.current.load_full())
    }
}

/// A rustls server configuration over a [`ReloadingCert`] (ring provider, TLS 1.2 and 1.3,
/// HTTP/1.1 over ALPN).
pub fn server_config(files: TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Arc::new(ReloadingCert::new(files, provider.clone())?);
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// [`server_config`] for `--tls-cert-file` and `--tls-key-file` when both are given.
pub fn from_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => server_config(TlsFiles { cert, key }).map(Some),
        (None, None) => Ok(None),
        _ => Err(TlsError::Config(
            "--tls-cert-file and --tls-key-file go together".into(),
        )),
    }
}

/// Serves `app` on `listener` until `cancel` fires, then drains open connections: plain HTTP
/// without `tls`, HTTPS with it.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let Some(tls) = tls else {
        return axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(error = &e as &dyn std::error::Error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app, cancel) = (acceptor.clone(), app.clone(), cancel.clone());
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    debug!(%peer, error = &e as &dyn std::error::Error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                debug!(%peer, error = &e as &dyn std::error::Error, "connection ended with an error");
            }
        });
    }
    connections.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.wait())
        .await
        .is_err()
    {
        warn!("open HTTPS connections did not finish in time");
    }
    Ok(())
}
