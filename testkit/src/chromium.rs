//! A real headless Chromium (Debian's `chromium` package, or `$CHROMIUM_BIN`), driven over the
//! DevTools protocol through `--remote-debugging-pipe`: commands go to the browser's fd 3 and
//! answers come from its fd 4, each message a JSON object ended by NUL. No port, no websocket,
//! nothing to discover — the least fragile way to drive it from a test.
//!
//! [`Browser::launch`] starts it with a throw-away profile and every background service off;
//! [`Browser::page`] opens a tab ([`Page`]) to navigate, evaluate JavaScript, read the DOM with
//! scripts disabled, and take screenshots. Calls block (the protocol is request/response); the
//! process is owned by a [`ChildGuard`] like every other testkit process.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};

use crate::process::ChildGuard;

/// How long one protocol call may take (page loads on a loaded 2-core machine included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `$CHROMIUM_BIN`, else Debian's `/usr/lib/chromium/chromium` (the launcher script's target),
/// else `chromium` on `PATH`. Fails naming the package when none is there: tests that need a
/// browser fail loudly rather than skip.
pub fn chromium_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let debian = Path::new("/usr/lib/chromium/chromium");
    if debian.is_file() {
        return Ok(debian.to_path_buf());
    }
    if let Some(dir) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| d.join("chromium").is_file())
    {
        return Ok(dir.join("chromium"));
    }
    bail!(
        "chromium not found (apt-get install chromium, or set CHROMIUM_BIN); scripts/test.sh installs it"
    )
}

struct Wire {
    to_browser: std::io::PipeWriter,
    next_id: u64,
    /// Events received while waiting for an answer, oldest first.
    events: VecDeque<Value>,
}

/// A running headless Chromium; dropping it closes the browser and stops the process.
pub struct Browser {
    wire: Mutex<Wire>,
    from_browser: Mutex<Receiver<Value>>,
    guard: Mutex<ChildGuard>,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").finish_non_exhaustive()
    }
}

impl Browser {
    /// Starts Chromium headless with its log in `log_dir/chromium.log`.
    pub fn launch(log_dir: &Path) -> Result<Self> {
        let bin = chromium_bin()?;
        let profile = tempfile::tempdir().context("chromium profile dir")?;
        let (browser_reads, we_write) = std::io::pipe().context("pipe")?;
        let (we_read, browser_writes) = std::io::pipe().context("pipe")?;
        let (r, w) = (browser_reads.as_raw_fd(), browser_writes.as_raw_fd());
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank");
        // SAFETY: only async-signal-safe libc calls between fork and exec. The pipe ends are first
        // moved above fd 10 (so placing them on 3 and 4 cannot clobber one another), then
        // duplicated onto 3 and 4 without close-on-exec; the originals close on exec.
        unsafe {
            cmd.pre_exec(move || {
                let r2 = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let w2 = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if r2 < 0 || w2 < 0 || libc::dup2(r2, 3) < 0 || libc::dup2(w2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let guard = ChildGuard::spawn("chromium", cmd, &log_dir.join("chromium.log"))
            .with_context(|| format!("starting {}", bin.display()))?;
        // The browser holds its ends now.
        drop(browser_reads);
        drop(browser_writes);
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("chromium-devtools".into())
            .spawn(move || {
                let mut reader = BufReader::new(we_read);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match reader.read_until(0, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if buf.last() == Some(&0) {
                                buf.pop();
                            }
                            if let Ok(v) = serde_json::from_slice::<Value>(&buf)
                                && tx.send(v).is_err()
                            {
                                break;
                            }
                        }
                    }
                }
            })
            .context("devtools reader thread")?;
        let browser = Browser {
            wire: Mutex::new(Wire {
                to_browser: we_write,
                next_id: 0,
                events: VecDeque::new(),
            }),
            from_browser: Mutex::new(rx),
            guard: Mutex::new(guard),
            _profile: profile,
        };
        let version = browser
            .call(None, "Browser.getVersion", json!({}))
            .context("chromium did not answer on the DevTools pipe")?;
        if version["product"].as_str().is_none() {
            bail!("unexpected Browser.getVersion answer: {version}");
        }
        Ok(browser)
    }

    /// The browser's product string ("HeadlessChrome/…").
    pub fn version(&self) -> Result<String> {
        let v = self.call(None, "Browser.getVersion", json!({}))?;
        Ok(v["product"].as_str().unwrap_or_default().to_string())
    }

    /// Sends `method` (to a page session when `session` is set) and waits for its answer.
    pub fn call(&self, session: Option<&str>, method: &str, params: Value) -> Result<Value> {
        let mut wire = self
            .wire
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        wire.next_id += 1;
        let id = wire.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg)?;
        bytes.push(0);
        wire.to_browser
            .write_all(&bytes)
            .with_context(|| format!("sending {method}"))?;
        let rx = self
            .from_browser
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(v) if v["id"].as_u64() == Some(id) => {
                    if let Some(e) = v.get("error") {
                        bail!("{method}: {e}");
                    }
                    return Ok(v["result"].clone());
                }
                Ok(v) => wire.events.push_back(v),
                Err(RecvTimeoutError::Timeout) => bail!("{method}: no answer in {CALL_TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => bail!("{method}: chromium went away"),
            }
        }
    }

    /// Waits for event `method` of `session` (events already received count).
    pub fn wait_event(&self, session: &str, method: &str, timeout: Duration) -> Result<Value> {
        let matches = |v: &Value| v["method"] == method && v["sessionId"] == session;
        let mut wire = self
            .wire
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = wire.events.iter().position(matches) {
            return Ok(wire.events.remove(i).unwrap_or_default()["params"].clone());
        }
        let rx = self
            .from_browser
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(v) if matches(&v) => return Ok(v["params"].clone()),
                Ok(v) => wire.events.push_back(v),
                Err(RecvTimeoutError::Timeout) => bail!("no {method} event in {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => bail!("chromium went away"),
            }
        }
    }

    /// Opens a tab of `width` × `height` CSS pixels; `javascript: false` disables page scripts.
    pub fn page(&self, width: u32, height: u32, javascript: bool) -> Result<Page<'_>> {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"]
            .as_str()
            .context("createTarget without targetId")?
            .to_string();
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        )?;
        let session = attached["sessionId"]
            .as_str()
            .context("attachToTarget without sessionId")?
            .to_string();
        let page = Page {
            browser: self,
            session,
            target_id,
        };
        page.call("Page.enable", json!({}))?;
        page.call("Runtime.enable", json!({}))?;
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )?;
        page.call(
            "Emulation.setScriptExecutionDisabled",
            json!({"value": !javascript}),
        )?;
        Ok(page)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.call(None, "Browser.close", json!({}));
        self.guard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .terminate(Duration::from_secs(5));
    }
}

/// One tab.
#[derive(Debug)]
pub struct Page<'a> {
    browser: &'a Browser,
    session: String,
    target_id: String,
}

impl Page<'_> {
    fn call(&self, method: &str, params: Value) -> Result<Value> {
        self.browser.call(Some(&self.session), method, params)
    }

    /// Loads `url` and waits for its `load` event (load events of earlier documents, still
    /// buffered, are dropped first) and a complete document.
    pub fn navigate(&self, url: &str) -> Result<()> {
        let _ = self.take_events("Page.loadEventFired");
        let nav = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(e) = nav["errorText"].as_str().filter(|e| !e.is_empty()) {
            bail!("navigating to {url}: {e}");
        }
        self.browser
            .wait_event(&self.session, "Page.loadEventFired", CALL_TIMEOUT)
            .with_context(|| format!("loading {url}"))?;
        self.wait_for("document.readyState === 'complete'", CALL_TIMEOUT)
    }

    /// The value of a JavaScript expression (evaluated by DevTools, so it works with page scripts
    /// disabled too); a thrown exception is an error.
    pub fn evaluate(&self, expression: &str) -> Result<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            bail!("{expression}: {ex}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expression` until it is `true` or `timeout` passes.
    pub fn wait_for(&self, expression: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.evaluate(expression)? == Value::Bool(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{expression} not true after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The whole document's HTML as the browser holds it (DOM domain, no page script involved).
    pub fn outer_html(&self) -> Result<String> {
        let doc = self.call("DOM.getDocument", json!({"depth": 0}))?;
        let node = doc["root"]["nodeId"].clone();
        let html = self.call("DOM.getOuterHTML", json!({"nodeId": node}))?;
        Ok(html["outerHTML"].as_str().unwrap_or_default().to_string())
    }

    /// A PNG of the full page (not only the viewport) written to `path`.
    pub fn screenshot(&self, path: &Path) -> Result<()> {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        )?;
        let data = shot["data"].as_str().context("screenshot without data")?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .context("screenshot base64")?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Takes the events `method` of this tab received so far (after a round trip, so every
    /// event sent before now is counted), e.g. `Runtime.exceptionThrown`,
    /// `Page.javascriptDialogOpening`, `Network.requestWillBeSent`.
    pub fn take_events(&self, method: &str) -> Vec<Value> {
        let _ = self.evaluate("0");
        let mut wire = self
            .browser
            .wire
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Vec::new();
        wire.events.retain(|v| {
            let hit = v["method"] == method && v["sessionId"] == self.session;
            if hit {
                out.push(v["params"].clone());
            }
            !hit
        });
        out
    }

    /// Starts reporting network requests (`Network.requestWillBeSent`).
    pub fn watch_network(&self) -> Result<()> {
        self.call("Network.enable", json!({})).map(|_| ())
    }
}

impl Drop for Page<'_> {
    fn drop(&mut self) {
        let _ = self.browser.call(
            None,
            "Target.closeTarget",
            json!({"targetId": self.target_id}),
        );
    }
}
