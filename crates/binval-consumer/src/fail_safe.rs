//! The fail safe (invariant I5): how far behind the invalidation stream the listener is, and
//! when the local cache must not be served.
//!
//! **What "confirmed" means.** A *watermark observation* `(t, highs)` is taken by the
//! checker thread ([`spawn_checker`]): `t` is the instant *before* its first ListOffsets
//! request, `highs[p]` the high watermark the broker answered for partition `p`. A high
//! watermark only grows, so every event the broker had acknowledged before `t` has an offset
//! below `highs[p]`. Once the listener's next offset of every partition is at or past
//! `highs`, it has applied every event acknowledged before `t`: the stream is *confirmed at
//! `t`*. The lag is `now - t` of the newest confirmed observation.
//!
//! **Why this and not "at the high watermark now".** The first fail safe compared the read
//! position with the high watermark at the moment of the check. Under a steady flow some
//! events are always between the broker and the listener (published, not fetched yet), so the
//! position was almost never equal to the watermark, however small the real lag: at 300
//! events/s with librdkafka's default `fetch.wait.max.ms` on tansu the check failed in about
//! three of four samples, the consumer bypassed its cache and, after four bounds, rebuilt its
//! librdkafka consumer for nothing (issue #15). Here an observation stays pending until the
//! listener reaches it, which under a flowing stream is one fetch later; observations are
//! taken every `max_staleness / 4`, several can be pending at once, and the lag of a busy but
//! healthy stream stays at about one observation interval plus one fetch.
//!
//! **The guarantee.** The local cache is served only while the lag is within the bound
//! ([`crate::ConsumerBuilder::max_staleness`]). When the broker hangs (SIGSTOP, a network black
//! hole) no observation succeeds; when the listener falls behind, observations are not
//! reached; when the listener's connection is wedged, they are not reached either. In each
//! case the lag grows past the bound (less its eighth, at most 250 ms: [`engage_at`], so that a
//! value served before the next evaluation is still within it) and [`FailSafe::evaluate`]
//! stops local serving, checked
//! by the listener thread after every poll (at most 100 ms apart) and by the checker after
//! every observation. Local serving resumes (cache cleared first) once the lag is back under
//! half the bound, so a lag near the bound does not flap.
//!
//! So a value served locally at time `now` has seen every event the broker acknowledged
//! before `now - bound`. What this does not cover is the *source side*: binval's Redis writes
//! and events can stall (a frozen Redis master) while the stream, with nothing new in it,
//! stays confirmed. That is what binval's progress messages are for.
//!
//! **The source lag (issue #22).** binval sends a progress message
//! ([`binval_protocol::ProgressMessage`]) to every partition every
//! `kafka.progress_interval_ms`: its own lag, `lag_ms`, how far what is in Redis and enqueued is
//! behind the source. The listener records, per (source, partition), the newest message's
//! `lag_ms` and the instant it was received (monotonic: no clock of another host is read); the
//! source lag is the worst over them of `lag_ms + (now - received)`
//! ([`crate::Consumer::source_lag`], gauge `binval_consumer_source_lag_ms`). So a binval that
//! stops sending (frozen, cut off from the broker) makes it grow by itself. The time since
//! received counts only as far as the stream is confirmed (plus two observation intervals):
//! when the *broker* stops answering, nothing says binval stopped, the source lag stops
//! growing and the stream lag takes over (local cache bypassed, Redis read: binval keeps
//! writing Redis while the broker is away). It counts only
//! once a progress message has been seen (consumers of an older binval keep the stream lag
//! alone), or from `build()` on with [`crate::ConsumerBuilder::require_progress`]. Past the
//! bound the local cache is bypassed like for the stream lag, and a Redis read is not served as
//! fresh either ([`crate::ConsumerBuilder::on_source_behind`]); local serving resumes (cache
//! cleared) once both lags are under half the bound. Messages of a source with a lower fencing
//! token than the highest seen (an old leader) are ignored; a message that names another
//! partition than the one it was read from is a bad message. When a message carries per-slot
//! lags (`masters`), each hash slot has its own lag ([`FailSafe::slot_lags`]), and a read
//! skips replicas whose slot is past the bound when the key has another.
//!
//! Not covered: the time a progress message spends between binval's producer and this
//! listener (milliseconds normally; binval enqueues a round only after the previous one was
//! delivered, so at most one waits while the broker is slow, and the stream lag reports a slow
//! broker on its own).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_protocol::{MasterLag, ProgressMessage};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::listener::{self, ListenerSettings};
use crate::state::Shared;

/// At most this many observations wait for the listener; past it the oldest is dropped.
/// Dropping one only delays a confirmation to the next observation (a later `t`), so it can
/// make the lag look larger, never smaller.
const MAX_PENDING: usize = 64;

/// One look at the high watermarks: every event acknowledged before `at` lies below `highs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    pub at: Instant,
    pub highs: BTreeMap<i32, i64>,
}

impl Observation {
    /// `true` when `next` (next offset to read per partition) is at or past every high
    /// watermark of this observation. A partition missing from `next` has read nothing.
    fn reached_by(&self, next: &BTreeMap<i32, i64>) -> bool {
        self.highs.iter().all(|(p, &high)| next.get(p).copied().unwrap_or(0) >= high)
    }
}

/// Observations not reached yet, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    queue: VecDeque<Observation>,
}

impl Pending {
    pub(crate) fn push(&mut self, o: Observation) {
        if self.queue.len() == MAX_PENDING {
            self.queue.pop_front();
        }
        self.queue.push_back(o);
    }

    /// The newest observation `next` has reached, removed together with every older one
    /// (high watermarks only grow, so an older one is reached too, or belongs to a log that
    /// was reset and says nothing any more).
    pub(crate) fn take_reached(&mut self, next: &BTreeMap<i32, i64>) -> Option<Observation> {
        let newest = self.queue.iter().rposition(|o| o.reached_by(next))?;
        self.queue.drain(..=newest).next_back()
    }

    /// When the oldest observation still waiting was taken.
    pub(crate) fn oldest_at(&self) -> Option<Instant> {
        self.queue.front().map(|o| o.at)
    }

    /// When the newest observation still waiting was taken.
    pub(crate) fn newest_at(&self) -> Option<Instant> {
        self.queue.back().map(|o| o.at)
    }
}

/// The fail-safe decision, shared by the listener and the checker thread. Every transition is
/// made under one mutex, so the two threads cannot undo each other's decision with a stale
/// view (a stop computed from an old lag landing after a resume).
pub(crate) struct FailSafe {
    bound: Option<Duration>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// `t` of the newest confirmed observation (at start: the instant before the listener
    /// read the watermarks it was assigned at).
    confirmed_at: Instant,
    /// The last time librdkafka reported the stream lost; cleared by a confirmation taken
    /// after it.
    lost_at: Option<Instant>,
    /// The lag went past the bound and has not come back under half of it.
    lagging: bool,
    /// The source lag went past the bound and has not come back under half of it.
    source_lagging: bool,
    /// The listener ended: never serve locally again.
    ended: bool,
    /// What binval's progress messages said.
    progress: Progress,
}

/// At most this many (source, partition) pairs are tracked; a source beyond it is ignored
/// (with a warning). A topic has a few sources and partitions.
const MAX_TRACKED: usize = 4096;

/// The newest progress message of one (source, partition).
#[derive(Debug, Clone)]
struct Seen {
    /// Its `lag_ms`.
    lag: Duration,
    /// When the listener received it (or when the pair started to count without one).
    at: Instant,
    /// Its per-slot lags, if it had any.
    masters: Option<Vec<MasterLag>>,
}

impl Seen {
    /// Lag of the replicas in `slot` (or of the whole source, `None`) at `now`.
    fn lag_at(&self, slot: Option<u16>, now: Instant) -> Duration {
        let lag = match (slot, &self.masters) {
            (Some(slot), Some(ranges)) => {
                ranges.iter().find(|r| (r.first_slot..=r.last_slot).contains(&slot)).map_or(self.lag, |r| Duration::from_millis(r.lag_ms))
            }
            _ => self.lag,
        };
        lag + now.saturating_duration_since(self.at)
    }
}

/// The source side as binval's progress messages describe it.
#[derive(Debug)]
struct Progress {
    /// The source lag counts: a progress message was seen, or they are required.
    on: bool,
    /// Since when it counts (build time with `require_progress`, else the first message): the
    /// lag while no message has been seen at all.
    since: Instant,
    /// Newest message per (source, partition).
    seen: HashMap<(String, i32), Seen>,
    /// Highest fencing token seen per source.
    tokens: HashMap<String, u64>,
}

/// What recording one progress message did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Taken.
    Taken,
    /// From an older tenure of its source (lower fencing token): ignored.
    OldTenure { highest: u64 },
    /// A new source beyond [`MAX_TRACKED`] pairs: ignored.
    TooMany,
}

impl FailSafe {
    #[cfg(test)]
    pub(crate) fn new(bound: Option<Duration>) -> Self {
        Self::with_progress(bound, false)
    }

    /// `require_progress`: the source lag counts from now on, even before a progress message.
    pub(crate) fn with_progress(bound: Option<Duration>, require_progress: bool) -> Self {
        let now = Instant::now();
        let progress = Progress { on: require_progress, since: now, seen: HashMap::new(), tokens: HashMap::new() };
        let state = State { confirmed_at: now, lost_at: None, lagging: false, source_lagging: false, ended: false, progress };
        FailSafe { bound, state: Mutex::new(state) }
    }

    /// The lag bound ([`crate::ConsumerBuilder::max_staleness`]).
    pub(crate) fn bound(&self) -> Option<Duration> {
        self.bound
    }

    /// Record progress message `m`, read from `partition` at `now`. `partitions`: every
    /// partition the listener reads: the first message of a source makes each of them count
    /// for that source from `now` on (a partition that then gets none grows old like one
    /// whose messages stopped).
    pub(crate) fn progress(&self, m: &ProgressMessage, partitions: impl Iterator<Item = i32>, now: Instant) -> Recorded {
        let mut st = self.lock();
        let p = &mut st.progress;
        let highest = p.tokens.get(m.source.as_str()).copied();
        if highest.is_some_and(|h| m.fencing_token < h) {
            return Recorded::OldTenure { highest: highest.unwrap_or(0) };
        }
        if highest.is_none() {
            let pairs: Vec<i32> = partitions.collect();
            if p.seen.len() + pairs.len() + 1 > MAX_TRACKED {
                return Recorded::TooMany;
            }
            if !p.on {
                p.on = true;
                p.since = now;
            }
            for q in pairs {
                p.seen.entry((m.source.clone(), q)).or_insert(Seen { lag: Duration::ZERO, at: now, masters: None });
            }
        }
        p.tokens.insert(m.source.clone(), m.fencing_token);
        let seen = Seen { lag: Duration::from_millis(m.lag_ms), at: now, masters: m.masters.clone() };
        p.seen.insert((m.source.clone(), m.partition), seen);
        Recorded::Taken
    }

    /// Partitions added to the topic (assigned from now on): they count for every source known
    /// from `now` on.
    pub(crate) fn partitions_added(&self, added: &[i32], now: Instant) {
        let mut st = self.lock();
        let p = &mut st.progress;
        let sources: Vec<String> = p.tokens.keys().cloned().collect();
        for s in sources {
            for &q in added {
                if p.seen.len() < MAX_TRACKED {
                    p.seen.entry((s.clone(), q)).or_insert(Seen { lag: Duration::ZERO, at: now, masters: None });
                }
            }
        }
    }

    /// The source lag at `now` (the worst (source, partition)); `None` while it does not count
    /// (no progress message seen and none required).
    pub(crate) fn source_lag(&self, now: Instant) -> Option<Duration> {
        let st = self.lock();
        source_lag_of(&st.progress, None, now, st.confirmed_at, self.slack())
    }

    /// How far a healthy stream's confirmation may trail `now` (two observation intervals):
    /// see [`source_lag_of`].
    fn slack(&self) -> Duration {
        observe_every(self.bound) * 2
    }

    /// The lag of each of `slots` (hash slots of a key's replicas) at `now`, per the newest
    /// progress messages (a slot outside every `masters` range has the source's lag); `None`
    /// while the source lag does not count.
    pub(crate) fn slot_lags(&self, slots: &[u16], now: Instant) -> Option<Vec<Duration>> {
        let st = self.lock();
        if !st.progress.on {
            return None;
        }
        Some(
            slots
                .iter()
                .map(|&slot| source_lag_of(&st.progress, Some(slot), now, st.confirmed_at, self.slack()).unwrap_or_default())
                .collect(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The listener starts from watermarks read at `at`: the stream is confirmed at `at`.
    pub(crate) fn start(&self, at: Instant) {
        self.lock().confirmed_at = at;
    }

    /// The listener reached an observation taken at `at`.
    pub(crate) fn confirmed(&self, at: Instant) {
        let mut st = self.lock();
        st.confirmed_at = st.confirmed_at.max(at);
    }

    /// The lag now: time since the newest confirmed observation was taken.
    pub(crate) fn lag(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.lock().confirmed_at)
    }

    /// librdkafka reported that events may be missed (every broker down, a fatal error):
    /// stop serving locally at once, without waiting for the bound.
    pub(crate) fn lost(&self, shared: &Shared, error: &KafkaError, topic: &str) {
        let mut st = self.lock();
        if st.lost_at.is_none() {
            warn!(topic, %error, "invalidation stream lost; bypassing the local cache until it is confirmed caught up again");
        }
        st.lost_at = Some(Instant::now());
        if shared.stop_serving_local() {
            shared.counters.fail_safe_engaged();
        }
    }

    /// The listener thread ended: bypass the local cache for good.
    pub(crate) fn end(&self, shared: &Shared) {
        self.lock().ended = true;
        shared.stop_serving_local();
    }

    /// Apply the bound at `now`: stop serving locally when the stream lag or the source lag is
    /// past it; resume (the local cache cleared first) when both are back under half of it and
    /// the stream is not lost. Also sets the lag gauges.
    pub(crate) fn evaluate(&self, shared: &Shared, now: Instant, topic: &str) {
        let mut st = self.lock();
        let lag = now.saturating_duration_since(st.confirmed_at);
        shared.counters.stream_lag(lag);
        let source_lag = source_lag_of(&st.progress, None, now, st.confirmed_at, self.slack());
        if let Some(l) = source_lag {
            shared.counters.source_lag(l);
        }
        if st.ended {
            return;
        }
        if let Some(bound) = self.bound {
            // Local serving stops a little before the bound: this runs at most every 100 ms
            // (after each poll), and a value served between two runs must not be older than
            // the bound (the fault benchmark served a few at 2.07 s with a 2 s bound).
            let engage = engage_at(bound);
            if !st.lagging && lag > engage {
                st.lagging = true;
                warn!(
                    topic,
                    lag_ms = lag.as_millis() as u64,
                    bound_ms = bound.as_millis() as u64,
                    "invalidation stream not confirmed within the bound; bypassing the local cache until it is"
                );
                if shared.stop_serving_local() {
                    shared.counters.fail_safe_engaged();
                }
            } else if st.lagging && lag <= bound / 2 {
                st.lagging = false;
            }
            let source_lag = source_lag.unwrap_or_default();
            if !st.source_lagging && source_lag > engage {
                st.source_lagging = true;
                warn!(
                    topic,
                    source_lag_ms = source_lag.as_millis() as u64,
                    bound_ms = bound.as_millis() as u64,
                    "binval's progress messages say the source side (its Redis writes) is behind the bound; bypassing the local cache, and Redis reads follow on_source_behind"
                );
                if shared.stop_serving_local() {
                    shared.counters.fail_safe_engaged();
                }
            } else if st.source_lagging && source_lag <= bound / 2 {
                st.source_lagging = false;
                info!(topic, source_lag_ms = source_lag.as_millis() as u64, "binval's progress messages say the source side caught up");
            }
        }
        if st.lost_at.is_some_and(|lost| st.confirmed_at > lost) {
            st.lost_at = None;
        }
        if !st.lagging && !st.source_lagging && st.lost_at.is_none() && shared.resume_serving_local() {
            info!(
                topic,
                lag_ms = lag.as_millis() as u64,
                "invalidation stream confirmed caught up; local cache cleared, serving locally again"
            );
        }
    }
}

/// The worst lag over every tracked (source, partition) at `now`, of `slot` (`None`: the
/// whole source); the time since the progress began to count while none is tracked; `None`
/// while it does not count.
///
/// Time without a progress message counts only up to what the stream confirms:
/// `confirmed_at` (every message the broker held then has been read) plus `slack` (how far a
/// healthy stream's confirmation trails: two observation intervals). A binval that stops
/// sending while the broker answers grows its lag by itself; a broker that stops answering
/// does not make binval look behind (the stream lag covers it: the local cache is bypassed and
/// Redis, which binval keeps writing while the broker is away, is read).
fn source_lag_of(p: &Progress, slot: Option<u16>, now: Instant, confirmed_at: Instant, slack: Duration) -> Option<Duration> {
    if !p.on {
        return None;
    }
    let upto = now.min(confirmed_at + slack);
    Some(p.seen.values().map(|s| s.lag_at(slot, upto)).max().unwrap_or_else(|| upto.saturating_duration_since(p.since)))
}

/// The lag past which local serving stops: the bound less its eighth, at most 250 ms (two
/// evaluation periods of the listener, which evaluates after every poll, at most 100 ms
/// apart), so a value served between two evaluations is still within the bound.
pub(crate) fn engage_at(bound: Duration) -> Duration {
    bound.saturating_sub((bound / 8).min(Duration::from_millis(250)))
}

/// What the checker thread tells the listener, in order (a partition is announced before any
/// observation that includes it).
pub(crate) enum FromChecker {
    /// Partitions that appeared in the metadata, with their low watermark (where to start).
    NewPartitions(Vec<(i32, i64)>),
    Observed(Observation),
}

/// How often the checker observes the watermarks: a quarter of the bound (so under a flowing
/// stream the lag stays near a quarter of the bound plus one fetch), between 25 ms and 1 s;
/// every second without a bound (to notice a lost stream is back).
pub(crate) fn observe_every(bound: Option<Duration>) -> Duration {
    bound.map_or(Duration::from_secs(1), |b| (b / 4).clamp(Duration::from_millis(25), Duration::from_secs(1)))
}

/// Start the checker thread: with its own librdkafka client (its ListOffsets requests must not
/// queue behind the listener's long-polling fetches on the same connection), it observes the
/// high watermarks of every known partition every [`observe_every`], re-reads the metadata
/// every `metadata_refresh` for partitions added to the topic, sends both to the listener and
/// applies the bound after each observation. It ends when `stop` is set or the listener is
/// gone; it is never joined (a request to a hung broker blocks it up to the request timeout).
pub(crate) fn spawn_checker(
    s: ListenerSettings,
    known: BTreeSet<i32>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    tx: Sender<FromChecker>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("binval-inval-check".into()).spawn(move || {
        let client = match listener::create_consumer(&s) {
            Ok(c) => c,
            Err(e) => {
                // Without observations the lag only grows: the bound bypasses the local cache.
                warn!(topic = %s.topic, error = %e, "lag checker could not start; the local cache will be bypassed after the bound");
                return;
            }
        };
        checker_loop(&client, &s, known, &shared, &stop, &tx);
        debug!(topic = %s.topic, "lag checker stopped");
    })?;
    Ok(())
}

fn checker_loop(
    client: &BaseConsumer,
    s: &ListenerSettings,
    mut known: BTreeSet<i32>,
    shared: &Shared,
    stop: &AtomicBool,
    tx: &Sender<FromChecker>,
) {
    let every = observe_every(s.max_staleness);
    // A watermark answer older than the bound could not confirm anything useful.
    let timeout = s.request_timeout.min(s.max_staleness.unwrap_or(s.request_timeout).max(Duration::from_millis(100)));
    let mut next_refresh = Instant::now() + s.metadata_refresh;
    while !stop.load(SeqCst) {
        let started = Instant::now();
        if started >= next_refresh {
            match new_partitions(client, s, &known, timeout) {
                Ok(new) if !new.is_empty() => {
                    known.extend(new.iter().map(|(p, _)| *p));
                    if tx.send(FromChecker::NewPartitions(new)).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(topic = %s.topic, error = %e, "invalidation listener: metadata refresh failed"),
            }
            next_refresh = Instant::now() + s.metadata_refresh;
        }
        let at = Instant::now();
        match highs(client, s, &known, timeout) {
            Ok(highs) => {
                if tx.send(FromChecker::Observed(Observation { at, highs })).is_err() {
                    return;
                }
            }
            Err(e) => debug!(topic = %s.topic, error = %e, "watermark observation failed"),
        }
        shared.fail_safe.evaluate(shared, Instant::now(), &s.topic);
        // Sleep in short steps, so that shutdown is noticed quickly.
        let next = started + every;
        while !stop.load(SeqCst) {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

/// The high watermark of every partition in `known`, in one ListOffsets request per broker
/// (timestamp "latest", -1, through `offsets_for_times`; the per-partition
/// `fetch_watermarks` costs two requests per partition, one after the other), bounded by
/// `timeout`. A partition answered with an error fails the whole observation.
fn highs(client: &BaseConsumer, s: &ListenerSettings, known: &BTreeSet<i32>, timeout: Duration) -> Result<BTreeMap<i32, i64>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for &p in known {
        tpl.add_partition_offset(&s.topic, p, Offset::End)?;
    }
    let answer = client.offsets_for_times(tpl, timeout)?;
    let highs: BTreeMap<i32, i64> = answer
        .elements()
        .iter()
        .map(|e| {
            e.error()?;
            match e.offset() {
                Offset::Offset(high) => Ok((e.partition(), high)),
                // No offset for "latest" (should not happen): no observation this time.
                _ => Err(KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::OffsetNotAvailable)),
            }
        })
        .collect::<Result<_, KafkaError>>()?;
    // An observation must cover every partition, or it could confirm one that was not read.
    if highs.len() != known.len() || !known.iter().all(|p| highs.contains_key(p)) {
        return Err(KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::OffsetNotAvailable));
    }
    Ok(highs)
}

/// Partitions of the topic not in `known`, with their low watermark.
fn new_partitions(
    client: &BaseConsumer,
    s: &ListenerSettings,
    known: &BTreeSet<i32>,
    timeout: Duration,
) -> Result<Vec<(i32, i64)>, crate::ConsumerError> {
    let ids = listener::partitions(client, s)?;
    ids.difference(known)
        .map(|&p| {
            let (low, _high) = client
                .fetch_watermarks(&s.topic, p, timeout)
                .map_err(|e| crate::ConsumerError::kafka(format!("fetch watermarks of topic `{}` partition {p}", s.topic), e))?;
            Ok((p, low))
        })
        .collect()
}

#[cfg(test)]
mod tests;
