//! Integration-test harness for gpu-ledger: real control-plane processes, no mocks.
//!
//! * [`ControlPlane`] runs etcd + kube-apiserver ([`Tier::A`]) and optionally kube-scheduler,
//!   kube-controller-manager and kwok ([`Tier::B`]) as local processes on loopback ports,
//!   with token authentication, RBAC and a private CA.
//! * [`Prometheus`] runs the Debian `prometheus` binary, optionally over a TSDB backfilled
//!   with `promtool tsdb create-blocks-from openmetrics`.
//! * [`chromium::Browser`] runs Debian's headless Chromium, driven over the DevTools protocol.
//! * [`FaultProxy`] (a test double) hangs or refuses chosen apiserver requests.
//! * [`kueue::Kueue`] runs Kueue's controller manager (built from its Go module by
//!   `scripts/build-kueue.sh`) against a tier-B control plane, with its own CRDs and webhooks.
//! * [`binaries`] / [`binary`] locate the binaries built by `scripts/build-test-cluster.sh`
//!   (`TEST_ASSET_*`, `KUBEBUILDER_ASSETS`, then the build cache).
//!
//! Every spawned process is owned by a [`process::ChildGuard`] that SIGTERMs (then SIGKILLs)
//! exactly the PID it started, and children are spawned with `PR_SET_PDEATHSIG` so they die
//! with the test process.

pub mod bins;
pub mod certs;
pub mod chromium;
pub mod control_plane;
pub mod dcgm;
pub mod dra;
pub mod fault_proxy;
pub mod kuberay;
pub mod kueue;
pub mod nodes;
pub mod process;
pub mod prometheus;
pub mod stack;
pub mod stores;
pub mod util;

pub use bins::{Bins, binaries, binary, cache_root};
pub use control_plane::{ControlPlane, Tier, TierBOptions, USERS};
pub use dcgm::{FakeDcgmExporter, ReplayExporter};
pub use fault_proxy::{Fault, FaultProxy, Rule};
pub use nodes::GpuNode;
pub use prometheus::Prometheus;
