#!/usr/bin/env bash
# Input-limit figures of the offline report (docs/benchmarks.md, "Dump size and memory"): peak
# RSS and wall time of `gpu-ledger report --from DIR -o json` on
#   samples16  the 400-node x 8-GPU synthetic dump with 16 samples per series (~140 MB dcgm.prom),
#   ignored    the same claims, dcgm.prom = 192 DCGM series + ~144 MB of node_exporter-like lines,
#   distinct   the same claims, dcgm.prom = ~144 MB of distinct DCGM_FI_DEV_GPU_UTIL series,
#   tiny       the same claims, a 2 KB dcgm.prom (what the kubectl dumps alone cost),
# and the time to refuse a 400 KB deeply nested pods.yaml (flow sequences).
#
#   scripts/bench-dump-memory.sh [GPU_LEDGER_BINARY]
#
# Needs GNU time (/usr/bin/time). Not part of scripts/test.sh; quote the load (printed).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
BIN=${1:-}
if [[ -z $BIN ]]; then
	cargo build --release --bin gpu-ledger
	BIN=$TARGET/release/gpu-ledger
fi
cargo build --release -p gpu-ledger-testkit --example offline_dump
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 2; }

DIR=$(mktemp -d /tmp/gpu-ledger-dump-memory.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
echo "== $(date -u +%FT%TZ) $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
echo "== binary: $BIN"

"$TARGET/release/examples/offline_dump" "$DIR/samples16" --samples 16 >/dev/null
for d in ignored distinct tiny; do
	mkdir -p "$DIR/$d"
	cp "$DIR/samples16/pods.json" "$DIR/samples16/nodes.json" "$DIR/$d/"
done
head -c 2000 "$DIR/samples16/dcgm.prom" | sed '$d' >"$DIR/tiny/dcgm.prom"
awk 'BEGIN {
	for (g = 0; g < 64; g++)
		for (f = 0; f < 3; f++) {
			split("DCGM_FI_DEV_GPU_UTIL DCGM_FI_DEV_FB_USED DCGM_FI_PROF_GR_ENGINE_ACTIVE", n, " ")
			printf "%s{Hostname=\"node-%d\",UUID=\"GPU-%04x\",gpu=\"%d\"} 5 1795849200000\n", n[f + 1], int(g / 8), g, g % 8
		}
	size = 0
	for (i = 0; size < 144000000; i++) {
		l = sprintf("node_cpu_seconds_total{cpu=\"%d\",instance=\"10.0.%d.%d:9100\",job=\"node\",mode=\"idle\",series=\"%d\"} %d.5 1795849200000", i % 128, int(i / 65536) % 256, int(i / 256) % 256, i, i)
		print l
		size += length(l) + 1
	}
}' >"$DIR/ignored/dcgm.prom"
awk 'BEGIN {
	size = 0
	for (i = 0; size < 144000000; i++) {
		l = sprintf("DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION=\"580.95.05\",Hostname=\"node-%05d\",UUID=\"GPU-%08x-0000-0000-0000-000000000000\",container=\"nvidia-dcgm-exporter\",device=\"nvidia%d\",gpu=\"%d\",instance=\"10.0.0.1:9400\",job=\"gpu-metrics\",modelName=\"NVIDIA H100 80GB HBM3\",namespace=\"gpu-operator\",pod=\"nvidia-dcgm-exporter-x\"} 5 1795849200000", int(i / 8), i, i % 8, i % 8)
		print l
		size += length(l) + 1
	}
}' >"$DIR/distinct/dcgm.prom"

printf '%-10s %12s %14s %10s\n' dump dcgm.prom "peak RSS" wall
for d in tiny samples16 ignored distinct; do
	/usr/bin/time -f '%M %e' -o "$DIR/time" "$BIN" report --from "$DIR/$d" -o json >/dev/null 2>"$DIR/err" ||
		{ cat "$DIR/err" >&2; exit 1; }
	read -r kb secs < <(tail -1 "$DIR/time")
	printf '%-10s %9d MB %11d MiB %9ss\n' "$d" $(($(stat -c %s "$DIR/$d/dcgm.prom") / 1000000)) $((kb / 1024)) "$secs"
done

# 400 KB of flow nesting (serde_norway: 79 s before it refused it), refused as too deep (exit 2).
mkdir -p "$DIR/deep"
cp "$DIR/samples16/nodes.json" "$DIR/tiny/dcgm.prom" "$DIR/deep/"
{
	printf 'apiVersion: v1\nkind: List\nitems: '
	head -c $((400 * 1024)) /dev/zero | tr '\0' '['
} >"$DIR/deep/pods.yaml"
set +e
/usr/bin/time -f '%M %e' -o "$DIR/time" "$BIN" report --from "$DIR/deep" >/dev/null 2>"$DIR/err"
code=$?
set -e
# GNU time adds "Command exited with non-zero status" first.
read -r kb secs < <(tail -1 "$DIR/time")
echo "deep pods.yaml ($(($(stat -c %s "$DIR/deep/pods.yaml") / 1024)) KB): exit $code in ${secs}s, peak RSS $((kb / 1024)) MiB: $(grep -v '^\s' "$DIR/err" | head -1)"
