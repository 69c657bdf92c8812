use super::*;
use binval_protocol::{Op as EvOp, SourcePosition};

fn shared() -> Shared {
    Shared::new(SharedSettings::plain(100, 100, 16))
}

fn ev(key: &str, version: Version) -> InvalidationEvent {
    InvalidationEvent {
        schema: 1,
        key: key.into(),
        version,
        op: EvOp::Update,
        table: "a.b".into(),
        position: SourcePosition::default(),
        commit_time_ms: 0,
        publish_time_ms: 0,
    }
}

/// A `truncate` event evicts every older key of the template's prefix, refuses older fills
/// of such keys afterwards, and leaves other keys and newer entries alone.
#[test]
fn truncate_evicts_by_prefix_and_guards_fills() {
    let s = shared();
    let v: Arc<str> = Arc::from("x");
    assert!(s.try_cache("p:item:1", Some(&v), 5, s.epoch(), None));
    assert!(s.try_cache("p:item:2", Some(&v), 12, s.epoch(), None));
    assert!(s.try_cache("p:tag:1", Some(&v), 5, s.epoch(), None));
    let mut t = ev("p:item:{id}", 10);
    t.op = EvOp::Truncate;
    s.apply_batch(&[t]);
    assert!(s.local.get("p:item:1").is_none(), "older entry of the table evicted");
    assert!(s.local.get("p:item:2").is_some(), "entry newer than the truncate stays");
    assert!(s.local.get("p:tag:1").is_some(), "other prefix stays");
    assert!(!s.try_cache("p:item:3", Some(&v), 9, s.epoch(), None), "a fill older than the truncate is refused");
    assert!(s.try_cache("p:item:3", Some(&v), 10, s.epoch(), None), "a fill at or after it is cached");
    assert!(s.try_cache("p:tag:2", Some(&v), 9, s.epoch(), None));
}

/// The front remembers an entry the local cache no longer holds (dropped for size); an
/// event of that key evicts nothing from the cache, and must still invalidate the front.
#[test]
fn every_batch_invalidates_the_front() {
    let s = shared();
    let v: Arc<str> = Arc::from("old");
    assert!(s.try_cache("k", Some(&v), 1, s.epoch(), None));
    let gen = s.front_gen();
    let e = s.local.get("k").unwrap();
    crate::front::put(s.id, gen, "k", &e);
    s.local.invalidate("k"); // as a size eviction would
    let now = Instant::now();
    assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_some());
    let notices = s.apply_batch(&[ev("k", 2)]);
    assert!(!notices[0].evicted, "nothing left in the cache to evict");
    assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_none(), "front still serves after the event");
}

/// The front remembers an entry the local cache dropped (for size); a newer fill of the key
/// is an insert, not a replacement, and must still invalidate the front, so the next read
/// sees the newer value.
#[test]
fn a_fill_after_a_size_drop_invalidates_the_front() {
    let s = shared();
    let (old, new): (Arc<str>, Arc<str>) = (Arc::from("v1"), Arc::from("v2"));
    assert!(s.try_cache("k", Some(&old), 1, s.epoch(), None));
    let gen = s.front_gen();
    crate::front::put(s.id, gen, "k", &s.local.get("k").unwrap());
    s.local.invalidate("k"); // as a size eviction would
    assert!(s.try_cache("k", Some(&new), 2, s.epoch(), None));
    let now = Instant::now();
    assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_none(), "front still serves v1 after v2 was cached");
    assert_eq!(s.local.get("k").and_then(|e| e.value).as_deref(), Some("v2"));
}

/// A fill removed again by the fill-race guard, and a fail-safe clear, invalidate the front.
#[test]
fn guard_removal_and_fail_safe_invalidate_the_front() {
    let s = shared();
    let v: Arc<str> = Arc::from("x");
    assert!(s.try_cache("k", Some(&v), 5, s.epoch(), None));
    let gen = s.front_gen();
    crate::front::put(s.id, gen, "k", &s.local.get("k").unwrap());
    s.apply_batch(&[ev("k", 9)]);
    let g1 = s.front_gen();
    assert_ne!(g1, gen);
    // A fill at an older version than the guard is refused: nothing cached.
    assert!(!s.try_cache("k", Some(&v), 8, s.epoch(), None));
    // A fill started before a fail-safe transition is removed again, and the front moves.
    let epoch = s.epoch();
    s.stop_serving_local();
    assert!(s.front_gen() > g1);
    s.resume_serving_local();
    let g2 = s.front_gen();
    assert!(!s.try_cache("k", Some(&v), 10, epoch, None), "fill from an older epoch");
    assert!(s.front_gen() > g2);
    assert!(s.local.get("k").is_none());
}

/// "No row" entries follow the same rules as values: a tombstone at its position is evicted
/// only by a newer event; a missing key at position 0 by any event, and refused while an
/// event of the key is remembered; a missing key's own TTL is used.
#[test]
fn no_row_entries_follow_the_evict_rule_and_the_guard() {
    let s = shared();
    assert!(s.try_cache("tomb", None, 7, s.epoch(), None));
    assert!(s.try_cache("gone", None, 0, s.epoch(), Some(Duration::from_millis(500))));
    assert_eq!(s.local.get("gone").map(|e| (e.value, e.ttl)), Some((None, Duration::from_millis(500))));
    let n = s.apply_batch(&[ev("tomb", 7), ev("gone", 1)]);
    assert_eq!((n[0].evicted, n[1].evicted), (false, true));
    assert!(s.local.get("tomb").is_some_and(|e| e.value.is_none() && e.version == 7));
    assert!(!s.try_cache("gone", None, 0, s.epoch(), Some(Duration::from_secs(1))), "the guard remembers version 1");
    let v: Arc<str> = Arc::from("back");
    assert!(s.try_cache("gone", Some(&v), 1, s.epoch(), None));
    assert!(s.apply_batch(&[ev("tomb", 8)])[0].evicted);
}

fn batch(changes: &[(&str, Version, EvOp)]) -> Vec<u8> {
    let mut b = binval_protocol::BatchBuilder::new();
    let pos = SourcePosition { file: "f.000001".into(), pos: 4, gtid: None };
    for (k, v, op) in changes {
        b.push(&pos, 1000, *op, *v, "a.b", k).unwrap();
    }
    b.finish(1010)
}

/// A batch applies each change by the per-key rules: a cached older entry is evicted and
/// its older fills refused afterwards, a newer entry stays, an uncached key leaves nothing
/// behind (no guard entry: nobody held or filled it), a truncate evicts by prefix; one
/// notice per change.
#[test]
fn a_batch_applies_like_its_per_key_events() {
    let s = shared();
    let v: Arc<str> = Arc::from("x");
    assert!(s.try_cache("p:1", Some(&v), 5, s.epoch(), None));
    assert!(s.try_cache("p:2", Some(&v), 20, s.epoch(), None));
    assert!(s.try_cache("q:1", Some(&v), 5, s.epoch(), None));
    let bytes = batch(&[("p:1", 10, EvOp::Update), ("p:2", 10, EvOp::Update), ("p:3", 10, EvOp::Delete), ("q:{id}", 11, EvOp::Truncate)]);
    let b = binval_protocol::BatchView::parse(&bytes).unwrap();
    let notices = s.apply_batch_view(&b, &mut BatchScratch::default(), true);
    let evicted: Vec<(&str, bool)> = notices.iter().map(|n| (n.key.as_str(), n.evicted)).collect();
    assert_eq!(evicted, [("p:1", true), ("p:2", false), ("p:3", false), ("q:{id}", true)]);
    assert_eq!((notices[0].commit_time_ms, notices[0].publish_time_ms), (1000, 1010));
    assert!(s.local.get("p:1").is_none());
    assert!(s.local.get("p:2").is_some(), "newer than the change");
    assert!(s.local.get("q:1").is_none(), "truncated");
    assert!(!s.try_cache("p:1", Some(&v), 9, s.epoch(), None), "an older fill of an evicted key is refused");
    assert!(s.guard.get("p:3").is_none(), "an uncached key costs no guard entry");
    assert!(s.try_cache("p:3", Some(&v), 10, s.epoch(), None));
    assert_eq!(s.counters.snapshot().events, 4);
}

/// With reads from replica nodes every key of a batch raises the guard, as per key.
#[test]
fn guard_every_key_guards_uncached_keys() {
    let mut s = shared();
    s.guard_every_key = true;
    let bytes = batch(&[("p:3", 10, EvOp::Update)]);
    s.apply_batch_view(&binval_protocol::BatchView::parse(&bytes).unwrap(), &mut BatchScratch::default(), false);
    assert_eq!(s.guard.get("p:3"), Some(10));
}

proptest::proptest! {
    /// Random bytes, and valid batches cut short or with bytes changed, never panic the
    /// listener's batch path: a bad one is an error, a good one applies.
    #[test]
    fn batch_bytes_never_panic(
        raw in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        keys in proptest::collection::vec("[a-z:{}0-9]{0,12}", 1..20),
        cut in 0usize..2000,
        flips in proptest::collection::vec((0usize..2000, proptest::num::u8::ANY), 0..4),
    ) {
        let s = shared();
        let mut scratch = BatchScratch::default();
        let changes: Vec<(&str, Version, EvOp)> = keys.iter().enumerate().map(|(i, k)| (k.as_str(), i as u64, [EvOp::Insert, EvOp::Update, EvOp::Delete, EvOp::Truncate][i % 4])).collect();
        let good = batch(&changes);
        let mut bent = good.clone();
        for (at, x) in &flips {
            let n = bent.len();
            bent[at % n] = *x;
        }
        let cut = cut % (good.len() + 1);
        for bytes in [&raw[..], &good[..cut], &bent[..], &good[..]] {
            match crate::listener::decode_batch(Some(bytes), crate::listener::DEFAULT_MAX_MESSAGE_BYTES) {
                Ok(b) => {
                    let n = s.apply_batch_view(&b, &mut scratch, true);
                    proptest::prop_assert_eq!(n.len(), b.change_count);
                }
                Err(e) => { let _ = e.to_string(); }
            }
        }
        let b = binval_protocol::BatchView::parse(&good).unwrap();
        proptest::prop_assert_eq!(b.change_count, keys.len());
    }
}

#[test]
fn jittered_ttl_stays_within_bounds_and_spreads() {
    let t = JitteredTtl { ttl: Duration::from_secs(10), jitter: 0.1 };
    let samples: Vec<Duration> = (0..10_000).map(|_| t.sample()).collect();
    let (lo, hi) = (Duration::from_secs(9), Duration::from_secs(11));
    assert!(samples.iter().all(|d| (lo..=hi).contains(d)));
    let min = samples.iter().min().unwrap();
    let max = samples.iter().max().unwrap();
    assert!(*min < Duration::from_millis(9_500) && *max > Duration::from_millis(10_500), "{min:?} {max:?}");
    let exact = JitteredTtl { ttl: Duration::from_secs(10), jitter: 0.0 };
    assert_eq!(exact.sample(), Duration::from_secs(10));
}
