//! MariaDB with a row-based binlog, started from a cached template datadir.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::proc::{new_state_dir, Proc};
use crate::util::{connect, copy_dir, require_binary, tail, unique_name, unwrap_started};

/// Bump when the template's content (users, grants, install options) changes.
const TEMPLATE_FORMAT: u32 = 1;
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Same value for install and every start, so InnoDB never resizes its log.
const INNODB_LOG_FILE_SIZE: &str = "--innodb-log-file-size=8M";

const SETUP_SQL: &str = "\
CREATE USER 'binval'@'%' IDENTIFIED BY 'binval';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR, SELECT, RELOAD ON *.* TO 'binval'@'%';
";

/// A MariaDB server (binlog on, `ROW` format, `FULL` row image and row
/// metadata, `server_id=1`, `gtid_strict_mode=OFF`, utf8mb4) listening on
/// `127.0.0.1:port`.
///
/// Users: `root` with an empty password (from `127.0.0.1` and `localhost`)
/// and `binval`/`binval` with `REPLICATION SLAVE, REPLICATION CLIENT,
/// BINLOG MONITOR, SELECT, RELOAD` on `*.*`.
pub struct MariaDb {
    pub port: u16,
    pub datadir: PathBuf,
    socket: PathBuf,
    client: PathBuf,
    /// How to start it again on the same port and datadir ([`MariaDb::stop`]/[`MariaDb::start_again`]).
    server: PathBuf,
    args: Vec<std::ffi::OsString>,
    dir: PathBuf,
    error_log: PathBuf,
    _proc: Mutex<Proc>,
}

/// The shared MariaDB of this test process, started on first use.
///
/// Panics (with the reason and the error log tail) if it cannot be started,
/// e.g. when `mariadbd` is not installed.
pub fn mariadb() -> &'static MariaDb {
    static M: OnceLock<Result<MariaDb, String>> = OnceLock::new();
    unwrap_started("MariaDB", M.get_or_init(|| MariaDb::start().map_err(|e| format!("{e:#}"))))
}

struct Binaries {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

fn binaries() -> anyhow::Result<Binaries> {
    Ok(Binaries {
        server: require_binary("MariaDB server", Some("BINVAL_MARIADBD"), &["mariadbd", "mysqld"], &[])?,
        install_db: require_binary("MariaDB initialisation", None, &["mariadb-install-db", "mysql_install_db"], &[])?,
        client: require_binary("MariaDB client", None, &["mariadb", "mysql"], &[])?,
    })
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

impl MariaDb {
    /// `mysql://root@127.0.0.1:PORT` (root, empty password, over TCP).
    pub fn root_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// `mysql://binval:binval@127.0.0.1:PORT`: the binlog reader's user.
    pub fn repl_url(&self) -> String {
        format!("mysql://binval:binval@127.0.0.1:{}", self.port)
    }

    /// The server's unix socket (root may also connect through it).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Run SQL (one or more `;`-separated statements, sent on stdin) through
    /// the `mariadb` CLI as root over TCP, in batch mode *without column
    /// names* (`--batch --skip-column-names`): rows are lines, columns are
    /// tab-separated, NULL prints as `NULL`. Returns stdout; stops at the
    /// first failing statement and returns an error with the CLI's stderr.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        run_client(&self.client, &["-uroot", "-h127.0.0.1", &format!("-P{}", self.port), "--protocol=TCP"], sql)
    }

    /// Create a database with a [`unique_name`] built from `prefix`; returns
    /// its name.
    pub fn create_database(&self, prefix: &str) -> anyhow::Result<String> {
        let name = unique_name(prefix);
        self.sql(&format!("CREATE DATABASE `{name}`"))?;
        Ok(name)
    }

    /// Start a separate MariaDB owned by the caller (stopped when dropped), with `extra_args`
    /// appended to the standard ones (a later `--option=value` wins), e.g.
    /// `&["--binlog-format=STATEMENT"]` to test what binval says about wrong settings.
    pub fn start_with(extra_args: &[&str]) -> anyhow::Result<MariaDb> {
        Self::start_args(extra_args)
    }

    /// Stop the server (SIGTERM: a clean shutdown, up to 30 s, then SIGKILL). Use only on an
    /// instance of your own ([`MariaDb::start_with`]), never on the shared one.
    pub fn stop(&self) {
        self._proc.lock().unwrap().terminate(Duration::from_secs(30));
    }

    /// Make this server (one of your own, [`MariaDb::start_with`] with its own `--server-id`) a
    /// GTID replica of `primary`: it starts at `primary`'s current GTID position
    /// (`gtid_slave_pos`), so only what `primary` writes from now on is replicated
    /// (`CHANGE MASTER TO ... MASTER_USE_GTID = slave_pos`, MariaDB docs "Global Transaction
    /// ID"). Start both with `--log-slave-updates=ON` for a replica that can be promoted.
    pub fn replicate_from(&self, primary: &MariaDb) -> anyhow::Result<()> {
        let pos = primary.sql("SELECT @@gtid_binlog_pos")?.trim().to_string();
        self.sql(&format!(
            "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL gtid_slave_pos = '{pos}';
             CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root', MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
             START SLAVE;",
            primary.port
        ))?;
        Ok(())
    }

    /// Wait (up to 30 s) until this replica has applied everything `primary` has written
    /// (`gtid_slave_pos` reached `primary`'s `gtid_binlog_pos`).
    pub fn wait_caught_up(&self, primary: &MariaDb) -> anyhow::Result<()> {
        let want = primary.sql("SELECT @@gtid_binlog_pos")?.trim().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let have = self.sql("SELECT @@gtid_slave_pos")?.trim().to_string();
            if have == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                let status = self.sql("SHOW SLAVE STATUS\\G").unwrap_or_default();
                bail!("replica at GTID {have:?}, primary at {want:?} after 30 s\n{status}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Promote this replica: stop replicating and forget the primary (`STOP SLAVE; RESET SLAVE
    /// ALL`); it then takes writes and keeps the domain's GTID numbering.
    pub fn promote(&self) -> anyhow::Result<()> {
        self.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF")?;
        Ok(())
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) the server process: connections stay open but
    /// nothing answers — a half-open connection as a hung host or a network black hole makes.
    pub fn freeze(&self, frozen: bool) {
        self._proc.lock().unwrap().signal(if frozen { libc::SIGSTOP } else { libc::SIGCONT });
    }

    /// Start it again after [`stop`](Self::stop), same port, datadir and options; waits until
    /// it accepts connections.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.server);
        cmd.args(&self.args).current_dir(&self.dir);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut proc = Proc::spawn(cmd, &self.dir.join("mariadbd.out"))?;
            match wait_handshake(&mut proc, self.port, &self.error_log) {
                Ok(()) => {
                    *self._proc.lock().unwrap() = proc;
                    return Ok(());
                }
                // The port can linger for a moment after the old process exited.
                Err(e) if Instant::now() < deadline => {
                    proc.kill();
                    let _ = e;
                    thread::sleep(Duration::from_millis(300));
                    cmd = Command::new(&self.server);
                    cmd.args(&self.args).current_dir(&self.dir);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn start() -> anyhow::Result<MariaDb> {
        Self::start_args(&[])
    }

    fn start_args(extra_args: &[&str]) -> anyhow::Result<MariaDb> {
        let bins = binaries()?;
        let template = template(&bins)?;
        let dir = new_state_dir("mariadb")?;
        let datadir = dir.join("data");
        copy_dir(template, &datadir).with_context(|| format!("copying template {} to {}", template.display(), datadir.display()))?;
        let socket = socket_path(&dir);
        let error_log = dir.join("error.log");
        // Its own tmpdir: the server's internal temporary tables (information_schema
        // queries, sorts) live there, and a shared /tmp is cleaned by others — a deleted
        // `#sql-temptable-*.MAI` fails the next query on any connection, the binlog dump
        // included ("Error on delete of ...", seen in CI).
        let tmpdir = dir.join("tmp");
        std::fs::create_dir_all(&tmpdir).with_context(|| format!("creating {}", tmpdir.display()))?;
        let mut last_err = None;
        for _attempt in 0..3 {
            let port = crate::util::free_port()?;
            let mut cmd = Command::new(&bins.server);
            cmd.arg("--no-defaults");
            if is_root() {
                cmd.arg("--user=root");
            }
            cmd.arg(format!("--datadir={}", datadir.display()))
                .arg(format!("--port={port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
                .arg(format!("--log-error={}", error_log.display()))
                .arg(format!("--tmpdir={}", tmpdir.display()))
                .arg("--log-bin=mysql-bin")
                .arg("--binlog-format=ROW")
                .arg("--binlog-row-image=FULL")
                .arg("--binlog-row-metadata=FULL")
                .arg("--server-id=1")
                .arg("--gtid-strict-mode=OFF")
                .arg("--skip-name-resolve")
                .arg("--character-set-server=utf8mb4")
                .arg("--collation-server=utf8mb4_general_ci")
                .arg("--max-connections=1000")
                .arg(INNODB_LOG_FILE_SIZE)
                .arg("--innodb-buffer-pool-size=128M")
                .arg("--innodb-flush-log-at-trx-commit=2")
                .arg("--sync-binlog=0")
                .args(extra_args)
                .current_dir(&dir);
            let args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
            let mut proc = Proc::spawn(cmd, &dir.join("mariadbd.out"))?;
            match wait_handshake(&mut proc, port, &error_log) {
                Ok(()) => {
                    let db = MariaDb {
                        port,
                        datadir: datadir.clone(),
                        socket: socket.clone(),
                        client: bins.client.clone(),
                        server: bins.server.clone(),
                        args,
                        dir: dir.clone(),
                        error_log: error_log.clone(),
                        _proc: Mutex::new(proc),
                    };
                    db.sql("SELECT 1").context("MariaDB is up but root cannot run SQL over TCP")?;
                    return Ok(db);
                }
                Err(e) => {
                    proc.kill();
                    let log = std::fs::read_to_string(&error_log).unwrap_or_default();
                    let port_clash = log.contains("Address already in use") || log.contains("Do you already have another");
                    last_err = Some(e);
                    if !port_clash {
                        break;
                    }
                    let _ = std::fs::remove_file(&socket);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("MariaDB did not start")))
    }
}

fn socket_path(dir: &Path) -> PathBuf {
    let p = dir.join("mariadbd.sock");
    if p.as_os_str().len() < 100 {
        p
    } else {
        // sun_path is 108 bytes; fall back to a short name.
        PathBuf::from(format!("/tmp/btk-{}-{}.sock", std::process::id(), unique_name("s")))
    }
}

/// Wait until the server sends its protocol-10 handshake on TCP.
fn wait_handshake(proc: &mut Proc, port: u16, error_log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(st) = proc.try_wait() {
            bail!("mariadbd exited during start-up ({st})\n{}", tail(error_log, 30));
        }
        if let Ok(mut s) = connect(port, Duration::from_millis(500)) {
            let mut buf = [0u8; 5];
            if s.read_exact(&mut buf).is_ok() && buf[4] == 10 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "MariaDB did not accept TCP connections on 127.0.0.1:{port} within {}s\n{}",
                START_TIMEOUT.as_secs(),
                tail(error_log, 30)
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Run `sql` through the CLI with the given connection args.
fn run_client(client: &Path, conn: &[&str], sql: &str) -> anyhow::Result<String> {
    let mut child = Command::new(client)
        .arg("--no-defaults")
        .args(conn)
        .args(["--batch", "--skip-column-names", "--default-character-set=utf8mb4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", client.display()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let sql_owned = sql.to_owned();
    // Write from another thread so a large result cannot deadlock us.
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(sql_owned.as_bytes());
        let _ = stdin.write_all(b"\n");
    });
    let out = child.wait_with_output()?;
    let _ = writer.join();
    if !out.status.success() {
        bail!("mariadb CLI failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The initialised template datadir, built once per machine and version.
fn template(bins: &Binaries) -> anyhow::Result<&'static Path> {
    static T: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match T.get_or_init(|| build_template(bins).map_err(|e| format!("{e:#}"))) {
        Ok(p) => Ok(p),
        Err(e) => Err(anyhow!("{e}")),
    }
}

fn server_version(server: &Path) -> anyhow::Result<String> {
    let out = Command::new(server).arg("--version").output().with_context(|| format!("running {} --version", server.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ver = text.split_whitespace().skip_while(|w| *w != "Ver").nth(1).ok_or_else(|| anyhow!("cannot parse version from {text:?}"))?;
    Ok(ver.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect())
}

fn build_template(bins: &Binaries) -> anyhow::Result<PathBuf> {
    let version = server_version(&bins.server)?;
    let tmp_root = std::env::temp_dir();
    let target = tmp_root.join(format!("binval-testkit-template-{version}-v{TEMPLATE_FORMAT}"));
    if target.join("mysql").is_dir() {
        return Ok(target);
    }
    let building = tmp_root.join(format!(".binval-testkit-template-{version}-v{TEMPLATE_FORMAT}.tmp-{}", unique_name("b")));
    let result = build_template_into(bins, &building);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&building);
        return Err(e);
    }
    match std::fs::rename(&building, &target) {
        Ok(()) => Ok(target),
        // Another process won the race: use its template.
        Err(_) if target.join("mysql").is_dir() => {
            let _ = std::fs::remove_dir_all(&building);
            Ok(target)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&building);
            Err(e).with_context(|| format!("renaming template into {}", target.display()))
        }
    }
}

fn build_template_into(bins: &Binaries, datadir: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(datadir);
    let work = new_state_dir("mariadb-template")?;
    let mut cmd = Command::new(&bins.install_db);
    cmd.arg("--no-defaults");
    if is_root() {
        cmd.arg("--user=root");
    }
    // normal: root gets an ordinary (empty) password instead of unix_socket
    // auth, so `mysql://root@127.0.0.1` works over TCP.
    let out = cmd
        .arg(format!("--datadir={}", datadir.display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg(INNODB_LOG_FILE_SIZE)
        .current_dir(&work)
        .output()
        .with_context(|| format!("running {}", bins.install_db.display()))?;
    std::fs::write(work.join("install-db.log"), [&out.stdout[..], &out.stderr[..]].concat())?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}\n{}",
            bins.install_db.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Start it once without networking and binlog to create the users.
    let socket = socket_path(&work);
    let error_log = work.join("error.log");
    let mut cmd = Command::new(&bins.server);
    cmd.arg("--no-defaults");
    if is_root() {
        cmd.arg("--user=root");
    }
    cmd.arg(format!("--datadir={}", datadir.display()))
        .arg("--skip-networking")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", work.join("mariadbd.pid").display()))
        .arg(format!("--log-error={}", error_log.display()))
        .arg("--skip-log-bin")
        .arg(INNODB_LOG_FILE_SIZE)
        .arg("--innodb-buffer-pool-size=32M")
        .current_dir(&work);
    let mut proc = Proc::spawn(cmd, &work.join("mariadbd.out"))?;
    let sock_arg = format!("--socket={}", socket.display());
    let conn = ["-uroot", sock_arg.as_str()];
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(st) = proc.try_wait() {
            bail!("template mariadbd exited during start-up ({st})\n{}", tail(&error_log, 30));
        }
        if socket.exists() && run_client(&bins.client, &conn, "SELECT 1").is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("template mariadbd did not come up within 60s\n{}", tail(&error_log, 30));
        }
        thread::sleep(Duration::from_millis(50));
    }
    run_client(&bins.client, &conn, SETUP_SQL).context("creating the binval user in the template")?;
    // root@<hostname> would be ignored with a warning under skip-name-resolve
    // (and the hostname differs between machines): drop it.
    let drops = run_client(
        &bins.client,
        &conn,
        "SELECT CONCAT('DROP USER ', QUOTE(User), '@', QUOTE(Host), ';') FROM mysql.user \
         WHERE User = 'root' AND Host NOT IN ('localhost', '127.0.0.1', '::1')",
    )?;
    if !drops.trim().is_empty() {
        run_client(&bins.client, &conn, &drops)?;
    }
    proc.terminate(Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
