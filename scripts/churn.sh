#!/usr/bin/env bash
# Full churn run (docs/reliability.md): create+delete GPU pods against a real tier-A cluster while
# gpu-ledger watches (in-process stores and a `gpu-ledger serve` process), then check that the
# store, the /metrics series count and serve's RSS return to baseline.
#
#   scripts/churn.sh [CYCLES] [WORKERS]       # defaults: 10000 cycles, 8 workers
#
# Figures are printed and appended to ${GPU_LEDGER_CHURN_REPORT:-target/churn-report.txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_LEDGER_CHURN_CYCLES="${1:-10000}"
export GPU_LEDGER_CHURN_WORKERS="${2:-8}"
export GPU_LEDGER_CHURN_REPORT="${GPU_LEDGER_CHURN_REPORT:-$PWD/target/churn-report.txt}"
if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
  KUBEBUILDER_ASSETS="$(scripts/build-test-cluster.sh --print-bindir)"
  export KUBEBUILDER_ASSETS
fi
cargo test --test faults_kube churn_returns_to_baseline -- --exact --nocapture
echo "report: $GPU_LEDGER_CHURN_REPORT"
