//! TLS for the admin server: a certificate and key from PEM files, reloaded when the files
//! change (checked at most once per [`RELOAD_CHECK`] on a handshake), and the serve loop for
//! plain HTTP or HTTPS with graceful shutdown and bounds on slow and numerous clients.

use std::future::Future as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
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
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// Shortest time between two checks of the files for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// Longest a client may take to finish the TLS handshake, to send a request's headers, or to
/// start its next request on a kept-alive connection (so it also bounds idle connections).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--max-connections`: well below the 1024 descriptors a container often gets as
/// its soft limit, so the process keeps descriptors for its own clients (API server, Prometheus).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Connections served beyond `max_connections`, each under [`RESERVE_HEADER_TIMEOUT`] and for
/// one request: a probe from a fresh client is answered while slow clients hold the cap.
pub const RESERVE_CONNECTIONS: usize = 64;
/// Header-read (and TLS handshake) deadline of a reserve connection.
pub const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a connection is kept (a slow reader of a large `/metrics` answer, a client that
/// never stops asking); then it is shut down gracefully, and dropped after [`DRAIN_TIMEOUT`].
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// Longest a reserve connection is kept.
const MAX_RESERVE_AGE: Duration = Duration::from_secs(45);
/// Largest request head (request line and headers) buffered per connection; larger is refused
/// with 431 (hyper's default of about 400 KiB let a few thousand clients take gigabytes).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Default of `--write-timeout`: longest a write to a client may make no progress before the
/// connection (and the answer it holds) is dropped.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for open connections to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Least time between two warnings about refused connections.
const REFUSED_WARN_EVERY: Duration = Duration::from_secs(60);

/// Bounds on the connections the admin server keeps.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once (`--max-connections`); beyond it, [`RESERVE_CONNECTIONS`]
    /// more under short deadlines, and beyond those, new connections are closed at once.
    pub max_connections: usize,
    /// Longest a write may make no progress (`--write-timeout`): a client that stops reading
    /// loses its connection, and the server the answer it held for it.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

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

/// How one connection is served: a regular one, or one of the reserve.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    header: Duration,
    keep_alive: bool,
    max_age: Duration,
}

const REGULAR: Deadlines = Deadlines {
    header: HEADER_READ_TIMEOUT,
    keep_alive: true,
    max_age: MAX_CONNECTION_AGE,
};
const RESERVE: Deadlines = Deadlines {
    header: RESERVE_HEADER_TIMEOUT,
    keep_alive: false,
    max_age: MAX_RESERVE_AGE,
};

/// Serves `app` on `listener` until `cancel` fires, then drains open connections: plain HTTP
/// without `tls`, HTTPS with it. One loop for both, so both have the same bounds: a header-read
/// timeout (which also closes idle kept-alive connections), a largest request head, a longest
/// connection age, a write timeout (a client that stops reading is dropped), and at most
/// `limits.max_connections` (+ [`RESERVE_CONNECTIONS`]) at once.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let regular = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let reserve = Arc::new(Semaphore::new(RESERVE_CONNECTIONS));
    let mut refused = Refused::default();
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
        // Accepting beyond the bounds and closing at once, rather than not accepting: the
        // kernel's queue would otherwise keep slow clients in front of a fresh probe.
        let (permit, deadlines) = if let Ok(p) = regular.clone().try_acquire_owned() {
            (p, REGULAR)
        } else if let Ok(p) = reserve.clone().try_acquire_owned() {
            (p, RESERVE)
        } else {
            drop(tcp);
            refused.note(limits.max_connections);
            continue;
        };
        let (acceptor, app, cancel) = (acceptor.clone(), app.clone(), cancel.clone());
        // Below TLS, so a stalled handshake or close_notify is bounded too.
        let tcp = WriteDeadline::new(tcp, limits.write_timeout);
        connections.spawn(async move {
            let _permit = permit;
            let Some(acceptor) = acceptor else {
                return http1(tcp, peer, app, deadlines, cancel).await;
            };
            match tokio::time::timeout(deadlines.header, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => http1(stream, peer, app, deadlines, cancel).await,
                Ok(Err(e)) => {
                    debug!(%peer, error = &e as &dyn std::error::Error, "TLS handshake failed");
                }
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
    // New connections are refused while the open ones finish.
    drop(listener);
    connections.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.wait())
        .await
        .is_err()
    {
        warn!("open HTTP connections did not finish in time");
    }
    Ok(())
}

/// Serves HTTP/1.1 on one connection within `deadlines`, until the client is done, the
/// connection is too old, or `cancel` fires.
async fn http1<I>(
    io: I,
    peer: std::net::SocketAddr,
    app: Router,
    deadlines: Deadlines,
    cancel: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(deadlines.header)
        .keep_alive(deadlines.keep_alive)
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = tokio::time::sleep(deadlines.max_age) => {
            // Finish the request in flight, but not forever (a client that stopped reading).
            conn.as_mut().graceful_shutdown();
            if let Ok(r) = tokio::time::timeout(DRAIN_TIMEOUT, conn.as_mut()).await {
                r
            } else {
                debug!(%peer, "connection dropped: too old and not finishing");
                return;
            }
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = &e as &dyn std::error::Error, "connection ended with an error");
    }
}

/// A connection whose writes fail once one has made no progress for `timeout`: a client that
/// stops reading would otherwise keep its answer in memory until the connection's maximum age.
struct WriteDeadline {
    io: tokio::net::TcpStream,
    timeout: Duration,
    /// Fires `timeout` after the first write that found the socket full; re-armed by progress.
    stall: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
}

impl WriteDeadline {
    fn new(io: tokio::net::TcpStream, timeout: Duration) -> Self {
        WriteDeadline {
            io,
            timeout,
            stall: Box::pin(tokio::time::sleep(timeout)),
            armed: false,
        }
    }

    /// Passes a ready result through (progress: disarms the deadline); on `Pending`, arms the
    /// deadline if needed and fails once it has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        if !self.armed {
            self.armed = true;
            self.stall
                .as_mut()
                .reset(tokio::time::Instant::now() + self.timeout);
        }
        // Polling registers the timer, so the connection is polled again when it fires.
        if self.stall.as_mut().poll(cx).is_ready() {
            // The close that follows resets the connection: the kernel drops what it still
            // queued for this client instead of keeping it for an orphaned socket.
            if let Err(e) = self.io.set_zero_linger() {
                debug!(error = &e as &dyn std::error::Error, "cannot set SO_LINGER");
            }
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {:?}", self.timeout),
            )));
        }
        Poll::Pending
    }
}

impl tokio::io::AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

/// Connections closed at once because every slot was taken; warned about at most once per
/// [`REFUSED_WARN_EVERY`].
#[derive(Default)]
struct Refused {
    since_warning: u64,
    warned_at: Option<Instant>,
}

impl Refused {
    fn note(&mut self, max_connections: usize) {
        self.since_warning = self.since_warning.saturating_add(1);
        if self
            .warned_at
            .is_none_or(|at| at.elapsed() >= REFUSED_WARN_EVERY)
        {
            warn!(
                refused = self.since_warning,
                max_connections,
                reserve = RESERVE_CONNECTIONS,
                "HTTP connections refused: every connection slot is taken"
            );
            self.since_warning = 0;
            self.warned_at = Some(Instant::now());
        }
    }
}
