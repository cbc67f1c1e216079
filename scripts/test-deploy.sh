#!/usr/bin/env bash
# Deployment tests only: Helm chart, kustomize manifests, Dockerfile, docs/install.md values
# table, against a real kube-apiserver (tests/deploy_chart.rs, tests/deploy_files.rs).
# scripts/test.sh runs them too, with everything else.
#
#   scripts/test-deploy.sh [extra cargo test args, e.g. a test name filter]
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_LEDGER_CACHE=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$GPU_LEDGER_CACHE/target}
# helm, kubectl, etcd and kube-apiserver come from the pinned build (built on first use).
KUBEBUILDER_ASSETS=$(scripts/build-test-cluster.sh --print-bindir)
export KUBEBUILDER_ASSETS
cargo test --locked --test deploy_files --test deploy_chart "$@" -- --test-threads 2
