//! Kafka stage: one invalidation event per key change, keyed by the logical key so every
//! change of a key lands on one partition in order. The producer is idempotent with
//! `acks=all` (Kafka docs: `enable.idempotence`), so retries inside librdkafka neither reorder
//! nor duplicate within a session.
//!
//! Sending only enqueues; the returned [`DeliveryFuture`]s go to the checkpoint stage, which
//! advances the checkpoint past a transaction only when all of its events are acknowledged.
//!
//! Errors are classified by [`crate::error::classify_kafka`]: an event Kafka will never take
//! (too large, not authorised, no such topic while binval may not create it, an invalid
//! setting) is definite and names key and topic; anything else is retried.

use std::time::Duration;

use binval_protocol::{InvalidationEvent, ProgressMessage, KIND_HEADER, KIND_PROGRESS};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::config::KafkaConfig;
use crate::error::{classify_kafka, kafka_is_definite, Error, TransientError};
use crate::security::kafka::SecurityContext;

/// librdkafka's default `queue.buffering.max.messages` (CONFIGURATION.md).
const LIBRDKAFKA_QUEUE_MESSAGES: usize = 100_000;

/// Kafka header naming the command that published an event when it is not `binval run`
/// (`replay`, `repair`, `bootstrap`; [`KafkaSink::with_writer`]): their versions are not the
/// run's progress, so the topic's recovery reader (`ha::topic_marks`) skips them.
pub const WRITER_HEADER: &str = "binval.writer";
/// Kafka header of events `binval republish` published again.
pub const REPUBLISHED_HEADER: &str = "binval.republished";

/// The invalidation event producer.
pub struct KafkaSink {
    producer: FutureProducer<SecurityContext>,
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
        let producer: FutureProducer<SecurityContext> =
            cc.create_with_context(context.clone()).map_err(|e| connect_error(&e, cfg, "producer", &context))?;
        if cfg.create_topic {
            ensure_topic(&cc, cfg, &context).await?;
        }
        // Fail early (and retry) when no broker answers.
        let p = producer.clone();
        let topic = cfg.topic.clone();
        tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&topic), Duration::from_secs(5)))
            .await
            .expect("metadata task")
            .map_err(|e| connect_error(&e, cfg, &format!("metadata for topic {}", cfg.topic), &context))?;
        let queue_capacity =
            cfg.properties.get("queue.buffering.max.messages").and_then(|v| v.parse().ok()).unwrap_or(LIBRDKAFKA_QUEUE_MESSAGES);
        Ok(KafkaSink { producer, topic: cfg.topic.clone(), create_topic: cfg.create_topic, queue_capacity, writer: None })
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

    /// The producer's queue as the `checkpoint` stage of `binval_queue_depth`: events enqueued
    /// and not yet acknowledged (librdkafka's `rd_kafka_outq_len`), out of
    /// `queue.buffering.max.messages`.
    pub fn queue_probe(&self) -> crate::telemetry::QueueProbe {
        let (producer, capacity) = (self.producer.clone(), self.queue_capacity);
        crate::telemetry::QueueProbe {
            stage: crate::telemetry::stage::CHECKPOINT,
            fill: Box::new(move || Some((producer.in_flight_count().max(0) as usize, capacity))),
        }
    }

    /// Enqueue one event; waits while the local producer queue is full. Errors per
    /// [`classify_kafka`] (e.g. an event larger than `message.max.bytes` is definite).
    pub async fn enqueue(&self, ev: &InvalidationEvent) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        let payload = ev.to_json();
        loop {
            let mut rec = FutureRecord::to(&self.topic).key(ev.key.as_bytes()).payload(&payload);
            if let Some(w) = self.writer {
                rec = rec.headers(OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(w) }));
            }
            match self.producer.send_result(rec) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(classify_kafka(&e, &ev.key, &self.topic, self.create_topic, &format!("enqueue key {}", ev.key))),
            }
        }
    }

    /// Enqueue an already-encoded event (re-publishing), with a `binval.republished` header.
    pub async fn enqueue_raw(&self, key: &[u8], payload: &[u8]) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        loop {
            let headers = OwnedHeaders::new().insert(Header { key: REPUBLISHED_HEADER, value: Some("1") });
            let rec = FutureRecord::to(&self.topic).key(key).payload(payload).headers(headers);
            match self.producer.send_result(rec) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(TransientError::Kafka(format!("enqueue: {e}")).into()),
            }
        }
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
        match self.producer.send_result(rec) {
            Ok(f) => Ok(Some(f)),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => Ok(None),
            Err((e, _)) => Err(TransientError::Kafka(format!("enqueue progress to partition {}: {e}", msg.partition)).into()),
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
            Ok(Err((e, _))) => {
                Err(classify_kafka(&e, key, &self.topic, self.create_topic, &format!("delivery of event for key {key} failed")))
            }
            Err(_) => Err(TransientError::Kafka(format!("delivery of event for key {key} was cancelled")).into()),
        }
    }

    /// Wait up to `timeout` for everything enqueued to be delivered.
    pub async fn flush(&self, timeout: Duration) {
        let p = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || p.flush(timeout)).await;
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
fn connect_error(e: &KafkaError, cfg: &KafkaConfig, what: &str, context: &SecurityContext) -> Error {
    if let Some(f) = context.explain(cfg) {
        crate::telemetry::error_classified("kafka", true);
        return Error::config(f.field, format!("{what}: {}", f.reason));
    }
    match classify_kafka(e, "", &cfg.topic, cfg.create_topic, what) {
        Error::Definite(_) => Error::config("kafka", format!("{what}: {e}")),
        Error::Transient(t) => match context.last_error() {
            Some(last) => TransientError::Kafka(format!("{t} (last broker error: {last})")).into(),
            None => Error::Transient(t),
        },
    }
}
