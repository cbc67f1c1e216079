#!/usr/bin/env bash
# Showback over a month (issue 37, docs/benchmarks.md "Showback over a month"): backfills a
# 31-day month of kube-state-metrics' kube_namespace_labels for N namespaces (and gpu-ledger's
# own counters for them) into Debian's Prometheus 2.42, then times
#   - `gpu-ledger showback --month M --group-by-label team` (release build), 3 runs,
#   - `gpu-ledger showback --month M` (by namespace: the counters alone), 3 runs,
#   - the label query gpu-ledger asked before issue 37 (one max_over_time(timestamp(..)[31d:5m])
#     subquery) by hand with curl: over 5 namespaces (3 runs) and 10 (one run); over all N it
#     would take N times the per-series cost (minutes: it is not run),
# and prints medians, gpu-ledger's peak RSS (GNU time) and Prometheus' peak RSS during each
# phase (VmHWM from /proc, reset before each phase through /proc/PID/clear_refs).
#
#   scripts/bench-showback.sh [--namespaces 500] [--ksm-interval 30] [--counter-interval 300]
#                             [--binary PATH] [--keep DIR] [--max-rss-mib 64] [--help]
#
# Data: kube_namespace_labels every --ksm-interval seconds (30 s: kube-prometheus-stack's
# default scrape interval, which its kube-state-metrics ServiceMonitor inherits), labels as that
# chart's ServiceMonitor writes them; every 10th namespace moves to another team on day 15, every
# 100th moves again on the month's last day (the fine query's case), every 50th is deleted on
# day 20. gpu-ledger's counters (claimed, idle, by model busy/idle, namespace_gpus_claimed, one
# replica) every --counter-interval seconds: 300 by default, not the chart's 30 s, because
# promtool 2.42 re-reads its whole input for every 2-hour block it writes (a month at 30 s would
# take half an hour to backfill); the script feeds it one block at a time.
#
# Exits 1 when gpu-ledger's median peak RSS in a showback phase is over --max-rss-mib (64: issue
# 41's target; showback folds each answer as it arrives, so it stays near 50 MiB at 500
# namespaces whatever the period).
#
# Needs prometheus and promtool (Debian's `prometheus` package), curl, awk, python3 (a free
# port) and GNU time (/usr/bin/time). Takes about 10 minutes on 2 cores (backfill, then waiting
# for Prometheus to compact the 2-hour blocks as a long-running server would have). Not part of
# scripts/test.sh; quote the load it prints, and whether other builds ran beside it.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
NAMESPACES=500
KSM_INTERVAL=30
COUNTER_INTERVAL=300
BIN=
KEEP=
MAX_RSS_MIB=64
while [[ $# -gt 0 ]]; do
	case $1 in
	--namespaces) NAMESPACES=$2; shift ;;
	--ksm-interval) KSM_INTERVAL=$2; shift ;;
	--counter-interval) COUNTER_INTERVAL=$2; shift ;;
	--binary) BIN=$2; shift ;;
	--keep) KEEP=$2; shift ;;
	--max-rss-mib) MAX_RSS_MIB=$2; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done
for n in "$NAMESPACES" "$KSM_INTERVAL" "$COUNTER_INTERVAL" "$MAX_RSS_MIB"; do
	[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "not a positive whole number: $n" >&2; exit 2; }
done
for tool in prometheus promtool curl awk python3; do
	command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install prometheus curl gawk python3)" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 2; }
if [[ -z $BIN ]]; then
	cargo build --release --bin gpu-ledger
	BIN=${CARGO_TARGET_DIR:-target}/release/gpu-ledger
fi

if [[ -n $KEEP ]]; then
	DIR=$KEEP
	mkdir -p "$DIR"
else
	DIR=$(mktemp -d /tmp/gpu-ledger-bench-showback.XXXXXX)
fi
PROM_PID=
cleanup() {
	[[ -z $PROM_PID ]] || kill "$PROM_PID" 2>/dev/null || true
	[[ -n $KEEP ]] || rm -rf "$DIR"
}
trap cleanup EXIT
rm -f "$DIR/over"

# The newest month of 31 days that ended before the current month began.
MONTH=
for back in 1 2 3 4 5 6; do
	first=$(date -u -d "$(date -u +%Y-%m-01) -$back month" +%Y-%m-01)
	if [[ $(date -u -d "$first +1 month -1 day" +%d) == 31 ]]; then
		MONTH=${first%-01}
		break
	fi
done
START=$(date -u -d "$MONTH-01" +%s)
END=$((START + 31 * 86400))
DAY=86400
BLOCK=7200

echo "== $(date -u +%FT%TZ) $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
echo "== month $MONTH, $NAMESPACES namespaces, kube_namespace_labels every ${KSM_INTERVAL}s, counters every ${COUNTER_INTERVAL}s"
echo "== $("$BIN" --version 2>&1 | head -1); $(prometheus --version 2>&1 | head -1)"

# One 2-hour block of OpenMetrics text on stdout: families contiguous, each series in time order.
block() {
	awk -v N="$NAMESPACES" -v KSM="$KSM_INTERVAL" -v CTR="$COUNTER_INTERVAL" -v B0="$1" -v B1="$2" \
		-v ORIGIN=$((START - DAY)) -v DELETED=$((START + 20 * DAY + 5 * 3600)) \
		-v MIDMONTH=$((START + 15 * DAY + 7 * 3600)) -v LASTDAY=$((END - DAY + 12 * 3600)) '
	function team(i, t) {
		if (i % 50 == 7 && t > DELETED) return ""
		if (i % 100 == 5 && t >= LASTDAY) return sprintf("team-%02d", (i + 2) % 20)
		if (i % 10 == 3 && t >= MIDMONTH) return sprintf("team-%02d", (i + 1) % 20)
		return sprintf("team-%02d", i % 20)
	}
	BEGIN {
		first = B0 + (KSM - B0 % KSM) % KSM
		print "# TYPE kube_namespace_labels gauge"
		for (i = 0; i < N; i++) {
			ns = sprintf("ns-%03d", i)
			for (t = first; t < B1; t += KSM) {
				tm = team(i, t)
				if (tm == "") break
				printf "kube_namespace_labels{container=\"kube-state-metrics\",endpoint=\"http\",instance=\"10.244.1.17:8080\",job=\"kube-state-metrics\",label_team=\"%s\",namespace=\"%s\",pod=\"kube-prometheus-stack-kube-state-metrics-7d5c9b8f4-q2x8z\",service=\"kube-prometheus-stack-kube-state-metrics\"} 1 %d\n", tm, ns, t
			}
		}
		first = B0 + (CTR - B0 % CTR) % CTR
		tgt = "container=\"gpu-ledger\",endpoint=\"metrics\",instance=\"10.244.2.9:8080\",job=\"gpu-ledger\",pod=\"gpu-ledger-6f7d9c4b5-k8s2p\",service=\"gpu-ledger\""
		split("gpu_ledger_gpu_seconds_claimed_total gpu_ledger_gpu_seconds_idle_total gpu_ledger_gpu_seconds_by_model_total gpu_ledger_gpu_seconds_by_model_total gpu_ledger_namespace_gpus_claimed", fam, " ")
		split("claimed idle busy idle held", kind, " ")
		for (f = 1; f <= 5; f++) {
			if (f != 4) printf "# TYPE %s gauge\n", fam[f]
			for (i = 0; i < N; i++) {
				ns = sprintf("ns-%03d", i)
				gpus = 1 + i % 4
				share = (kind[f] == "claimed" || kind[f] == "held") ? 1 : (kind[f] == "busy" ? 0.7 : 0.3)
				extra = (f == 3 || f == 4) ? sprintf(",model=\"NVIDIA-A100-SXM4-80GB\",activity=\"%s\"", kind[f]) : ""
				for (t = first; t < B1; t += CTR) {
					if (i % 50 == 7 && t > DELETED) break
					v = (kind[f] == "held") ? gpus : gpus * share * (t - ORIGIN)
					printf "%s{%s,namespace=\"%s\"%s} %.0f %d\n", fam[f], tgt, ns, extra, v, t
				}
			}
		}
		print "# TYPE gpu_ledger_last_refresh_timestamp_seconds gauge"
		for (t = first; t < B1; t += CTR)
			printf "gpu_ledger_last_refresh_timestamp_seconds{%s} %d %d\n", tgt, t, t
		print "# EOF"
	}'
}

# From a day before the month (kube-state-metrics ran before it) to an hour after it, one block
# per promtool run, the next block generated while promtool writes this one.
TSDB=$DIR/tsdb
if [[ ! -d $TSDB ]]; then
	mkdir -p "$TSDB.partial"
	t0=$(date +%s)
	b=$((START - DAY))
	block "$b" $((b + BLOCK)) >"$DIR/next.om"
	while [[ $b -lt $((END + 3600)) ]]; do
		mv "$DIR/next.om" "$DIR/this.om"
		n=$((b + BLOCK))
		[[ $n -ge $((END + 3600)) ]] || block "$n" $((n + BLOCK)) >"$DIR/next.om" &
		promtool tsdb create-blocks-from openmetrics "$DIR/this.om" "$TSDB.partial" >/dev/null
		wait
		b=$n
	done
	rm -f "$DIR/this.om" "$DIR/next.om"
	mv "$TSDB.partial" "$TSDB"
	echo "== backfilled in $(($(date +%s) - t0)) s: $(du -sh "$TSDB" | cut -f1)"
fi

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
printf 'global:\n  scrape_interval: 30s\n' >"$DIR/prometheus.yml"
# Retention long enough to keep the month, short enough that blocks compact to the sizes a
# server keeping ~6 weeks has (at most 10 % of retention).
prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$TSDB" \
	--storage.tsdb.retention.time=45d --web.listen-address="127.0.0.1:$PORT" >"$DIR/prometheus.log" 2>&1 &
PROM_PID=$!
until curl -sf "$URL/-/ready" >/dev/null; do
	kill -0 "$PROM_PID" 2>/dev/null || { tail -20 "$DIR/prometheus.log" >&2; exit 1; }
	sleep 1
done
# Wait for the compactor to finish (block count unchanged for a minute).
blocks() { find "$TSDB" -maxdepth 1 -name '01*' -type d | wc -l; }
before=-1
while [[ $(blocks) != "$before" ]]; do
	before=$(blocks)
	sleep 60
done
echo "== Prometheus ready, $(blocks) blocks after compaction; load: $(uptime | sed 's/.*load average: //')"

reset_peak() { echo 5 >"/proc/$PROM_PID/clear_refs"; }
peak_mib() { awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$PROM_PID/status"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# gpu-ledger showback, 3 runs: "median s, gpu-ledger peak MiB, exit codes, Prometheus peak MiB".
showback() {
	local times=() rss=() codes=()
	reset_peak
	for _ in 1 2 3; do
		local code=0
		/usr/bin/time -f '%e %M' -o "$DIR/time" "$BIN" showback --prometheus-url "$URL" \
			--month "$MONTH" -o json "$@" >"$DIR/showback.json" 2>"$DIR/showback.err" || code=$?
		read -r e m <"$DIR/time"
		times+=("$e")
		rss+=("$m")
		codes+=("$code")
	done
	local peak
	peak=$(printf '%s\n' "${rss[@]}" | median | awk '{ printf "%.0f", $1 / 1024 }')
	printf '%s s median (%s), gpu-ledger peak %s MiB, exit %s; Prometheus peak %s MiB\n' \
		"$(printf '%s\n' "${times[@]}" | median)" "${times[*]}" "$peak" \
		"${codes[*]}" "$(peak_mib)"
	[[ $peak -le $MAX_RSS_MIB ]] || echo "OVER: gpu-ledger peak $peak MiB > --max-rss-mib $MAX_RSS_MIB" >"$DIR/over"
}

# The label query before issue 37 over the namespaces matching $1, evaluated at the month's end;
# curl gives up after $2 seconds (Prometheus' own --query.timeout is 2 minutes).
old_query() {
	curl -s -o "$DIR/old.json" -w '%{time_total}' --max-time "$2" "$URL/api/v1/query" \
		--data-urlencode "query=max by (namespace, label_team, cluster, cluster_id) (max_over_time(timestamp(kube_namespace_labels{namespace=~\"$1\"})[2678400000ms:300000ms]))" \
		--data-urlencode "time=$END" || true
}
old_query_runs() {
	local times=()
	reset_peak
	for _ in $(seq "$2"); do times+=("$(old_query "$1" 300)"); done
	printf '%s s median (%s), %s series; Prometheus peak %s MiB\n' \
		"$(printf '%s\n' "${times[@]}" | median)" "${times[*]}" \
		"$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["data"]["result"]))' "$DIR/old.json" 2>/dev/null || echo '?')" \
		"$(peak_mib)"
}

echo "== rustc/cargo running beside this run: $(pgrep -c rustc || true)"
echo "showback --group-by-label team: $(showback --group-by-label team)"
cp "$DIR/showback.json" "$DIR/by-team.json"
echo "showback by namespace:          $(showback)"
# The two queries the label grouping asks now (as gpu-ledger writes them for this month): the
# days of every namespace's values, and the one fine query, over the last day, for the
# namespaces relabelled on it.
new_query_runs() {
	local times=()
	reset_peak
	for _ in 1 2 3; do
		times+=("$(curl -s -o "$DIR/new.json" -w '%{time_total}' --max-time 300 "$URL/api/v1/query" \
			--data-urlencode "query=$1" --data-urlencode "time=$END" || true)")
	done
	printf '%s s median (%s); Prometheus peak %s MiB\n' \
		"$(printf '%s\n' "${times[@]}" | median)" "${times[*]}" "$(peak_mib)"
}
echo "label grouping, days of values:  $(new_query_runs "(group by (namespace, label_team, cluster, cluster_id) (count_over_time(kube_namespace_labels[86400000ms])))[$((32 * DAY * 1000))ms:86400000ms]")"
relabelled_last_day=$(seq 5 100 $((NAMESPACES - 1)) | awk '{ printf "%sns-%03d", (NR > 1 ? "|" : ""), $1 }')
echo "label grouping, last-day query: $(new_query_runs "max by (namespace, label_team, cluster, cluster_id) (max_over_time(timestamp(kube_namespace_labels{namespace=~\"$relabelled_last_day\"})[86400000ms:300000ms]))")"
echo "old label query, 5 namespaces:  $(old_query_runs 'ns-00[0-4]' 3)"
echo "old label query, 10 namespaces: $(old_query_runs 'ns-00[0-9]' 1)"
python3 - "$DIR/by-team.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
groups = {g["group"]: len(g["namespaces"]) for g in v["groups"]}
print(f"== grouping: {len(groups)} teams, {sum(groups.values())} namespaces, status {v['status']}")
EOF
echo "== $(date -u +%FT%TZ) load: $(uptime | sed 's/.*load average: //'); rustc running now: $(pgrep -c rustc || true)"
if [[ -e $DIR/over ]]; then
	cat "$DIR/over" >&2
	rm -f "$DIR/over"
	exit 1
fi
