//! Crash points for the kill -9 test harness.
//!
//! `BINVAL_KILL_AT=<point>:<n>` makes the process kill itself with SIGKILL the `n`-th time it
//! passes `<point>` (1-based). Nothing runs on the way out: no drop, no flush, no checkpoint
//! save — exactly what `kill -9` or a power loss does at that instruction. Without the variable
//! a point costs one relaxed atomic load.
//!
//! Points (in the order one key change passes them):
//!
//! | point | where |
//! |-------|-------|
//! | `redis.after_replica` | one replica write acknowledged, the others may not be (cluster) |
//! | `redis.before_version` | all replicas acknowledged, version token not yet written (cluster) |
//! | `kafka.before_enqueue` | Redis done for the key, its event not yet handed to the producer |
//! | `checkpoint.before_save` | events acknowledged, checkpoint not yet written |
//! | `checkpoint.after_save` | checkpoint written |
//! | `bootstrap.after_chunk` | `binval bootstrap`: a chunk written and its progress saved |
//!
//! This is test tooling compiled into the release binary on purpose: the harness must kill the
//! binary operators run, not a special build.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// All crash points, for harnesses that pick one at random.
pub const POINTS: &[&str] =
    &["redis.after_replica", "redis.before_version", "kafka.before_enqueue", "checkpoint.before_save", "checkpoint.after_save"];

static ARMED: AtomicBool = AtomicBool::new(true);
static HITS: AtomicU64 = AtomicU64::new(0);
static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();

fn target() -> &'static Option<(String, u64)> {
    TARGET.get_or_init(|| {
        let t = std::env::var("BINVAL_KILL_AT").ok().and_then(|v| {
            let (p, n) = v.rsplit_once(':')?;
            Some((p.to_string(), n.parse().ok()?))
        });
        if t.is_none() {
            ARMED.store(false, Relaxed);
        }
        t
    })
}

/// Pass crash point `point`; see the module docs.
#[inline]
pub fn hit(point: &'static str) {
    if !ARMED.load(Relaxed) {
        return;
    }
    if let Some((p, n)) = target() {
        if p == point && HITS.fetch_add(1, Relaxed) + 1 == *n {
            eprintln!("BINVAL_KILL_AT: killing at {point} (hit {n})");
            // SAFETY: raise(2) with a valid signal number has no memory-safety preconditions.
            unsafe {
                libc::raise(libc::SIGKILL);
            }
        }
    }
}
