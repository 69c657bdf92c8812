//! Where the machine's CPU goes during a cell: user + system CPU seconds of every process of
//! the services (by command name in `/proc/<pid>/stat`) and of this benchmark process (the
//! writer and the two app instances), so a cell can print CPU per commit per component.
//! Linux only (reads `/proc`); elsewhere every figure is 0.

use std::collections::BTreeMap;

/// The components a cell reports, by process command name (`comm`, at most 15 bytes).
pub const COMPONENTS: [(&str, &str); 5] = [
    ("mariadbd", "MariaDB"),
    ("redis-server", "Redis (3 masters + replicas)"),
    ("tansu", "tansu"),
    ("binval", "binval"),
    ("", "writer + apps"),
];

/// CPU seconds per component at one moment.
#[derive(Clone, Default)]
pub struct CpuSnapshot(BTreeMap<&'static str, f64>);

impl CpuSnapshot {
    /// Read every process' CPU time now. Processes that end between two snapshots drop out of
    /// the second one; the services live for the whole benchmark, so this does not matter here.
    pub fn take() -> CpuSnapshot {
        let mut by: BTreeMap<&'static str, f64> = BTreeMap::new();
        let me = std::process::id();
        let Ok(dir) = std::fs::read_dir("/proc") else { return CpuSnapshot(by) };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let Some((head, _)) = stat.rsplit_once(')') else { continue };
            let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
            let name = if pid == me { "" } else { comm };
            let Some(&(key, _)) = COMPONENTS.iter().find(|(c, _)| *c == name) else { continue };
            *by.entry(key).or_default() += binval_testkit::procfs::stat_cpu_secs(&stat).unwrap_or(0.0);
        }
        CpuSnapshot(by)
    }

    /// CPU seconds per component since `earlier`, in [`COMPONENTS`] order.
    pub fn since(&self, earlier: &CpuSnapshot) -> Vec<f64> {
        COMPONENTS.iter().map(|(k, _)| self.0.get(k).copied().unwrap_or(0.0) - earlier.0.get(k).copied().unwrap_or(0.0)).collect()
    }
}
