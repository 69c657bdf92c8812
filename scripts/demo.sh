#!/usr/bin/env bash
# Quick start, command 1: the whole pipeline end to end on this machine, no Docker.
#   1. scripts/services.sh up: MariaDB (row binlog), Redis Cluster (3 masters), tansu broker
#   2. builds binval and the demo app (release)
#   3. binval check, then binval run --config config/demo.toml in the background
#   4. the demo app: 2 app instances with local caches; 200 updates in MariaDB; prints the
#      commit -> eviction latency per instance and checks each then reads the new value
#   5. the product_api example (an axum HTTP service reading through binval-consumer):
#      GET /products/1 before and after an UPDATE, and its /stats
#   6. SIGTERM to binval: it drains, saves its checkpoint and must exit 0
# Services stay up afterwards (scripts/services.sh down stops them).
#
# DEMO_LOAD=N runs a background writer at N commits/s (single-row UPDATEs of other rows)
# while the updates are timed, and reports the rate reached and how much of the time each app
# instance served from its local cache, e.g. `DEMO_LOAD=1000 scripts/demo.sh`.
#
# Every run starts binval at the binlog's current end: an earlier run's checkpoint and its
# copies (left in Redis, and possibly far behind after activity on the demo database) are
# dropped first, and the start is the primary's position now (an explicit source.start: with
# "current", the traces of the earlier run would make binval recover from the topic), so the
# demo never spends its time catching up on old changes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ":$PATH:" in *":${HOME:-/root}/.cargo/bin:"*) ;; *) export PATH="$PATH:${HOME:-/root}/.cargo/bin" ;; esac

scripts/services.sh up
echo "==> building binval and the demo app (release)"
cargo build --release --locked --bin binval --example demo
cargo build --release --locked -p binval-consumer --example product_api

STATE="${BINVAL_STATE:-$PWD/.state}"
mkdir -p "$STATE"
LOG="$STATE/binval-demo.log"
BIN=target/release/binval

echo "==> dropping an earlier demo run's checkpoint and its copies: binval starts at the binlog's current end"
redis_cli="$(command -v redis-cli)"
"$redis_cli" -c -p 17001 DEL "binval:{demo}:checkpoint" >/dev/null
for port in ${BINVAL_CLUSTER_PORTS:-17001 17002 17003}; do
  "$redis_cli" -p "$port" --scan --pattern 'binval:{demo~cp*}:checkpoint' | while read -r k; do
    "$redis_cli" -c -p "$port" DEL "$k" >/dev/null
  done
done
mariadb="$(command -v mariadb || command -v mysql)"
now="$("$mariadb" --no-defaults -uroot -h127.0.0.1 -P"${BINVAL_MARIADB_PORT:-13306}" --protocol=TCP -N -e 'SHOW MASTER STATUS' | awk '{print $1 ":" $2}')"
export BINVAL__SOURCE__START="$now"
echo "    source.start = $now"

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

echo "==> demo app${DEMO_LOAD:+ (background writer: $DEMO_LOAD commits/s)}"
target/release/examples/demo

echo "==> product_api (HTTP service through binval-consumer)"
API_PORT="${DEMO_API_PORT:-18080}"
API_LOG="$STATE/product_api.log"
LISTEN_ADDR="127.0.0.1:$API_PORT" \
BINVAL_REDIS_URLS="redis://127.0.0.1:17001,redis://127.0.0.1:17002,redis://127.0.0.1:17003" \
BINVAL_BROKERS="127.0.0.1:19092" BINVAL_TOPIC="binval.invalidations" \
  target/release/examples/product_api >"$API_LOG" 2>&1 &
api=$!
cleanup() { kill -TERM "$pid" "$api" 2>/dev/null || true; }
api_get() { curl -fsS "http://127.0.0.1:$API_PORT$1"; }
for _ in $(seq 1 100); do api_get /stats >/dev/null 2>&1 && break; sleep 0.1; done
echo "GET /products/1: $(api_get /products/1)"
mariadb_sql() { "$(command -v mariadb || command -v mysql)" --no-defaults -uapp -papp -h127.0.0.1 -P13306 --protocol=TCP shop -e "$1"; }
mariadb_sql "UPDATE items SET price = 99.99 WHERE id = 1"
got=""
for _ in $(seq 1 50); do
  got="$(api_get /products/1)"
  case "$got" in *'"99.99"'*) break ;; esac
  sleep 0.02
done
echo "after UPDATE ... price = 99.99: $got"
case "$got" in *'"99.99"'*) ;; *) echo "product_api did not serve the new price within 1 s" >&2; exit 1 ;; esac
echo "GET /stats: $(api_get /stats)"
kill -TERM "$api"; wait "$api" 2>/dev/null || true

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
