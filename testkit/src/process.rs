//! Child-process guard: spawn with `PR_SET_PDEATHSIG`, log to a file, SIGTERM then SIGKILL
//! exactly the PID we started on drop.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
//! Test threads (and tokio's blocking-pool threads) come and go, and a cluster shared by
//! several tests would otherwise be killed when the first test's thread ends. All children
//! are therefore forked from one dedicated, never-ending spawner thread: they die when the
//! test process dies, and not before.

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::util::tail_lines;

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static, so this loop never ends while the process
                // runs; park forever just in case so PDEATHSIG never fires early.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the testkit-spawner thread");
        Mutex::new(tx)
    })
}

/// A running child process that is terminated when the guard is dropped.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    log_path: PathBuf,
}

impl ChildGuard {
    /// Spawns `cmd` with stdin closed and stdout+stderr appended to `log_path`; the child gets
    /// `PR_SET_PDEATHSIG(SIGKILL)` so it cannot outlive the test process.
    pub fn spawn(name: &str, mut cmd: Command, log_path: &Path) -> Result<Self> {
        let log = File::create(log_path)
            .with_context(|| format!("creating log file {}", log_path.display()))?;
        let log2 = log.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        // SAFETY: only async-signal-safe libc calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may already have died between fork and prctl.
                if libc::getppid() == 1 {
                    return Err(io::Error::other("parent died before exec"));
                }
                Ok(())
            });
        }
        let program = cmd.get_program().to_string_lossy().into_owned();
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| anyhow::anyhow!("testkit spawner mutex poisoned"))?
            .send((cmd, reply_tx))
            .map_err(|_| anyhow::anyhow!("testkit spawner thread is gone"))?;
        let child = reply_rx
            .recv()
            .context("testkit spawner thread dropped the request")?
            .with_context(|| format!("spawning {name} ({program})"))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log_path: log_path.to_path_buf(),
        })
    }

    /// Name given at spawn time (e.g. `kube-apiserver`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Path of the combined stdout/stderr log.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Last `n` lines of the process log.
    pub fn log_tail(&self, n: usize) -> String {
        tail_lines(&self.log_path, n)
    }

    /// `Some(status)` if the process has already exited.
    pub fn try_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Idempotent.
    pub fn terminate(&mut self, grace: Duration) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            let _ = self.child.kill();
            return;
        };
        // SAFETY: plain kill(2) on the PID of a child we spawned and have not reaped yet
        // (an unreaped child's PID cannot be reused).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}

/// A command for the `gpu-ledger` binary at `bin` whose environment cannot configure it: every
/// `GPU_LEDGER_*` variable of the test's own environment removed (each flag reads one).
pub fn isolated_command(bin: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPU_LEDGER_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs a command to completion, `stdin` written to it when given, and returns its output
/// whatever the exit status.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Result<std::process::Output> {
    use std::io::Write as _;
    let desc = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawning {desc}"))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(input.as_bytes())?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("waiting for {desc}"))
}

/// [`run`], then its stdout; an error names the command, its exit status and its stderr.
pub fn run_ok(cmd: Command, stdin: Option<&str>) -> Result<String> {
    let desc = format!("{cmd:?}");
    let out = run(cmd, stdin)?;
    anyhow::ensure!(
        out.status.success(),
        "{desc} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
