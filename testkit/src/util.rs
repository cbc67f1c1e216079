//! Small helpers: free loopback ports, polling with a deadline, log tails.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Returns a currently free TCP port on 127.0.0.1 for a child process to bind.
///
/// The port is drawn from below the kernel's ephemeral range: anything that binds port 0
/// (every in-process fake server, every outgoing connection) is handed ports from that range,
/// so a port probed and released there can be taken by a parallel test before the child binds
/// it. CI saw exactly that: a fake exporter answered Prometheus' `/-/ready` on the released
/// port, and the Thanos sidecar then waited for a Prometheus that had exited.
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// Returns `n` distinct free loopback ports (all held open until every one is chosen), drawn
/// like [`free_port`].
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut listeners = Vec::with_capacity(n);
    let mut draws = PortDraws::new();
    while listeners.len() < n {
        let listener = match draws.next() {
            Some(port) => match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => l,
                Err(_) => continue,
            },
            // No room below the ephemeral range (or too many ports taken): let the kernel pick.
            None => TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?,
        };
        listeners.push(listener);
    }
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Pseudo-random ports between 10000 and the start of the kernel's ephemeral range, at most
/// 200 draws (then `None`). Seeded per call from the std hasher's random keys, so parallel
/// test processes draw different sequences.
struct PortDraws {
    low: u32,
    span: u32,
    state: u64,
    left: u32,
}

impl PortDraws {
    fn new() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32768);
        let low = 10_000;
        Self {
            low,
            span: ephemeral_start.saturating_sub(low),
            state: RandomState::new().hash_one(std::process::id()) | 1,
            left: 200,
        }
    }
}

impl Iterator for PortDraws {
    type Item = u16;

    fn next(&mut self) -> Option<u16> {
        if self.span < 1_000 || self.left == 0 {
            return None;
        }
        self.left -= 1;
        // xorshift64: plenty for spreading probes, no extra crate.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let offset = u32::try_from(self.state % u64::from(self.span)).unwrap_or(0);
        u16::try_from(self.low + offset).ok()
    }
}

/// Whether `url` answers 2xx with exactly `expect` (trimmed) as its body: the readiness probe
/// of a child we started. Checking the body, not only the status, tells our child from another
/// test's server that happens to hold the port (a fake exporter answers every path with 200).
pub async fn answers_ready(client: &reqwest::Client, url: &str, expect: &str) -> bool {
    ready_answer(client, url, expect).await.is_ok()
}

/// [`answers_ready`], saying otherwise what answered (for a timeout's message).
pub async fn ready_answer(client: &reqwest::Client, url: &str, expect: &str) -> Result<(), String> {
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => match r.text().await {
            Ok(body) if body.trim() == expect => Ok(()),
            Ok(body) => Err(format!("HTTP 200 from something else: {body:.80}")),
            Err(e) => Err(format!("{e:#}")),
        },
        Ok(r) => Err(format!("HTTP {}", r.status())),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Last `n` lines of a text file (best effort; empty string if unreadable).
pub fn tail_lines(path: &Path, n: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `check` every `interval` until it returns `Ok(Some(v))` or `timeout` elapses.
/// `Ok(None)` and `Err(_)` both mean "not yet"; the last error is reported on timeout.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("condition not met");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Control-plane start timeout: `KUBEBUILDER_CONTROLPLANE_START_TIMEOUT` (Go duration such
/// as `90s`, `2m`, or plain seconds), default 120 s (a cold kube-apiserver on 2 cores is slow).
pub fn start_timeout() -> Duration {
    std::env::var("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT")
        .ok()
        .and_then(|s| parse_go_duration(&s))
        .unwrap_or(Duration::from_secs(120))
}

/// Parses the simple Go durations envtest users write: `90`, `90s`, `2m`, `1m30s`, `500ms`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let value: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3600.0,
            's' => 1.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            _ => return None,
        };
        total += Duration::from_secs_f64(value * unit);
        any = true;
    }
    (any && num.is_empty()).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ephemeral_start: u16 =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
                .expect("linux port range")
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .expect("range start");
        let ports = free_ports(20).expect("ports");
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), 20, "{ports:?}");
        // A port-0 bind (what every fake server does) can never be handed one of these.
        let kernel_pick = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr");
        assert!(kernel_pick.port() >= ephemeral_start, "{kernel_pick}");
        assert!(
            ports.iter().all(|p| *p >= 10_000 && *p < ephemeral_start),
            "{ports:?}"
        );
    }

    /// The CI failure this guards: another test's server on the port answers every path 200.
    #[tokio::test]
    async fn readiness_wants_the_childs_own_answer_not_any_200() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 1024];
                    let _ = socket.read(&mut buf).await;
                    let body = "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization.\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/-/ready");
        assert!(!answers_ready(&client, &url, "Prometheus Server is Ready.").await);
        assert!(
            answers_ready(
                &client,
                &url,
                "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization."
            )
            .await
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("abc"), None);
        assert_eq!(parse_go_duration("5"), Some(Duration::from_secs(5)));
    }
}
