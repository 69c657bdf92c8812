#!/usr/bin/env bash
# The load benchmark (issue #15, invariant I8): binval run beside a writer at 200, 1000, 5000
# commits/s and as fast as 4 connections go, with two app instances serving reads; then the
# catch-up table beside python-mysql-replication's decode-only rate over the same binlog.
# Starts its own MariaDB, Redis Cluster and tansu on free loopback ports (binval-testkit).
# Prints markdown tables (docs/benchmarks.md, "Load benchmark"). Takes ~5 minutes.
#
#   scripts/loadbench.sh                         # everything
#   BENCH_RATES=1000 BENCH_CATCHUP=0 scripts/loadbench.sh
#
# Settings: see the header of benches/load/main.rs. python-mysql-replication is installed
# into a virtualenv under .state/ (or set BENCH_PYTHON to a python that has it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ":$PATH:" in *":${HOME:-/root}/.cargo/bin:"*) ;; *) export PATH="$PATH:${HOME:-/root}/.cargo/bin" ;; esac

scripts/services.sh install

if [ -z "${BENCH_PYTHON:-}" ]; then
  VENV="${BINVAL_STATE:-$PWD/.state}/pyvenv"
  if ! "$VENV/bin/python" -c 'import pymysqlreplication' 2>/dev/null; then
    echo "==> installing python-mysql-replication into $VENV"
    if python3 -m venv "$VENV" && "$VENV/bin/pip" install -q 'mysql-replication==1.0.*'; then :; else
      echo "(could not install python-mysql-replication: its column is skipped)"
    fi
  fi
  if "$VENV/bin/python" -c 'import pymysqlreplication' 2>/dev/null; then export BENCH_PYTHON="$VENV/bin/python"; fi
fi

exec cargo bench --locked --bench load "$@"
