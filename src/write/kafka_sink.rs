//! Kafka stage: one invalidation event per key change, keyed by the logical key so every
//! change of a key lands on one partition in order. The producer is idempotent with
//! `acks=all` (Kafka docs: `enable.idempotence`), so retries inside librdkafka neither reorder
//! nor duplicate within a session.
//!
//! Sending only enqueues; the returned [`DeliveryFuture`]s go to the checkpoint stage, which
//! advances the checkpoint past a transaction only when all of its events are acknowledged.

use std::time::Duration;

use binval_protocol::InvalidationEvent;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::config::KafkaConfig;
use crate::error::{Error, TransientError};

/// The invalidation event producer.
pub struct KafkaSink {
    producer: FutureProducer,
    topic: String,
}

impl KafkaSink {
    /// Create the producer and, if configured, the topic. Errors are transient (the broker may
    /// come up later).
    pub async fn connect(cfg: &KafkaConfig) -> Result<Self, Error> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &cfg.brokers)
            .set("linger.ms", "1")
            .set("message.timeout.ms", "30000")
            .set("socket.keepalive.enable", "true");
        for (k, v) in &cfg.properties {
            cc.set(k, v);
        }
        // Always: the guarantees binval documents depend on them.
        cc.set("enable.idempotence", "true").set("acks", "all");
        let producer: FutureProducer = cc.create().map_err(|e| TransientError::Kafka(format!("producer: {e}")))?;
        if cfg.create_topic {
            ensure_topic(&cc, &cfg.topic, cfg.partitions, cfg.replication_factor).await?;
        }
        // Fail early (and retry) when no broker answers.
        let p = producer.clone();
        let topic = cfg.topic.clone();
        tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&topic), Duration::from_secs(5)))
            .await
            .expect("metadata task")
            .map_err(|e| TransientError::Kafka(format!("metadata for topic {}: {e}", cfg.topic)))?;
        Ok(KafkaSink { producer, topic: cfg.topic.clone() })
    }

    /// Topic events go to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Enqueue one event; waits while the local producer queue is full.
    pub async fn enqueue(&self, ev: &InvalidationEvent) -> Result<DeliveryFuture, Error> {
        let payload = ev.to_json();
        loop {
            let rec = FutureRecord::to(&self.topic).key(ev.key.as_bytes()).payload(&payload);
            match self.producer.send_result(rec) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(TransientError::Kafka(format!("enqueue key {}: {e}", ev.key)).into()),
            }
        }
    }

    /// Enqueue an already-encoded event (re-publishing), with a `binval.republished` header.
    pub async fn enqueue_raw(&self, key: &[u8], payload: &[u8]) -> Result<DeliveryFuture, Error> {
        use rdkafka::message::{Header, OwnedHeaders};
        loop {
            let headers = OwnedHeaders::new().insert(Header { key: "binval.republished", value: Some("1") });
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

    /// Wait up to `timeout` for everything enqueued to be delivered.
    pub async fn flush(&self, timeout: Duration) {
        let p = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || p.flush(timeout)).await;
    }
}

async fn ensure_topic(cc: &ClientConfig, topic: &str, partitions: i32, replication: i32) -> Result<(), Error> {
    let admin: AdminClient<DefaultClientContext> = cc.create().map_err(|e| TransientError::Kafka(format!("admin client: {e}")))?;
    let nt = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let res = admin.create_topics([&nt], &opts).await.map_err(|e| TransientError::Kafka(format!("create topic {topic}: {e}")))?;
    for r in res {
        match r {
            Ok(_) => tracing::info!(topic, partitions, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => return Err(TransientError::Kafka(format!("create topic {t}: {code}")).into()),
        }
    }
    Ok(())
}
