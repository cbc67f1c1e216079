//! Small helpers: free loopback ports, polling with a deadline, log tails.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Returns a currently free TCP port on 127.0.0.1 (bind to port 0 and release it).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Returns `n` distinct free loopback ports (all held open until every one is chosen).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0"))
        .collect::<Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
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
