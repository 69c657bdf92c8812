//! The invalidation listener: one dedicated OS thread per [`crate::Consumer`] that polls a
//! librdkafka consumer assigned to *every* partition of the topic and applies the events to
//! the local cache in batches: it waits up to 100 ms for a message, then takes everything
//! already queued (up to 1024 messages) and applies it at once ([`Shared::apply_batch`]:
//! one guard update and at most one eviction per distinct key). Readers never wait for the
//! listener: the local cache is a concurrent map and no lock is held across a batch.
//!
//! binval's progress messages (header `binval.kind: progress`, [`binval_protocol::progress`])
//! come on the same partitions: they are told apart by the header before decoding
//! ([`decode_topic_message`]), never applied as invalidations, and handed to the fail safe
//! (the source lag) after the events read before them in the batch. One that does not decode
//! is counted and skipped like a bad event.
//!
//! A second thread, the lag checker (`fail_safe.rs`), observes the high watermarks and the
//! metadata with its own client and sends them here; the listener confirms an observation once
//! its positions reach it, which is what the fail safe measures the lag by. Nothing on this
//! thread waits for the broker except `poll` (at most 100 ms), so the events flow on while a
//! watermark or metadata request is slow, and the fail safe's bound is applied at least every
//! 100 ms.
//!
//! Why a thread and a `BaseConsumer` rather than a tokio task and a `StreamConsumer`: all the
//! work per event is synchronous (moka, a broadcast send), and a thread can be abandoned if
//! librdkafka's teardown hangs, without blocking an async runtime. Shutdown latency is bounded
//! by the poll interval (100 ms).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_protocol::{BatchView, InvalidationEvent, ProgressMessage, KIND_BATCH, KIND_HEADER, KIND_PROGRESS};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::error::ConsumerError;
use crate::fail_safe::{self, FromChecker, Pending, Recorded};
use crate::metric_names;
use crate::state::{BatchScratch, Shared};

/// The longest wait of one `poll` for the first message of a batch. A message that arrives
/// during the wait is returned at once; this only bounds how often an idle listener looks at
/// the fail safe and the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// The listener's default `fetch.wait.max.ms` (see [`create_consumer`]).
pub(crate) const DEFAULT_FETCH_WAIT_MS: &str = "10";

#[derive(Debug, Clone)]
pub(crate) struct ListenerSettings {
    pub brokers: String,
    pub topic: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    pub metadata_refresh: Duration,
    pub request_timeout: Duration,
    pub max_staleness: Option<Duration>,
    /// Messages longer than this are counted as bad and skipped
    /// ([`crate::ConsumerBuilder::max_message_bytes`]).
    pub max_message_bytes: usize,
}

pub(crate) fn create_consumer(s: &ListenerSettings) -> Result<BaseConsumer, ConsumerError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &s.brokers)
        // A group.id is required by librdkafka even for assign(); it is unique per instance
        // and never used for a group join or an offset commit.
        .set("group.id", &s.group_id)
        .set("client.id", &s.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Only reached when a fetch position is out of range (retention deleted unread data,
        // or the broker lost its log). Re-reading events is harmless (the evict rule is
        // idempotent), skipping them is not.
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // How long the broker may hold a fetch that finds nothing new. Kafka answers a fetch
        // as soon as `fetch.min.bytes` (1) is there, so on Kafka this only sets how often an
        // idle listener asks again; tansu (the test and demo broker) holds every fetch for
        // the whole wait, even with data, so there it is the floor of the eviction latency:
        // librdkafka's 500 ms default gave p50 ~380 ms / p99 ~500 ms publish -> applied, 10 ms
        // gives ~10-20 ms / ~17-76 ms at 20-1000 events/s on a fresh topic (docs/benchmarks.md,
        // "Kafka leg under load"). See
        // `ConsumerBuilder::kafka_property` for what to set on a large Kafka cluster.
        .set("fetch.wait.max.ms", DEFAULT_FETCH_WAIT_MS);
    for (k, v) in &s.properties {
        cfg.set(k, v);
    }
    cfg.create().map_err(|e| ConsumerError::kafka(format!("create consumer for brokers `{}`", s.brokers), e))
}

/// Partition ids of `topic`, from fresh metadata.
pub(crate) fn partitions(consumer: &BaseConsumer, s: &ListenerSettings) -> Result<BTreeSet<i32>, ConsumerError> {
    let md = consumer
        .fetch_metadata(Some(&s.topic), s.request_timeout)
        .map_err(|e| ConsumerError::kafka(format!("fetch metadata of topic `{}`", s.topic), e))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == s.topic) else {
        return Err(ConsumerError::Config {
            field: "topic",
            reason: format!("brokers `{}` returned no metadata for topic `{}`", s.brokers, s.topic),
        });
    };
    if let Some(err) = t.error() {
        return Err(ConsumerError::Config {
            field: "topic",
            reason: format!("topic `{}` on brokers `{}`: {:?}", s.topic, s.brokers, RDKafkaErrorCode::from(err)),
        });
    }
    let ids: BTreeSet<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if ids.is_empty() {
        return Err(ConsumerError::Config {
            field: "topic",
            reason: format!("topic `{}` on brokers `{}` has no partitions (does it exist?)", s.topic, s.brokers),
        });
    }
    Ok(ids)
}

/// Assign every partition of the topic at its current high watermark (blocking).
///
/// The high watermark is read explicitly instead of assigning `Offset::End`: with `End`,
/// librdkafka resolves "the end" only when its fetcher starts, some time after `assign()`
/// returned, and a message published in between would be skipped. Reading the watermarks
/// first means every message published after this function returns is consumed.
pub(crate) fn assign_all_at_end(consumer: &BaseConsumer, s: &ListenerSettings) -> Result<BTreeMap<i32, i64>, ConsumerError> {
    let ids = partitions(consumer, s)?;
    let mut starts = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for &p in &ids {
        let (_low, high) = consumer
            .fetch_watermarks(&s.topic, p, s.request_timeout)
            .map_err(|e| ConsumerError::kafka(format!("fetch watermarks of topic `{}` partition {p}", s.topic), e))?;
        tpl.add_partition_offset(&s.topic, p, Offset::Offset(high))
            .map_err(|e| ConsumerError::kafka(format!("build assignment for partition {p}"), e))?;
        starts.insert(p, high);
        debug!(topic = %s.topic, partition = p, offset = high, "assigning partition at its high watermark");
    }
    consumer.assign(&tpl).map_err(|e| ConsumerError::kafka(format!("assign {} partitions of topic `{}`", ids.len(), s.topic), e))?;
    Ok(starts)
}

/// What [`start_assigned`] returns: the consumer, the start offset per partition, when
/// those offsets were read (the stream is confirmed up to then) and the settings.
pub(crate) type Started = (BaseConsumer, BTreeMap<i32, i64>, Instant, ListenerSettings);

/// Create the listener's librdkafka consumer and assign it every partition at its high
/// watermark ([`assign_all_at_end`]), on a blocking thread: metadata, watermarks and assign
/// are blocking librdkafka calls. The settings are moved in and out of the blocking task.
pub(crate) async fn start_assigned(settings: ListenerSettings) -> Result<Started, ConsumerError> {
    tokio::task::spawn_blocking(move || {
        let consumer = create_consumer(&settings)?;
        let at = Instant::now();
        let known = assign_all_at_end(&consumer, &settings)?;
        Ok::<_, ConsumerError>((consumer, known, at, settings))
    })
    .await
    .map_err(|e| ConsumerError::Config { field: "listener", reason: format!("startup task failed: {e}") })?
}

/// Ends the fail safe for good when the listener thread ends for any reason (including a
/// panic; on shutdown too), and signals whoever waits in `shutdown()`.
struct ExitGuard {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    done: Option<oneshot::Sender<()>>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if !self.stop.load(SeqCst) {
            warn!("binval-consumer invalidation listener ended unexpectedly; local cache bypassed from now on");
        }
        // Without a listener nothing evicts: never serve locally again.
        self.shared.fail_safe.end(&self.shared);
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
    }
}

/// Start the listener thread and its lag checker ([`fail_safe::spawn_checker`]). `confirmed_at`
/// is when the start offsets `known` were read (the stream is confirmed up to then). `done`
/// fires after the librdkafka consumer was dropped.
pub(crate) fn spawn(
    consumer: BaseConsumer,
    known: BTreeMap<i32, i64>,
    confirmed_at: Instant,
    settings: ListenerSettings,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> Result<oneshot::Receiver<()>, ConsumerError> {
    shared.fail_safe.start(confirmed_at);
    let (to_listener, from_checker) = mpsc::channel();
    fail_safe::spawn_checker(settings.clone(), known.keys().copied().collect(), shared.clone(), stop.clone(), to_listener)
        .map_err(|e| ConsumerError::Config { field: "listener", reason: format!("cannot start the lag checker thread: {e}") })?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("binval-inval".into())
        .spawn(move || {
            let guard = ExitGuard { shared: shared.clone(), stop: stop.clone(), done: Some(tx) };
            let consumer = run(consumer, known, from_checker, &settings, &shared, &stop);
            // librdkafka teardown (rd_kafka_consumer_close + destroy) happens here and can
            // hang; shutdown() only waits a bounded time for `done`.
            drop(consumer);
            drop(guard);
        })
        .map_err(|e| ConsumerError::Config { field: "listener", reason: format!("cannot start listener thread: {e}") })?;
    Ok(rx)
}

/// At most this many messages are taken from librdkafka's queue and applied as one batch.
const MAX_BATCH: usize = 1024;

/// The broker has answered the checker with events the listener's consumer did not receive,
/// and the consumer received nothing at all, for this many bounds: its broker connections are
/// presumed wedged (a half-open TCP connection, a broker that stopped answering on it) and the
/// librdkafka consumer is rebuilt. A busy stream (messages arriving) or a broker that answers
/// nobody (frozen: rebuilding would not help) never triggers it.
const REBUILD_AFTER_BOUNDS: u32 = 4;

/// The listener thread's body: until `stop`, take a batch of messages and apply it, react to
/// a Kafka error, take the checker's observations and new partitions, confirm what the
/// positions reached, apply the fail safe's bound, rebuild a wedged consumer and publish the
/// hot-key gauges, each when due. Returns the librdkafka consumer, so that its (possibly
/// hanging) teardown happens in the caller.
fn run(
    consumer: BaseConsumer,
    starts: BTreeMap<i32, i64>,
    from_checker: Receiver<FromChecker>,
    s: &ListenerSettings,
    shared: &Shared,
    stop: &AtomicBool,
) -> BaseConsumer {
    let mut l = Listener::new(consumer, starts, from_checker, s, shared);
    info!(topic = %s.topic, partitions = l.next_offset.len(), group_id = %s.group_id, "invalidation listener started");
    while !stop.load(SeqCst) {
        let (received, error) = l.poll_batch();
        if received > 0 {
            l.last_message = Instant::now();
        }
        if !l.batch.is_empty() {
            shared.apply_batch(&l.batch);
            l.batch.clear();
        }
        // After the events read before them: a progress message speaks for them too.
        l.record_progress();
        if let Some(e) = error {
            l.on_error(&e);
        }
        l.take_from_checker();
        l.confirm();
        shared.fail_safe.evaluate(shared, Instant::now(), &s.topic);
        l.rebuild_if_wedged();
        l.publish_hot_keys_if_due();
    }
    info!(topic = %s.topic, "invalidation listener stopping");
    l.consumer
}

/// The state of the listener loop ([`run`]). The fail safe's decision lives in
/// [`crate::fail_safe::FailSafe`]; the listener feeds it confirmations (watermark observations
/// its positions reached) and lost-stream errors.
struct Listener<'a> {
    s: &'a ListenerSettings,
    shared: &'a Shared,
    consumer: BaseConsumer,
    from_checker: Receiver<FromChecker>,
    checker_gone: bool,
    /// Next offset to read per assigned partition (what observations are compared with, and
    /// gap detection).
    next_offset: BTreeMap<i32, i64>,
    /// Where a rebuilt consumer starts each partition: the high watermark of the newest
    /// confirmed observation (at first the start offset). It is at or before `next_offset`,
    /// so a rebuild re-reads a few events (harmless: the evict rule is idempotent) rather than
    /// starting inside a record batch; see [`Listener::rebuild_if_wedged`].
    restart_at: BTreeMap<i32, i64>,
    /// Partitions of the first assignment (at their high watermarks, with the local cache
    /// empty) not read from yet. Their first message may lie past the start offset without a
    /// gap: tansu 0.6 answers ListOffsets(latest) with the base offset of its newest record
    /// batch plus one, which lies inside that batch when it holds several records, and answers
    /// a fetch from inside a batch with the next one. The records skipped were stored before
    /// the watermark was read, so before anything was cached, and every later fill reads
    /// Redis, which already holds their changes (invariant I1): nothing they would evict can
    /// be cached. A jump after the first message, or on a partition added later (assigned at
    /// its low watermark, with the cache in use), is a gap.
    unread: BTreeSet<i32>,
    /// Observations the positions have not reached yet.
    pending: Pending,
    /// New partitions whose assignment failed; retried every loop.
    unassigned: Vec<(i32, i64)>,
    last_message: Instant,
    next_hot: Instant,
    batch: Vec<InvalidationEvent>,
    /// Progress messages of the current batch, recorded after its events were applied.
    progress: Vec<ProgressMessage>,
    /// Reused by every batch message ([`Shared::apply_batch_view`]).
    scratch: BatchScratch,
}

impl<'a> Listener<'a> {
    fn new(
        consumer: BaseConsumer,
        starts: BTreeMap<i32, i64>,
        from_checker: Receiver<FromChecker>,
        s: &'a ListenerSettings,
        shared: &'a Shared,
    ) -> Self {
        Listener {
            s,
            shared,
            consumer,
            from_checker,
            checker_gone: false,
            restart_at: starts.clone(),
            unread: starts.keys().copied().collect(),
            next_offset: starts,
            pending: Pending::default(),
            unassigned: Vec::new(),
            last_message: Instant::now(),
            next_hot: Instant::now(),
            batch: Vec::with_capacity(MAX_BATCH),
            progress: Vec::new(),
            scratch: BatchScratch::default(),
        }
    }

    /// Wait up to POLL for the first message, then take whatever else is already queued
    /// (without waiting), up to [`MAX_BATCH`], parsing each into the batch. Returns the number
    /// of messages received and the error that ended the batch, if one did.
    fn poll_batch(&mut self) -> (usize, Option<KafkaError>) {
        let (s, shared) = (self.s, self.shared);
        let mut wait = POLL;
        let mut received = 0usize;
        let mut bytes = 0u64;
        while received < MAX_BATCH {
            match self.consumer.poll(wait) {
                None => break,
                Some(Ok(msg)) => {
                    received += 1;
                    bytes += msg.payload_len() as u64;
                    wait = Duration::ZERO;
                    let first = self.unread.remove(&msg.partition());
                    let n = self.next_offset.entry(msg.partition()).or_insert(msg.offset());
                    if msg.offset() > *n && first {
                        // The start offset lay inside a record batch and the broker answered
                        // with the next batch: not a gap (see `unread`).
                        info!(topic = %s.topic, partition = msg.partition(), start = *n, first = msg.offset(), "the partition's first event lies past its start offset (the broker's high watermark was inside a record batch); nothing was cached then, nothing to clear");
                    } else if msg.offset() > *n {
                        // Offsets of this topic are contiguous (binval's producer is idempotent,
                        // not transactional: no control records; the topic is not compacted),
                        // and the listener only ever starts a partition at a high watermark or
                        // its low watermark, which are record batch boundaries. So a jump means
                        // events were lost to retention or a broker log loss, and entries they
                        // would have evicted may be cached: clear the local cache.
                        //
                        // (Under load this warning used to fire after the false-alarm rebuilds
                        // of issue #15: the rebuilt consumer started at the next offset, which
                        // can lie inside a record batch, and tansu, unlike Kafka, answers a
                        // fetch from inside a batch with the *next* batch: it serves batches by
                        // base offset. The events in between were really never delivered. A
                        // rebuild now starts at the last confirmed high watermark instead, and
                        // a flowing stream no longer causes rebuilds.)
                        warn!(topic = %s.topic, partition = msg.partition(), expected = *n, got = msg.offset(), "gap in the invalidation stream; clearing the local cache");
                        shared.counters.stream_gap();
                        shared.clear_local();
                    }
                    *n = (*n).max(msg.offset() + 1);
                    let kind = kind_header(&msg);
                    if kind == Some(KIND_BATCH.as_bytes()) {
                        // A batch message (`binval.kind: batch`): the per-key events read before
                        // it first (per-key order across formats), then its changes, straight
                        // from the payload.
                        if !self.batch.is_empty() {
                            shared.apply_batch(&self.batch);
                            self.batch.clear();
                        }
                        match decode_batch(msg.payload(), s.max_message_bytes) {
                            Ok(b) => {
                                shared.apply_batch_view(&b, &mut self.scratch, false);
                            }
                            Err(e) => {
                                shared.counters.bad_message();
                                warn!(topic = msg.topic(), partition = msg.partition(), offset = msg.offset(), error = %e, "skipping invalidation message");
                            }
                        }
                        continue;
                    }
                    match parse_message(shared, s.max_message_bytes, msg.topic(), msg.partition(), msg.offset(), kind, msg.payload()) {
                        Some(TopicMessage::Event(ev)) => self.batch.push(ev),
                        Some(TopicMessage::Progress(p)) => self.progress.push(p),
                        // Not built from a message with this header (handled above).
                        Some(TopicMessage::Batch(evs)) => self.batch.extend(evs),
                        None => {}
                    }
                }
                Some(Err(e)) => {
                    shared.counters.received(received as u64, bytes);
                    return (received, Some(e));
                }
            }
        }
        shared.counters.received(received as u64, bytes);
        (received, None)
    }

    /// Hand the batch's progress messages to the fail safe (source lag). One from an older
    /// tenure of its source is ignored (logged at debug); one beyond the tracking bound is
    /// counted as bad.
    fn record_progress(&mut self) {
        if self.progress.is_empty() {
            return;
        }
        let now = Instant::now();
        for p in self.progress.drain(..) {
            match self.shared.fail_safe.progress(&p, self.next_offset.keys().copied(), now) {
                Recorded::Taken => self.shared.counters.progress_message(),
                Recorded::OldTenure { highest } => {
                    debug!(topic = %self.s.topic, source = %p.source, token = p.fencing_token, highest, "progress message of an older tenure ignored")
                }
                Recorded::TooMany => {
                    self.shared.counters.bad_message();
                    warn!(topic = %self.s.topic, source = %p.source, "progress message of one source too many ignored");
                }
            }
        }
    }

    /// A Kafka error from `poll`: when events may be missed ([`stream_lost`]), stop serving
    /// locally until the stream is confirmed again; else log it.
    fn on_error(&mut self, e: &KafkaError) {
        if stream_lost(e) {
            self.shared.fail_safe.lost(self.shared, e, &self.s.topic);
        } else {
            warn!(topic = %self.s.topic, error = %e, "invalidation listener: kafka error");
        }
    }

    /// Take what the checker sent: observations to confirm, partitions to assign (from their
    /// low watermark: they are younger than this listener, so everything in them is new to it).
    fn take_from_checker(&mut self) {
        loop {
            match self.from_checker.try_recv() {
                Ok(FromChecker::Observed(o)) => {
                    for (&p, &high) in &o.highs {
                        let next = self.next_offset.get(&p).copied().unwrap_or(high);
                        metrics::gauge!(metric_names::PARTITION_LAG_MESSAGES, "partition" => p.to_string())
                            .set((high - next).max(0) as f64);
                    }
                    self.pending.push(o)
                }
                Ok(FromChecker::NewPartitions(new)) => {
                    for &(p, low) in &new {
                        self.next_offset.entry(p).or_insert(low);
                        self.restart_at.entry(p).or_insert(low);
                    }
                    let added: Vec<i32> = new.iter().map(|(p, _)| *p).collect();
                    self.shared.fail_safe.partitions_added(&added, Instant::now());
                    self.unassigned.extend(new);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if !self.checker_gone {
                        // No more observations: the lag grows, and the bound stops local serving.
                        warn!(topic = %self.s.topic, "lag checker ended; the local cache will be bypassed after the bound");
                        self.checker_gone = true;
                    }
                    break;
                }
            }
        }
        if self.unassigned.is_empty() {
            return;
        }
        match assign_more(&self.consumer, self.s, &self.unassigned) {
            Ok(()) => {
                info!(topic = %self.s.topic, new_partitions = ?self.unassigned, total = self.next_offset.len(), "topic grew; assigned new partitions from their low watermark");
                self.unassigned.clear();
            }
            Err(e) => warn!(topic = %self.s.topic, error = %e, "assigning new partitions failed; retrying"),
        }
    }

    /// Confirm the newest observation the positions reached (after the batch that reached it
    /// was applied).
    fn confirm(&mut self) {
        if let Some(o) = self.pending.take_reached(&self.next_offset) {
            self.shared.fail_safe.confirmed(o.at);
            self.restart_at.extend(o.highs);
        }
    }

    /// The consumer's connections look wedged ([`REBUILD_AFTER_BOUNDS`]): replace the
    /// librdkafka consumer by a new one assigned at `restart_at`.
    ///
    /// Why `restart_at` (the last confirmed high watermarks) and not the next offsets: a next
    /// offset can lie inside a record batch (a batch was only partly taken), and tansu serves
    /// a fetch from inside a batch with the following batch, silently skipping the rest (Kafka
    /// returns the whole batch and librdkafka drops the records before the fetch offset). A
    /// high watermark is always a batch boundary. The old consumer is dropped on a thread of
    /// its own: its teardown on a wedged connection can hang.
    fn rebuild_if_wedged(&mut self) {
        let s = self.s;
        let (Some(bound), Some(oldest), Some(newest)) = (s.max_staleness, self.pending.oldest_at(), self.pending.newest_at()) else {
            return;
        };
        let now = Instant::now();
        let wedged_for = bound * REBUILD_AFTER_BOUNDS;
        let broker_answers = now.saturating_duration_since(newest) <= bound;
        if !broker_answers || now.saturating_duration_since(oldest) < wedged_for || self.last_message.elapsed() < wedged_for {
            return;
        }
        self.last_message = now;
        match assign_new_consumer(s, &self.restart_at) {
            Ok(c) => {
                let old = std::mem::replace(&mut self.consumer, c);
                let _ = std::thread::Builder::new().name("binval-inval-drop".into()).spawn(move || drop(old));
                self.shared.counters.listener_rebuild();
                // The cache may be in use now: a jump before the first message is a gap.
                self.unread.clear();
                info!(topic = %s.topic, from = ?self.restart_at, "invalidation consumer rebuilt (the broker reports events it did not deliver; connections presumed wedged); reading on from the last confirmed watermarks");
            }
            Err(e) => warn!(topic = %s.topic, error = %e, "rebuilding the invalidation consumer failed; retrying later"),
        }
    }

    /// Once per hot-key window: set the hot-key gauges.
    fn publish_hot_keys_if_due(&mut self) {
        if let Some(hot) = &self.shared.hot {
            if Instant::now() >= self.next_hot {
                hot.publish_metrics();
                self.next_hot = Instant::now() + hot.window();
            }
        }
    }
}

/// A new consumer assigned at `at` (offset per partition).
fn assign_new_consumer(s: &ListenerSettings, at: &BTreeMap<i32, i64>) -> Result<BaseConsumer, ConsumerError> {
    let c = create_consumer(s)?;
    let mut tpl = TopicPartitionList::new();
    for (&p, &o) in at {
        tpl.add_partition_offset(&s.topic, p, Offset::Offset(o))
            .map_err(|e| ConsumerError::kafka(format!("build assignment for partition {p}"), e))?;
    }
    c.assign(&tpl).map_err(|e| ConsumerError::kafka(format!("assign topic `{}`", s.topic), e))?;
    Ok(c)
}

/// Add partitions to the assignment, each at its given offset.
fn assign_more(consumer: &BaseConsumer, s: &ListenerSettings, new: &[(i32, i64)]) -> Result<(), ConsumerError> {
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in new {
        tpl.add_partition_offset(&s.topic, p, Offset::Offset(o))
            .map_err(|e| ConsumerError::kafka(format!("build assignment for partition {p}"), e))?;
    }
    consumer.incremental_assign(&tpl).map_err(|e| ConsumerError::kafka(format!("assign new partitions of topic `{}`", s.topic), e))
}

/// Errors after which events may be missed: every broker is unreachable, or librdkafka
/// declared the client unusable.
fn stream_lost(e: &KafkaError) -> bool {
    match e {
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::MessageConsumption(code) | KafkaError::Global(code) => {
            matches!(code, RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::Fatal)
        }
        _ => false,
    }
}

mod decode;
use decode::kind_header;
pub(crate) use decode::parse_message;
pub(crate) use decode::DEFAULT_MAX_MESSAGE_BYTES;
pub use decode::{decode_batch, decode_message, decode_topic_message, BadMessage, TopicMessage};
