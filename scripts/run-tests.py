#!/usr/bin/env python3
"""Build every test binary once, then run them side by side (scripts/test.sh calls this).

`cargo test` runs its binaries one after another, and most of their time is spent waiting on
refresh intervals and control-plane start-up, so two binaries at once finish the suite in about
half the time on two cores. Every binary runs to the end (cargo test stops at the first failing
one); a failed binary's whole output is printed, and the exit status is non-zero if any failed.

Usage: scripts/run-tests.py [--jobs N] [--test-threads N] [-- CARGO_TEST_ARGS...]
  --jobs N          binaries at once (default 2, or GPU_LEDGER_TEST_JOBS)
  --test-threads N  test threads inside each binary (default 2)
  CARGO_TEST_ARGS   what selects the binaries (default: --workspace --lib --bins --tests --locked)

Longest binaries start first: durations of the previous run are kept in
$GPU_LEDGER_CACHE/test-durations.json (a missing file only changes the order).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_SELECTION = ["--workspace", "--lib", "--bins", "--tests", "--locked"]


def stamp() -> str:
    return time.strftime("%H:%M:%S")


def build(selection: list[str]) -> list[dict]:
    """Compile the test binaries; return one entry per executable, in cargo's order."""
    cmd = ["cargo", "test", *selection, "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    binaries = []
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{kind}:{target['name']}"
        binaries.append(
            {
                "name": f"{package_name(msg['package_id'])}/{name}",
                "exe": msg["executable"],
                # cargo test runs each binary from its package's root; some tests read files
                # relative to it.
                "cwd": str(Path(msg["manifest_path"]).parent),
            }
        )
    if proc.wait() != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed (exit {proc.returncode})")
    if not binaries:
        sys.exit("run-tests: cargo built no test binary; nothing would run")
    return binaries


def package_name(package_id: str) -> str:
    """`path+file:///dir#name@1.0` → name; `path+file:///dir/name#1.0` → name."""
    location, _, fragment = package_id.partition("#")
    if "@" in fragment:
        return fragment.split("@", 1)[0]
    return location.rstrip("/").rsplit("/", 1)[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--jobs", type=int, default=int(os.environ.get("GPU_LEDGER_TEST_JOBS", "2"))
    )
    parser.add_argument("--test-threads", type=int, default=2)
    parser.add_argument("selection", nargs="*")
    args = parser.parse_args()
    if args.jobs < 1 or args.test_threads < 1:
        parser.error("--jobs and --test-threads must be at least 1")

    cache = Path(
        os.environ.get("GPU_LEDGER_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpu-ledger"
    )
    durations_file = cache / "test-durations.json"
    try:
        known = json.loads(durations_file.read_text())
    except (OSError, ValueError):
        known = {}

    binaries = build(args.selection or DEFAULT_SELECTION)
    # Unknown binaries first (they may be long), then the longest known.
    binaries.sort(key=lambda b: -known.get(b["name"], float("inf")))
    print(
        f"[{stamp()}] running {len(binaries)} test binaries, {args.jobs} at a time, "
        f"{args.test_threads} test threads each",
        flush=True,
    )

    queue = list(binaries)
    lock = threading.Lock()
    results: dict[str, tuple[int, float]] = {}
    logs = Path(tempfile.mkdtemp(prefix="gpu-ledger-tests-"))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            log_path = logs / (b["name"].replace("/", "__").replace(":", "_") + ".log")
            started = time.monotonic()
            with open(log_path, "w") as log:
                rc = subprocess.call(
                    [b["exe"], "--test-threads", str(args.test_threads)],
                    cwd=b["cwd"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            took = time.monotonic() - started
            with lock:
                results[b["name"]] = (rc, took)
                summary = summarize(log_path)
                if rc == 0:
                    print(f"[{stamp()}] ok     {b['name']} ({took:.0f} s) {summary}", flush=True)
                else:
                    print(f"[{stamp()}] FAILED {b['name']} ({took:.0f} s, exit {rc})", flush=True)
                    print(log_path.read_text(errors="replace"), flush=True)

    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    failed = sorted(name for name, (rc, _) in results.items() if rc != 0)
    if not failed:
        # Keep only durations of passing runs: a binary that failed early would sort last next time.
        known.update({name: round(took, 1) for name, (_, took) in results.items()})
        try:
            cache.mkdir(parents=True, exist_ok=True)
            durations_file.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        except OSError as e:
            print(f"run-tests: could not record durations in {durations_file}: {e}", file=sys.stderr)
    slowest = sorted(results.items(), key=lambda kv: -kv[1][1])[:8]
    print(
        f"[{stamp()}] slowest: "
        + ", ".join(f"{name} {took:.0f} s" for name, (_, took) in slowest),
        flush=True,
    )
    if failed:
        print(f"[{stamp()}] {len(failed)} of {len(results)} test binaries FAILED: {', '.join(failed)}")
        print(f"logs: {logs}")
        return 1
    print(f"[{stamp()}] all {len(results)} test binaries passed")
    return 0


def summarize(log_path: Path) -> str:
    """The libtest totals of one binary ("N passed; M ignored ..."), summed over its lines."""
    passed = ignored = 0
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("test result:"):
            parts = line.replace(";", "").split()
            for value, word in zip(parts, parts[1:]):
                if word == "passed" and value.isdigit():
                    passed += int(value)
                elif word == "ignored" and value.isdigit():
                    ignored += int(value)
    return f"{passed} passed" + (f", {ignored} ignored" if ignored else "")


if __name__ == "__main__":
    sys.exit(main())
