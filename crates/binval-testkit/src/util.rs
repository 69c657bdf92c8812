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

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free port `p` with `p + 10000` (the Redis Cluster bus port) free too.
pub(crate) fn free_cluster_port(taken: &[u16]) -> io::Result<u16> {
    for _ in 0..200 {
        let p = free_port()?;
        if p <= 55535 && !taken.contains(&p) && !taken.contains(&(p + 10000)) && port_free(p + 10000) {
            return Ok(p);
        }
    }
    Err(io::Error::other("no free port pair (p, p+10000) found"))
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
