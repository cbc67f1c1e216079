#!/usr/bin/env bash
# Cold build of the README's first command (docs/first-build.md): builds `gpu-ledger` with the
# given cargo profile flags into an EMPTY target directory under /tmp (the crates are taken from
# the local registry cache, so download time is not included), then prints
#   - wall and CPU seconds (user + sys, from GNU time: less sensitive to other load than wall),
#   - the load average before and after (quote it with the figures),
#   - the crates that took longest, from `cargo build --timings`,
#   - the run time of `gpu-ledger report --from examples/homelab` with the binary just built.
#
#   scripts/bench-first-build.sh                    # the README command's profile (dev)
#   scripts/bench-first-build.sh --release          # the shipped profile
#   scripts/bench-first-build.sh --profile NAME     # any other profile
#
# TOP (default 15) sets how many crates are listed; KEEP_TIMINGS=DIR copies cargo-timing.html
# there. The target directory is deleted on exit. Needs GNU time (/usr/bin/time) and python3.
# Not part of scripts/test.sh: a cold build takes minutes, and only one should run at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 2; }

FLAGS=("$@")
TOP=${TOP:-15}
# Where cargo puts the binary for these flags: target/debug for dev, target/release for
# --release, target/NAME for --profile NAME.
OUT=debug
for ((i = 0; i < ${#FLAGS[@]}; i++)); do
	case ${FLAGS[i]} in
	--release | -r) OUT=release ;;
	--profile) OUT=${FLAGS[i + 1]:-debug} ;;
	--profile=*) OUT=${FLAGS[i]#--profile=} ;;
	esac
done
[[ $OUT == dev ]] && OUT=debug
[[ $OUT == test ]] && OUT=debug
[[ $OUT == bench ]] && OUT=release

DIR=$(mktemp -d /tmp/gl-first-build.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export CARGO_TARGET_DIR=$DIR/target

load() { sed 's/.*load average: //' /proc/loadavg 2>/dev/null || uptime | sed 's/.*load average: //'; }
echo "== $(date -u +%FT%TZ) $(nproc) cores; rustc $(rustc --version | cut -d' ' -f2); profile flags: ${FLAGS[*]:-(dev)}"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -f '%e %U %S' -o "$DIR/time" \
	cargo build "${FLAGS[@]}" --bin gpu-ledger --timings --quiet
read -r wall user sys <"$DIR/time"
echo "== load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$wall" "$user" "$sys" <<'EOF'
import sys
wall, user, sys_ = map(float, sys.argv[1:4])
print(f"== cold build: wall {wall:.0f} s, CPU {user + sys_:.0f} s (user {user:.0f} + sys {sys_:.0f})")
EOF

HTML=$CARGO_TARGET_DIR/cargo-timings/cargo-timing.html
[[ -n ${KEEP_TIMINGS:-} ]] && mkdir -p "$KEEP_TIMINGS" && cp "$HTML" "$KEEP_TIMINGS/"
# cargo-timing.html carries every unit as JSON (`const UNIT_DATA = [...]`): name, target
# (" build-script (run)" for running one), start and duration in seconds, and per crate the
# frontend/codegen split ("sections"; older cargo: "rmeta_time", the end of the frontend).
python3 - "$HTML" "$TOP" <<'EOF'
import json, re, sys
html = open(sys.argv[1], encoding="utf-8").read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
top = int(sys.argv[2])
total = sum(u["duration"] for u in units)
print(f"== {len(units)} units, {total:.0f} s of unit time (summed over parallel jobs); top {top}:")
print(f"{'s':>7} {'codegen':>8} {'start':>6}  crate")
for u in sorted(units, key=lambda u: u["duration"], reverse=True)[:top]:
    sections = dict(u.get("sections") or [])
    if "codegen" in sections:
        codegen = f"{sections['codegen']['end'] - sections['codegen']['start']:.1f}"
    elif u.get("rmeta_time") is not None:
        codegen = f"{u['duration'] - u['rmeta_time']:.1f}"
    else:
        codegen = "-"
    print(f"{u['duration']:7.1f} {codegen:>8} {u['start']:6.0f}  {u['name']} {u['version']}{u['target']}")
EOF

BIN=$CARGO_TARGET_DIR/$OUT/gpu-ledger
# The report itself: best of five runs, output discarded (the first output a newcomer sees).
best=
for _ in 1 2 3 4 5; do
	/usr/bin/time -f '%e' -o "$DIR/run" "$BIN" report --from examples/homelab >/dev/null
	t=$(cat "$DIR/run")
	if [[ -z $best ]] || python3 -c "import sys; sys.exit(not $t < $best)"; then best=$t; fi
done
echo "== report --from examples/homelab with $OUT/gpu-ledger: best of 5 runs $best s"
