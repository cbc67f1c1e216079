#!/usr/bin/env bash
# Build Thanos (sidecar + querier, one binary) from its Go module at a pinned version into a cache
# OUTSIDE the repository, for the multi-cluster tests (tests/multi_cluster.rs). See docs/testing.md.
#
# Usage: scripts/build-thanos.sh [--print-bin]
#   --print-bin   print only the binary's path on stdout (progress goes to stderr), building first
#                 if needed
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   THANOS_BIN         use this binary instead of building one
#
# Why a wrapper module: thanos' go.mod carries replace directives (a forked grpc-go among them),
# which `go install module@version` refuses. The wrapper requires thanos at the pinned version and
# repeats its replace directives, read from thanos' own go.mod, so the build is the release's.
# v0.41.0 is the newest release whose go.mod accepts this machine's Go (v0.42.x asks for 1.26.10).
set -euo pipefail

THANOS_VERSION=v0.41.0

PRINT_BIN=0
for arg in "$@"; do
	case "$arg" in
	--print-bin) PRINT_BIN=1 ;;
	-h | --help)
		sed -n '2,13p' "$0"
		exit 0
		;;
	*)
		echo "unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

exec 3>&1
if [[ $PRINT_BIN == 1 ]]; then
	exec 1>&2
fi

log() { printf '==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [[ -n ${THANOS_BIN:-} ]]; then
	[[ -x $THANOS_BIN ]] || {
		echo "THANOS_BIN=$THANOS_BIN is not an executable" >&2
		exit 1
	}
	[[ $PRINT_BIN == 1 ]] && echo "$THANOS_BIN" >&3
	exit 0
fi

export GOFLAGS=-mod=mod
export GOTOOLCHAIN=local
export CGO_ENABLED=0
# Thanos replaces grpc with its fork github.com/thanos-community/grpc-go, whose pseudo-version the
# checksum database does not know (its lookup answers 404): take that one module from the proxy
# without a sumdb entry; every other module is still verified.
export GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/thanos-community

CACHE_ROOT=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
# The stamp names the build recipe too: a binary built without the release's tags is unusable.
STAMP_DIR="$CACHE_ROOT/thanos-${THANOS_VERSION#v}-slicelabels"
BIN="$STAMP_DIR/bin/thanos"
mkdir -p "$STAMP_DIR/bin"

if [[ ! -x $BIN ]]; then
	exec 9>"$STAMP_DIR/.lock"
	if ! flock -n 9; then
		log "another build of thanos $THANOS_VERSION holds $STAMP_DIR/.lock; waiting for it"
		flock 9
	fi
fi

if [[ ! -x $BIN ]]; then
	t=$(date +%s)
	log "building thanos $THANOS_VERSION (wrapper module; ~6-10 min cold on 2 cores)"
	info=$(cd / && GOFLAGS='' go mod download -json "github.com/thanos-io/thanos@$THANOS_VERSION")
	gomod=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
	[[ -f $gomod ]] || {
		echo "could not locate go.mod of github.com/thanos-io/thanos@$THANOS_VERSION" >&2
		exit 1
	}
	d="$STAMP_DIR/work"
	rm -rf "$d" && mkdir -p "$d" && cd "$d"
	go mod init local.invalid/thanosbin
	go_line=$(awk '$1 == "go" {print $2; exit}' "$gomod")
	go mod edit -go="${go_line:-1.25.0}"
	go mod edit -require="github.com/thanos-io/thanos@$THANOS_VERSION"
	# Replace directives: single-line `replace a => b v` and the lines of `replace ( … )` blocks.
	mapfile -t replaces < <(awk '
		/^replace \($/ { inblock = 1; next }
		inblock && /^\)/ { inblock = 0; next }
		inblock && /=>/ { sub(/\/\/.*/, ""); print; next }
		/^replace [^(]/ && /=>/ { sub(/^replace /, ""); sub(/\/\/.*/, ""); print }
	' "$gomod")
	edits=()
	for r in "${replaces[@]}"; do
		# "old [oldver] => new newver" → -replace=old[@oldver]=new@newver
		read -r -a w <<<"$r"
		if [[ ${w[1]} == "=>" ]]; then
			old=${w[0]}
			new=${w[2]}
			newver=${w[3]:-}
		else
			old="${w[0]}@${w[1]}"
			new=${w[3]}
			newver=${w[4]:-}
		fi
		edits+=("-replace=$old=$new${newver:+@$newver}")
	done
	log "${#edits[@]} replace directives from thanos' go.mod"
	[[ ${#edits[@]} -gt 0 ]] && go mod edit "${edits[@]}"
	go get "github.com/thanos-io/thanos/cmd/thanos@$THANOS_VERSION"
	# The release's build tags (thanos' .promu.yml): `slicelabels` is required, since thanos
	# converts Prometheus' labels to its protobuf types in place and Prometheus now defaults to
	# another labels layout; without it the sidecar computes absurd message sizes and dies with
	# "runtime: out of memory" on its first gRPC answer.
	nice -n 10 go build -p 2 -trimpath -tags netgo,slicelabels \
		-ldflags "-X github.com/prometheus/common/version.Version=${THANOS_VERSION#v}" \
		-o "$BIN.tmp" github.com/thanos-io/thanos/cmd/thanos
	mv "$BIN.tmp" "$BIN"
	log "thanos built in $(($(date +%s) - t))s"
fi
"$BIN" --version 2>&1 | head -1
[[ $PRINT_BIN == 1 ]] && echo "$BIN" >&3
exit 0
