#!/usr/bin/env bash
# Build KubeRay's operator (ray-operator's manager) from its Go module at a pinned release into a
# cache OUTSIDE the repository, for the RayCluster culling test (tests/e2e_raycluster.rs). See
# docs/testing.md.
#
# Usage: scripts/build-kuberay.sh [--print-bin | --print-crds]
#   --print-bin    print only the operator binary's path on stdout (progress goes to stderr),
#                  building first if needed
#   --print-crds   print only the directory holding KubeRay's own CRD manifests (from the module's
#                  config/crd/bases)
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   KUBERAY_BIN        use this binary instead of building one
#
# v1.5.0: the manager is the module's root package (main.go); its go.mod asks Go 1.24 and carries
# no replace directives, so `go install module@version` builds exactly the release's dependency
# set.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERAY_VERSION=v1.5.0
MODULE=github.com/ray-project/kuberay/ray-operator

MODE=build
for arg in "$@"; do
	case "$arg" in
	--print-bin) MODE=bin ;;
	--print-crds) MODE=crds ;;
	-h | --help)
		sed -n '2,17p' "$0"
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
STAMP_DIR="$CACHE_ROOT/kuberay-${KUBERAY_VERSION#v}"
mkdir -p "$STAMP_DIR"

if [[ $MODE == crds ]]; then
	# The module zip carries config/crd; `go mod download` fetches only the zip, and answers from
	# the module cache once it is there.
	dir=$(go mod download -json "$MODULE@$KUBERAY_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	crds="$dir/config/crd/bases"
	[[ -f $crds/ray.io_rayclusters.yaml ]] || {
		echo "KubeRay CRDs not found under $crds" >&2
		exit 1
	}
	echo "$crds" >&3
	exit 0
fi

if [[ -n ${KUBERAY_BIN:-} ]]; then
	[[ -x $KUBERAY_BIN ]] || {
		echo "KUBERAY_BIN=$KUBERAY_BIN is not an executable" >&2
		exit 1
	}
	BIN=$KUBERAY_BIN
else
	BIN="$STAMP_DIR/bin/ray-operator"
	if [[ ! -x $BIN ]]; then
		exec 9>"$STAMP_DIR/.lock"
		flock 9
	fi
	if [[ ! -x $BIN ]]; then
		t=$(date +%s)
		log "building KubeRay $KUBERAY_VERSION (ray-operator) from its Go module"
		rm -rf "$STAMP_DIR/bin.tmp"
		GOFLAGS=-trimpath GOBIN="$STAMP_DIR/bin.tmp" nice -n 10 go install "$MODULE@$KUBERAY_VERSION"
		mkdir -p "$STAMP_DIR/bin"
		mv "$STAMP_DIR/bin.tmp/ray-operator" "$BIN"
		rmdir "$STAMP_DIR/bin.tmp"
		log "KubeRay built in $(($(date +%s) - t))s"
	fi
fi

[[ $MODE == bin ]] && echo "$BIN" >&3
log "kuberay: $BIN"
