//! Services over TLS and with authentication, for the tests of issue #13: certificates made by
//! the tests (rcgen), MariaDB with `--ssl-cert`/`--ssl-key` and `require_secure_transport=ON`,
//! standalone Redis and a 3-master Redis Cluster with `--tls-port` and `--port 0` (plaintext
//! off), and a Kafka broker behind a TLS front (tansu 0.6 takes `--cert`/`--key` but serves
//! plaintext: its TLS acceptor is never used) and with SASL (`tansu broker --authentication`).
//!
//! The certificates: one CA, a server certificate for `localhost` and `127.0.0.1` (so Cluster
//! nodes, which announce `127.0.0.1`, verify by name), a client certificate of the same CA, and
//! a second, unrelated CA for wrong-CA tests. All PEM, in this process's state folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::mariadb::MariaDb;
use crate::proc::{new_state_dir, Proc};
use crate::util::{free_cluster_port, free_port, require_binary, tail, unwrap_started};

/// Password of Redis's `default` user on the TLS servers (tests use their own ACL users).
pub const REDIS_ADMIN_PASSWORD: &str = "testkit-admin";

/// PEM files of the test PKI.
pub struct TestCerts {
    /// The CA certificate the servers' and the client's certificates are signed by.
    pub ca: PathBuf,
    /// Server certificate (`localhost`, `127.0.0.1`) and its key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Client certificate (CN `binval-test-client`) and its key.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here (a wrong `ca_file`).
    pub other_ca: PathBuf,
}

/// The test PKI of this process, made on first use.
pub fn test_certs() -> &'static TestCerts {
    static C: OnceLock<Result<TestCerts, String>> = OnceLock::new();
    unwrap_started("the test certificates", C.get_or_init(|| make_certs().map_err(|e| format!("{e:#}"))))
}

fn make_certs() -> anyhow::Result<TestCerts> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let dir = new_state_dir("tls")?;
    let write = |name: &str, text: String| -> anyhow::Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    };
    let ca = |cn: &str| -> anyhow::Result<(CertificateParams, KeyPair, String)> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let pem = p.self_signed(&key)?.pem();
        Ok((p, key, pem))
    };
    let (ca_params, ca_key, ca_pem) = ca("binval test CA")?;
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| -> anyhow::Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(names)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = usages;
        Ok((p.signed_by(&key, &issuer)?.pem(), key.serialize_pem()))
    };
    // Redis Cluster nodes present their server certificate as client certificate on the TLS
    // cluster bus: the server certificate serves both purposes.
    let both = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let (server_pem, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()], "localhost", both)?;
    let (client_pem, client_key) =
        leaf(vec!["binval-test-client".into()], "binval-test-client", vec![ExtendedKeyUsagePurpose::ClientAuth])?;
    let (_, _, other_pem) = ca("some other CA")?;
    Ok(TestCerts {
        ca: write("ca.pem", ca_pem)?,
        server_cert: write("server.pem", server_pem)?,
        server_key: write("server.key", server_key)?,
        client_cert: write("client.pem", client_pem)?,
        client_key: write("client.key", client_key)?,
        other_ca: write("other-ca.pem", other_pem)?,
    })
}

// ------------------------------------------------------------------ MariaDB

/// The shared MariaDB over TLS of this test process: `--ssl-cert`, `--ssl-key`, `--ssl-ca`,
/// then `require_secure_transport=ON` (TCP without TLS is refused; the Unix socket, which
/// [`sql_via_socket`] uses, counts as secure).
pub fn mariadb_tls() -> &'static MariaDb {
    static M: OnceLock<Result<MariaDb, String>> = OnceLock::new();
    unwrap_started("MariaDB over TLS", M.get_or_init(|| start_mariadb_tls().map_err(|e| format!("{e:#}"))))
}

fn start_mariadb_tls() -> anyhow::Result<MariaDb> {
    let c = test_certs();
    let args = [
        format!("--ssl-cert={}", c.server_cert.display()),
        format!("--ssl-key={}", c.server_key.display()),
        format!("--ssl-ca={}", c.ca.display()),
    ];
    let db = MariaDb::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    // Switched on after start: the testkit checks a new server with plaintext SQL over TCP.
    db.sql("SET GLOBAL require_secure_transport = ON").context("SET GLOBAL require_secure_transport = ON")?;
    Ok(db)
}

/// Run SQL as root through the server's Unix socket (no TLS needed there), like
/// [`MariaDb::sql`]: rows as lines, tab-separated, no column names.
pub fn sql_via_socket(db: &MariaDb, sql: &str) -> anyhow::Result<String> {
    let client = require_binary("MariaDB client", None, &["mariadb", "mysql"], &[])?;
    let out = Command::new(&client)
        .args(["--no-defaults", "-uroot"])
        .arg(format!("--socket={}", db.socket().display()))
        .args(["--batch", "--skip-column-names", "-e", sql])
        .output()
        .with_context(|| format!("running {}", client.display()))?;
    if !out.status.success() {
        bail!("mariadb CLI failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ------------------------------------------------------------------ Redis

/// Redis over TLS only (`--port 0`): one standalone server or the 3 masters of a Cluster
/// (`--tls-cluster yes`: the bus is TLS too, and nodes announce their TLS port). Client
/// certificates are optional (`--tls-auth-clients optional`). The `default` user has the
/// password [`REDIS_ADMIN_PASSWORD`]; tests add ACL users with [`TlsRedis::acl_setuser`].
pub struct TlsRedis {
    pub ports: Vec<u16>,
    _procs: Mutex<Vec<Proc>>,
}

impl TlsRedis {
    /// `rediss://127.0.0.1:PORT` of each node.
    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("rediss://127.0.0.1:{p}")).collect()
    }

    /// `redis-cli` over TLS as the `default` user against node `i`; stdout.
    pub fn cli(&self, i: usize, args: &[&str]) -> anyhow::Result<String> {
        redis_cli(self.ports[i], args)
    }

    /// `ACL SETUSER <rule...>` on every node (ACLs are per node), e.g.
    /// `&["app", "on", ">pw", "resetkeys", "%R~item:*", "-@all", "+get"]`.
    pub fn acl_setuser(&self, rule: &[&str]) -> anyhow::Result<()> {
        for i in 0..self.ports.len() {
            let mut args = vec!["ACL", "SETUSER"];
            args.extend_from_slice(rule);
            let out = self.cli(i, &args)?;
            if out.trim() != "OK" {
                bail!("ACL SETUSER {rule:?} on node {i}: {out}");
            }
        }
        Ok(())
    }
}

/// The shared standalone Redis over TLS of this test process.
pub fn redis_tls() -> &'static TlsRedis {
    static R: OnceLock<Result<TlsRedis, String>> = OnceLock::new();
    unwrap_started("Redis over TLS", R.get_or_init(|| start_tls_redis(false).map_err(|e| format!("{e:#}"))))
}

/// The shared 3-master Redis Cluster over TLS of this test process.
pub fn redis_tls_cluster() -> &'static TlsRedis {
    static R: OnceLock<Result<TlsRedis, String>> = OnceLock::new();
    unwrap_started("Redis Cluster over TLS", R.get_or_init(|| start_tls_redis(true).map_err(|e| format!("{e:#}"))))
}

fn redis_cli(port: u16, args: &[&str]) -> anyhow::Result<String> {
    let c = test_certs();
    let cli = require_binary("Redis client", Some("BINVAL_REDIS_CLI"), &["redis-cli"], &[])?;
    let mut cmd = Command::new(&cli);
    cmd.args(["--tls", "--cacert"])
        .arg(&c.ca)
        .arg("--cert")
        .arg(&c.client_cert)
        .arg("--key")
        .arg(&c.client_key)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-a", REDIS_ADMIN_PASSWORD, "--no-auth-warning"])
        .args(args);
    let out = output_within(cmd, Duration::from_secs(30)).with_context(|| format!("running {} {args:?}", cli.display()))?;
    if !out.status.success() {
        bail!("redis-cli {args:?} on port {port} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run `cmd` to its end, killing it after `limit` (an error then).
fn output_within(mut cmd: Command, limit: Duration) -> anyhow::Result<std::process::Output> {
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!("no end within {limit:?}; output: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

fn start_tls_redis(cluster: bool) -> anyhow::Result<TlsRedis> {
    let bin = require_binary("Redis server", Some("BINVAL_REDIS_SERVER"), &["redis-server"], &[])?;
    let c = test_certs();
    let (mut ports, mut procs) = (Vec::new(), Vec::new());
    for i in 0..if cluster { 3 } else { 1 } {
        let dir = new_state_dir(&format!("redis-tls-{i}"))?;
        let mut taken = ports.clone();
        taken.extend(ports.iter().map(|p| p + 10000));
        let port = if cluster { free_cluster_port(&taken)? } else { free_port()? };
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--tls-cert-file")
            .arg(&c.server_cert)
            .arg("--tls-key-file")
            .arg(&c.server_key)
            .arg("--tls-ca-cert-file")
            .arg(&c.ca)
            .args(["--tls-auth-clients", "optional", "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", ""])
            .args(["--user", "default", "on", &format!(">{REDIS_ADMIN_PASSWORD}"), "~*", "&*", "+@all"])
            .arg("--dir")
            .arg(&dir)
            .current_dir(&dir);
        if cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
                "--tls-cluster",
                "yes",
            ]);
        }
        let log = dir.join("redis.log");
        let mut proc = Proc::spawn(cmd, &log)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(redis_cli(port, &["PING"]).as_deref().map(str::trim), Ok("PONG")) {
            if let Some(st) = proc.try_wait() {
                bail!("redis-server (TLS) on port {port} exited during start-up ({st})\n{}", tail(&log, 20));
            }
            if Instant::now() > deadline {
                bail!("redis-server (TLS) did not answer PING on {port}\n{}", tail(&log, 20));
            }
            thread::sleep(Duration::from_millis(50));
        }
        ports.push(port);
        procs.push(proc);
    }
    if cluster {
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        redis_cli(ports[0], &args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = ports.iter().all(|p| {
                redis_cli(*p, &["CLUSTER", "INFO"]).is_ok_and(|i| i.contains("cluster_state:ok") && i.contains("cluster_known_nodes:3"))
            });
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("Redis Cluster over TLS {ports:?} not ready within 30 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(TlsRedis { ports, _procs: Mutex::new(procs) })
}

// ------------------------------------------------------------------ Kafka

/// How a [`SecureBroker`] is reached.
#[derive(Debug, Clone, Copy, Default)]
pub struct BrokerSecurity {
    /// A TLS front (rustls, the test server certificate) that clients connect to; the broker
    /// advertises the front's address.
    pub tls: bool,
    /// The front requires a client certificate of the test CA.
    pub client_auth: bool,
    /// SASL required (`tansu broker --authentication`). tansu 0.6 offers SCRAM-SHA-256/512 and
    /// OAUTHBEARER (not PLAIN) and checks SCRAM against users in its storage, but its `tansu
    /// user create` must itself authenticate once authentication is on, and the storage is in
    /// memory: no user can exist, so every SASL exchange is refused (what the tests use).
    pub sasl: bool,
}

/// A tansu broker of the caller's own behind [`BrokerSecurity`]. Dropping it stops tansu (the
/// TLS front's thread stays, idle, until the process ends).
pub struct SecureBroker {
    /// The port clients connect to (the TLS front, or tansu itself without TLS).
    pub port: u16,
    /// tansu's own port (plaintext).
    pub broker_port: u16,
    bin: PathBuf,
    dir: PathBuf,
    _proc: Proc,
}

impl SecureBroker {
    /// Start one.
    pub fn start(security: BrokerSecurity) -> anyhow::Result<SecureBroker> {
        let bin = crate::broker::tansu_bin()?;
        let dir = new_state_dir("secure-broker")?;
        let broker_port = free_port()?;
        let port = if security.tls { tls_front(broker_port, security.client_auth)? } else { broker_port };
        let cwd = dir.join("cwd");
        std::fs::create_dir_all(&cwd)?;
        let mut cmd = Command::new(&bin);
        cmd.arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{broker_port}")])
            .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args(["--storage-engine", "memory://tansu/", "--silent"])
            .current_dir(&cwd);
        if security.sasl {
            cmd.arg("--authentication");
        }
        for v in crate::broker::TANSU_ENV {
            cmd.env_remove(v);
        }
        cmd.env("RUST_LOG", std::env::var("BINVAL_TANSU_LOG").unwrap_or_else(|_| "warn".to_string()));
        let log = dir.join("tansu.log");
        let mut proc = Proc::spawn(cmd, &log)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !crate::broker::api_versions_ok(broker_port) {
            if let Some(st) = proc.try_wait() {
                bail!("tansu (secure) exited during start-up ({st})\n{}", tail(&log, 20));
            }
            if Instant::now() > deadline {
                bail!("tansu (secure) did not answer on {broker_port}\n{}", tail(&log, 20));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(SecureBroker { port, broker_port, bin, dir, _proc: proc })
    }

    /// `127.0.0.1:PORT` of the port clients use.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `tansu topic create` against tansu's own port (only without SASL: the tool does not
    /// authenticate).
    pub fn create_topic(&self, name: &str, partitions: u32) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["topic", "create", "--broker", &format!("tcp://127.0.0.1:{}", self.broker_port)])
            .args(["--partitions", &partitions.to_string()])
            .arg(name)
            .current_dir(self.dir.join("cwd"));
        for v in crate::broker::TANSU_ENV {
            cmd.env_remove(v);
        }
        let out = cmd.output()?;
        if !out.status.success() {
            bail!("tansu topic create {name}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

/// A TLS-terminating front on a free port forwarding every connection to `127.0.0.1:to`;
/// returns the port. Runs on its own thread with a current-thread tokio runtime.
fn tls_front(to: u16, client_auth: bool) -> anyhow::Result<u16> {
    let c = test_certs();
    let config = server_config(&c.server_cert, &c.server_key, client_auth.then_some(c.ca.as_path()))?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    thread::Builder::new().name(format!("tls-front-{port}")).spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tls front runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tls front listener");
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Ok(mut back) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut back).await;
                });
            }
        });
    })?;
    Ok(port)
}

fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let builder = rustls::ServerConfig::builder();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)? {
                roots.add(c?)?;
            }
            builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().map_err(|e| anyhow!("{e}"))?,
            )
        }
        None => builder.with_no_client_auth(),
    };
    Ok(builder.with_single_cert(certs, key)?)
}
