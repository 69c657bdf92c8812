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
    status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
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
    fn this_process_has_a_peak_and_cpu_time() {
        let pid = std::process::id();
        assert!(peak_rss_kib(pid).is_some_and(|k| k > 0));
        assert!(cpu_secs(pid).is_some());
        assert_eq!(status_kib(pid, "NoSuchField:"), None);
    }
}
