#!/usr/bin/env bash
# Fuzz smoke: runs every cargo-fuzz target for a few seconds (default 5; total well under 60 s once
# built). Long campaigns and the reasons behind each flag: docs/reliability.md.
#
#   scripts/fuzz-smoke.sh              every target, FUZZ_SECONDS each
#   scripts/fuzz-smoke.sh quantity     one target
#
# Environment:
#   GPU_LEDGER_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger)
#   FUZZ_SECONDS       seconds per target (default 5)
#   FUZZ_SANITIZER     address (default) or none
#   FUZZ_BUILD         dev (default: unoptimised, debug assertions; a cold build of the crate and
#                      its dependencies is several times faster) or release (cargo-fuzz's default,
#                      for campaigns: more executions per second)
#
# Only stable Rust is installed: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags to stable.
set -euo pipefail
cd "$(dirname "$0")/.."

export GPU_LEDGER_CACHE=${GPU_LEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-ledger}
# The fuzz crate is built with sanitizer flags: keep it apart from the main target directory.
export CARGO_TARGET_DIR="$GPU_LEDGER_CACHE/fuzz-target"
export RUSTC_BOOTSTRAP=1
SECONDS_PER_TARGET=${FUZZ_SECONDS:-5}
SANITIZER=${FUZZ_SANITIZER:-address}
case ${FUZZ_BUILD:-dev} in
dev) BUILD=(--dev) ;;
release) BUILD=(--release --debug-assertions) ;;
*)
	echo "FUZZ_BUILD must be dev or release, not '${FUZZ_BUILD}'" >&2
	exit 2
	;;
esac
CORPUS_ROOT="$GPU_LEDGER_CACHE/fuzz-corpus"
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu-ledger-fuzz-smoke.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT

if ! cargo fuzz --version >/dev/null 2>&1; then
	echo "cargo-fuzz missing: installing it (cargo install --locked cargo-fuzz)"
	cargo install --locked --debug cargo-fuzz
fi

targets=("$@")
if [[ ${#targets[@]} == 0 ]]; then
	mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi

# One build for every target (the first build of the fuzz crate takes minutes; later ones are warm).
cargo fuzz build --fuzz-dir fuzz "${BUILD[@]}" --sanitizer "$SANITIZER" --codegen-units 16

passed=0
failed=0
for t in "${targets[@]}"; do
	corpus="$CORPUS_ROOT/$t"
	mkdir -p "$corpus"
	artifacts="$SCRATCH/artifacts/$t/"
	mkdir -p "$artifacts"
	log="$SCRATCH/$t.log"
	# New inputs go to the cached corpus (first directory); the committed seeds and regressions
	# are read only. kubectl_list writes its scratch dumps under TMPDIR, removed on exit.
	if TMPDIR="$SCRATCH" cargo fuzz run --fuzz-dir fuzz "${BUILD[@]}" --sanitizer "$SANITIZER" --codegen-units 16 "$t" \
		"$corpus" "fuzz/seeds/$t" "fuzz/regressions/$t" -- \
		-max_total_time="$SECONDS_PER_TARGET" -artifact_prefix="$artifacts" -print_final_stats=1 \
		>"$log" 2>&1; then
		runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
		echo "fuzz $t: ok ($runs executions in ${SECONDS_PER_TARGET}s)"
		passed=$((passed + 1))
	else
		echo "fuzz $t: FAILED; last lines of the log:" >&2
		tail -n 40 "$log" >&2
		for a in "$artifacts"*; do
			[[ -e $a ]] || continue
			mkdir -p "fuzz/regressions/$t"
			cp "$a" "fuzz/regressions/$t/"
			echo "  crashing input saved as fuzz/regressions/$t/$(basename "$a") (tests/fuzz_regressions.rs replays it)" >&2
		done
		failed=$((failed + 1))
	fi
done

echo "fuzz: $passed passed, $failed failed"
[[ $failed == 0 ]]
