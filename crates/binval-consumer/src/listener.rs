//! The invalidation listener: one dedicated OS thread per [`crate::Consumer`] that polls a
//! librdkafka consumer assigned to *every* partition of the topic and applies the events to
//! the local cache in batches: it waits up to 100 ms for a message, then takes everything
//! already queued (up to 1024 messages) and applies it at once ([`Shared::apply_batch`]:
//! one guard update and at most one eviction per distinct key). Readers never wait for the
//! listener: the local cache is a concurrent map and no lock is held across a batch.
//!
//! Why a thread and a `BaseConsumer` rather than a tokio task and a `StreamConsumer`: all the
//! work per event is synchronous (moka, a broadcast send), the metadata refresh is a blocking
//! librdkafka call, and a thread can be abandoned if librdkafka's teardown hangs, without
//! blocking an async runtime. Shutdown latency is bounded by the poll interval (100 ms).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_protocol::InvalidationEvent;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::error::ConsumerError;
use crate::state::Shared;

const POLL: Duration = Duration::from_millis(100);
/// How often metadata is re-read while the stream is lost (to notice it is back).
const LOST_REFRESH: Duration = Duration::from_secs(1);

pub(crate) struct ListenerSettings {
    pub brokers: String,
    pub topic: String,
    pub group_id: String,
    pub properties: Vec<(String, String)>,
    pub metadata_refresh: Duration,
    pub request_timeout: Duration,
    pub max_staleness: Option<Duration>,
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
        .set("enable.partition.eof", "false");
    for (k, v) in &s.properties {
        cfg.set(k, v);
    }
    cfg.create().map_err(|e| ConsumerError::kafka(format!("create consumer for brokers `{}`", s.brokers), e))
}

/// Partition ids of `topic`, from fresh metadata.
fn partitions(consumer: &BaseConsumer, s: &ListenerSettings) -> Result<BTreeSet<i32>, ConsumerError> {
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

/// Create the listener's librdkafka consumer and assign it every partition at its high
/// watermark ([`assign_all_at_end`]), on a blocking thread: metadata, watermarks and assign
/// are blocking librdkafka calls. Returns the consumer, the start offset per partition and the
/// settings (moved in and out of the blocking task).
pub(crate) async fn start_assigned(
    settings: ListenerSettings,
) -> Result<(BaseConsumer, BTreeMap<i32, i64>, ListenerSettings), ConsumerError> {
    tokio::task::spawn_blocking(move || {
        let consumer = create_consumer(&settings)?;
        let known = assign_all_at_end(&consumer, &settings)?;
        Ok::<_, ConsumerError>((consumer, known, settings))
    })
    .await
    .map_err(|e| ConsumerError::Config { field: "listener", reason: format!("startup task failed: {e}") })?
}

/// Sets the fail-safe when the listener thread ends for any reason other than shutdown
/// (including a panic), and signals whoever waits in `shutdown()`.
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
        self.shared.stop_serving_local();
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
    }
}

/// Start the listener thread. `done` fires after the librdkafka consumer was dropped.
pub(crate) fn spawn(
    consumer: BaseConsumer,
    known: BTreeMap<i32, i64>,
    settings: ListenerSettings,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> Result<oneshot::Receiver<()>, ConsumerError> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("binval-inval".into())
        .spawn(move || {
            let guard = ExitGuard { shared: shared.clone(), stop: stop.clone(), done: Some(tx) };
            let consumer = run(consumer, known, &settings, &shared, &stop);
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

/// Behind (or unconfirmed) this many bounds in a row: the consumer's broker connections are
/// presumed wedged (a half-open TCP connection, a broker that stopped answering on it) and the
/// librdkafka consumer is rebuilt at the positions read so far.
const REBUILD_AFTER_BOUNDS: u32 = 4;

/// The listener thread's body: until `stop`, take a batch of messages and apply it, react to
/// a Kafka error, run the lag check of the fail safe, refresh the metadata and publish the
/// hot-key gauges, each when due. Returns the librdkafka consumer, so that its (possibly
/// hanging) teardown happens in the caller.
fn run(consumer: BaseConsumer, starts: BTreeMap<i32, i64>, s: &ListenerSettings, shared: &Shared, stop: &AtomicBool) -> BaseConsumer {
    let mut l = Listener::new(consumer, starts, s, shared);
    info!(topic = %s.topic, partitions = l.known.len(), group_id = %s.group_id, "invalidation listener started");
    while !stop.load(SeqCst) {
        let (received, error) = l.poll_batch();
        if received > 0 {
            l.on_messages();
        }
        if let Some(e) = error {
            l.on_error(&e);
        }
        l.check_lag_if_due();
        l.refresh_if_due();
        l.publish_hot_keys_if_due();
    }
    info!(topic = %s.topic, "invalidation listener stopping");
    l.consumer
}

/// The state of the listener loop ([`run`]).
///
/// Two flags drive the fail safe, and the local cache is served only when both are clear:
/// `lost` (librdkafka reported the stream lost; cleared by a message or a metadata answer) and
/// `behind` (the lag check could not confirm reading up to the high watermarks within
/// `max_staleness`; cleared only by a successful check). Either one set stops serving locally;
/// clearing resumes it, which clears the local cache first.
struct Listener<'a> {
    s: &'a ListenerSettings,
    shared: &'a Shared,
    consumer: BaseConsumer,
    /// A second client only for the lag check: its watermark requests must not queue behind
    /// the main consumer's long-polling fetches on the same connection.
    checker: Option<BaseConsumer>,
    /// Partitions assigned so far.
    known: BTreeSet<i32>,
    /// Next offset to read per partition (for the lag check and gap detection).
    next_offset: BTreeMap<i32, i64>,
    lost: bool,
    behind: bool,
    last_caught_up: Instant,
    next_check: Instant,
    next_refresh: Instant,
    next_hot: Instant,
    batch: Vec<InvalidationEvent>,
}

impl<'a> Listener<'a> {
    fn new(consumer: BaseConsumer, starts: BTreeMap<i32, i64>, s: &'a ListenerSettings, shared: &'a Shared) -> Self {
        let known: BTreeSet<i32> = starts.keys().copied().collect();
        let checker = s.max_staleness.and_then(|_| create_consumer(s).map_err(|e| warn!(error = %e, "lag checker not started")).ok());
        Listener {
            s,
            shared,
            consumer,
            checker,
            known,
            next_offset: starts,
            lost: false,
            behind: false,
            last_caught_up: Instant::now(),
            next_check: Instant::now() + s.max_staleness.map(|b| b / 2).unwrap_or(Duration::MAX / 4),
            next_refresh: Instant::now() + s.metadata_refresh,
            next_hot: Instant::now(),
            batch: Vec::with_capacity(MAX_BATCH),
        }
    }

    /// Wait up to POLL for the first message, then take whatever else is already queued
    /// (without waiting), up to [`MAX_BATCH`], parsing each into the batch. Returns the number
    /// of messages received and the error that ended the batch, if one did.
    fn poll_batch(&mut self) -> (usize, Option<KafkaError>) {
        let (s, shared) = (self.s, self.shared);
        let mut wait = POLL;
        let mut received = 0usize;
        while received < MAX_BATCH {
            match self.consumer.poll(wait) {
                None => break,
                Some(Ok(msg)) => {
                    received += 1;
                    wait = Duration::ZERO;
                    let n = self.next_offset.entry(msg.partition()).or_insert(msg.offset());
                    if msg.offset() > *n {
                        // Offsets of this topic are contiguous (binval's producer is not
                        // transactional, the topic is not compacted): a jump means events were
                        // lost to retention or a broker log loss. Entries they would have
                        // evicted may be cached: clear the local cache.
                        warn!(topic = %s.topic, partition = msg.partition(), expected = *n, got = msg.offset(), "gap in the invalidation stream; clearing the local cache");
                        // (While not serving locally, the coming resume clears it anyway.)
                        if shared.is_serving_local() {
                            shared.stop_serving_local();
                            shared.resume_serving_local();
                        }
                    }
                    *n = (*n).max(msg.offset() + 1);
                    if let Some(ev) = parse_message(shared, msg.topic(), msg.partition(), msg.offset(), msg.payload()) {
                        self.batch.push(ev);
                    }
                }
                Some(Err(e)) => return (received, Some(e)),
            }
        }
        (received, None)
    }

    /// Messages arrived: the stream is back if it was lost (and the lag check is not failing);
    /// apply the batch.
    fn on_messages(&mut self) {
        if self.lost && !self.behind {
            self.lost = false;
            if self.shared.resume_serving_local() {
                info!(topic = %self.s.topic, "invalidation stream is back (message received); local cache cleared, serving locally again");
            }
        }
        if !self.batch.is_empty() {
            self.shared.apply_batch(&self.batch);
            self.batch.clear();
        }
    }

    /// A Kafka error from `poll`: when events may be missed ([`stream_lost`]), stop serving
    /// locally and look at the metadata soon (to notice the stream is back); else log it.
    fn on_error(&mut self, e: &KafkaError) {
        let s = self.s;
        if stream_lost(e) {
            if !self.lost {
                warn!(topic = %s.topic, error = %e, "invalidation stream lost; bypassing the local cache until it is back");
            }
            self.lost = true;
            self.shared.stop_serving_local();
            self.next_refresh = self.next_refresh.min(Instant::now() + LOST_REFRESH);
        } else {
            warn!(topic = %s.topic, error = %e, "invalidation listener: kafka error");
        }
    }

    /// Every half `max_staleness`: confirm every partition was read up to the broker's high
    /// watermark now (resuming if the check had been failing), then enforce the bound.
    fn check_lag_if_due(&mut self) {
        let s = self.s;
        let (Some(bound), Some(check), true) = (s.max_staleness, self.checker.as_ref(), Instant::now() >= self.next_check) else {
            return;
        };
        let started = Instant::now();
        match caught_up(check, s, &self.next_offset, bound / 2) {
            Ok(true) => {
                self.last_caught_up = started;
                if self.behind {
                    self.behind = false;
                    self.lost = false;
                    if self.shared.resume_serving_local() {
                        info!(topic = %s.topic, "invalidation stream caught up again; local cache cleared, serving locally again");
                    }
                }
            }
            Ok(false) => debug!(topic = %s.topic, "listener behind the high watermark"),
            Err(e) => debug!(topic = %s.topic, error = %e, "lag check failed"),
        }
        self.enforce_lag_bound(bound);
        self.next_check = Instant::now() + bound / 2;
    }

    /// Not confirmed caught up for longer than `bound`: stop serving locally (invariant I5).
    /// For [`REBUILD_AFTER_BOUNDS`] bounds: rebuild the librdkafka consumer (and the checker)
    /// at the positions read so far.
    fn enforce_lag_bound(&mut self, bound: Duration) {
        let s = self.s;
        if !self.behind && self.last_caught_up.elapsed() > bound {
            warn!(topic = %s.topic, bound_ms = bound.as_millis() as u64, "invalidation stream not confirmed caught up within the bound; bypassing the local cache until it is");
            self.behind = true;
            self.shared.stop_serving_local();
        }
        if self.behind && self.last_caught_up.elapsed() > bound * REBUILD_AFTER_BOUNDS {
            match rebuild(s, &self.next_offset) {
                Ok(c) => {
                    info!(topic = %s.topic, "invalidation consumer rebuilt (connections presumed wedged); reading on from the last positions");
                    self.consumer = c;
                    self.checker = create_consumer(s).ok();
                }
                Err(e) => warn!(topic = %s.topic, error = %e, "rebuilding the invalidation consumer failed; retrying later"),
            }
            self.last_caught_up = Instant::now() - bound - Duration::from_millis(1);
        }
    }

    /// Every `metadata_refresh` (every [`LOST_REFRESH`] while the stream is lost): re-read the
    /// metadata, assign new partitions; an answer while lost means the stream is back.
    fn refresh_if_due(&mut self) {
        let s = self.s;
        if Instant::now() < self.next_refresh {
            return;
        }
        match refresh(&self.consumer, s, &mut self.known) {
            Ok(()) => {
                if self.lost && !self.behind {
                    self.lost = false;
                    if self.shared.resume_serving_local() {
                        info!(topic = %s.topic, "invalidation stream is back (metadata answered); local cache cleared, serving locally again");
                    }
                }
            }
            Err(e) => warn!(topic = %s.topic, error = %e, "invalidation listener: metadata refresh failed"),
        }
        self.next_refresh = Instant::now() + if self.lost { LOST_REFRESH } else { s.metadata_refresh };
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

/// A new consumer assigned at `next` (the next offset to read per partition).
fn rebuild(s: &ListenerSettings, next: &BTreeMap<i32, i64>) -> Result<BaseConsumer, ConsumerError> {
    let c = create_consumer(s)?;
    let mut tpl = TopicPartitionList::new();
    for (&p, &o) in next {
        tpl.add_partition_offset(&s.topic, p, Offset::Offset(o))
            .map_err(|e| ConsumerError::kafka(format!("build assignment for partition {p}"), e))?;
    }
    c.assign(&tpl).map_err(|e| ConsumerError::kafka(format!("assign topic `{}`", s.topic), e))?;
    Ok(c)
}

/// Whether every partition was read up to the high watermark the broker reports now. Errors
/// when a watermark request fails or times out (`timeout` each).
fn caught_up(consumer: &BaseConsumer, s: &ListenerSettings, next: &BTreeMap<i32, i64>, timeout: Duration) -> Result<bool, KafkaError> {
    for (&p, &n) in next {
        let (_low, high) = consumer.fetch_watermarks(&s.topic, p, timeout)?;
        metrics::gauge!("binval_consumer_partition_lag_messages", "partition" => p.to_string()).set((high - n).max(0) as f64);
        if n < high {
            return Ok(false);
        }
    }
    Ok(true)
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

/// Re-read metadata; assign partitions that appeared since the last look, from their start
/// (they are younger than this listener, so everything in them is new to it).
fn refresh(consumer: &BaseConsumer, s: &ListenerSettings, known: &mut BTreeSet<i32>) -> Result<(), ConsumerError> {
    let ids = partitions(consumer, s)?;
    let new: Vec<i32> = ids.difference(known).copied().collect();
    if new.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for &p in &new {
        tpl.add_partition_offset(&s.topic, p, Offset::Beginning)
            .map_err(|e| ConsumerError::kafka(format!("build assignment for partition {p}"), e))?;
    }
    consumer
        .incremental_assign(&tpl)
        .map_err(|e| ConsumerError::kafka(format!("assign new partitions {new:?} of topic `{}`", s.topic), e))?;
    info!(topic = %s.topic, new_partitions = ?new, total = ids.len(), "topic grew; assigned new partitions from their beginning");
    known.extend(new);
    Ok(())
}

/// Parse one topic message into an event; a message without payload or that does not parse
/// is logged (topic, partition, offset, error), counted and skipped.
pub(crate) fn parse_message(
    shared: &Shared,
    topic: &str,
    partition: i32,
    offset: i64,
    payload: Option<&[u8]>,
) -> Option<InvalidationEvent> {
    let Some(payload) = payload else {
        shared.counters.bad_message();
        warn!(topic, partition, offset, "skipping invalidation message without payload");
        return None;
    };
    match InvalidationEvent::from_json(payload) {
        Ok(ev) => Some(ev),
        Err(e) => {
            shared.counters.bad_message();
            warn!(topic, partition, offset, error = %e, "skipping invalidation message that does not parse");
            None
        }
    }
}
