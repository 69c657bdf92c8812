//! Kafka stage: one invalidation event per key change, keyed by the logical key so every
//! change of a key lands on one partition in order. The producer is idempotent with
//! `acks=all` (Kafka docs: `enable.idempotence`), so retries inside librdkafka neither reorder
//! nor duplicate within a session.
//!
//! Sending only enqueues; the returned [`DeliveryFuture`]s go to the checkpoint stage, which
//! advances the checkpoint past a transaction only when all of its events are acknowledged.
//!
//! # Formats (`kafka.event_format`)
//!
//! * `per_key` (default): one JSON [`InvalidationEvent`] per key change, keyed by the logical
//!   key; librdkafka's partitioner picks the partition.
//! * `batched`: a [`Publisher`] gathers the key changes of one group (one chunk of a large
//!   transaction; the `truncate` events of one statement) per partition and enqueues one
//!   [`binval_protocol::batch`] message per partition (more when one would exceed
//!   [`BATCH_MAX_BYTES`]), with the header `binval.kind: batch`, to an explicit partition:
//!   the one librdkafka's partitioner gives the key ([`Partitioner`]), so a key's changes stay
//!   on one partition across formats. The producer compresses (`compression.type` lz4 unless
//!   set in `kafka.properties`).
//!
//! Either way the deliveries go to the checkpoint stage in enqueue order, and the checkpoint
//! moves past a group only when every message of it is acknowledged (I3).
//!
//! Errors are classified by [`crate::error::classify_kafka`]: an event Kafka will never take
//! (too large, not authorised, no such topic while binval may not create it, an invalid
//! setting) is definite and names key and topic; anything else is retried.

use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

use binval_protocol::batch::{change_bytes, txn_bytes, BatchBuilder};
use binval_protocol::{InvalidationEvent, Op, ProgressMessage, SourcePosition, KIND_BATCH, KIND_HEADER, KIND_PROGRESS};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;

use crate::config::{EventFormat, KafkaConfig};
use crate::error::{classify_kafka, kafka_is_definite, DefiniteError, Error, TransientError};
use crate::kafka::producer::{DeliveryFuture, EventProducer};
use crate::kafka::Partitioner;
use crate::security::kafka::SecurityContext;

/// librdkafka's default `queue.buffering.max.messages` (CONFIGURATION.md).
const LIBRDKAFKA_QUEUE_MESSAGES: usize = 100_000;

/// Kafka header naming the command that published an event when it is not `binval run`
/// (`replay`, `repair`, `bootstrap`; [`KafkaSink::with_writer`]): their versions are not the
/// run's progress, so the topic's recovery reader (`ha::topic_marks`) skips them.
pub const WRITER_HEADER: &str = "binval.writer";
/// Kafka header of events `binval republish` published again.
pub const REPUBLISHED_HEADER: &str = "binval.republished";

/// The largest batch payload binval builds, bytes (uncompressed): a partition's share of a group
/// beyond it goes out as several messages, each well under Kafka's default 1 MiB
/// `message.max.bytes` and binval-consumer's default `max_message_bytes` (also 1 MiB).
pub const BATCH_MAX_BYTES: usize = 256 << 10;

/// The invalidation event producer.
pub struct KafkaSink {
    /// `kafka.event_format`.
    format: EventFormat,
    /// The producer's partitioner, for the batched format.
    partitioner: Partitioner,
    /// Partitions of the topic, from the newest metadata ([`KafkaSink::partitions`]).
    partition_count: AtomicI32,
    producer: EventProducer,
    topic: String,
    create_topic: bool,
    /// `queue.buffering.max.messages`: how many events the producer holds before enqueue waits.
    queue_capacity: usize,
    /// [`WRITER_HEADER`] of every event, unless this is `binval run`'s producer.
    writer: Option<&'static str>,
}

impl KafkaSink {
    /// Create the producer and, if configured, the topic. Errors are transient (the broker may
    /// come up later), except those [`kafka_is_definite`] names (authentication and
    /// authorisation failures, an invalid setting, a missing topic binval may not create) and
    /// a TLS or SASL failure librdkafka reported meanwhile
    /// ([`crate::security::kafka::SecurityContext`]): those are definite configuration errors
    /// naming the `kafka` setting.
    pub async fn connect(cfg: &KafkaConfig) -> Result<Self, Error> {
        let mut cc = crate::security::kafka::client_config(cfg)?;
        // Defaults, each overridable in `kafka.properties`:
        // - linger.ms 5 (librdkafka's own default): under load, a produce request carries the
        //   events of several groups. With 1 ms, binval used 142 µs of CPU per single-row
        //   transaction at ~2,500 commits/s on a 2-core machine (a third of it in librdkafka's
        //   broker thread), with 5 ms 87 µs (docs/benchmarks.md, "Under load"). It adds at most
        //   5 ms to commit -> event.
        // - queue.buffering.max.kbytes 65536: the producer's queue holds at most 64 MiB of
        //   events not yet delivered (librdkafka's default is 1 GiB): with the broker away,
        //   binval waits (the queue is full) instead of growing (invariant I6).
        // - message.timeout.ms 300000 (librdkafka's default): a broker away for minutes delays
        //   the acknowledgements (and the checkpoint) but does not end the tenure; while it
        //   is away the Redis writes go on until the queue above is full (issue #22), and
        //   `binval_kafka_unacked_seconds` with a warning every 3 s says that it waits.
        // - compression.type lz4 with the batched format: a batch message carries many keys with
        //   common prefixes, and its fixed-width fields are mostly zeros.
        if cfg.event_format == EventFormat::Batched {
            cc.set("compression.type", "lz4");
        }
        cc.set("linger.ms", "5")
            .set("queue.buffering.max.kbytes", "65536")
            .set("message.timeout.ms", "300000")
            .set("socket.keepalive.enable", "true");
        for (k, v) in &cfg.properties {
            cc.set(k, v);
        }
        // Always: the guarantees binval documents depend on them.
        cc.set("enable.idempotence", "true").set("acks", "all");
        let context = SecurityContext::default();
        let producer = EventProducer::create(&cc, context.clone()).map_err(|e| connect_error(&e, cfg, "producer", &context))?;
        if cfg.create_topic {
            ensure_topic(&cc, cfg, &context).await?;
        }
        // Fail early (and retry) when no broker answers.
        let p = producer.clone();
        let topic = cfg.topic.clone();
        let md = tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&topic), Duration::from_secs(5)))
            .await
            .expect("metadata task")
            .map_err(|e| connect_error(&e, cfg, &format!("metadata for topic {}", cfg.topic), &context))?;
        let count = md.topics().iter().filter(|t| t.name() == cfg.topic).map(|t| t.partitions().len()).sum::<usize>() as i32;
        let queue_capacity =
            cfg.properties.get("queue.buffering.max.messages").and_then(|v| v.parse().ok()).unwrap_or(LIBRDKAFKA_QUEUE_MESSAGES);
        let partitioner = Partitioner::from_property(cfg.properties.get("partitioner").map(String::as_str))?;
        if cfg.event_format == EventFormat::Batched && count < 1 {
            return Err(TransientError::Kafka(format!("metadata for topic {}: no partitions yet", cfg.topic)).into());
        }
        Ok(KafkaSink {
            format: cfg.event_format,
            partitioner,
            partition_count: AtomicI32::new(count),
            producer,
            topic: cfg.topic.clone(),
            create_topic: cfg.create_topic,
            queue_capacity,
            writer: None,
        })
    }

    /// The format events are published in (`kafka.event_format`).
    pub fn format(&self) -> EventFormat {
        self.format
    }

    /// The partition the producer gives `key` (what a per-key event of it is produced to, and
    /// which batch carries it in the batched format), among the topic's partitions as of the
    /// newest metadata binval read (at connect, then every progress round,
    /// [`KafkaSink::partitions`]; librdkafka refreshes its own every
    /// `topic.metadata.refresh.interval.ms`, so right after partitions are added the two may
    /// differ for a while: a key moves partition then in either format).
    pub fn partition_of(&self, key: &str) -> i32 {
        self.partitioner.partition(key.as_bytes(), self.partition_count.load(Relaxed))
    }

    /// A [`Publisher`] for the events of one group (or chunk, or statement).
    pub fn publisher(&self) -> Publisher<'_> {
        Publisher { sink: self, batches: BTreeMap::new(), deliveries: Vec::new() }
    }

    /// Hand the record `rec()` builds to the producer, building it again and waiting 5 ms while
    /// the producer's queue is full (`queue.buffering.max.messages` or `.kbytes`); any other
    /// error is returned for the caller to name.
    async fn send_when_room<'r, K, P>(&self, mut rec: impl FnMut() -> FutureRecord<'r, K, P>) -> Result<DeliveryFuture, KafkaError>
    where
        K: rdkafka::message::ToBytes + ?Sized + 'r,
        P: rdkafka::message::ToBytes + ?Sized + 'r,
    {
        loop {
            match self.producer.send(rec()) {
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => tokio::time::sleep(Duration::from_millis(5)).await,
                done => return done,
            }
        }
    }

    /// Enqueue one batch payload ([`binval_protocol::batch`]) to `partition`, with the header
    /// `binval.kind: batch` (and [`WRITER_HEADER`] for commands other than `binval run`);
    /// waits while the producer's queue is full. `what` names it in errors.
    pub async fn enqueue_batch(&self, partition: i32, payload: &[u8], what: &str) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        self.send_when_room(|| {
            let mut headers = OwnedHeaders::new().insert(Header { key: KIND_HEADER, value: Some(KIND_BATCH) });
            if let Some(w) = self.writer {
                headers = headers.insert(Header { key: WRITER_HEADER, value: Some(w) });
            }
            FutureRecord::<'_, [u8], [u8]>::to(&self.topic).partition(partition).payload(payload).headers(headers)
        })
        .await
        .map_err(|e| classify_kafka(&e, what, &self.topic, self.create_topic, &format!("enqueue {what}")))
    }

    /// Enqueue an already-encoded batch again (re-publishing) to the partition it was read
    /// from, with the headers `binval.kind: batch` and `binval.republished: 1`.
    pub async fn enqueue_raw_batch(&self, partition: i32, payload: &[u8]) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        self.send_when_room(|| {
            let headers = OwnedHeaders::new()
                .insert(Header { key: KIND_HEADER, value: Some(KIND_BATCH) })
                .insert(Header { key: REPUBLISHED_HEADER, value: Some("1") });
            FutureRecord::<'_, [u8], [u8]>::to(&self.topic).partition(partition).payload(payload).headers(headers)
        })
        .await
        .map_err(|e| TransientError::Kafka(format!("enqueue batch to partition {partition}: {e}")).into())
    }

    /// Mark every event of this producer with [`WRITER_HEADER`] = `writer` (commands other
    /// than `binval run`).
    pub fn with_writer(mut self, writer: &'static str) -> Self {
        self.writer = Some(writer);
        self
    }

    /// Topic events go to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The producer's queue as the `kafka` stage of `binval_queue_depth`: events enqueued
    /// and not yet acknowledged (librdkafka's `rd_kafka_outq_len`), out of
    /// `queue.buffering.max.messages`.
    pub fn queue_probe(&self) -> crate::telemetry::QueueProbe {
        let (producer, capacity) = (self.producer.clone(), self.queue_capacity);
        crate::telemetry::QueueProbe {
            stage: crate::telemetry::stage::KAFKA,
            fill: Box::new(move || Some((producer.in_flight_count().max(0) as usize, capacity))),
        }
    }

    /// Enqueue one event; waits while the local producer queue is full. Errors per
    /// [`classify_kafka`] (e.g. an event larger than `message.max.bytes` is definite).
    pub async fn enqueue(&self, ev: &InvalidationEvent) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        let payload = ev.to_json();
        self.send_when_room(|| {
            let rec = FutureRecord::to(&self.topic).key(ev.key.as_bytes()).payload(&payload);
            match self.writer {
                Some(w) => rec.headers(OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(w) })),
                None => rec,
            }
        })
        .await
        .map_err(|e| classify_kafka(&e, &ev.key, &self.topic, self.create_topic, &format!("enqueue key {}", ev.key)))
    }

    /// Enqueue an already-encoded event (re-publishing), with a `binval.republished` header.
    pub async fn enqueue_raw(&self, key: &[u8], payload: &[u8]) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        self.send_when_room(|| {
            let headers = OwnedHeaders::new().insert(Header { key: REPUBLISHED_HEADER, value: Some("1") });
            FutureRecord::to(&self.topic).key(key).payload(payload).headers(headers)
        })
        .await
        .map_err(|e| TransientError::Kafka(format!("enqueue: {e}")).into())
    }

    /// Enqueue one progress message ([`crate::write::progress`]) to partition `msg.partition`,
    /// keyed by the source name, with the header [`KIND_HEADER`] = [`KIND_PROGRESS`] that tells
    /// readers it is not an invalidation event. Never waits: `Ok(None)` when the producer's queue
    /// is full (events come first; the round is tried again later). Enqueued after a group's
    /// events, it is delivered after them (idempotent producer: one partition's messages in
    /// enqueue order). Errors are transient (`enqueue progress to partition P: ...`).
    pub fn enqueue_progress(&self, msg: &ProgressMessage) -> Result<Option<DeliveryFuture>, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        let payload = msg.to_json();
        let headers = OwnedHeaders::new().insert(Header { key: KIND_HEADER, value: Some(KIND_PROGRESS) });
        let rec = FutureRecord::to(&self.topic).partition(msg.partition).key(msg.source.as_bytes()).payload(&payload).headers(headers);
        match self.producer.send(rec) {
            Ok(f) => Ok(Some(f)),
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => Ok(None),
            Err(e) => Err(TransientError::Kafka(format!("enqueue progress to partition {}: {e}", msg.partition)).into()),
        }
    }

    /// The partition ids of the topic, from fresh metadata (blocking librdkafka call, on a
    /// blocking thread), bounded by `timeout`.
    pub async fn partitions(&self, timeout: Duration) -> Result<Vec<i32>, Error> {
        let (p, topic) = (self.producer.clone(), self.topic.clone());
        let md = tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&topic), timeout))
            .await
            .map_err(|e| TransientError::Kafka(format!("metadata task: {e}")))?
            .map_err(|e| TransientError::Kafka(format!("metadata for topic {}: {e}", self.topic)))?;
        let ids: Vec<i32> =
            md.topics().iter().filter(|t| t.name() == self.topic).flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
        if ids.is_empty() {
            return Err(TransientError::Kafka(format!("metadata for topic {}: no partitions", self.topic)).into());
        }
        // The batched format partitions by this count, as librdkafka does by its own metadata.
        self.partition_count.store(ids.len() as i32, Relaxed);
        Ok(ids)
    }

    /// Wait for the delivery of the event of `key` (`delivery`, from [`KafkaSink::enqueue`]).
    /// A failed delivery is classified per [`classify_kafka`] (definite: names key and topic;
    /// transient: "delivery of event for key K failed" and the error); a cancelled one (the
    /// producer went away) is transient. The messages are built only on failure: this runs once
    /// per event.
    pub async fn delivered(&self, key: &str, delivery: DeliveryFuture) -> Result<(), Error> {
        match delivery.await {
            Ok(Ok(d)) => {
                crate::telemetry::kafka_delivered(d.timestamp.to_millis());
                Ok(())
            }
            Ok(Err(e)) => Err(classify_kafka(&e, key, &self.topic, self.create_topic, &format!("delivery of event for key {key} failed"))),
            Err(_) => Err(TransientError::Kafka(format!("delivery of event for key {key} was cancelled")).into()),
        }
    }

    /// Wait up to `timeout` for everything enqueued to be delivered.
    pub async fn flush(&self, timeout: Duration) {
        let p = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || p.flush(timeout)).await;
    }
}

/// The events of one group (one chunk of a large transaction, one statement's `truncate`
/// events) on their way to the producer, in the sink's format ([`KafkaSink::publisher`]):
/// per key, each [`Publisher::push`] enqueues its event at once; batched, the changes are
/// gathered per partition and [`Publisher::finish`] enqueues one message per partition (a
/// partition's batch that would exceed [`BATCH_MAX_BYTES`] is enqueued when full, and a new one
/// begins). The deliveries come back in enqueue order, each named by its (first) key.
pub struct Publisher<'a> {
    sink: &'a KafkaSink,
    /// Per partition: the batch being built and its first key (names it in errors).
    batches: BTreeMap<i32, (BatchBuilder, String)>,
    deliveries: Vec<(String, DeliveryFuture)>,
}

impl Publisher<'_> {
    /// One key change of the transaction at `position` (committed at `commit_time_ms`).
    /// Errors: as [`KafkaSink::enqueue`]; batched, a key longer than 65,535 bytes is a
    /// definite error naming it.
    pub async fn push(
        &mut self,
        position: &SourcePosition,
        commit_time_ms: u64,
        key: &str,
        version: u64,
        op: Op,
        table: &str,
    ) -> Result<(), Error> {
        crate::failpoint::hit("kafka.before_enqueue");
        match self.sink.format {
            EventFormat::PerKey => {
                let ev = InvalidationEvent {
                    schema: binval_protocol::EVENT_SCHEMA_VERSION,
                    key: key.to_string(),
                    version,
                    op,
                    table: table.to_string(),
                    position: position.clone(),
                    commit_time_ms,
                    publish_time_ms: crate::now_ms(),
                };
                let d = self.sink.enqueue(&ev).await?;
                self.deliveries.push((ev.key, d));
            }
            EventFormat::Batched => {
                let p = self.sink.partition_of(key);
                let full = self
                    .batches
                    .get(&p)
                    .is_some_and(|(b, _)| !b.is_empty() && b.encoded_len() + change_bytes(key) + txn_bytes(position) > BATCH_MAX_BYTES);
                if full {
                    self.enqueue_partition(p).await?;
                }
                let (b, first) = self.batches.entry(p).or_insert_with(|| (BatchBuilder::new(), key.to_string()));
                b.push(position, commit_time_ms, op, version, table, key).map_err(|e| {
                    Error::from(DefiniteError::KafkaRefused {
                        key: key.to_string(),
                        topic: self.sink.topic.clone(),
                        message: e.to_string(),
                    })
                })?;
                if first.is_empty() {
                    *first = key.to_string();
                }
            }
        }
        Ok(())
    }

    /// Enqueue partition `p`'s batch, if it holds a change.
    async fn enqueue_partition(&mut self, p: i32) -> Result<(), Error> {
        let Some((b, first)) = self.batches.get_mut(&p) else { return Ok(()) };
        if b.is_empty() {
            return Ok(());
        }
        let n = b.len();
        let payload = b.finish(crate::now_ms());
        let what = if n == 1 { first.clone() } else { format!("{first} (and {} more in the batch for partition {p})", n - 1) };
        first.clear();
        let d = self.sink.enqueue_batch(p, &payload, &what).await?;
        self.deliveries.push((what, d));
        Ok(())
    }

    /// Enqueue what is gathered (batched: one message per partition, in partition order) and
    /// return every delivery, in enqueue order.
    pub async fn finish(mut self) -> Result<Vec<(String, DeliveryFuture)>, Error> {
        let parts: Vec<i32> = self.batches.keys().copied().collect();
        for p in parts {
            self.enqueue_partition(p).await?;
        }
        Ok(self.deliveries)
    }
}

async fn ensure_topic(cc: &ClientConfig, cfg: &KafkaConfig, context: &SecurityContext) -> Result<(), Error> {
    let (topic, partitions) = (cfg.topic.as_str(), cfg.partitions);
    let admin: AdminClient<SecurityContext> =
        cc.create_with_context(context.clone()).map_err(|e| connect_error(&e, cfg, "admin client", context))?;
    let nt = NewTopic::new(topic, partitions, TopicReplication::Fixed(cfg.replication_factor));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let res = admin.create_topics([&nt], &opts).await.map_err(|e| connect_error(&e, cfg, &format!("create topic {topic}"), context))?;
    for r in res {
        match r {
            Ok(_) => tracing::info!(topic, partitions, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) if kafka_is_definite(code, cfg.create_topic) => {
                return Err(Error::config("kafka", format!("create topic {t}: {code}")))
            }
            Err((t, code)) => {
                if let Some(f) = context.explain(cfg) {
                    return Err(Error::config(f.field, f.reason));
                }
                return Err(TransientError::Kafka(format!("create topic {t}: {code}")).into());
            }
        }
    }
    Ok(())
}

/// A failure while connecting: definite (a configuration error naming the setting) when the
/// last error librdkafka reported is a TLS or SASL failure, or naming the `kafka` section when
/// [`classify_kafka`] says so; else transient, with the last broker error appended.
/// The error of a client that reached no broker: it names `kafka.brokers` and its value (a wrong
/// address otherwise reads as a broker outage), then `what` failed.
pub(crate) fn no_broker_answered(cfg: &KafkaConfig, what: impl std::fmt::Display) -> TransientError {
    TransientError::Kafka(format!("kafka.brokers = {:?}: no broker answered: {what}", cfg.brokers))
}

fn connect_error(e: &KafkaError, cfg: &KafkaConfig, what: &str, context: &SecurityContext) -> Error {
    if let Some(f) = context.explain(cfg) {
        crate::telemetry::error_classified("kafka", true);
        return Error::config(f.field, format!("{what}: {}", f.reason));
    }
    match classify_kafka(e, "", &cfg.topic, cfg.create_topic, what) {
        Error::Definite(_) => Error::config("kafka", format!("{what}: {e}")),
        // Name the setting: a wrong address otherwise reads as a broker outage.
        Error::Transient(t) => {
            let last = context.last_error().map(|l| format!(" (last broker error: {l})")).unwrap_or_default();
            let t = match t {
                TransientError::Kafka(m) => m,
                other => other.to_string(),
            };
            no_broker_answered(cfg, format!("{t}{last}")).into()
        }
    }
}
