use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

pub(crate) const INSTALL_HINT: &str = "install it with `scripts/services.sh install` (from the repository root)";

/// A name unique in this machine run, for database names, topics and key
/// prefixes: `<prefix>_<pid>_<counter><4 random letters>`, only `[a-z0-9_]`
/// (other characters of `prefix` become `_`, upper case is lowered).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut p: String = prefix
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if p.is_empty() {
        p.push('t');
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    let mut r = h.finish();
    let mut rand = String::with_capacity(4);
    for _ in 0..4 {
        rand.push((b'a' + (r % 26) as u8) as char);
        r /= 26;
    }
    format!("{p}_{}_{n}{rand}", std::process::id())
}

/// The kernel's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`, Linux's
/// default 32768-60999), from which it picks the local port of every outgoing connection and
/// of every `bind(port 0)`.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// Ports handed out by this process, so two services of one test run never get the same one.
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A random loopback port in `lo..hi` (outside the kernel's ephemeral range where one is
/// left) that is free now, with `p + extra` free too when `extra` is given, and that this
/// process has not handed out before.
///
/// Why not `bind(port 0)`: a port from the ephemeral range can be taken, while a service is
/// stopped for a restart test, as the *local* port of any outgoing connection of the test
/// process (a Redis or Kafka client reconnecting), and the restarted server then fails with
/// `EADDRINUSE` for as long as that connection lives. Ports below the range are never used
/// that way.
fn pick_port(extra: Option<u16>, taken: &[u16]) -> io::Result<u16> {
    let (eph_lo, eph_hi) = ephemeral_range();
    let span = extra.unwrap_or(0);
    // Below the ephemeral range when it leaves room (it does by default: 10000..32768),
    // otherwise above it, otherwise anywhere (then bind(0) semantics are the best we have).
    let (lo, hi) = if eph_lo >= 12000u16.saturating_add(span) {
        (10000u16, eph_lo - span)
    } else if u32::from(eph_hi) + 2000 + u32::from(span) < 65535 {
        (eph_hi + 1, 65535 - span)
    } else {
        (1024, 65535 - span)
    };
    let mut seed = RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let mut r = seed.finish();
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..2000 {
        r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let p = lo + ((r >> 33) % u64::from(hi - lo)) as u16;
        let pair = extra.map(|e| p + e);
        let clash = |q: u16| handed.contains(&q) || taken.contains(&q) || !port_free(q);
        if clash(p) || pair.is_some_and(clash) {
            continue;
        }
        handed.push(p);
        handed.extend(pair);
        return Ok(p);
    }
    Err(io::Error::other(format!("no free loopback port found in {lo}..{hi} after 2000 tries")))
}

/// A loopback port that is free now and outside the kernel's ephemeral range, so no outgoing
/// connection can take it while its service is stopped (see [`pick_port`]).
pub fn free_port() -> io::Result<u16> {
    pick_port(None, &[])
}

pub(crate) fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free port `p` with `p + 10000` (the Redis Cluster bus port) free too, both outside the
/// ephemeral range.
pub(crate) fn free_cluster_port(taken: &[u16]) -> io::Result<u16> {
    pick_port(Some(10000), taken)
}

pub(crate) fn connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

/// Send one inline command to a Redis on `port`, return the reply's
/// payload (simple string, bulk string or integer). `-ERR` becomes an error.
pub(crate) fn redis_cmd(port: u16, cmd: &str) -> io::Result<String> {
    let mut s = connect(port, Duration::from_secs(1))?;
    s.write_all(cmd.as_bytes())?;
    s.write_all(b"\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "redis closed the connection"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else { continue };
        let head = String::from_utf8_lossy(&buf[1..eol]).into_owned();
        match buf[0] {
            b'+' | b':' => return Ok(head),
            b'-' => return Err(io::Error::other(head)),
            b'$' => {
                let len: i64 = head.parse().map_err(|_| io::Error::other("bad bulk length"))?;
                if len < 0 {
                    return Ok(String::new());
                }
                let start = eol + 2;
                let end = start + len as usize;
                if buf.len() >= end {
                    return Ok(String::from_utf8_lossy(&buf[start..end]).into_owned());
                }
            }
            _ => return Err(io::Error::other("unexpected redis reply")),
        }
    }
}

/// Last `lines` lines of a log file, for error messages.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            format!("--- last lines of {} ---\n{}", path.display(), all[from..].join("\n"))
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// First existing executable among: `$env_var`, `name` (and `alt_names`) on
/// PATH, then `extra` absolute paths.
pub(crate) fn find_binary(env_var: Option<&str>, names: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    if let Some(var) = env_var {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(v));
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path) {
            let cand = dir.join(name);
            if is_executable(&cand) {
                return Some(cand);
            }
        }
        for dir in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/sbin"] {
            let cand = Path::new(dir).join(name);
            if is_executable(&cand) {
                return Some(cand);
            }
        }
    }
    extra.iter().find(|p| is_executable(p)).cloned()
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// Like `find_binary`, but with an error message saying how to install it.
pub(crate) fn require_binary(what: &str, env_var: Option<&str>, names: &[&str], extra: &[PathBuf]) -> anyhow::Result<PathBuf> {
    if let Some(var) = env_var {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(&v);
            if !is_executable(&p) {
                anyhow::bail!("${var}={} is not an executable file", p.display());
            }
            return Ok(p);
        }
    }
    find_binary(env_var, names, extra).ok_or_else(|| {
        let env = env_var.map(|v| format!(", ${v}")).unwrap_or_default();
        anyhow::anyhow!("{what} binary `{}` not found (looked in PATH, /usr/sbin, /usr/bin{env}); {INSTALL_HINT}", names[0])
    })
}

/// Recursive copy preserving permission bits.
pub(crate) fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let dst = to.join(entry.file_name());
        if ty.is_dir() {
            copy_dir(&entry.path(), &dst)?;
        } else if ty.is_file() {
            std::fs::copy(entry.path(), &dst)?;
        }
    }
    Ok(())
}

/// Stores a start-up result so that a failure is reported to every caller
/// without retrying the slow start each time.
pub(crate) fn unwrap_started<T>(what: &str, r: &'static Result<T, String>) -> &'static T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("binval-testkit: starting {what} failed: {e}"),
    }
}
