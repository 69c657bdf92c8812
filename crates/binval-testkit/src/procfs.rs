//! What tests and benchmarks read of a process from Linux's `/proc/<pid>` (proc(5)): its peak
//! resident set and its CPU time. One parser each, so a test's figure and a benchmark's figure
//! of the same process are the same number.
//!
//! ```no_run
//! let pid = std::process::id();
//! let peak_kib = binval_testkit::procfs::peak_rss_kib(pid).unwrap_or(0);
//! let cpu_s = binval_testkit::procfs::cpu_secs(pid).unwrap_or(0.0);
//! println!("{peak_kib} KiB peak, {cpu_s:.2} s of CPU");
//! ```

/// A `kB` field of `/proc/<pid>/status` (`field` with its colon, e.g. `"VmRSS:"`), in KiB;
/// `None` when the process is gone or has no such field.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&status, field).and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
}

/// The value of `field` (with its colon) in the text of a `status` file, trimmed.
fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(field)).map(str::trim)
}

/// Peak resident set of process `pid` (`VmHWM`), KiB; `None` when the process is gone.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// User + system CPU seconds of process `pid` (all its threads); `None` when it is gone.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| stat_cpu_secs(&s))
}

/// User + system CPU seconds from the text of a `/proc/<pid>/stat` line: the fields after the
/// command name (which may hold spaces and parentheses) start after the last `)`, and `utime`
/// and `stime` are the 12th and 13th of them, in clock ticks (`sysconf(_SC_CLK_TCK)`). `None`
/// when the text is not a stat line.
pub fn stat_cpu_secs(stat: &str) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) as f64 / hz)
}

/// One thread of a process, from `/proc/<pid>/task/<tid>`: its name (`comm`, as the thread set
/// it: `tokio-rt-worker`, `rdk:broker1`...), its user + system CPU seconds and its voluntary
/// context switches (it blocked: each is a sleep, and the wake-up that ends it).
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadStat {
    /// `comm`, without its trailing newline.
    pub name: String,
    /// User + system CPU seconds.
    pub cpu_secs: f64,
    /// `voluntary_ctxt_switches` of its `status`.
    pub voluntary_switches: u64,
}

/// Every thread of process `pid` alive now (threads that ended are not listed: their CPU counts
/// in [`cpu_secs`] only); empty when the process is gone.
pub fn threads(pid: u32) -> Vec<ThreadStat> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(|e| {
        let path = e.ok()?.path();
        let name = std::fs::read_to_string(path.join("comm")).ok()?.trim_end().to_string();
        let cpu_secs = stat_cpu_secs(&std::fs::read_to_string(path.join("stat")).ok()?)?;
        let status = std::fs::read_to_string(path.join("status")).ok()?;
        let voluntary_switches = status_field(&status, "voluntary_ctxt_switches:")?.parse().ok()?;
        Some(ThreadStat { name, cpu_secs, voluntary_switches })
    })
    .collect()
}

/// CPU seconds and voluntary context switches of one process' threads, summed by kind:
/// `[tokio workers, librdkafka threads, other]` (by thread name: `tokio-rt-worker`, `rdk:*`).
/// Threads that ended are not counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadKinds(pub [(f64, u64); 3]);

impl ThreadKinds {
    /// The threads of process `pid` now.
    pub fn of(pid: u32) -> ThreadKinds {
        let mut k = ThreadKinds::default();
        for t in threads(pid) {
            let i = if t.name.starts_with("tokio") {
                0
            } else if t.name.starts_with("rdk:") {
                1
            } else {
                2
            };
            k.0[i].0 += t.cpu_secs;
            k.0[i].1 += t.voluntary_switches;
        }
        k
    }

    /// What `self` added since `before` (threads gone since are taken as unchanged).
    pub fn since(&self, before: &ThreadKinds) -> ThreadKinds {
        let mut d = ThreadKinds::default();
        for i in 0..3 {
            d.0[i] = ((self.0[i].0 - before.0[i].0).max(0.0), self.0[i].1.saturating_sub(before.0[i].1));
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_spaces_and_parens_in_the_name() {
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 1000 10";
        assert_eq!(stat_cpu_secs(line), Some(300.0 / hz));
        assert_eq!(stat_cpu_secs("not a stat line"), None);
        assert_eq!(stat_cpu_secs("1 (x) S 1 2"), None);
    }

    #[test]
    fn this_process_lists_its_threads() {
        let pid = std::process::id();
        let spawned = std::thread::Builder::new().name("procfs-probe".into()).spawn(move || threads(pid)).unwrap().join().unwrap();
        assert!(spawned.iter().any(|t| t.name == "procfs-probe"), "{spawned:?}");
        assert!(spawned.iter().all(|t| t.cpu_secs >= 0.0));
        assert!(threads(u32::MAX).is_empty());
        let kinds = ThreadKinds::of(pid);
        assert!(kinds.0[2].0 >= 0.0, "{kinds:?}");
        assert_eq!(kinds.since(&kinds).0, [(0.0, 0); 3]);
    }

    #[test]
    fn this_process_has_a_peak_and_cpu_time() {
        let pid = std::process::id();
        assert!(peak_rss_kib(pid).is_some_and(|k| k > 0));
        assert!(cpu_secs(pid).is_some());
        assert_eq!(status_kib(pid, "NoSuchField:"), None);
    }
}
