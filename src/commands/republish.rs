//! `binval republish`: publish the invalidation events of a past time range again, so app
//! instances that missed them (partitioned from the broker, restarted from the newest offset,
//! a consumer bug) apply them now.
//!
//! # Why this is safe
//!
//! The evict rule makes applying an event idempotent: an event with version `v` evicts only
//! entries cached at a lower version, and every version is the source position of a change
//! (see `binval_protocol::fence`). Re-published events therefore evict exactly the entries that
//! are older than the change they describe, and nothing else, however often they arrive. They
//! carry a `binval.republished: 1` Kafka header and the original payload (version, commit time,
//! position), so the consumers' invalidation-lag metrics show them as old events.
//!
//! The range is given by time (Kafka message timestamps, resolved per partition with
//! `offsets_for_times`) or by explicit `partition:offset` starts; it ends at `--to` (time) or
//! where the reading first reaches each partition's end (at or after its end when the command
//! started). Nothing in Redis changes; the
//! checkpoint is not touched.
//!
//! # Formats
//!
//! Each message is published again in the format it was read in, whatever
//! `kafka.event_format` says now: a per-key event with its key (the producer's partitioner puts
//! it on the partition it came from), a batch (`binval.kind: batch`) to the partition it was
//! read from. So re-publishing never moves a key to another partition, and never sends a batch
//! to apps that only ever read per-key events from this topic.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

/// The consumer republish reads the topic with.
type RepublishConsumer = BaseConsumer<crate::security::kafka::SecurityContext>;
use serde::Serialize;

use crate::config::Config;
use crate::error::{Error, TransientError};
use crate::kafka::KafkaSink;

/// Where re-publishing starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepublishFrom {
    /// Kafka message time, Unix ms.
    Time(u64),
    /// Explicit start offset per partition.
    Offsets(Vec<(i32, i64)>),
}

/// Why a `--from` of `binval republish` does not parse; each names the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRepublishFrom {
    /// Neither a date-time nor a list of `PARTITION:OFFSET`.
    #[error("--from `{0}`: expected a UTC date-time or PARTITION:OFFSET[,...]")]
    Form(String),
    /// A date-time before 1970.
    #[error("--from `{0}`: the time is before 1970-01-01")]
    BeforeEpoch(String),
    /// A partition that is not a number.
    #[error("--from `{text}`: bad partition `{partition}`")]
    Partition { text: String, partition: String },
    /// An offset that is not a number.
    #[error("--from `{text}`: bad offset `{offset}`")]
    Offset { text: String, offset: String },
}

impl RepublishFrom {
    /// Parse a UTC date-time (`2026-11-30 12:00:00`) or `P:O[,P:O...]` partition offsets.
    pub fn parse(s: &str) -> Result<Self, BadRepublishFrom> {
        let s = s.trim();
        if let Ok(t) = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')) {
            let ms = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| BadRepublishFrom::BeforeEpoch(s.to_string()))?.as_millis() as u64;
            return Ok(RepublishFrom::Time(ms));
        }
        let mut v = Vec::new();
        for part in s.split(',') {
            let (p, o) = part.split_once(':').ok_or_else(|| BadRepublishFrom::Form(s.to_string()))?;
            let p: i32 = p.trim().parse().map_err(|_| BadRepublishFrom::Partition { text: s.to_string(), partition: p.to_string() })?;
            let o: i64 = o.trim().parse().map_err(|_| BadRepublishFrom::Offset { text: s.to_string(), offset: o.to_string() })?;
            v.push((p, o));
        }
        Ok(RepublishFrom::Offsets(v))
    }
}

/// Totals, printed as one JSON line.
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct RepublishSummary {
    /// Events (key changes) read in the range; a batch message counts its key changes.
    pub read: u64,
    /// Events (key changes) published again (0 in a dry run).
    pub republished: u64,
    /// Messages skipped because they are not invalidation events (reported, never re-sent).
    /// binval's progress messages are neither counted nor re-sent.
    pub skipped: u64,
    /// Whether nothing was published.
    pub dry_run: bool,
    /// Events (key changes) a run without `--dry-run` would publish again (= `read`); 0 when
    /// not a dry run.
    pub would_republish: u64,
    /// Messages in the range (a batch is one message; progress messages not counted).
    pub messages: u64,
    /// Per partition, the range read: first and last offset of its messages in the range and
    /// their events.
    pub partitions: BTreeMap<i32, PartitionRange>,
}

/// What one partition contributed to a republish ([`RepublishSummary::partitions`]).
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct PartitionRange {
    /// Offset of the first message in the range.
    pub first_offset: i64,
    /// Offset of the last message in the range.
    pub last_offset: i64,
    /// Events (key changes) of its messages.
    pub events: u64,
}

/// `binval republish` from the command line: validate `--from` / `--to` (errors name the flag,
/// exit code 2), re-publish, print the summary as one JSON line.
pub async fn cli(cfg: &Config, from: &str, to: Option<&str>, dry_run: bool) -> Result<(), Error> {
    let from = RepublishFrom::parse(from).map_err(|r| Error::config("--from", r.to_string()))?;
    let to = match to {
        Some(t) => match RepublishFrom::parse(t) {
            Ok(RepublishFrom::Time(ms)) => Some(ms),
            _ => return Err(Error::config("--to", format!("`{t}`: expected a UTC date-time"))),
        },
        None => None,
    };
    if let (RepublishFrom::Time(a), Some(b)) = (&from, to) {
        if b < *a {
            return Err(Error::config("--to", "the end time is before --from"));
        }
    }
    let summary = run(cfg, &from, to, dry_run).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

/// Re-publish the events of the configured topic from `from` until `to_ms` (message time,
/// inclusive) or the partitions' ends (see `read_range`). Errors: a bad partition (definite), broker
/// unreachable (transient).
pub async fn run(cfg: &Config, from: &RepublishFrom, to_ms: Option<u64>, dry_run: bool) -> Result<RepublishSummary, Error> {
    let topic = cfg.kafka.topic.clone();
    let consumer = consumer(cfg)?;
    let sink = if dry_run { None } else { Some(KafkaSink::connect(&cfg.kafka).await?) };
    let (mut summary, deliveries) = tokio::task::block_in_place(|| -> Result<(RepublishSummary, Vec<_>), Error> {
        let (partitions, ends) = partitions_and_ends(&consumer, &topic)?;
        let tpl = start_offsets(&consumer, &topic, from, &partitions, &ends)?;
        read_range(&consumer, &tpl, &ends, from, to_ms, dry_run)
    })?;
    if dry_run {
        summary.would_republish = summary.read;
    }
    if let Some(sink) = sink {
        let mut futs = Vec::with_capacity(deliveries.len());
        for m in &deliveries {
            let f = match m.batch_partition {
                Some(p) => sink.enqueue_raw_batch(p, &m.payload).await?,
                None => sink.enqueue_raw(&m.key, &m.payload).await?,
            };
            futs.push((f, m.events));
        }
        for (f, events) in futs {
            match f.await {
                Ok(Ok(_)) => summary.republished += events,
                Ok(Err(e)) => return Err(TransientError::Kafka(format!("republish: {e}")).into()),
                Err(_) => return Err(TransientError::Kafka("republish cancelled".into()).into()),
            }
        }
    }
    Ok(summary)
}

/// A consumer outside any group's offsets (manual assignment, no commits), with the brokers'
/// security settings (typed, and raw `ssl.*` / `sasl.*` / `security.*` properties).
fn consumer(cfg: &Config) -> Result<RepublishConsumer, Error> {
    let mut cc = crate::security::kafka::client_config(&cfg.kafka)?;
    for (k, v) in cfg.kafka.properties.iter().filter(|(k, _)| ["ssl.", "sasl.", "security."].iter().any(|p| k.starts_with(p))) {
        cc.set(k, v);
    }
    cc.set("group.id", format!("binval-republish-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        // The end of each partition is where the reader reaches the high watermark of a fetch
        // response (see `read_range`).
        .set("enable.partition.eof", "true");
    Ok(cc.create_with_context(Default::default()).map_err(|e| TransientError::Kafka(format!("consumer: {e}")))?)
}

/// The topic's partitions and the end offset (high watermark) of each at start. A topic
/// without partitions is an error naming `kafka.topic`.
fn partitions_and_ends(consumer: &RepublishConsumer, topic: &str) -> Result<(Vec<i32>, BTreeMap<i32, i64>), Error> {
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| TransientError::Kafka(format!("metadata of {topic}: {e}")))?;
    let partitions: Vec<i32> = md.topics().first().map(|t| t.partitions().iter().map(|p| p.id()).collect()).unwrap_or_default();
    if partitions.is_empty() {
        return Err(Error::config("kafka.topic", format!("topic {topic} has no partitions (does it exist?)")));
    }
    let mut ends = BTreeMap::new();
    for &p in &partitions {
        let (_, high) =
            consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).map_err(|e| TransientError::Kafka(format!("watermarks: {e}")))?;
        ends.insert(p, high);
    }
    Ok((partitions, ends))
}

/// The start offset of each partition: by time, or as given (a partition the topic does not
/// have is an error naming `--from`).
fn start_offsets(
    consumer: &RepublishConsumer,
    topic: &str,
    from: &RepublishFrom,
    partitions: &[i32],
    ends: &BTreeMap<i32, i64>,
) -> Result<TopicPartitionList, Error> {
    let mut tpl = TopicPartitionList::new();
    match from {
        RepublishFrom::Time(ms) => {
            let mut q = TopicPartitionList::new();
            for &p in partitions {
                q.add_partition_offset(topic, p, Offset::Offset(*ms as i64)).expect("valid partition");
            }
            // offsets_for_times (Kafka ListOffsets by timestamp) where the broker answers it;
            // otherwise (some Kafka-protocol brokers do not) start at the low watermark. The
            // message-time filter in read_range makes both exact.
            let found = consumer.offsets_for_times(q, Duration::from_secs(10)).ok();
            for &p in partitions {
                let by_time = found.as_ref().and_then(|f| f.find_partition(topic, p)).and_then(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                });
                let start = match by_time {
                    Some(o) => o,
                    None => {
                        consumer
                            .fetch_watermarks(topic, p, Duration::from_secs(10))
                            .map_err(|e| TransientError::Kafka(format!("watermarks: {e}")))?
                            .0
                    }
                };
                tracing::debug!(partition = p, ?by_time, start, end = ends[&p], "republish start offset");
                tpl.add_partition_offset(topic, p, Offset::Offset(start)).expect("valid partition");
            }
        }
        RepublishFrom::Offsets(v) => {
            for (p, o) in v {
                if !partitions.contains(p) {
                    return Err(Error::config("--from", format!("topic {topic} has no partition {p} (partitions: {partitions:?})")));
                }
                tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).expect("valid partition");
            }
        }
    }
    Ok(tpl)
}

/// One message to publish again.
struct Resend {
    key: Vec<u8>,
    payload: Vec<u8>,
    /// `Some(partition)` for a batch message (re-sent there), `None` for a per-key event.
    batch_partition: Option<i32>,
    /// Key changes it carries.
    events: u64,
}

/// Read each partition from its start in `tpl` to its end, keeping the invalidation events
/// within the time range (key, payload).
///
/// A partition ends where the reader first reaches the high watermark of a fetch response
/// (librdkafka's partition EOF), at or after `ends` (its ListOffsets end at start): everything
/// that was in the partition when the command started is read, and perhaps a few newer events
/// (harmless: the evict rule is idempotent). Nothing is sent before the whole range is read,
/// so the re-published events themselves are never read back. Why not stop at `ends`: tansu
/// 0.6 answers ListOffsets(latest) with its newest record batch's base offset plus one, which
/// lies inside that batch when it holds several events, so the tail of the range was lost
/// (`tests/recovery.rs`, the republish runbook, failed on it).
fn read_range(
    consumer: &RepublishConsumer,
    tpl: &TopicPartitionList,
    ends: &BTreeMap<i32, i64>,
    from: &RepublishFrom,
    to_ms: Option<u64>,
    dry_run: bool,
) -> Result<(RepublishSummary, Vec<Resend>), Error> {
    // Brokers that report no usable high watermark (some Kafka-protocol implementations
    // answer 0) are read until they stay quiet for IDLE instead.
    const IDLE: Duration = Duration::from_millis(1500);
    // Partitions not read to their end yet (partition EOF).
    let mut remaining: BTreeSet<i32> = BTreeSet::new();
    let mut by_idle = false;
    for e in tpl.elements() {
        if let Offset::Offset(o) = e.offset() {
            let end = ends[&e.partition()];
            if end > 0 || o == 0 {
                remaining.insert(e.partition());
            } else {
                by_idle = true;
            }
        }
    }
    let mut last_msg = Instant::now();
    consumer.assign(tpl).map_err(|e| TransientError::Kafka(format!("assign: {e}")))?;
    let mut summary = RepublishSummary { dry_run, ..Default::default() };
    let mut to_send: Vec<Resend> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while (!remaining.is_empty() || (by_idle && last_msg.elapsed() < IDLE)) && Instant::now() < deadline {
        let m = match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            Some(Err(KafkaError::PartitionEOF(p))) => {
                remaining.remove(&p);
                continue;
            }
            Some(m) => m.map_err(|e| TransientError::Kafka(format!("read: {e}")))?,
        };
        let (p, o) = (m.partition(), m.offset());
        if is_progress(&m) {
            // binval's own progress messages (`write::progress`) say how far the writer was
            // then; re-sending them would say it again, out of date. A running binval sends
            // them all the time, so they do not count as activity for the idle end either.
            continue;
        }
        last_msg = Instant::now();
        let ts = m.timestamp().to_millis().map(|t| t.max(0) as u64);
        if let (Some(to), Some(ts)) = (to_ms, ts) {
            if ts > to {
                remaining.remove(&p);
                continue;
            }
        }
        if let (RepublishFrom::Time(from_ms), Some(ts)) = (from, ts) {
            if ts < *from_ms {
                continue;
            }
        }
        let payload = m.payload().unwrap_or_default();
        let (batch_partition, events) = if is_batch(&m) {
            match binval_protocol::BatchView::parse(payload) {
                Ok(b) => (Some(p), b.change_count as u64),
                Err(e) => {
                    tracing::warn!(partition = p, offset = o, error = %e, "not an invalidation batch; not re-published");
                    summary.skipped += 1;
                    continue;
                }
            }
        } else {
            if binval_protocol::InvalidationEvent::from_json(payload).is_err() {
                tracing::warn!(partition = p, offset = o, "not an invalidation event; not re-published");
                summary.skipped += 1;
                continue;
            }
            (None, 1)
        };
        summary.read += events;
        summary.messages += 1;
        let range = summary.partitions.entry(p).or_insert(PartitionRange { first_offset: o, last_offset: o, events: 0 });
        range.last_offset = o;
        range.events += events;
        to_send.push(Resend { key: m.key().unwrap_or_default().to_vec(), payload: payload.to_vec(), batch_partition, events });
    }
    if !remaining.is_empty() {
        return Err(TransientError::Kafka(format!(
            "partitions {:?} were not read to their end within 300 s; nothing was re-published (rerun with a narrower range)",
            remaining.iter().collect::<Vec<_>>()
        ))
        .into());
    }
    Ok((summary, to_send))
}

/// A message with the header `binval.kind: progress` ([`binval_protocol::KIND_HEADER`]).
fn is_progress<M: Message>(m: &M) -> bool {
    use rdkafka::message::Headers;
    m.headers().is_some_and(|h| {
        h.iter().any(|h| h.key == binval_protocol::KIND_HEADER && h.value == Some(binval_protocol::KIND_PROGRESS.as_bytes()))
    })
}

/// A batch message: the header `binval.kind: batch` ([`binval_protocol::KIND_BATCH`]).
fn is_batch<M: Message>(m: &M) -> bool {
    use rdkafka::message::Headers;
    m.headers()
        .is_some_and(|h| h.iter().any(|h| h.key == binval_protocol::KIND_HEADER && h.value == Some(binval_protocol::KIND_BATCH.as_bytes())))
}
