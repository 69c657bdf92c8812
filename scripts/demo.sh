#!/usr/bin/env bash
# Quick start, command 1: the whole pipeline end to end on this machine, no Docker.
#   1. scripts/services.sh up: MariaDB (row binlog), Redis Cluster (3 masters), tansu broker
#   2. builds binval and the demo app (release)
#   3. binval check, then binval run --config config/demo.toml in the background
#   4. the demo app: 2 app instances with local caches; 200 updates in MariaDB; prints the
#      commit -> eviction latency per instance and checks each then reads the new value
#   5. SIGTERM to binval: it drains, saves its checkpoint and must exit 0
# Services stay up afterwards (scripts/services.sh down stops them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ":$PATH:" in *":${HOME:-/root}/.cargo/bin:"*) ;; *) export PATH="$PATH:${HOME:-/root}/.cargo/bin" ;; esac

scripts/services.sh up
echo "==> building binval and the demo app (release)"
cargo build --release --locked --bin binval --example demo

STATE="${BINVAL_STATE:-$PWD/.state}"
mkdir -p "$STATE"
LOG="$STATE/binval-demo.log"
BIN=target/release/binval

echo "==> binval check"
"$BIN" check --config config/demo.toml

echo "==> binval run (log: $LOG)"
"$BIN" run --config config/demo.toml >"$LOG" 2>&1 &
pid=$!
cleanup() { kill -TERM "$pid" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 300); do
  grep -q "replica connection open" "$LOG" && break
  kill -0 "$pid" 2>/dev/null || { cat "$LOG"; echo "binval exited early" >&2; exit 1; }
  sleep 0.1
done
grep -q "replica connection open" "$LOG" || { cat "$LOG"; echo "binval did not connect within 30 s" >&2; exit 1; }

echo "==> demo app"
target/release/examples/demo

echo "==> stopping binval (SIGTERM)"
trap - EXIT
kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
tail -n 5 "$LOG"
if [ "$code" -ne 0 ]; then echo "binval exited $code" >&2; exit 1; fi
echo "==> binval drained, saved its checkpoint and exited 0. Stop the services with: scripts/services.sh down"
