#!/usr/bin/env bash
# Build actionlint (the GitHub Actions workflow linter) from its Go module at a pinned version into
# a cache OUTSIDE the repository, then lint .github/workflows/*.yml with it. scripts/test.sh runs
# it; see docs/testing.md.
#
# Usage: scripts/build-actionlint.sh [--print-bin | --lint]
#   --print-bin   print only the binary's path on stdout (progress goes to stderr), building first
#                 if needed
#   --lint        build if needed, then lint every workflow under .github/workflows
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   ACTIONLINT_BIN     use this binary instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."

ACTIONLINT_VERSION=v1.7.12

MODE=build
for arg in "$@"; do
	case "$arg" in
	--print-bin) MODE=print ;;
	--lint) MODE=lint ;;
	-h | --help)
		sed -n '2,12p' "$0"
		exit 0
		;;
	*)
		echo "unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

exec 3>&1
if [[ $MODE == print ]]; then
	exec 1>&2
fi
log() { printf '==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [[ -n ${ACTIONLINT_BIN:-} ]]; then
	[[ -x $ACTIONLINT_BIN ]] || {
		echo "ACTIONLINT_BIN=$ACTIONLINT_BIN is not an executable" >&2
		exit 1
	}
	BIN=$ACTIONLINT_BIN
else
	CACHE_ROOT=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
	STAMP_DIR="$CACHE_ROOT/actionlint-${ACTIONLINT_VERSION#v}"
	BIN="$STAMP_DIR/bin/actionlint"
	mkdir -p "$STAMP_DIR/bin"
	if [[ ! -x $BIN ]]; then
		exec 9>"$STAMP_DIR/.lock"
		flock 9
	fi
	if [[ ! -x $BIN ]]; then
		t=$(date +%s)
		log "building actionlint $ACTIONLINT_VERSION from its Go module"
		# `go install module@version` honours the module's own go.mod and go.sum (no replace
		# directives in actionlint's, unlike thanos'); GOBIN puts the binary in the cache.
		GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath GOBIN="$STAMP_DIR/bin.tmp" \
			nice -n 10 go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
		mv "$STAMP_DIR/bin.tmp/actionlint" "$BIN"
		rmdir "$STAMP_DIR/bin.tmp"
		log "actionlint built in $(($(date +%s) - t))s"
	fi
fi

"$BIN" -version | head -1
case $MODE in
print) echo "$BIN" >&3 ;;
lint)
	shopt -s nullglob
	workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
	[[ ${#workflows[@]} -gt 0 ]] || {
		echo "no workflows under .github/workflows" >&2
		exit 1
	}
	# shellcheck is not installed on purpose: -shellcheck= turns that integration off.
	"$BIN" -no-color -shellcheck= -pyflakes= "${workflows[@]}"
	# Negative control: a workflow with an undefined job output and a mistyped action input must
	# be refused, or the clean result above proves nothing.
	if "$BIN" -no-color -shellcheck= -pyflakes= - >/dev/null <<'YML'; then
on: push
jobs:
  a:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4.2.2
        with:
          fetch-dept: 1
      - run: echo "${{ needs.nothing.outputs.x }}"
YML
		echo "actionlint accepted a broken workflow" >&2
		exit 1
	fi
	log "actionlint: ${#workflows[@]} workflows clean, a broken one refused"
	;;
esac
