//! Where an earlier `binval run` stopped, read back from the invalidation topic: used by the
//! start plan when no checkpoint (and no copy of it) survived ([`crate::binlog::start_plan`],
//! [`crate::ha::traces`]).
//!
//! # What a message vouches for
//!
//! Every invalidation event carries the source position of the transaction that made its
//! change (`InvalidationEvent::position`). `binval run` applies transactions in commit order,
//! one group after the other, and enqueues a group's events only after every Redis write of
//! the group is acknowledged (I1); within and across groups it enqueues them in non-decreasing
//! position order (a group's changes keep their transactions' order; a table-wide DDL ends its
//! group; every chunk of a large transaction carries the transaction's position). The producer
//! is idempotent with `acks=all`, so a partition holds a prefix of what was enqueued for it,
//! in order, without gaps. Hence, if the newest run event on partition `P` is at position `p_P`:
//!
//! * every event enqueued for `P` before it was delivered, and that is every event for `P` of
//!   a transaction *before* the one ending at `p_P` (events of that transaction itself may
//!   come after it, and a large transaction may be written only up to the chunk that event
//!   belongs to);
//! * every Redis write of every transaction before it was acknowledged.
//!
//! Nothing is known of `P` past `p_P`: events enqueued for it later may have been lost with
//! the process. So the safe resume point is the **oldest of the partitions' newest positions**
//! — take `m = min_P p_P`: each partition `P` has every event of a transaction before `m`
//! (`m <= p_P`), and Redis has every write before it. Resuming at the *start* of the
//! transaction ending at `m` re-applies that transaction and everything after it (fenced
//! writes make that a no-op where Redis has it; events go out again with the same versions,
//! which consumers ignore), and skips nothing. A partition that has been quiet for long pulls
//! the resume point back that far: safe, only slower (and refused when the binlog no longer
//! holds it). A partition that holds no run event at all bounds nothing and is named in the
//! report: an event binval enqueued for it before it ever delivered one there could have been
//! lost (the consumers' own fail safe covers such an instance; `binval republish` the rest).
//!
//! Positions are compared as fence positions ([`crate::write::fence`]), so after a primary
//! failover (other file names, same GTID numbering) they still order.
//!
//! # Which messages count
//!
//! [`classify`] decides per message: an invalidation event of `binval run` is a
//! [`Mark::Before`]; events other commands published (`binval replay`, `verify --repair` and
//! `bootstrap --publish`, marked with [`WRITER_HEADER`]; `binval republish`, marked with
//! [`REPUBLISHED_HEADER`]) are skipped — their versions are not the run's progress (a repair
//! writes at a snapshot's position, which can be ahead of what `run` applied); so are events of
//! keys no mapping of this source renders (another source publishing to the same topic: events
//! name no source, their keys do), and anything that is not an invalidation event. A **batch
//! message** (header `binval.kind: batch`, `kafka.event_format = "batched"`) counts like the
//! per-key event of its last transaction with one of this source's keys.
//!
//! A **progress message** (Kafka header [`KIND_HEADER`] = `progress`: binval sends one to each
//! partition every `kafka.progress_interval_ms`, saying "everything of the source up to
//! `position` is in Redis and its events are enqueued before me in this partition") of this
//! source (`source` = `source.name`) with a `position` is a [`Mark::Through`]: it vouches for
//! its position inclusive, so a quiet partition's bound is as recent as the last one. It is
//! read by its JSON fields (`schema` 1, `source`, `position`), not by a shared type, so this
//! reader does not depend on the sender's version; a binval that sends none leaves the events
//! alone to bound the partition. Messages of other kinds are skipped.
//!
//! # Cost
//!
//! Per partition, the last 256 messages are read (then 4x further back, up to
//! [`MAX_MESSAGES_PER_PARTITION`]) until a mark is found; a broker that reports no high
//! watermark (some Kafka-protocol brokers answer 0) is read from the start until it stays quiet
//! for 1.5 s (an empty partition: 0.3 s without a message).

use std::time::{Duration, Instant};

use binval_protocol::{InvalidationEvent, SourcePosition};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::error::{Error, TransientError};
use crate::kafka::{REPUBLISHED_HEADER, WRITER_HEADER};
use crate::write::fence::FenceRule;

/// Most messages read back per partition looking for a mark.
pub const MAX_MESSAGES_PER_PARTITION: i64 = 1 << 20;
/// Messages read at first from the end of each partition.
const FIRST_WINDOW: i64 = 256;
/// A broker without high watermarks: read until this long without a message.
const IDLE: Duration = Duration::from_millis(1500);
/// A partition whose watermarks are both 0 is empty when no message comes within this.
const EMPTY: Duration = Duration::from_millis(300);

type MarkConsumer = BaseConsumer<crate::security::kafka::SecurityContext>;

/// What one message says about the progress of the run that published it (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// An invalidation event of `binval run` for the transaction ending at this position:
    /// every transaction *before* that one is in Redis and its events for this partition were
    /// delivered.
    Before(SourcePosition),
    /// Everything up to and including the transaction ending at this position is in Redis, and
    /// its events for this partition were delivered (a progress message of the source).
    Through(SourcePosition),
}

impl Mark {
    /// The source position the mark is about.
    pub fn position(&self) -> &SourcePosition {
        match self {
            Mark::Before(p) | Mark::Through(p) => p,
        }
    }

    /// Ordering key under `fence`: the fence position, then `Before` before `Through` of the
    /// same position. `None` when the position gives no fence position here.
    fn key(&self, fence: &FenceRule) -> Option<(u64, u8)> {
        let p = fence.position(self.position()).ok()?.0;
        Some((p, matches!(self, Mark::Through(_)) as u8))
    }
}

/// How [`classify`] judged a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// It tells the run's progress.
    Mark(Mark),
    /// It does not (why, for the report).
    Skip(&'static str),
}

/// Kafka header naming what a message on the topic is when it is not an invalidation event
/// (`progress` for binval's progress messages).
pub const KIND_HEADER: &str = "binval.kind";

/// Which messages are this source's: progress messages naming `source.name`, events whose
/// key fits one of its mappings' key templates (a `truncate` event's key is the template).
pub struct Ours {
    source: String,
    resolver: crate::scan::keyspace::KeyResolver,
    templates: Vec<String>,
}

impl Ours {
    /// The messages of `cfg`'s source.
    pub fn of(cfg: &Config) -> Self {
        Ours {
            source: cfg.source.name.clone(),
            resolver: crate::scan::keyspace::KeyResolver::new(&cfg.mappings),
            templates: cfg.mappings.iter().flat_map(|m| m.keys.iter().cloned()).collect(),
        }
    }

    fn event(&self, ev: &InvalidationEvent) -> bool {
        match ev.op {
            binval_protocol::Op::Truncate => self.templates.contains(&ev.key),
            _ => self.resolver.owner(&ev.key).is_some(),
        }
    }
}

/// Judge one message of the topic by its headers (`(name, value)` pairs) and payload (module
/// docs, "Which messages count"), for the source `ours`.
pub fn classify<'h>(headers: impl IntoIterator<Item = (&'h str, Option<&'h [u8]>)>, payload: &[u8], ours: &Ours) -> Classified {
    let mut kind = None;
    for (name, value) in headers {
        if name == REPUBLISHED_HEADER {
            return Classified::Skip("republished by binval republish");
        }
        if name == WRITER_HEADER {
            return Classified::Skip("published by binval replay, verify --repair or bootstrap");
        }
        if name == KIND_HEADER {
            kind = Some(value.unwrap_or_default());
        }
    }
    match kind {
        None => {}
        Some(b"progress") => return progress(payload, ours),
        Some(b"batch") => return batch(payload, ours),
        Some(_) => return Classified::Skip("a message of another kind"),
    }
    match InvalidationEvent::from_json(payload) {
        Ok(ev) if ours.event(&ev) => Classified::Mark(Mark::Before(ev.position)),
        Ok(_) => Classified::Skip("events of keys no mapping of this source renders"),
        Err(_) => Classified::Skip("not an invalidation event"),
    }
}

/// A batch message (`kafka.event_format = "batched"`): it stands for its key changes, which
/// were enqueued together after the Redis writes of their group, so it vouches like the
/// per-key event of its last transaction that has one of this source's keys: a
/// [`Mark::Before`] of that transaction's position (conservative: the whole group is in fact
/// delivered for this partition).
fn batch(payload: &[u8], ours: &Ours) -> Classified {
    let Ok(b) = binval_protocol::BatchView::parse(payload) else { return Classified::Skip("an unreadable invalidation batch") };
    let mut last = None;
    for c in b.changes() {
        let mine = match c.op {
            binval_protocol::Op::Truncate => ours.templates.iter().any(|t| t == c.key),
            _ => ours.resolver.owner(c.key).is_some(),
        };
        if mine {
            last = Some(c.txn);
        }
    }
    match last {
        Some(t) => Classified::Mark(Mark::Before(t.position())),
        None => Classified::Skip("events of keys no mapping of this source renders"),
    }
}

/// A progress message (module docs): a [`Mark::Through`] when it is this source's, of schema
/// 1, with a position.
fn progress(payload: &[u8], ours: &Ours) -> Classified {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else { return Classified::Skip("an unreadable progress message") };
    if v["schema"].as_u64() != Some(1) {
        return Classified::Skip("a progress message of a schema this reader does not know");
    }
    if v["source"].as_str() != Some(ours.source.as_str()) {
        return Classified::Skip("progress messages of another source");
    }
    match serde_json::from_value::<SourcePosition>(v["position"].clone()) {
        Ok(p) => Classified::Mark(Mark::Through(p)),
        Err(_) => Classified::Skip("progress messages without a position (nothing applied yet in their tenure)"),
    }
}

/// The newest mark found on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMark {
    /// The partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
    /// What it vouches for.
    pub mark: Mark,
}

/// What the tail of the topic holds (see [`read`]).
#[derive(Debug, Clone, Default)]
pub struct TopicReport {
    /// The topic.
    pub topic: String,
    /// Its partitions.
    pub partitions: usize,
    /// Messages it holds (sum of high minus low watermarks; 0 when the broker reports none).
    pub messages: i64,
    /// Partitions holding at least one message.
    pub with_messages: Vec<i32>,
    /// The newest mark of each partition that has one.
    pub marks: Vec<PartitionMark>,
    /// Partitions with messages but no mark in what was read, and why.
    pub unmarked: Vec<(i32, String)>,
}

impl TopicReport {
    /// Whether the topic holds any message at all.
    pub fn has_messages(&self) -> bool {
        self.messages > 0 || !self.with_messages.is_empty()
    }

    /// The safe resume point: the oldest of the partitions' newest marks (module docs), under
    /// `fence`. `None` when no partition holds a mark. Marks whose position gives no fence
    /// position (another GTID domain) are skipped.
    pub fn resume_mark(&self, fence: &FenceRule) -> Option<&PartitionMark> {
        self.marks.iter().filter_map(|m| m.mark.key(fence).map(|k| (k, m))).min_by_key(|(k, _)| *k).map(|(_, m)| m)
    }

    /// One line: the topic, its marks per partition, the partitions without one.
    pub fn describe(&self) -> String {
        let mut marks: Vec<String> = self
            .marks
            .iter()
            .map(|m| {
                let p = m.mark.position();
                format!("partition {} offset {}: {}", m.partition, m.offset, p)
            })
            .collect();
        for (p, why) in &self.unmarked {
            marks.push(format!("partition {p}: no event of binval run ({why})"));
        }
        format!("topic {} ({} partitions, {} messages): {}", self.topic, self.partitions, self.messages, marks.join("; "))
    }
}

/// Read the tail of the configured topic (module docs). Blocking (librdkafka): call it from a
/// blocking thread. Errors: the broker does not answer or the topic has no partitions
/// (transient: the topic may be created later).
pub fn read(cfg: &Config) -> Result<TopicReport, Error> {
    let topic = cfg.kafka.topic.as_str();
    let ours = Ours::of(cfg);
    let consumer = consumer(cfg)?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| crate::kafka::no_broker_answered(&cfg.kafka, format!("metadata of topic {topic}: {e}")))?;
    let partitions: Vec<i32> = md.topics().first().map(|t| t.partitions().iter().map(|p| p.id()).collect()).unwrap_or_default();
    let mut report = TopicReport { topic: topic.to_string(), partitions: partitions.len(), ..TopicReport::default() };
    let mut found = Vec::new();
    let mut unknown = Vec::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_err(|e| TransientError::Kafka(format!("watermarks of {topic} partition {p}: {e}")))?;
        if high == 0 {
            // Empty, or a broker that reports no high watermark: read below.
            unknown.push(p);
        } else if high > low {
            report.messages += high - low;
            found.push((p, tail_mark(&consumer, topic, p, low, high, &ours)?));
        }
    }
    if !unknown.is_empty() {
        found.extend(scan_until_idle(&consumer, topic, &unknown, &ours)?);
    }
    found.sort_by_key(|(p, _)| *p);
    for (p, tail) in found {
        match tail {
            Tail { mark: Some(m), .. } => {
                report.with_messages.push(p);
                report.marks.push(m);
            }
            Tail { mark: None, read: 0, .. } => {}
            Tail { mark: None, read, why } => {
                report.with_messages.push(p);
                report.unmarked.push((p, format!("{read} messages read: {why}")));
            }
        }
    }
    Ok(report)
}

/// What reading back one partition found.
struct Tail {
    mark: Option<PartitionMark>,
    read: i64,
    why: String,
}

/// The newest mark of partition `p` (messages `low..high`): the last `FIRST_WINDOW`, then 4x
/// as many further back, until one is found or `MAX_MESSAGES_PER_PARTITION` were read.
fn tail_mark(consumer: &MarkConsumer, topic: &str, p: i32, low: i64, high: i64, ours: &Ours) -> Result<Tail, Error> {
    let (mut end, mut window, mut read) = (high, FIRST_WINDOW, 0i64);
    let mut skipped: Vec<&'static str> = Vec::new();
    loop {
        let start = (end - window).max(low);
        let msgs = read_range(consumer, topic, p, start, end, ours)?;
        read += end - start;
        let mut newest = None;
        for (offset, c) in msgs {
            match c {
                Classified::Mark(mark) => newest = Some(PartitionMark { partition: p, offset, mark }),
                Classified::Skip(why) => {
                    if !skipped.contains(&why) {
                        skipped.push(why)
                    }
                }
            }
        }
        if newest.is_some() {
            return Ok(Tail { mark: newest, read, why: String::new() });
        }
        if start <= low || read >= MAX_MESSAGES_PER_PARTITION {
            let why = if skipped.is_empty() { "none readable".to_string() } else { skipped.join(", ") };
            return Ok(Tail { mark: None, read, why });
        }
        end = start;
        window = window.saturating_mul(4);
    }
}

/// Messages `start..end` of partition `p`, classified, in offset order.
fn read_range(consumer: &MarkConsumer, topic: &str, p: i32, start: i64, end: i64, ours: &Ours) -> Result<Vec<(i64, Classified)>, Error> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, p, Offset::Offset(start)).expect("valid partition");
    consumer.assign(&tpl).map_err(|e| TransientError::Kafka(format!("assign {topic} partition {p}: {e}")))?;
    let mut out = Vec::with_capacity((end - start).clamp(0, 1 << 16) as usize);
    let mut last = Instant::now();
    while out.last().map(|(o, _)| *o + 1).unwrap_or(start) < end {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last = Instant::now();
                if m.offset() >= end {
                    break;
                }
                out.push((m.offset(), classify_message(&m, ours)));
            }
            Some(Err(e)) => return Err(TransientError::Kafka(format!("read {topic} partition {p}: {e}")).into()),
            None if last.elapsed() > Duration::from_secs(10) => {
                return Err(TransientError::Kafka(format!(
                    "read {topic} partition {p}: no message for 10 s before offset {end} (read up to {:?})",
                    out.last().map(|(o, _)| *o)
                ))
                .into())
            }
            None => {}
        }
    }
    Ok(out)
}

/// Partitions `ps` whose high watermark is 0 (empty, or a broker that reports none): read
/// together from their start until quiet ([`IDLE`]; [`EMPTY`] while nothing came at all).
fn scan_until_idle(consumer: &MarkConsumer, topic: &str, ps: &[i32], ours: &Ours) -> Result<Vec<(i32, Tail)>, Error> {
    let mut tpl = TopicPartitionList::new();
    for &p in ps {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("valid partition");
    }
    consumer.assign(&tpl).map_err(|e| TransientError::Kafka(format!("assign {topic} partitions {ps:?}: {e}")))?;
    let mut tails: Vec<(i32, Tail)> = ps.iter().map(|&p| (p, Tail { mark: None, read: 0, why: "no event of binval run".into() })).collect();
    let (mut read, mut last) = (0i64, Instant::now());
    while last.elapsed() < if read == 0 { EMPTY } else { IDLE } {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Instant::now();
                read += 1;
                let Some((_, tail)) = tails.iter_mut().find(|(p, _)| *p == m.partition()) else { continue };
                tail.read += 1;
                if let Classified::Mark(mark) = classify_message(&m, ours) {
                    tail.mark = Some(PartitionMark { partition: m.partition(), offset: m.offset(), mark });
                }
            }
            Some(Err(e)) => return Err(TransientError::Kafka(format!("read {topic}: {e}")).into()),
            None => {}
        }
    }
    Ok(tails)
}

fn classify_message<M: Message>(m: &M, ours: &Ours) -> Classified {
    let headers: Vec<(&str, Option<&[u8]>)> = m.headers().map(|h| h.iter().map(|h| (h.key, h.value)).collect()).unwrap_or_default();
    classify(headers, m.payload().unwrap_or_default(), ours)
}

/// A consumer outside any group's offsets (manual assignment, no commits), with the brokers'
/// security settings, as `binval republish` reads the topic.
fn consumer(cfg: &Config) -> Result<MarkConsumer, Error> {
    let mut cc = crate::security::kafka::client_config(&cfg.kafka)?;
    for (k, v) in cfg.kafka.properties.iter().filter(|(k, _)| ["ssl.", "sasl.", "security."].iter().any(|p| k.starts_with(p))) {
        cc.set(k, v);
    }
    cc.set("group.id", format!("binval-recovery-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10");
    Ok(cc.create_with_context(Default::default()).map_err(|e| TransientError::Kafka(format!("consumer: {e}")))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(file: &str, pos: u64, gtid: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schema": 1, "key": "k:1", "version": 1, "op": "update", "table": "a.b",
            "position": {"file": file, "pos": pos, "gtid": gtid}, "commit_time_ms": 0, "publish_time_ms": 0
        }))
        .unwrap()
    }

    #[test]
    fn only_run_events_are_marks() {
        let e = ev("b.000001", 100, "0-1-5");
        let at = SourcePosition { file: "b.000001".into(), pos: 100, gtid: Some("0-1-5".into()) };
        let cfg = |keys: &str| {
            crate::config::Config::from_toml(&format!(
                "[source]\nname = \"s\"\nurl = \"mysql://u@h:3306\"\nserver_id = 9\n[redis]\nmode = \"standalone\"\nurls = [\"redis://h:6379\"]\n[kafka]\nbrokers = \"h:9092\"\n[[mappings]]\ntable = \"a.b\"\nkeys = [\"{keys}\"]\nreplicas = 3\n"
            ))
            .unwrap()
        };
        let ours = Ours::of(&cfg("k:{id}"));
        assert_eq!(classify([], &e, &ours), Classified::Mark(Mark::Before(at.clone())));
        assert!(matches!(classify([(REPUBLISHED_HEADER, Some(&b"1"[..]))], &e, &ours), Classified::Skip(_)));
        assert!(matches!(classify([(WRITER_HEADER, Some(&b"repair"[..]))], &e, &ours), Classified::Skip(_)));
        assert!(matches!(classify([], b"{}", &ours), Classified::Skip(_)));
        assert!(matches!(classify([], &e, &Ours::of(&cfg("other:{id}"))), Classified::Skip(_)), "another source's event");
        // A batch vouches like the event of its last transaction with a key of this source.
        let later = SourcePosition { file: "b.000001".into(), pos: 200, gtid: Some("0-1-6".into()) };
        let mut b = binval_protocol::BatchBuilder::new();
        b.push(&at, 0, binval_protocol::Op::Update, 5, "a.b", "k:1").unwrap();
        b.push(&later, 0, binval_protocol::Op::Update, 6, "a.b", "k:2").unwrap();
        b.push(&SourcePosition { pos: 300, ..later.clone() }, 0, binval_protocol::Op::Update, 7, "x.y", "other:3").unwrap();
        let batch = b.finish(0);
        let kind = [(KIND_HEADER, Some(&b"batch"[..]))];
        assert_eq!(classify(kind, &batch, &ours), Classified::Mark(Mark::Before(later.clone())));
        assert!(matches!(classify(kind, &batch[..batch.len() - 1], &ours), Classified::Skip(_)), "a truncated batch");
        assert!(matches!(classify(kind, &batch, &Ours::of(&cfg("zzz:{id}"))), Classified::Skip(_)), "another source's batch");
        let progress = |source: &str, position: bool| {
            let mut v = serde_json::json!({"schema": 1, "source": source, "partition": 0, "commit_time_ms": 0, "lag_ms": 0, "fencing_token": 1, "publish_time_ms": 0});
            if position {
                v["position"] = serde_json::json!({"file": "b.000001", "pos": 100, "gtid": "0-1-5"});
            }
            serde_json::to_vec(&v).unwrap()
        };
        let kind = [(KIND_HEADER, Some(&b"progress"[..]))];
        assert_eq!(classify(kind, &progress("s", true), &ours), Classified::Mark(Mark::Through(at)));
        assert!(matches!(classify(kind, &progress("t", true), &ours), Classified::Skip(_)), "another source's progress");
        assert!(matches!(classify(kind, &progress("s", false), &ours), Classified::Skip(_)), "no position yet");
        assert!(matches!(classify([(KIND_HEADER, Some(&b"other"[..]))], &e, &ours), Classified::Skip(_)));
    }

    #[test]
    fn the_resume_mark_is_the_oldest_of_the_newest() {
        let fence = FenceRule { mode: crate::config::FenceMode::Gtid, domain: 0, epoch: 0 };
        let m = |partition: i32, seq: u64, through: bool| {
            let p = SourcePosition { file: "b.000001".into(), pos: 100 + seq, gtid: Some(format!("0-1-{seq}")) };
            PartitionMark { partition, offset: 0, mark: if through { Mark::Through(p) } else { Mark::Before(p) } }
        };
        let r = TopicReport { marks: vec![m(0, 9, false), m(1, 7, false), m(2, 8, false)], ..TopicReport::default() };
        assert_eq!(r.resume_mark(&fence).unwrap().partition, 1);
        let r = TopicReport { marks: vec![m(0, 7, true), m(1, 7, false)], ..TopicReport::default() };
        assert_eq!(r.resume_mark(&fence).unwrap().partition, 1, "before the transaction is older than through it");
        assert!(TopicReport::default().resume_mark(&fence).is_none());
    }
}
