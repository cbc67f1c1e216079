#!/usr/bin/env bash
# Build the container-free Kubernetes test cluster binaries (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm, optionally kube-state-metrics)
# from pinned Go modules into a cache OUTSIDE the repository. See docs/testing.md and
# /work/shared/reference/test-cluster.md.
#
# Usage: scripts/build-test-cluster.sh [--with-ksm] [--print-bindir]
#   --with-ksm      also build kube-state-metrics (benchmarks only; built last)
#   --print-bindir  print only the bin dir on stdout (progress goes to stderr), building first
#                   if needed
# Environment:
#   GPU_LEDGER_CACHE    cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   KUBEBUILDER_ASSETS  if it holds kube-apiserver and etcd, those are reused (symlinked)
#   HELM_VERSION        override the pinned helm version
set -euo pipefail

K8S_VERSION=v1.36.3
K8S_STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=${HELM_VERSION:-v3.22.0} # newest v3.x on the proxy when pinned (go list -m -versions helm.sh/helm/v3)
KSM_VERSION=v2.20.0

WITH_KSM=0
PRINT_BINDIR=0
for arg in "$@"; do
	case "$arg" in
	--with-ksm) WITH_KSM=1 ;;
	--print-bindir) PRINT_BINDIR=1 ;;
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

# With --print-bindir, stdout carries only the bin dir; everything else goes to stderr.
exec 3>&1
if [[ $PRINT_BINDIR == 1 ]]; then
	exec 1>&2
fi

export GOFLAGS=-mod=mod
export GOTOOLCHAIN=local
export CGO_ENABLED=0

CACHE_ROOT=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
STAMP="k8s${K8S_VERSION#v}-etcd${ETCD_VERSION#v}-kwok${KWOK_VERSION#v}-helm${HELM_VERSION#v}"
STAMP_DIR="$CACHE_ROOT/cluster-$STAMP"
BINDIR="$STAMP_DIR/bin"
WORKDIR="$STAMP_DIR/work"
NICE=(nice -n 10)
SCRIPT_START=$(date +%s)
WARNINGS=()

log() { printf '==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
warn() {
	printf 'WARNING: %s\n' "$*"
	WARNINGS+=("$*")
}
elapsed() { echo "$(($(date +%s) - $1))s"; }

finish() {
	mkdir -p "$CACHE_ROOT"
	printf '%s\n' "$BINDIR" >"$CACHE_ROOT/current-bindir"
	for w in "${WARNINGS[@]+"${WARNINGS[@]}"}"; do
		printf 'SUMMARY WARNING: %s\n' "$w"
	done
	log "total $(elapsed "$SCRIPT_START")"
	echo "export KUBEBUILDER_ASSETS=$BINDIR"
	if [[ $PRINT_BINDIR == 1 ]]; then
		echo "$BINDIR" >&3
	fi
}

have() { [[ -x "$BINDIR/$1" ]]; }

mkdir -p "$BINDIR" "$WORKDIR"
log "go: $(go version)"
log "cache: $STAMP_DIR"

is_complete() { [[ -f "$STAMP_DIR/.complete" ]] && { [[ $WITH_KSM == 0 ]] || have kube-state-metrics; }; }

# Fast path without the lock: .complete is written once, after every core binary exists.
if is_complete; then
	log "reusing complete cache $BINDIR (.complete present)"
	finish
	exit 0
fi

# One build per stamp at a time; a concurrent caller (e.g. --print-bindir from a test run)
# waits for the running build instead of racing it.
exec 9>"$STAMP_DIR/.lock"
if ! flock -n 9; then
	log "another build of $STAMP holds $STAMP_DIR/.lock; waiting for it"
	flock 9
fi

if is_complete; then
	log "reusing complete cache $BINDIR (.complete present, finished by a concurrent build)"
	finish
	exit 0
fi

# --- Prometheus (Debian) ----------------------------------------------------------------
if [[ ! -x /usr/bin/prometheus || ! -x /usr/bin/promtool ]]; then
	log "installing prometheus via apt-get"
	if [[ $(id -u) != 0 ]]; then
		warn "prometheus missing and not root: run 'apt-get install -y prometheus' as root"
	elif ! DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus; then
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus; } ||
			warn "apt-get install prometheus failed"
	fi
else
	log "prometheus present: $(/usr/bin/prometheus --version 2>&1 | head -1)"
fi

# --- reuse KUBEBUILDER_ASSETS -----------------------------------------------------------
if [[ -n ${KUBEBUILDER_ASSETS:-} && -x $KUBEBUILDER_ASSETS/kube-apiserver && -x $KUBEBUILDER_ASSETS/etcd &&
	$(readlink -f "$KUBEBUILDER_ASSETS") != $(readlink -f "$BINDIR") ]]; then
	log "using kube-apiserver and etcd from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
	for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
		if [[ -x $KUBEBUILDER_ASSETS/$b ]] && ! have "$b"; then
			ln -sf "$(readlink -f "$KUBEBUILDER_ASSETS/$b")" "$BINDIR/$b"
		fi
	done
fi

# --- etcd --------------------------------------------------------------------------------
if have etcd; then
	log "etcd already built"
else
	t=$(date +%s)
	log "building etcd $ETCD_VERSION (wrapper module; ~2-5 min cold)"
	d="$WORKDIR/etcd"
	rm -rf "$d" && mkdir -p "$d" && cd "$d"
	go mod init local.invalid/etcdbin
	go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	"${NICE[@]}" go build -p 2 -trimpath -o "$BINDIR/etcd" go.etcd.io/etcd/server/v3
	"$BINDIR/etcd" --version | head -1
	log "etcd built in $(elapsed "$t")"
fi

# --- Kubernetes ---------------------------------------------------------------------------
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
k8s_missing=()
for b in "${K8S_CMDS[@]}"; do have "$b" || k8s_missing+=("$b"); done
if [[ ${#k8s_missing[@]} == 0 ]]; then
	log "kubernetes binaries already built"
else
	t=$(date +%s)
	log "preparing kubernetes $K8S_VERSION wrapper module"
	d="$WORKDIR/k8s"
	rm -rf "$d" && mkdir -p "$d"
	# Fetch k8s.io/kubernetes's own go.mod outside any module.
	info=$(cd / && GOFLAGS='' go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
	gomod=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
	origin_hash=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]\{40\}\)",*$/\1/p' | head -1)
	mod_time=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Time": "\([^"]*\)",*$/\1/p' | head -1)
	[[ -f $gomod ]] || {
		echo "could not locate go.mod of k8s.io/kubernetes@$K8S_VERSION" >&2
		exit 1
	}
	mapfile -t staging < <(awk '$1 ~ /^k8s\.io\/[^\/ ]+$/ && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)
	[[ ${#staging[@]} -gt 20 ]] || {
		echo "found only ${#staging[@]} staging modules in $gomod" >&2
		exit 1
	}
	log "found ${#staging[@]} staging modules in k8s.io/kubernetes go.mod"
	go_line=$(awk '$1 == "go" {print $2; exit}' "$gomod")
	godebug=$(awk '$1 == "godebug" && $2 ~ /=/ {print $2; exit}' "$gomod")
	cd "$d"
	go mod init local.invalid/k8sbin
	go mod edit -go="${go_line:-1.26.0}"
	[[ -n $godebug ]] && go mod edit -godebug="$godebug"
	go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
	edits=()
	for m in "${staging[@]}"; do edits+=("-replace=$m=$m@$K8S_STAGING_VERSION"); done
	go mod edit "${edits[@]}"
	pkgs=()
	for b in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	tools=()
	for p in "${pkgs[@]}"; do tools+=("$p@$K8S_VERSION"); done
	go get -tool "${tools[@]}"
	log "wrapper module ready in $(elapsed "$t")"

	minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	build_date=${mod_time:-1970-01-01T00:00:00Z}
	build_date=${build_date%%.*}
	build_date=${build_date%Z}Z
	ldflags=""
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitCommit=${origin_hash} -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
	done
	# kube-apiserver first (tier A needs only it + etcd), then the rest reuse the build cache.
	if ! have kube-apiserver; then
		t=$(date +%s)
		log "building kube-apiserver $K8S_VERSION ... (cold builds take 15-30 min on 2 cores)"
		"${NICE[@]}" go build -p 2 -trimpath -ldflags "$ldflags" -o "$BINDIR/" k8s.io/kubernetes/cmd/kube-apiserver
		log "kube-apiserver built in $(elapsed "$t")"
	fi
	for b in kube-controller-manager kube-scheduler kubectl; do
		have "$b" && continue
		t=$(date +%s)
		log "building $b $K8S_VERSION ..."
		"${NICE[@]}" go build -p 2 -trimpath -ldflags "$ldflags" -o "$BINDIR/" "k8s.io/kubernetes/cmd/$b"
		log "$b built in $(elapsed "$t")"
	done
	ver=$("$BINDIR/kube-apiserver" --version)
	log "kube-apiserver --version: $ver"
	[[ $ver == "Kubernetes $K8S_VERSION" ]] || {
		echo "unexpected kube-apiserver version: $ver" >&2
		exit 1
	}
	if go version -m "$BINDIR/kube-apiserver" | awk '$1=="dep" && $2 ~ /^k8s\.io\// {print $2, $3}' |
		grep -Ev "^k8s\.io/(kubernetes $K8S_VERSION|[^ ]+ $K8S_STAGING_VERSION)$" |
		grep -E '^k8s\.io/(api|apimachinery|apiserver|client-go|component-base) '; then
		warn "kube-apiserver embeds core k8s.io modules not at $K8S_STAGING_VERSION (listed above)"
	fi
fi

# --- kwok ----------------------------------------------------------------------------------
if have kwok; then
	log "kwok already built"
else
	t=$(date +%s)
	log "building kwok $KWOK_VERSION (go install)"
	(cd / && GOFLAGS='' GOBIN="$BINDIR" "${NICE[@]}" go install -p 2 -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
	log "kwok built in $(elapsed "$t")"
fi

# --- helm (not on the critical path) -------------------------------------------------------
if have helm; then
	log "helm already built"
else
	t=$(date +%s)
	log "building helm $HELM_VERSION (go install)"
	if (cd / && GOFLAGS='' GOBIN="$BINDIR" "${NICE[@]}" go install -p 2 -trimpath "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"); then
		log "helm built in $(elapsed "$t")"
	else
		warn "helm $HELM_VERSION failed to build (see errors above); continuing without helm"
	fi
fi

core_ok=1
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
	have "$b" || {
		warn "$b missing from $BINDIR"
		core_ok=0
	}
done
# helm is not on the critical path: a failed helm build warns but does not block .complete
# (delete .complete to retry it).
if [[ $core_ok == 1 ]]; then
	{
		echo "stamp=$STAMP"
		date -u +built=%Y-%m-%dT%H:%M:%SZ
		for b in "$BINDIR"/*; do echo "bin=$(basename "$b")"; done
	} >"$STAMP_DIR/.complete"
	log "wrote $STAMP_DIR/.complete"
fi

# --- kube-state-metrics (optional, last) ---------------------------------------------------
if [[ $WITH_KSM == 1 ]]; then
	if have kube-state-metrics; then
		log "kube-state-metrics already built"
	else
		t=$(date +%s)
		# Wrapper module instead of `go install ...@v2.20.0`: go install's deprecation check
		# reads .../kube-state-metrics/v2/@v/list, which our proxy answers with 403 Forbidden.
		log "building kube-state-metrics $KSM_VERSION (wrapper module)"
		d="$WORKDIR/ksm"
		rm -rf "$d" && mkdir -p "$d"
		if (cd "$d" && go mod init local.invalid/ksmbin &&
			go get -tool "k8s.io/kube-state-metrics/v2@$KSM_VERSION" &&
			"${NICE[@]}" go build -p 2 -trimpath -o "$BINDIR/kube-state-metrics" k8s.io/kube-state-metrics/v2); then
			log "kube-state-metrics built in $(elapsed "$t")"
		else
			warn "kube-state-metrics $KSM_VERSION failed to build"
		fi
	fi
fi

finish
[[ $core_ok == 1 ]]
