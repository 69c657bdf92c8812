#!/usr/bin/env bash
# The test entry point: installs missing service binaries (MariaDB, Redis,
# tansu; nothing is started: the tests start their own instances on free
# loopback ports through crates/binval-testkit), then runs the workspace
# tests. Arguments replace `--workspace`, e.g. `scripts/test.sh -p binval-testkit`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh install

# tansu may have been installed just now into ~/.cargo/bin.
case ":$PATH:" in
  *":${HOME:-/root}/.cargo/bin:"*) ;;
  *) export PATH="$PATH:${HOME:-/root}/.cargo/bin" ;;
esac

[ "$#" -gt 0 ] || set -- --workspace
set +e
cargo test --locked "$@" -- --test-threads="${BINVAL_TEST_THREADS:-4}"
code=$?
set -e
exit "$code"
