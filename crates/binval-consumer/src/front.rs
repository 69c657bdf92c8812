//! The per-thread front of the local cache: the last entries each thread read, so a thread that
//! reads the same hot key over and over does not pay moka's read path (hash table lookup, read
//! buffer, maintenance) every time.
//!
//! # Why it cannot serve anything the local cache would not
//!
//! The local cache (moka) stays the one source of truth; the front only remembers entries read
//! from it, tagged with a **generation**: a counter in [`crate::state::Shared`] that is bumped
//! *after* every change that may make a remembered entry wrong — every applied batch of
//! invalidation events (whether or not it evicted: the entry may have left moka by size and
//! still be remembered here), every fill cached (a newer value) or removed again by the
//! fill-race guard, every fail-safe clear. A front entry is served only while the generation is
//! the one read *before* the entry was read from moka, and only before its own expiry time (its
//! TTL, measured from slightly before moka's), so:
//!
//! - an entry read from moka before an eviction carries an older generation than the bump that
//!   follows the eviction, and is never served after it;
//! - an entry read after the eviction is not the evicted one.
//!
//! A front hit is therefore exactly as fresh as a moka hit at the same moment, counting a
//! change as made when its bump is: between moka's change and the bump (both inside one event
//! batch or one fill, before it reports anything) a front may still serve the entry replaced.
//! Every [`REVISIT`]-th hit of a slot goes to moka anyway, so moka's frequency sketch still sees
//! the key as hot (its size-based eviction keeps it).
//!
//! # Bounds
//!
//! [`SLOTS`] direct-mapped slots per thread (a key and an `Arc` of its cached value each); a
//! slot is overwritten by the next key that maps to it. A value removed from the local cache
//! stays referenced by a thread's slot until that slot is overwritten or the thread ends: at
//! most `SLOTS` payloads per thread that reads through a consumer.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::time::Instant;

use crate::state::Entry;

/// Slots per thread.
pub(crate) const SLOTS: usize = 64;
/// Every this many hits of one slot, the read goes to moka instead (and refreshes the slot).
pub(crate) const REVISIT: u32 = 32;

struct Slot {
    /// Which consumer the entry belongs to (a process-unique id, never reused).
    owner: u64,
    /// The generation read before the entry was read from the local cache.
    gen: u64,
    uses: u32,
    key: Box<str>,
    entry: Entry,
}

thread_local! {
    static FRONT: RefCell<Vec<Option<Slot>>> = RefCell::new((0..SLOTS).map(|_| None).collect());
}

fn index(key: &str) -> usize {
    // Fixed seed: the index only picks a slot; the key itself is compared on every hit.
    (foldhash::fast::FixedState::with_seed(0x5eed_b17a).hash_one(key) as usize) & (SLOTS - 1)
}

/// The entry of `key` if this thread's front holds it for `owner` at generation `gen` and it
/// has not expired at `now`; `None` sends the read to the local cache.
#[inline]
pub(crate) fn get(owner: u64, gen: u64, key: &str, now: Instant) -> Option<Entry> {
    FRONT
        .try_with(|f| {
            let mut f = f.borrow_mut();
            let slot = f[index(key)].as_mut()?;
            if slot.owner != owner || slot.gen != gen || now >= slot.entry.expires_at || &*slot.key != key {
                return None;
            }
            slot.uses = slot.uses.wrapping_add(1);
            if slot.uses.is_multiple_of(REVISIT) {
                return None;
            }
            Some(slot.entry.clone())
        })
        .ok()
        .flatten()
}

/// Remember `entry` of `key`, read from the local cache after reading generation `gen`.
#[inline]
pub(crate) fn put(owner: u64, gen: u64, key: &str, entry: &Entry) {
    let _ = FRONT.try_with(|f| {
        let mut f = f.borrow_mut();
        let i = index(key);
        match &mut f[i] {
            Some(slot) if &*slot.key == key => {
                slot.owner = owner;
                slot.gen = gen;
                slot.entry = entry.clone();
            }
            other => {
                *other = Some(Slot { owner, gen, uses: 0, key: key.into(), entry: entry.clone() });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn entry(v: &str, expires_at: Instant) -> Entry {
        Entry { value: Some(Arc::from(v)), version: 1, ttl: Duration::from_secs(1), expires_at, refresh: None }
    }

    #[test]
    fn serves_only_same_owner_generation_key_and_unexpired() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        put(7, 3, "k", &entry("v", later));
        assert_eq!(get(7, 3, "k", now).and_then(|e| e.value).as_deref(), Some("v"));
        assert!(get(8, 3, "k", now).is_none(), "other consumer");
        assert!(get(7, 4, "k", now).is_none(), "generation moved");
        assert!(get(7, 3, "other", now).is_none(), "other key");
        assert!(get(7, 3, "k", later).is_none(), "expired");
    }

    #[test]
    fn every_revisit_th_hit_goes_to_the_cache() {
        let now = Instant::now();
        put(1, 1, "r", &entry("v", now + Duration::from_secs(10)));
        let served = (0..REVISIT * 4).filter(|_| get(1, 1, "r", now).is_some()).count();
        assert_eq!(served as u32, REVISIT * 4 - 4);
    }
}
