#!/usr/bin/env bash
# Build Kueue's controller manager from its Go module at a pinned release into a cache OUTSIDE the
# repository, for the quota and queue tests (tests/e2e_kueue.rs). See docs/testing.md.
#
# Usage: scripts/build-kueue.sh [--print-bin | --print-crds | --print-module | --print-dependency=MODULE]
#   --print-bin    print only the manager binary's path on stdout (progress goes to stderr),
#                  building first if needed
#   --print-crds   print only the directory holding Kueue's own CRD manifests (from the module)
#   --print-module print only the module's directory (testkit/src/kueue.rs reads its CRDs,
#                  webhook manifests and conversion patches under config/components)
#   --print-dependency=MODULE  print only the directory of MODULE at the version Kueue's go.mod
#                  pins (e.g. sigs.k8s.io/jobset: testkit installs the JobSet CRD from it)
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   KUEUE_BIN          use this binary instead of building one
#
# v0.17.0: its go.mod asks Go 1.25 and carries no replace directives, so `go install
# module@version` builds exactly the release's dependency set.
set -euo pipefail
cd "$(dirname "$0")/.."

KUEUE_VERSION=v0.17.0
MODULE=sigs.k8s.io/kueue

MODE=build
for arg in "$@"; do
	case "$arg" in
	--print-bin) MODE=bin ;;
	--print-crds) MODE=crds ;;
	--print-module) MODE=module ;;
	--print-dependency=*)
		MODE=dependency
		DEPENDENCY=${arg#--print-dependency=}
		;;
	-h | --help)
		sed -n '2,15p' "$0"
		exit 0
		;;
	*)
		echo "unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

exec 3>&1
if [[ $MODE != build ]]; then
	exec 1>&2
fi
log() { printf '==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

export GOTOOLCHAIN=local
export CGO_ENABLED=0

CACHE_ROOT=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
STAMP_DIR="$CACHE_ROOT/kueue-${KUEUE_VERSION#v}"
mkdir -p "$STAMP_DIR"

if [[ $MODE == crds || $MODE == module || $MODE == dependency ]]; then
	# The module zip carries config/components (CRDs, webhook manifests); `go mod download`
	# fetches only the zip, and answers from the module cache once it is there.
	dir=$(go mod download -json "$MODULE@$KUEUE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	crds="$dir/config/components/crd/bases"
	[[ -f $crds/kueue.x-k8s.io_clusterqueues.yaml ]] || {
		echo "Kueue CRDs not found under $crds" >&2
		exit 1
	}
	if [[ $MODE == dependency ]]; then
		# The version Kueue itself is built and tested with, from its go.mod's require block.
		version=$(awk -v m="$DEPENDENCY" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$dir/go.mod")
		[[ -n $version ]] || {
			echo "$DEPENDENCY is not required by $MODULE@$KUEUE_VERSION's go.mod" >&2
			exit 1
		}
		dep=$(go mod download -json "$DEPENDENCY@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[[ -d $dep ]] || {
			echo "go mod download $DEPENDENCY@$version gave no directory" >&2
			exit 1
		}
		echo "$dep" >&3
	elif [[ $MODE == crds ]]; then
		echo "$crds" >&3
	else
		echo "$dir" >&3
	fi
	exit 0
fi

if [[ -n ${KUEUE_BIN:-} ]]; then
	[[ -x $KUEUE_BIN ]] || {
		echo "KUEUE_BIN=$KUEUE_BIN is not an executable" >&2
		exit 1
	}
	BIN=$KUEUE_BIN
else
	BIN="$STAMP_DIR/bin/kueue"
	if [[ ! -x $BIN ]]; then
		exec 9>"$STAMP_DIR/.lock"
		flock 9
	fi
	if [[ ! -x $BIN ]]; then
		t=$(date +%s)
		log "building Kueue $KUEUE_VERSION (cmd/kueue) from its Go module"
		rm -rf "$STAMP_DIR/bin.tmp"
		GOFLAGS=-trimpath GOBIN="$STAMP_DIR/bin.tmp" nice -n 10 go install "$MODULE/cmd/kueue@$KUEUE_VERSION"
		mkdir -p "$STAMP_DIR/bin"
		mv "$STAMP_DIR/bin.tmp/kueue" "$BIN"
		rmdir "$STAMP_DIR/bin.tmp"
		log "Kueue built in $(($(date +%s) - t))s"
	fi
fi

[[ $MODE == bin ]] && echo "$BIN" >&3
log "kueue: $BIN"
