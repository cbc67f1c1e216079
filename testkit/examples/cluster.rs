//! Runs a test control plane interactively: `cargo run -p gpu-ledger-testkit --example cluster
//! -- [a|b]`, prints the admin kubeconfig and keeps running until Ctrl-C / SIGTERM.

use anyhow::Result;
use gpu_ledger_testkit::{ControlPlane, Tier, TierBOptions};

#[tokio::main]
async fn main() -> Result<()> {
    let tier = match std::env::args().nth(1).as_deref() {
        Some("b" | "B") => Tier::B(TierBOptions::default()),
        _ => Tier::A,
    };
    let started = std::time::Instant::now();
    let cp = ControlPlane::start(tier).await?;
    println!("ready in {:.1?}", started.elapsed());
    println!(
        "export KUBECONFIG={}",
        cp.kubeconfig_path("admin")?.display()
    );
    println!("dir: {}", cp.dir().display());
    for (name, pid) in cp.pids() {
        println!("{name}: pid {pid}");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(cp);
    Ok(())
}
