#!/usr/bin/env bash
# Pure-path benchmarks (docs/benchmarks.md): criterion's `ledger` bench (ledger::build and
# /metrics rendering at 10,000 nodes x 8 GPUs / 80,000 pods), then the offline report of a
# generated 400-node x 8-GPU dump (5,000 pods, ~8 MB of dcgm-exporter text), end to end:
# `gpu-ledger report --from DIR -o json > /dev/null`, timed with hyperfine (median of >= 10
# runs) or, without hyperfine, a median of 7 runs.
#
#   scripts/bench.sh [--no-criterion] [--nodes 400] [--pods 5000] [--samples 1]
#
# Not part of scripts/test.sh. Results vary with machine load: quote medians and say how busy
# the machine was (uptime is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

CRITERION=1
GEN_ARGS=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--no-criterion) CRITERION=0 ;;
	--nodes | --pods | --samples) GEN_ARGS+=("$1" "$2"); shift ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

TARGET=${CARGO_TARGET_DIR:-target}
echo "== $(date -u +%FT%TZ) $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"

if [[ $CRITERION == 1 ]]; then
	echo "== criterion: cargo bench --bench ledger"
	cargo bench --bench ledger
fi

echo "== offline report of a generated dump"
cargo build --release --bin gpu-ledger
cargo build --release -p gpu-ledger-testkit --example offline_dump
DIR=$(mktemp -d /tmp/gpu-ledger-dump.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$TARGET/release/examples/offline_dump" "$DIR" "${GEN_ARGS[@]}"
ls -l "$DIR"
BIN="$TARGET/release/gpu-ledger"
"$BIN" report --from "$DIR" -o json >/dev/null # warm the page cache, fail early
if command -v hyperfine >/dev/null; then
	hyperfine --warmup 2 --min-runs 10 --export-markdown "$DIR/hyperfine.md" \
		"$BIN report --from $DIR -o json > /dev/null"
	cat "$DIR/hyperfine.md"
else
	times=()
	for _ in 1 2 3 4 5 6 7; do
		s=$(date +%s.%N)
		"$BIN" report --from "$DIR" -o json >/dev/null
		e=$(date +%s.%N)
		times+=("$(echo "$e - $s" | bc)")
	done
	printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print "median of " NR ": " a[int((NR+1)/2)] " s"}'
fi
echo "== load after: $(uptime | sed 's/.*load average: //')"
