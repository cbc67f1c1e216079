#!/usr/bin/env bash
# The one test command (README, .ci/run): installs and builds what the tests need, then runs
# every tier. Safe to re-run; everything built goes to a cache outside the repository.
#
#   ./scripts/test.sh            everything (lint, unit, Prometheus, control plane, alerts, dashboards)
#
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   CARGO_TARGET_DIR   defaults to $GPU_LEDGER_CACHE/target so fresh clones build warm
#   KUBEBUILDER_ASSETS reuse prebuilt kube-apiserver/etcd/... instead of building them
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's wall time is kept and printed at the end (and on failure), so a cold run shows
# which step to cut (issue 41).
STEP_NAMES=()
STEP_STARTS=()
step() {
	STEP_NAMES+=("$*")
	STEP_STARTS+=("$(date +%s)")
	printf '\n==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"
}
step_times() {
	local now i end
	now=$(date +%s)
	printf '\n==> step times (wall seconds)\n'
	for i in "${!STEP_NAMES[@]}"; do
		end=${STEP_STARTS[i + 1]:-$now}
		printf '%6d  %s\n' "$((end - STEP_STARTS[i]))" "${STEP_NAMES[i]}"
	done
	printf '%6d  total\n' "$((now - START))"
}
START=$(date +%s)
trap step_times EXIT
export GPU_LEDGER_CACHE=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$GPU_LEDGER_CACHE/target}
export CARGO_TERM_COLOR=never
mkdir -p "$GPU_LEDGER_CACHE"

step "system packages (prometheus, promtool)"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
	if [[ $(id -u) == 0 ]]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus
	else
		echo "prometheus/promtool missing: run 'sudo apt-get install prometheus'" >&2
		exit 1
	fi
fi
prometheus --version 2>&1 | head -1

step "system packages (chromium, for the page test)"
# Debian's chromium, headless, drives tests/page_chromium.rs over the DevTools pipe. Without
# recommends: 25 packages, about 125 MB; measured 29 s on the 2-core CI machine (cold apt cache).
if ! command -v chromium >/dev/null && [[ ! -x /usr/lib/chromium/chromium ]] && [[ -z ${CHROMIUM_BIN:-} ]]; then
	if [[ $(id -u) == 0 ]]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
	else
		echo "chromium missing: run 'sudo apt-get install --no-install-recommends chromium' (or set CHROMIUM_BIN)" >&2
		exit 1
	fi
fi
"${CHROMIUM_BIN:-$(command -v chromium || echo /usr/lib/chromium/chromium)}" --version 2>/dev/null | head -1

step "system packages (victoria-metrics, for the multi-cluster tests)"
# Debian's single-node VictoriaMetrics (1.79) receives two clusters' remote writes in
# tests/multi_cluster.rs. About 12 MB, one package.
if ! command -v victoria-metrics >/dev/null && [[ -z ${VICTORIA_METRICS_BIN:-} ]]; then
	if [[ $(id -u) == 0 ]]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics
	else
		echo "victoria-metrics missing: run 'sudo apt-get install --no-install-recommends victoria-metrics' (or set VICTORIA_METRICS_BIN)" >&2
		exit 1
	fi
fi
echo "victoria-metrics $(victoria-metrics -version 2>/dev/null || echo '(Debian 1.79)')"

step "system packages (buildah, docker-registry, for the release rehearsal)"
# tests/release_rehearsal.rs builds an image with Debian's buildah (vfs storage, chroot
# isolation: no daemon) and pushes it and the chart to Debian's docker-registry on loopback.
# Without recommends: buildah, docker-registry and their libraries, 15 packages, measured 23 s
# (apt-get update included) on the 2-core machine (cold apt cache).
if ! command -v buildah >/dev/null || ! command -v docker-registry >/dev/null; then
	if [[ $(id -u) == 0 ]]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah docker-registry
	else
		echo "buildah/docker-registry missing: run 'sudo apt-get install --no-install-recommends buildah docker-registry'" >&2
		exit 1
	fi
fi
buildah --version

step "control-plane binaries (etcd, kube-apiserver, scheduler, controller-manager, kubectl, kwok, helm)"
KUBEBUILDER_ASSETS=$(scripts/build-test-cluster.sh --print-bindir)
export KUBEBUILDER_ASSETS
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"

step "thanos (sidecar + querier) from its Go module, for the multi-cluster tests"
THANOS_BIN=$(scripts/build-thanos.sh --print-bin)
export THANOS_BIN
echo "THANOS_BIN=$THANOS_BIN"

step "kueue (controller manager) from its Go module, for the quota and queue tests"
# Cold (empty Go module and build caches, 2026-12-02): 480 s on the otherwise idle 2-core
# machine, 1,546 s beside three Rust builds; warm (binary cached) < 1 s. tests/e2e_kueue.rs
# also reads the module's CRDs and webhook manifests (`--print-module`) and JobSet's CRD from the
# jobset module Kueue requires (`--print-dependency=sigs.k8s.io/jobset`), which this build leaves
# in the Go module cache (`go mod download` fetches either when missing).
KUEUE_BIN=$(scripts/build-kueue.sh --print-bin)
export KUEUE_BIN
echo "KUEUE_BIN=$KUEUE_BIN"

step "kuberay (ray-operator) from its Go module, for the RayCluster culling test"
# 141 s on the 2-core machine beside Rust builds, with the Go module and build caches the other
# Go builds (Kueue, Thanos, the control plane) filled (2026-12-05; KubeRay's own modules were
# downloaded); warm (binary cached) < 1 s. tests/e2e_raycluster.rs also reads the module's CRDs
# (`--print-crds`), which this build leaves in the Go module cache.
KUBERAY_BIN=$(scripts/build-kuberay.sh --print-bin)
export KUBERAY_BIN
echo "KUBERAY_BIN=$KUBERAY_BIN"

step "workflows (actionlint from its Go module)"
# Cold (empty Go module and build caches): 110 s on the 2-core machine; 14 s with the Go build
# cache of the other Go builds present; warm (binary cached) < 1 s.
scripts/build-actionlint.sh --lint

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo tests: unit, Prometheus, control plane tiers A and B"
# Built once, then two test binaries at a time with two test threads each: most of a binary's
# time is spent waiting on refresh intervals and control-plane start-up, not on the cores. Every
# binary runs to its end and each failure is printed whole (scripts/run-tests.py).
# Benches and examples are compiled by clippy above; benchmarks run with scripts/bench.sh.
scripts/run-tests.py --jobs "${GPU_LEDGER_TEST_JOBS:-2}" --test-threads 2 -- --workspace --lib --bins --tests --locked

step "alerts and recording rules (promtool)"
scripts/test-alerts.sh

step "dashboards (schema and every panel query against a real Prometheus)"
scripts/test-dashboards.sh

step "supply chain (cargo-deny: bans, licenses, sources)"
# Advisories need the RustSec database from GitHub: scripts/deny.sh advisories where reachable.
scripts/deny.sh

step "fuzz smoke (cargo-fuzz, seconds per target)"
scripts/fuzz-smoke.sh

echo "done in $(( $(date +%s) - START )) s"
