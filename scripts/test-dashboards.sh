#!/usr/bin/env bash
# Dashboard tests:
#  1. dashboards/gpu-ledger.json and deploy/grafana/dashboard-configmap.yaml are what
#     scripts/dashboards/build.py generates, and the ConfigMap embeds exactly the dashboard JSON;
#  2. the dashboard type-checks against Grafana's published types (@grafana/schema, via tsc),
#     and deliberately broken copies are rejected (negative tests);
#  3. every panel query and variable query runs against a real Prometheus (Debian 2.42), once per
#     label scheme of dcgm-exporter's workload labels (exported_* and plain, see run_scheme), loaded
#     with SYNTHETIC OpenMetrics history (scripts/dashboards/synth_openmetrics.py: gpu-ledger
#     families per docs/metrics.md + dcgm-exporter series; a later Rust test may feed real
#     gpu-ledger output instead) and with alerts/gpu-ledger.rules.yaml as rule file; the hardware
#     panels keep fields a GPU does not report absent (scripts/dashboards/check_absent.py).
# Needs: promtool + prometheus (apt-get install prometheus), node + npm (apt-get install nodejs
# npm), python3. npm packages go to ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger/node, never
# into the repository. Prints "dashboards: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

SCHEMA_VERSION=13.2.3
TS_VERSION=5.9.3
export GPU_LEDGER_NODE_CACHE=${GPU_LEDGER_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger/node}
PROMETHEUS=${PROMETHEUS:-/usr/bin/prometheus}
PROMTOOL=${PROMTOOL:-promtool}

passed=0
failed=0
ok()   { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
finish() { echo "dashboards: $passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

missing=()
command -v "$PROMTOOL" >/dev/null 2>&1 || missing+=("promtool (apt-get install prometheus)")
[ -x "$PROMETHEUS" ] || command -v "$PROMETHEUS" >/dev/null 2>&1 || missing+=("prometheus (apt-get install prometheus)")
command -v node >/dev/null 2>&1 || missing+=("node (apt-get install nodejs)")
command -v npm >/dev/null 2>&1 || missing+=("npm (apt-get install npm)")
command -v python3 >/dev/null 2>&1 || missing+=("python3 (apt-get install python3)")
if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do echo "ERROR: missing $m" >&2; fail "tool missing: $m"; done
  finish
fi

# ---- 1. generated files and ConfigMap equality ------------------------------------------
if python3 scripts/dashboards/build.py --check; then ok "build.py --check"; else fail "build.py --check (run scripts/dashboards/build.py)"; fi
if python3 - "$ROOT" <<'PY'
import json, sys
root = sys.argv[1]
text = open(root + "/deploy/grafana/dashboard-configmap.yaml").read()
assert 'grafana_dashboard: "1"' in text, "label grafana_dashboard: \"1\" missing"
head, sep, body = text.partition("  gpu-ledger.json: |\n")
assert sep, "data key gpu-ledger.json missing"
embedded = "".join(l[4:] + "\n" for l in body.splitlines())
assert json.loads(embedded) == json.load(open(root + "/dashboards/gpu-ledger.json")), "embedded JSON differs"
PY
then ok "ConfigMap embeds dashboards/gpu-ledger.json"; else fail "ConfigMap does not embed dashboards/gpu-ledger.json"; fi

# ---- 2. @grafana/schema type check ---------------------------------------------------------
if [ ! -f "$GPU_LEDGER_NODE_CACHE/node_modules/@grafana/schema/package.json" ] \
   || ! grep -q "\"version\": \"$SCHEMA_VERSION\"" "$GPU_LEDGER_NODE_CACHE/node_modules/@grafana/schema/package.json" \
   || [ ! -x "$GPU_LEDGER_NODE_CACHE/node_modules/typescript/bin/tsc" ]; then
  mkdir -p "$GPU_LEDGER_NODE_CACHE"
  echo "installing @grafana/schema@$SCHEMA_VERSION typescript@$TS_VERSION into $GPU_LEDGER_NODE_CACHE"
  (cd "$GPU_LEDGER_NODE_CACHE" && [ -f package.json ] || echo '{"private":true}' > "$GPU_LEDGER_NODE_CACHE/package.json")
  if ! npm install --prefix "$GPU_LEDGER_NODE_CACHE" --no-audit --no-fund --silent \
        "@grafana/schema@$SCHEMA_VERSION" "typescript@$TS_VERSION"; then
    fail "npm install @grafana/schema typescript"; finish
  fi
fi
CHECK="node scripts/dashboards/check-dashboard.mjs"
if $CHECK dashboards/gpu-ledger.json; then ok "dashboard type-checks against @grafana/schema"; else fail "dashboard does not type-check"; fi

TMP=$(mktemp -d)
declare -A PROM_PID=() PROM_URL=()
cleanup() {
  local pid
  for pid in "${PROM_PID[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# ---- 3. queries against a real Prometheus, under both label schemes ----------------------
# exported: dcgm-exporter scraped without honor_labels (kube-prometheus-stack's default
# ServiceMonitor), no cluster label. plain: with honor_labels, and a `cluster` label on every
# series as in a store shared by several clusters. Each run gets its own Prometheus and TSDB.
NOW=$(date +%s)
start_scheme() {  # scheme [synth args...]: backfill, start its Prometheus (in the background)
  local scheme=$1; shift
  local dir="$TMP/$scheme"
  mkdir -p "$dir"
  python3 scripts/dashboards/synth_openmetrics.py "$dir/history.om" "$NOW" --scheme "$scheme" "$@"
  if "$PROMTOOL" tsdb create-blocks-from openmetrics "$dir/history.om" "$dir/data" >"$dir/backfill.log" 2>&1; then
    ok "[$scheme] backfilled $(grep -c '^[A-Za-z]' "$dir/history.om") samples"
  else
    cat "$dir/backfill.log"; fail "[$scheme] promtool tsdb create-blocks-from openmetrics"; return
  fi
  cat > "$dir/prometheus.yml" <<YML
global:
  evaluation_interval: 5s
rule_files:
  - $ROOT/alerts/gpu-ledger.rules.yaml
YML
  local port url ready=
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  url=http://127.0.0.1:$port
  "$PROMETHEUS" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$port" \
    >"$dir/prometheus.log" 2>&1 &
  PROM_PID[$scheme]=$!
  for _ in $(seq 1 120); do
    if curl -fsS "$url/-/ready" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "${PROM_PID[$scheme]}" 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$ready" ]; then tail -20 "$dir/prometheus.log"; fail "[$scheme] prometheus did not become ready on $url"; return; fi
  ok "[$scheme] prometheus ready on $url (pid ${PROM_PID[$scheme]})"
  PROM_URL[$scheme]=$url
}

check_scheme() {  # scheme [synth args...]: every panel query against its Prometheus
  local scheme=$1; shift
  local dir="$TMP/$scheme" url=${PROM_URL[$scheme]:-}
  [ -n "$url" ] || return 0
  # wait until the recording rules have been evaluated at least once
  for _ in $(seq 1 150); do
    # the accounting group runs every minute, first at an offset of up to a minute
    if curl -fsS "$url/api/v1/query" --data-urlencode 'query=cluster:gpu_ledger_gpus_used:sum' | grep -q '"value"' \
       && curl -fsS "$url/api/v1/query" --data-urlencode 'query=namespace_model_activity:gpu_ledger_gpu_seconds:increase1m' | grep -q '"value"' \
       && curl -fsS "$url/api/v1/query" --data-urlencode 'query=uuid_xid:dcgm_xid_events:new10m' | grep -q '"value"'; then break; fi
    sleep 0.5
  done

  local allow=()
  [[ " $* " == *" --cluster "* ]] || allow=(--allow-empty cluster)
  if python3 scripts/dashboards/query_panels.py "$url" dashboards/gpu-ledger.json team-a gpu-node-1 "${allow[@]}" >"$dir/queries.log" 2>&1; then
    grep -v '^ok' "$dir/queries.log"
    ok "[$scheme] every panel and variable query returns data"
  else
    grep -v '^ok' "$dir/queries.log"
    fail "[$scheme] panel queries"
  fi
  # Absent is absent (a GPU without clock-event reasons or power gets no line, never a 0), the
  # hardware panels show the synthetic XID events and unschedulable GPUs, and every GPU's
  # workload is named in either scheme.
  if python3 scripts/dashboards/check_absent.py "$url" dashboards/gpu-ledger.json >"$dir/absent.log" 2>&1; then
    ok "[$scheme] hardware and workload panels: $(tail -1 "$dir/absent.log")"
  else
    cat "$dir/absent.log"; fail "[$scheme] hardware and workload panels / absent stays absent"
  fi
  local q_line qp qf
  q_line=$(tail -1 "$dir/queries.log")
  qp=$(sed -n 's/^dashboard-queries: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' <<<"$q_line")
  qf=$(sed -n 's/^dashboard-queries: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' <<<"$q_line")
  passed=$((passed + ${qp:-0})); failed=$((failed + ${qf:-0}))
  kill "${PROM_PID[$scheme]}" 2>/dev/null; wait "${PROM_PID[$scheme]}" 2>/dev/null; unset "PROM_PID[$scheme]"
}

# Both Prometheus instances start now and evaluate the rules (the accounting group first runs
# up to a minute after start) while the dashboard's negative tests run below.
start_scheme exported
start_scheme plain --cluster lab-east

# Negative tests: each broken copy must be rejected.
broken() {  # name jq-filter
  jq "$2" dashboards/gpu-ledger.json > "$TMP/broken-$1.json"
  if $CHECK "$TMP/broken-$1.json" >"$TMP/broken-$1.log" 2>&1; then
    fail "broken dashboard '$1' was accepted"
  else
    ok "broken dashboard '$1' rejected: $(grep -m1 -E 'error TS|^  - ' "$TMP/broken-$1.log" | sed 's/.*dashboard.ts//' | cut -c1-110)"
  fi
}
broken schemaVersion-string '.schemaVersion = "39"'
broken unknown-top-level-key '.panelz = []'
broken gridPos-string '.panels[0].gridPos.w = "wide"'
broken legend-enum '(.panels[] | select(.type=="timeseries") | .options.legend.placement) |= "sideways"'
broken table-unknown-option '(.panels[] | select(.type=="table") | .options.showHeaders) = true'
broken threshold-mode '.panels[0].fieldConfig.defaults.thresholds.mode = "relative-ish"'
broken no-description 'del(.panels[3].description)'
broken no-node-variable '.templating.list |= map(select(.name != "node"))'
echo '{"title": "x", "panels": [' > "$TMP/broken-json.json"
if $CHECK "$TMP/broken-json.json" >/dev/null 2>&1; then fail "invalid JSON accepted"; else ok "invalid JSON rejected"; fi

# ---- the queries, once each Prometheus has evaluated its rules -------------------------------
check_scheme exported
check_scheme plain --cluster lab-east
finish
