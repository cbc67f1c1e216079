#!/usr/bin/env bash
# Scale benchmark, gpu-ledger versus kube-state-metrics v2.20.0 on one tier-B (kwok) cluster
# (issue 7; docs/benchmarks.md). Opt-in: NOT part of scripts/test.sh.
#
#   scripts/bench-scale.sh [--nodes 500] [--refresh-interval 10s] [--extra-pods 3000] \
#                          [--scrapes 100] [--deletions 100] [--out FILE] [--hold] \
#                          [--dra] [--no-ksm] [--shards K]
#
# --dra gives the 1-GPU pods and notebooks their GPU through DRA ResourceClaims (templates,
# allocated by the real scheduler from the ResourceSlices NVIDIA's driver would publish);
# --no-ksm skips kube-state-metrics (no --with-ksm build needed; its columns print `–`).
# --shards K runs K gpu-ledger shards (--shard i --total-shards K; K = 1 is the baseline) instead of one replica, without
# KSM, and prints per shard RSS, CPU, devices read and the Prometheus CPU of its refresh query.
#
# --hold builds the cluster and telemetry, prints the KUBECONFIG / Prometheus URL to run
# gpu-ledger by hand (under heaptrack or perf), and waits for Ctrl-C.
#
# Needs the test-cluster binaries incl. kube-state-metrics
# (`scripts/build-test-cluster.sh --with-ksm`) and Debian's prometheus. Builds the release
# gpu-ledger and the `scale_bench` testkit example, then runs it: N kwok nodes x 8 GPUs, GPU
# pods on most cards (notebooks, Terminating, Pending), as many non-GPU pods, fake DCGM
# exporter scraped by Prometheus, gpu-ledger serve and KSM side by side. Prints a Markdown
# table (also written to --out, default /tmp/gpu-ledger-bench-scale-<nodes>.md).
# Set-up of 500 nodes / ~7,000 pods takes several minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

NODES=500
NO_KSM=
ARGS=()
OUT=
while [[ $# -gt 0 ]]; do
	case $1 in
	--nodes) NODES=$2; shift ;;
	--out) OUT=$2; shift ;;
	--refresh-interval | --extra-pods | --scrapes | --deletions | --concurrency) ARGS+=("$1" "$2"); shift ;;
	--shards) ARGS+=("$1" "$2"); NO_KSM=1; shift ;;
	--hold | --dra) ARGS+=("$1") ;;
	--no-ksm) ARGS+=("$1"); NO_KSM=1 ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
OUT=${OUT:-/tmp/gpu-ledger-bench-scale-$NODES.md}

KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$(scripts/build-test-cluster.sh --print-bindir)}
export KUBEBUILDER_ASSETS
if [[ -z $NO_KSM && ! -x $KUBEBUILDER_ASSETS/kube-state-metrics && -z ${TEST_ASSET_KUBE_STATE_METRICS:-} ]]; then
	echo "kube-state-metrics missing: run scripts/build-test-cluster.sh --with-ksm" >&2
	exit 1
fi
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --bin gpu-ledger
cargo build --release -p gpu-ledger-testkit --example scale_bench

echo "== $(date -u +%FT%TZ) $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
[[ -n $NO_KSM ]] || "$KUBEBUILDER_ASSETS/kube-state-metrics" --version 2>&1 | head -1 || true
"$TARGET/release/gpu-ledger" --version || true
"$TARGET/release/examples/scale_bench" --nodes "$NODES" --gpu-ledger "$TARGET/release/gpu-ledger" \
	--out "$OUT" "${ARGS[@]}"
echo "== load after: $(uptime | sed 's/.*load average: //'); table in $OUT"
