use super::*;

fn obs(at: Instant, highs: &[(i32, i64)]) -> Observation {
    Observation { at, highs: highs.iter().copied().collect() }
}

fn next(n: &[(i32, i64)]) -> BTreeMap<i32, i64> {
    n.iter().copied().collect()
}

/// An observation counts once every partition reached its watermark; the newest reached
/// one is returned and older ones go with it; unreached ones stay.
#[test]
fn observations_are_confirmed_when_every_partition_reaches_them() {
    let t0 = Instant::now();
    let (t1, t2, t3) = (t0 + Duration::from_millis(10), t0 + Duration::from_millis(20), t0 + Duration::from_millis(30));
    let mut p = Pending::default();
    p.push(obs(t1, &[(0, 10), (1, 5)]));
    p.push(obs(t2, &[(0, 12), (1, 7)]));
    p.push(obs(t3, &[(0, 20), (1, 9)]));
    assert_eq!(p.take_reached(&next(&[(0, 9), (1, 100)])), None, "partition 0 is behind the oldest");
    assert_eq!(p.take_reached(&next(&[(0, 11), (1, 100)])).map(|o| o.at), Some(t1), "11 >= 10 and 100 >= 5");
    assert_eq!(p.take_reached(&next(&[(0, 12), (1, 7)])).map(|o| o.at), Some(t2), "the newest reached one");
    assert_eq!(p.oldest_at(), Some(t3));
    assert_eq!(p.take_reached(&next(&[(0, 20)])), None, "partition 1 read nothing");
    assert_eq!(p.take_reached(&next(&[(0, 25), (1, 9)])).map(|o| o.at), Some(t3));
    assert_eq!(p.oldest_at(), None);
}

fn shared(bound: Duration) -> Shared {
    use crate::state::SharedSettings;
    Shared::new(SharedSettings { max_staleness: Some(bound), ..SharedSettings::plain(10, 10, 1) })
}

/// The bound's transitions: stop past the bound (counted once), stay stopped until the lag
/// is under half of it, then resume; a lost stream stops at once and resumes only after a
/// confirmation taken after the loss; after the end nothing resumes.
#[test]
fn the_bound_stops_and_resumes_local_serving() {
    let s = shared(Duration::from_secs(1));
    let fs = &s.fail_safe;
    // In the past, so that the made-up instants below are too (the loss is stamped "now").
    let t0 = Instant::now().checked_sub(Duration::from_secs(10)).expect("monotonic clock past 10 s");
    fs.start(t0);
    fs.evaluate(&s, t0 + Duration::from_millis(850), "t");
    assert!(s.is_serving_local(), "lag 0.85 s: under the bound less its eighth (0.875 s)");
    fs.evaluate(&s, t0 + Duration::from_millis(900), "t");
    assert!(!s.is_serving_local(), "lag 0.9 s: past 0.875 s, so no value served before the next evaluation is older than 1 s");
    fs.evaluate(&s, t0 + Duration::from_millis(1200), "t");
    assert_eq!(s.counters.snapshot().fail_safe_engaged, 1, "counted once");
    fs.confirmed(t0 + Duration::from_millis(1000));
    fs.evaluate(&s, t0 + Duration::from_millis(1600), "t");
    assert!(!s.is_serving_local(), "lag 0.6 s: not yet under half the bound");
    fs.evaluate(&s, t0 + Duration::from_millis(1400), "t");
    assert!(s.is_serving_local(), "lag 0.4 s: resumed");
    fs.confirmed(t0 + Duration::from_millis(500));
    assert_eq!(fs.lag(t0 + Duration::from_millis(1400)), Duration::from_millis(400), "an older confirmation changes nothing");

    let e = KafkaError::MessageConsumption(rdkafka::types::RDKafkaErrorCode::AllBrokersDown);
    let before = Instant::now();
    fs.confirmed(before);
    fs.lost(&s, &e, "t");
    assert!(!s.is_serving_local(), "lost: stopped at once");
    fs.evaluate(&s, before + Duration::from_millis(10), "t");
    assert!(!s.is_serving_local(), "a confirmation from before the loss does not resume");
    let after = Instant::now();
    fs.confirmed(after);
    fs.evaluate(&s, after + Duration::from_millis(10), "t");
    assert!(s.is_serving_local(), "confirmed after the loss: resumed");
    assert_eq!(s.counters.snapshot().fail_safe_engaged, 2);

    fs.end(&s);
    fs.confirmed(Instant::now());
    fs.evaluate(&s, Instant::now(), "t");
    assert!(!s.is_serving_local(), "after the end: never again");
}

fn progress(source: &str, partition: i32, lag_ms: u64, token: u64) -> ProgressMessage {
    ProgressMessage {
        schema: 1,
        source: source.into(),
        partition,
        position: None,
        commit_time_ms: 0,
        lag_ms,
        fencing_token: token,
        publish_time_ms: 0,
        masters: None,
    }
}

/// The source lag: nothing until a progress message (or required); then the worst of
/// `lag_ms + time since received` over (source, partition), every partition counting from
/// the first message on; an older tenure is ignored; past the bound local serving stops,
/// and resumes under half of it.
#[test]
fn the_source_lag_follows_progress_messages() {
    let s = shared(Duration::from_secs(1));
    let fs = &s.fail_safe;
    let t0 = Instant::now().checked_sub(Duration::from_secs(10)).expect("monotonic clock past 10 s");
    fs.start(t0);
    assert_eq!(fs.source_lag(t0 + Duration::from_secs(5)), None, "no progress seen: does not count");
    assert_eq!(fs.progress(&progress("shop", 0, 100, 3), [0, 1].into_iter(), t0), Recorded::Taken);
    assert_eq!(fs.source_lag(t0), Some(Duration::from_millis(100)));
    // Partition 1 got none: it counts from the first message on (lag 0 then).
    assert_eq!(fs.source_lag(t0 + Duration::from_millis(50)), Some(Duration::from_millis(150)));
    fs.progress(&progress("shop", 0, 0, 3), [0, 1].into_iter(), t0 + Duration::from_millis(400));
    fs.progress(&progress("shop", 1, 0, 3), [0, 1].into_iter(), t0 + Duration::from_millis(400));
    assert_eq!(fs.source_lag(t0 + Duration::from_millis(500)), Some(Duration::from_millis(100)));
    // An old leader's message is ignored.
    assert_eq!(
        fs.progress(&progress("shop", 0, 9_000, 2), [0, 1].into_iter(), t0 + Duration::from_millis(500)),
        Recorded::OldTenure { highest: 3 }
    );
    assert_eq!(fs.source_lag(t0 + Duration::from_millis(500)), Some(Duration::from_millis(100)));
    // binval reports a stall on partition 1: past the bound, local serving stops.
    fs.confirmed(t0 + Duration::from_millis(900));
    fs.progress(&progress("shop", 1, 1_500, 3), [0, 1].into_iter(), t0 + Duration::from_millis(900));
    fs.evaluate(&s, t0 + Duration::from_millis(950), "t");
    assert!(!s.is_serving_local(), "source lag 1.55 s > bound 1 s");
    assert_eq!(s.counters.snapshot().fail_safe_engaged, 1);
    // Caught up, but only under half the bound resumes.
    fs.progress(&progress("shop", 0, 0, 3), [0, 1].into_iter(), t0 + Duration::from_millis(1_000));
    fs.progress(&progress("shop", 1, 300, 3), [0, 1].into_iter(), t0 + Duration::from_millis(1_000));
    fs.confirmed(t0 + Duration::from_millis(1_000));
    fs.evaluate(&s, t0 + Duration::from_millis(1_250), "t");
    assert!(!s.is_serving_local(), "source lag 0.55 s: not under half the bound yet");
    fs.progress(&progress("shop", 1, 0, 3), [0, 1].into_iter(), t0 + Duration::from_millis(1_300));
    fs.evaluate(&s, t0 + Duration::from_millis(1_310), "t");
    assert!(s.is_serving_local(), "both lags under half the bound: resumed");
    // The broker stops answering (no confirmation after 1.0 s): nothing says binval
    // stopped; the source lag stops at the confirmation plus the slack (2 x 250 ms).
    assert_eq!(fs.source_lag(t0 + Duration::from_millis(3_300)), Some(Duration::from_millis(500)));
    // Messages stop arriving while the broker answers: the lag grows by itself.
    fs.confirmed(t0 + Duration::from_millis(3_300));
    assert_eq!(fs.source_lag(t0 + Duration::from_millis(3_300)), Some(Duration::from_millis(2_300)));
    // A partition added later counts from when it was assigned.
    fs.partitions_added(&[2], t0 + Duration::from_millis(3_300));
    assert_eq!(fs.slot_lags(&[0], t0 + Duration::from_millis(3_300)), Some(vec![Duration::from_millis(2_300)]));
}

/// Per-slot lags: a range's own lag for its slots, the overall lag elsewhere; `require_progress`
/// counts from the start.
#[test]
fn slot_lags_use_the_masters_ranges() {
    let fs = FailSafe::with_progress(Some(Duration::from_secs(1)), true);
    let t0 = Instant::now();
    assert!(
        fs.source_lag(t0 + Duration::from_millis(10)).is_some_and(|l| l >= Duration::from_millis(10)),
        "required: counts from the start"
    );
    let mut m = progress("shop", 0, 5_000, 1);
    m.masters = Some(vec![
        MasterLag { first_slot: 0, last_slot: 8191, lag_ms: 20 },
        MasterLag { first_slot: 8192, last_slot: 16383, lag_ms: 5_000 },
    ]);
    fs.progress(&m, [0].into_iter(), t0);
    assert_eq!(
        fs.slot_lags(&[0, 8191, 8192], t0 + Duration::from_millis(10)),
        Some(vec![Duration::from_millis(30), Duration::from_millis(30), Duration::from_millis(5_010)])
    );
    assert_eq!(fs.source_lag(t0), Some(Duration::from_millis(5_000)));
    assert_eq!(FailSafe::new(Some(Duration::from_secs(1))).slot_lags(&[0], t0), None, "no progress: no slot lags");
}

/// The queue is bounded; the oldest goes first.
#[test]
fn pending_is_bounded() {
    let t0 = Instant::now();
    let mut p = Pending::default();
    for i in 0..(MAX_PENDING as u64 + 10) {
        p.push(obs(t0 + Duration::from_millis(i), &[(0, i as i64)]));
    }
    assert_eq!(p.oldest_at(), Some(t0 + Duration::from_millis(10)));
    assert_eq!(p.newest_at(), Some(t0 + Duration::from_millis(MAX_PENDING as u64 + 9)));
}
