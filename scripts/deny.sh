#!/usr/bin/env bash
# Supply-chain check with cargo-deny (policy in deny.toml), installing cargo-deny if missing.
#
#   scripts/deny.sh                 bans, licenses, sources (blocking in scripts/test.sh; offline)
#   scripts/deny.sh advisories      RustSec advisories (needs GitHub to fetch the database)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deny --version >/dev/null 2>&1; then
	# --debug: an unoptimised build installs in about half the time; checking one lock file
	# takes about a second either way.
	echo "cargo-deny missing: installing it (cargo install --locked --debug cargo-deny)"
	cargo install --locked --debug cargo-deny
fi
cargo deny --version

checks=("$@")
if [[ ${#checks[@]} == 0 ]]; then
	checks=(bans licenses sources)
fi
# --locked: judge exactly what Cargo.lock pins; no index update.
cargo deny --locked check --hide-inclusion-graph --show-stats "${checks[@]}"
