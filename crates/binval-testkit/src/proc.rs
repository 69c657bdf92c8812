//! Child processes: the keeper thread, PDEATHSIG, the per-process state folder
//! and the exit-time cleanup. See the crate docs for the reasoning.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Pids of live children, killed and reaped by the `atexit` hook. A pid is
/// removed as soon as its child has been reaped (pids get reused).
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<u32>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn keeper() -> &'static mpsc::Sender<SpawnRequest> {
    static KEEPER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("binval-testkit-keeper".into())
            .spawn(move || {
                for mut req in rx {
                    let res = spawn_here(&mut req.cmd);
                    let _ = req.reply.send(res);
                }
                // The sender lives in a static, so this is unreachable; but
                // this thread must never end while children exist.
                loop {
                    thread::park();
                }
            })
            .expect("binval-testkit: cannot start the keeper thread");
        tx
    })
}

/// Runs on the keeper thread: the forking thread is the one PDEATHSIG
/// watches.
fn spawn_here(cmd: &mut Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(111);
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    live().push(child.id());
    Ok(child)
}

/// A long-running child started by the keeper thread.
pub(crate) struct Proc {
    child: Child,
    reaped: bool,
}

impl Proc {
    /// Spawn `cmd` (stdin null, stdout+stderr appended to `log`) from the
    /// keeper thread.
    pub fn spawn(mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        state_root(); // make sure the exit hook is installed
        let out = open_log(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let program = format!("{:?}", cmd.get_program());
        let (tx, rx) = mpsc::channel();
        keeper().send(SpawnRequest { cmd, reply: tx }).map_err(|_| anyhow!("binval-testkit keeper thread is gone"))?;
        let child =
            rx.recv().map_err(|_| anyhow!("binval-testkit keeper thread is gone"))?.with_context(|| format!("spawning {program}"))?;
        Ok(Proc { child, reaped: false })
    }

    /// `Some(status)` if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.reaped {
            return Some(ExitStatus::default());
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.mark_reaped();
                Some(st)
            }
            _ => None,
        }
    }

    fn mark_reaped(&mut self) {
        self.reaped = true;
        let pid = self.child.id();
        live().retain(|p| *p != pid);
    }

    /// Send `sig` (e.g. SIGSTOP/SIGCONT) without reaping.
    pub fn signal(&self, sig: i32) {
        if !self.reaped {
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.mark_reaped();
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    pub fn terminate(&mut self, grace: Duration) {
        if self.reaped {
            return;
        }
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn open_log(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("opening log file {}", path.display()))
}

fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks existence/permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

extern "C" fn cleanup_at_exit() {
    let pids: Vec<u32> = match LIVE.try_lock() {
        Ok(g) => g.clone(),
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().clone(),
        Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
    };
    for &pid in &pids {
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    for &pid in &pids {
        unsafe {
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
    if std::env::var_os("BINVAL_TESTKIT_KEEP").is_none() {
        if let Some(root) = ROOT.get() {
            let _ = fs::remove_dir_all(root);
        }
    }
}

static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// `$TMPDIR/binval-testkit/<pid>`, created on first use; removes folders of
/// dead test processes and installs the exit hook.
pub(crate) fn state_root() -> &'static Path {
    ROOT.get_or_init(|| {
        let base = std::env::temp_dir().join("binval-testkit");
        fs::create_dir_all(&base).unwrap_or_else(|e| panic!("binval-testkit: cannot create {}: {e}", base.display()));
        let me = std::process::id();
        if let Ok(entries) = fs::read_dir(&base) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else {
                    continue;
                };
                if pid as u32 != me && !pid_alive(pid) {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
        let root = base.join(me.to_string());
        // A folder with our pid is a leftover of an earlier process.
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap_or_else(|e| panic!("binval-testkit: cannot create {}: {e}", root.display()));
        // SAFETY: registering a plain extern "C" fn.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
        root
    })
}

/// A fresh folder `<state_root>/<kind>-<n>`.
pub(crate) fn new_state_dir(kind: &str) -> anyhow::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = state_root().join(format!("{kind}-{}", N.fetch_add(1, Ordering::Relaxed)));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
