#!/usr/bin/env bash
# Local backing services for the binval demo, without Docker.
#
#   scripts/services.sh install   install what is missing (apt: MariaDB, Redis, promtool; cargo: tansu)
#   scripts/services.sh up        install, then start everything (idempotent) and print URLs
#   scripts/services.sh status    show each service, its port, up/down
#   scripts/services.sh down      stop what `up` started (by pid file)
#
# Everything runs on 127.0.0.1 under one state folder (default: <repo>/.state,
# override with BINVAL_STATE). Ports (override by env):
#   BINVAL_MARIADB_PORT   13306            MariaDB, row-based binlog
#   BINVAL_REDIS_PORT     16379            Redis standalone
#   BINVAL_CLUSTER_PORTS  "17001 17002 17003"  Redis Cluster, 3 masters (bus ports +10000)
#   BINVAL_KAFKA_PORT     19092            tansu (Kafka-compatible broker, in-memory storage)
# Binaries: BINVAL_TANSU may point at a tansu executable.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${BINVAL_STATE:-$ROOT/.state}"
mkdir -p "$STATE" 2>/dev/null || true
STATE="$(cd "$STATE" 2>/dev/null && pwd || echo "$STATE")"
MARIADB_PORT="${BINVAL_MARIADB_PORT:-13306}"
REDIS_PORT="${BINVAL_REDIS_PORT:-16379}"
read -r -a CLUSTER_PORTS <<<"${BINVAL_CLUSTER_PORTS:-17001 17002 17003}"
KAFKA_PORT="${BINVAL_KAFKA_PORT:-19092}"
TANSU_VERSION=0.6.0

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- binaries

find_bin() { # name... -> path of the first found on PATH or in sbin dirs
  local n d
  for n in "$@"; do
    if command -v "$n" >/dev/null 2>&1; then command -v "$n"; return 0; fi
    for d in /usr/sbin /usr/bin /usr/local/sbin /usr/local/bin /sbin; do
      if [[ -x "$d/$n" ]]; then echo "$d/$n"; return 0; fi
    done
  done
  return 1
}

find_tansu() {
  if [[ -n "${BINVAL_TANSU:-}" && -x "${BINVAL_TANSU}" ]]; then echo "$BINVAL_TANSU"; return 0; fi
  if command -v tansu >/dev/null 2>&1; then command -v tansu; return 0; fi
  if [[ -x "${HOME:-/root}/.cargo/bin/tansu" ]]; then echo "${HOME:-/root}/.cargo/bin/tansu"; return 0; fi
  return 1
}

find_cargo() {
  if command -v cargo >/dev/null 2>&1; then command -v cargo; return 0; fi
  if [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then echo "${HOME:-/root}/.cargo/bin/cargo"; return 0; fi
  return 1
}

as_root() {
  if [[ "$(id -u)" == 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

cmd_install() {
  local pkgs=()
  find_bin mariadbd mysqld >/dev/null || pkgs+=(mariadb-server)
  find_bin mariadb-install-db mysql_install_db >/dev/null || pkgs+=(mariadb-server)
  find_bin mariadb mysql >/dev/null || pkgs+=(mariadb-client)
  find_bin redis-server >/dev/null || pkgs+=(redis-server)
  find_bin redis-cli >/dev/null || pkgs+=(redis-tools)
  # C toolchain for crates with native parts (rdkafka, tansu's dependencies).
  { find_bin cc >/dev/null && find_bin make >/dev/null; } || pkgs+=(build-essential)
  find_bin pkg-config >/dev/null || pkgs+=(pkg-config)
  # OpenSSL headers: librdkafka is built with SSL (Kafka TLS and SASL SCRAM, issue #13).
  { [[ -f /usr/include/openssl/ssl.h ]] || pkg-config --exists openssl 2>/dev/null; } || pkgs+=(libssl-dev)
  find_bin perl >/dev/null || pkgs+=(perl)
  find_bin curl >/dev/null || pkgs+=(curl)  # the demo queries the product_api example
  if ((${#pkgs[@]})); then
    # shellcheck disable=SC2207
    pkgs=($(printf '%s\n' "${pkgs[@]}" | sort -u))
    command -v apt-get >/dev/null 2>&1 || die "missing: ${pkgs[*]} (and no apt-get here; install them yourself)"
    log "apt-get install ${pkgs[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
  else
    log "MariaDB, Redis and build tools already installed"
  fi

  if tansu_bin="$(find_tansu)"; then
    log "tansu found: $tansu_bin"
  else
    local cargo
    cargo="$(find_cargo)" || die "cargo not found: install Rust (https://rustup.rs) first, then re-run"
    log "installing tansu $TANSU_VERSION with cargo install (this takes ~11-16 minutes on a cold build)"
    "$cargo" install tansu --version "$TANSU_VERSION" --locked --features dynostore
    find_tansu >/dev/null || die "tansu still not found after cargo install (is ~/.cargo/bin on PATH?)"
  fi
  install_promtool
}

find_promtool() {
  command -v promtool 2>/dev/null || { [ -x "$HOME/.cargo/bin/promtool" ] && echo "$HOME/.cargo/bin/promtool"; }
}

# promtool checks deploy/prometheus (tests/deploy.rs). Taken out of Debian's prometheus
# package with apt-get download + dpkg-deb -x, so no Prometheus server is installed or started.
install_promtool() {
  local p
  if p="$(find_promtool)"; then
    log "promtool found: $p"
    return
  fi
  command -v apt-get >/dev/null 2>&1 || die "promtool missing (and no apt-get here): install Prometheus' promtool on PATH"
  local tmp
  tmp="$(mktemp -d)"
  log "promtool: apt-get download prometheus (only promtool is kept, in ~/.cargo/bin)"
  if ! (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$tmp" && apt-get download -qq prometheus) || die "apt-get download prometheus failed"
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$HOME/.cargo/bin"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$HOME/.cargo/bin/promtool"
  rm -rf "$tmp"
  find_promtool >/dev/null || die "promtool still not found after installing it"
}

# ---------------------------------------------------------------- processes

# pid file + liveness + expected command name (guards against reused pids)
running() { # pidfile comm
  local pid
  [[ -f "$1" ]] || return 1
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2"* ]]
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_port_free() { # port what
  if port_open "$1"; then
    die "port $1 (for $2) is already in use by another process; pick another with the BINVAL_*_PORT variables"
  fi
}

# Start a daemon detached from this shell (own session, survives the script).
daemon() { # pidfile logfile cwd cmd...
  local pidfile="$1" logfile="$2" cwd="$3"
  shift 3
  (cd "$cwd" && exec setsid nohup "$@" >>"$logfile" 2>&1 </dev/null) &
  echo $! >"$pidfile"
}

wait_for() { # seconds description command...
  local secs="$1" what="$2" i
  shift 2
  for ((i = 0; i < secs * 10; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

# alive and not a zombie (an orphan stays a zombie until init reaps it)
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

stop_pidfile() { # pidfile comm name
  local pid i
  if running "$1" "$2"; then
    pid="$(cat "$1")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    log "stopped $3 (pid $pid)"
  fi
  rm -f "$1"
}

# ---------------------------------------------------------------- MariaDB

MARIADB_DIR="$STATE/mariadb"
mariadb_cli() { "$(find_bin mariadb mysql)" --no-defaults -uroot -h127.0.0.1 -P"$MARIADB_PORT" --protocol=TCP "$@"; }

up_mariadb() {
  local pidfile="$MARIADB_DIR/mariadbd.pid" user=()
  [[ "$(id -u)" == 0 ]] && user=(--user=root)
  mkdir -p "$MARIADB_DIR"
  if running "$pidfile" mariadbd; then
    log "MariaDB already running (pid $(cat "$pidfile"), port $MARIADB_PORT)"
  else
    ensure_port_free "$MARIADB_PORT" MariaDB
    if [[ ! -d "$MARIADB_DIR/data/mysql" ]]; then
      log "initialising MariaDB datadir $MARIADB_DIR/data"
      rm -rf "$MARIADB_DIR/data"
      "$(find_bin mariadb-install-db mysql_install_db)" --no-defaults "${user[@]}" \
        --datadir="$MARIADB_DIR/data" --auth-root-authentication-method=normal \
        --skip-test-db --innodb-log-file-size=8M >"$MARIADB_DIR/install-db.log" 2>&1 ||
        { tail -20 "$MARIADB_DIR/install-db.log"; die "mariadb-install-db failed"; }
    fi
    log "starting MariaDB on 127.0.0.1:$MARIADB_PORT"
    daemon "$pidfile" "$MARIADB_DIR/mariadbd.out" "$MARIADB_DIR" \
      "$(find_bin mariadbd mysqld)" --no-defaults "${user[@]}" \
      --datadir="$MARIADB_DIR/data" --port="$MARIADB_PORT" --bind-address=127.0.0.1 \
      --socket="$MARIADB_DIR/mariadbd.sock" --log-error="$MARIADB_DIR/error.log" \
      --log-bin=mysql-bin --binlog-format=ROW --binlog-row-image=FULL --binlog-row-metadata=FULL \
      --server-id=1 --gtid-strict-mode=OFF --skip-name-resolve \
      --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
      --innodb-log-file-size=8M --innodb-buffer-pool-size=256M
    wait_for 60 MariaDB mariadb_cli -e 'SELECT 1' ||
      { tail -30 "$MARIADB_DIR/error.log" >&2; die "MariaDB did not come up on port $MARIADB_PORT"; }
  fi
  # Idempotent: users, grants and the demo database.
  mariadb_cli <<'SQL'
CREATE USER IF NOT EXISTS 'binval'@'%' IDENTIFIED BY 'binval';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR, SELECT, RELOAD ON *.* TO 'binval'@'%';
CREATE DATABASE IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.items (id INT PRIMARY KEY, title VARCHAR(200) NOT NULL, price DECIMAL(10,2) NOT NULL, stock INT NOT NULL, updated DATETIME(3) NOT NULL);
CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'app';
GRANT ALL PRIVILEGES ON shop.* TO 'app'@'%';
SQL
}

# ---------------------------------------------------------------- Redis

redis_ping() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null)" == PONG ]]; }

start_redis() { # dir port extra-args...
  local dir="$1" port="$2"
  shift 2
  mkdir -p "$dir"
  if running "$dir/redis.pid" redis-server; then
    log "Redis already running on $port (pid $(cat "$dir/redis.pid"))"
    return 0
  fi
  ensure_port_free "$port" Redis
  log "starting Redis on 127.0.0.1:$port"
  daemon "$dir/redis.pid" "$dir/redis.log" "$dir" \
    "$(find_bin redis-server)" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize no --logfile "" --dir "$dir" "$@"
  wait_for 30 "Redis $port" redis_ping "$port" ||
    { tail -20 "$dir/redis.log" >&2; die "Redis did not come up on port $port"; }
}

up_redis() { start_redis "$STATE/redis" "$REDIS_PORT"; }

cluster_field() { # port field
  redis-cli -h 127.0.0.1 -p "$1" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

cluster_ok() {
  local p
  for p in "${CLUSTER_PORTS[@]}"; do
    [[ "$(cluster_field "$p" cluster_state)" == ok ]] || return 1
    [[ "$(cluster_field "$p" cluster_known_nodes)" == "${#CLUSTER_PORTS[@]}" ]] || return 1
  done
}

up_cluster() {
  local p a assigned=0 nodes=()
  for p in "${CLUSTER_PORTS[@]}"; do
    start_redis "$STATE/cluster-$p" "$p" --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 5000
    nodes+=("127.0.0.1:$p")
    a="$(cluster_field "$p" cluster_slots_assigned)"
    assigned=$((assigned + ${a:-0}))
  done
  if [[ "$assigned" == 0 ]]; then
    log "creating Redis Cluster ${nodes[*]}"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
      >"$STATE/cluster-create.log" 2>&1 ||
      { cat "$STATE/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
  fi
  wait_for 60 "Redis Cluster" cluster_ok ||
    die "Redis Cluster not ok; try: $0 down && rm -rf $STATE/cluster-* && $0 up"
}

# ---------------------------------------------------------------- tansu

up_kafka() {
  local dir="$STATE/kafka" tansu
  mkdir -p "$dir/cwd" # tansu reads .env from its working directory: keep it empty
  if running "$dir/tansu.pid" tansu; then
    log "tansu already running on $KAFKA_PORT (pid $(cat "$dir/tansu.pid"))"
    return 0
  fi
  tansu="$(find_tansu)" || die "tansu not found; run: $0 install"
  ensure_port_free "$KAFKA_PORT" tansu
  log "starting tansu on 127.0.0.1:$KAFKA_PORT (in-memory storage: topics vanish on restart)"
  daemon "$dir/tansu.pid" "$dir/tansu.log" "$dir/cwd" \
    env -u CLUSTER_ID -u LISTENER_URL -u ADVERTISED_LISTENER_URL -u STORAGE_ENGINE \
    RUST_LOG="${RUST_LOG:-warn}" \
    "$tansu" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" --storage-engine memory://tansu/
  wait_for 30 tansu port_open "$KAFKA_PORT" ||
    { tail -20 "$dir/tansu.log" >&2; die "tansu did not come up on port $KAFKA_PORT"; }
}

# ---------------------------------------------------------------- commands

cmd_up() {
  cmd_install
  mkdir -p "$STATE"
  up_mariadb
  up_redis
  up_cluster
  up_kafka
  local urls=() p
  for p in "${CLUSTER_PORTS[@]}"; do urls+=("redis://127.0.0.1:$p"); done
  cat <<EOF

binval services are up (state and logs in $STATE):
  MariaDB (root, no password) mysql://root@127.0.0.1:$MARIADB_PORT
  MariaDB (binlog reader)     mysql://binval:binval@127.0.0.1:$MARIADB_PORT
  MariaDB (application)       mysql://app:app@127.0.0.1:$MARIADB_PORT/shop
  Redis                       redis://127.0.0.1:$REDIS_PORT
  Redis Cluster               ${urls[*]}
  Kafka bootstrap (tansu)     127.0.0.1:$KAFKA_PORT
Stop them with: $0 down
EOF
}

cmd_down() {
  local p
  # `running` checks the command name, so `env` has exec'd into tansu.
  stop_pidfile "$STATE/kafka/tansu.pid" tansu tansu
  for p in "${CLUSTER_PORTS[@]}"; do
    stop_pidfile "$STATE/cluster-$p/redis.pid" redis-server "Redis Cluster node $p"
  done
  stop_pidfile "$STATE/redis/redis.pid" redis-server Redis
  stop_pidfile "$MARIADB_DIR/mariadbd.pid" mariadbd MariaDB
}

status_line() { # name port pidfile comm
  local st=down pid=""
  if running "$3" "$4"; then
    pid="$(cat "$3")"
    if port_open "$2"; then st=up; else st="starting (pid $pid, port closed)"; fi
  elif port_open "$2"; then
    st="down (port in use by another process)"
  fi
  printf '%-22s 127.0.0.1:%-6s %s%s\n' "$1" "$2" "$st" "${pid:+ (pid $pid)}"
}

cmd_status() {
  local p
  status_line MariaDB "$MARIADB_PORT" "$MARIADB_DIR/mariadbd.pid" mariadbd
  status_line Redis "$REDIS_PORT" "$STATE/redis/redis.pid" redis-server
  for p in "${CLUSTER_PORTS[@]}"; do
    status_line "Redis Cluster node" "$p" "$STATE/cluster-$p/redis.pid" redis-server
  done
  if running "$STATE/cluster-${CLUSTER_PORTS[0]}/redis.pid" redis-server; then
    printf '%-22s %s\n' "Redis Cluster state" "$(cluster_field "${CLUSTER_PORTS[0]}" cluster_state)"
  fi
  status_line "Kafka (tansu)" "$KAFKA_PORT" "$STATE/kafka/tansu.pid" tansu
}

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 install|up|down|status" >&2
    exit 2
    ;;
esac
