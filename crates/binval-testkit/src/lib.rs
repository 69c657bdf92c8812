//! Real backing services for binval's integration tests.
//!
//! Tests of the service (`binval`) and of `binval-consumer` need a real
//! MariaDB with a row-based binlog, a standalone Redis, a 3-master Redis
//! Cluster (and, for reads from replica nodes, a [`ReplicatedCluster`] whose
//! masters have replica nodes) and a Kafka-compatible broker (tansu). This crate starts them as
//! plain child processes on free loopback ports; no Docker is involved.
//!
//! # Why shared, lazily started instances
//!
//! Starting a MariaDB costs a few hundred milliseconds, a Redis Cluster about
//! a second, so every accessor ([`mariadb()`], [`redis()`], [`redis_cluster()`],
//! [`broker()`]) returns a process-wide singleton (a `std::sync::OnceLock`)
//! that is started by the first test that asks for it and then shared by all
//! tests of that test binary. Tests isolate themselves by naming: use
//! [`unique_name`] for database names, topics and key prefixes. A test that
//! needs to kill and restart a broker uses its own [`OwnedBroker`].
//!
//! If a service fails to start, the failure is remembered and every later
//! caller panics with the same message at once instead of waiting for the
//! start-up timeout again.
//!
//! # Why a keeper thread
//!
//! Statics are never dropped, so nothing in Rust would ever stop the
//! servers. Every long-running child is therefore spawned with
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills the child when its
//! parent dies — even when the test process is killed with `SIGKILL`.
//! The catch: "parent" means the *thread* that forked, not the process, and
//! `cargo test` runs each test in its own short-lived thread. So all spawns
//! are sent over a channel to one dedicated keeper thread that lives as long
//! as the process. On a normal exit an `atexit` hook also kills and reaps the
//! children and removes this process's state folder (set
//! `BINVAL_TESTKIT_KEEP=1` to keep it for post-mortems).
//!
//! # State folders and logs
//!
//! Everything lives under `$TMPDIR/binval-testkit/<pid>/`; on start, sibling
//! folders whose pid is no longer alive are removed (leftovers of crashed
//! runs). Child stdout/stderr go to log files in the service's folder, never
//! to the test's output; start-up errors include the tail of those logs.
//!
//! # Why a template datadir
//!
//! `mariadb-install-db` plus creating the `binval` user takes a second or
//! two. It is done once per machine and MariaDB version into
//! `$TMPDIR/binval-testkit-template-<version>-v<N>` (built in a temporary
//! folder, then renamed into place atomically, so concurrent test processes
//! never see half a template) and copied for each new instance.
//!
//! # Notes for test authors
//!
//! * [`MariaDb::sql`] prints no column names (`--batch --skip-column-names`):
//!   `"SELECT 1, 2"` returns `"1\t2\n"`.
//! * tansu keeps topics in memory and does not auto-create them: call
//!   [`Broker::create_topic`] first. An [`OwnedBroker`] loses its topics on
//!   restart.
//! * Redis Cluster bus ports are `port + 10000`.
//!
//! # TLS and authentication
//!
//! `tls.rs` (issue #13): a test PKI made with rcgen ([`test_certs`]), MariaDB with TLS and
//! `require_secure_transport=ON` ([`mariadb_tls`]), Redis and a Redis Cluster on TLS ports only
//! ([`redis_tls`], [`redis_tls_cluster`]), a broker behind a TLS front and/or with SASL
//! ([`SecureBroker`]).
//!
//! # Process figures
//!
//! [`procfs`]: a process's peak RSS and CPU time from `/proc/<pid>`, one parser for the tests
//! (`tests/operate.rs`, `tests/huge_transaction.rs`, `tests/adopt_bench.rs`) and the load
//! benchmark, so their figures of the same process are the same number.
//!
//! # Binaries
//!
//! `mariadbd`, `mariadb-install-db`, `mariadb` (client), `redis-server`,
//! `redis-cli` and `tansu` must be installed; `scripts/services.sh install`
//! installs whatever is missing. Overrides: `BINVAL_MARIADBD`, `BINVAL_TANSU`.

mod broker;
pub mod forward;
mod mariadb;
mod proc;
pub mod procfs;
mod redis;
mod redis_replicated;
mod slots;
mod tls;
mod util;

pub use broker::{broker, Broker, OwnedBroker};
pub use mariadb::{mariadb, MariaDb};
pub use redis::{redis, redis_cluster, OwnedCluster, OwnedRedis, Redis, RedisCluster};
pub use redis_replicated::ReplicatedCluster;
pub use slots::SlotOwners;
pub use tls::{
    mariadb_tls, redis_tls, redis_tls_cluster, sql_via_socket, test_certs, BrokerSecurity, SecureBroker, TestCerts, TlsRedis,
    REDIS_ADMIN_PASSWORD,
};
pub use util::{free_port, unique_name};

/// The per-process folder holding every instance's state and logs:
/// `$TMPDIR/binval-testkit/<pid>`.
pub fn state_root() -> &'static std::path::Path {
    proc::state_root()
}
