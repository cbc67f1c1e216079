#!/usr/bin/env bash
# Checks and unit-tests the Prometheus rules in alerts/:
#   promtool check rules alerts/gpu-ledger.rules.yaml
#   promtool test rules alerts/tests/*.test.yml   (one run per file)
#   every alert has a unit test, a runbook in docs/runbooks/ and a matching runbook_url
# Needs promtool (Debian: apt-get install prometheus). Prints "alerts: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

PROMTOOL=${PROMTOOL:-promtool}
if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
  echo "ERROR: promtool not found; install it with: apt-get install prometheus" >&2
  echo "alerts: 0 passed, 1 failed"
  exit 1
fi

RULES=alerts/gpu-ledger.rules.yaml
passed=0
failed=0
ok()   { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

if out=$("$PROMTOOL" check rules "$RULES" 2>&1); then
  ok "promtool check rules $RULES"
else
  echo "$out"; fail "promtool check rules $RULES"
fi

shopt -s nullglob
tests=(alerts/tests/*.test.yml)
if [ ${#tests[@]} -eq 0 ]; then
  fail "no alerts/tests/*.test.yml found"
fi
for t in "${tests[@]}"; do
  if out=$("$PROMTOOL" test rules "$t" 2>&1); then
    ok "promtool test rules $t ($(grep -c 'eval_time:' "$t") assertions)"
  else
    echo "$out"; fail "promtool test rules $t"
  fi
done

# Every alert: a firing unit test, a runbook, and a runbook_url that points at it.
alerts=$(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$RULES")
for a in $alerts; do
  if grep -A3 -E "alertname: *$a\b" "${tests[@]}" | grep -q 'exp_labels' ; then
    ok "$a has a firing test"
  else
    fail "$a has no unit test that expects it to fire"
  fi
  if [ -s "docs/runbooks/$a.md" ]; then ok "$a has docs/runbooks/$a.md"; else fail "docs/runbooks/$a.md missing"; fi
  if grep -q "runbook_url: https://github.com/gpu-ledger/gpu-ledger/blob/main/docs/runbooks/$a.md" "$RULES"; then
    ok "$a runbook_url"
  else
    fail "$a runbook_url does not point at docs/runbooks/$a.md"
  fi
  if grep -qF "| [\`$a\`](runbooks/$a.md) |" docs/alerts.md 2>/dev/null; then ok "$a listed in docs/alerts.md"; else fail "$a missing from docs/alerts.md"; fi
done

echo "alerts: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
