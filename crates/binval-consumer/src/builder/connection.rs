//! Options of the connections: where the suffix replicas are read (Redis), where
//! the invalidation events come from (Kafka brokers and topic), and the bounds of every
//! request on them. The internals are `redis_conn.rs` and `listener.rs`.

use std::time::Duration;

use super::ConsumerBuilder;
use crate::redis_conn::RedisTarget;

/// # Connection: Redis, Kafka and their timeouts
///
/// The Redis target ([`ConsumerBuilder::redis_standalone`] or
/// [`ConsumerBuilder::redis_cluster`]), the [`ConsumerBuilder::brokers`] and the
/// [`ConsumerBuilder::topic`] are required; the rest bounds each request and the shutdown.
impl ConsumerBuilder {
    /// Read suffix replicas from one standalone Redis server. Required (or
    /// [`ConsumerBuilder::redis_cluster`]); the last call wins.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_standalone("redis://127.0.0.1:6379");
    /// ```
    pub fn redis_standalone(mut self, url: impl Into<String>) -> Self {
        self.redis = Some(RedisTarget::Standalone(url.into()));
        self
    }

    /// Read suffix replicas from a Redis Cluster, given by seed node URLs (one is
    /// enough; the slot map is discovered). Required (or [`ConsumerBuilder::redis_standalone`]).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_cluster(vec!["redis://10.0.0.1:7000".to_string(), "redis://10.0.0.2:7000".to_string()]);
    /// ```
    pub fn redis_cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.redis = Some(RedisTarget::Cluster(urls.into_iter().map(Into::into).collect()));
        self
    }

    /// Kafka bootstrap servers (`host:port[,host:port…]`) of the invalidation topic. Required.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.brokers("kafka-1:9092,kafka-2:9092");
    /// ```
    pub fn brokers(mut self, brokers: impl Into<String>) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    /// The topic binval publishes invalidation events to. Required; it must exist when
    /// `build()` runs.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.topic("binval.invalidations");
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Pass a librdkafka setting to the listener's consumer (applied after this crate's own
    /// settings, so it can override them; do not override `group.id` or enable commits).
    ///
    /// The crate sets `fetch.wait.max.ms` to **10** (librdkafka's default is 500) and leaves
    /// the rest of librdkafka's fetch settings as they are: `fetch.min.bytes` 1 (answer as
    /// soon as one event is there: keep it), `fetch.queue.backoff.ms` 1000 and
    /// `queued.min.messages` 100 000 (they only act when the listener is 100 000 events
    /// behind, which the fail safe reports long before), `fetch.error.backoff.ms` 500.
    ///
    /// Why 10 ms: on tansu (the broker of the tests and the demo) a fetch is always held for
    /// the whole wait, so it is the floor of the eviction latency (500 ms gave p99 ~500 ms,
    /// 10 ms gives p99 ~17-76 ms at 20-1000 events/s on a fresh topic; `docs/benchmarks.md`,
    /// "Kafka leg under load"). On **Kafka**
    /// the broker answers as soon as `fetch.min.bytes` is there, so the wait only sets how
    /// often an idle instance asks again (about `1000 / wait` fetch requests per second per
    /// broker per instance): with many instances on one cluster, raise it to 100-500 ms; the
    /// eviction latency does not change. Keep `fetch.min.bytes` at 1 in any case: a larger
    /// value makes a quiet stream wait the whole `fetch.wait.max.ms` for each event.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_property("fetch.wait.max.ms", "250").kafka_property("security.protocol", "ssl");
    /// ```
    pub fn kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka_properties.push((key.into(), value.into()));
        self
    }

    /// Hard bound of each Redis read of a fill (one replica). Default 200 ms. A read that has
    /// not answered within [`ConsumerBuilder::replica_read_timeout`] (default 100 ms) is joined
    /// by a read of a replica on another master (within
    /// [`ConsumerBuilder::max_replica_reads`]); one that exceeds this bound is given up; when
    /// no read answered, the fill fails with
    /// [`ConsumerError::Timeout`](crate::ConsumerError::Timeout). A read is never repeated on
    /// the same master.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_response_timeout(Duration::from_millis(50));
    /// ```
    pub fn redis_response_timeout(mut self, timeout: Duration) -> Self {
        self.redis_response_timeout = timeout;
        self
    }

    /// Soft bound of one replica read: when a read has not answered after this long, the fill
    /// reads the next replica in its master-balanced order as well — a replica of the same key
    /// on **another master** first — and takes the first value or tombstone that arrives (the
    /// slow read stays in flight up to [`ConsumerBuilder::redis_response_timeout`] and counts
    /// if it answers first). Default **100 ms**; values above `redis_response_timeout` act as
    /// it. Within [`ConsumerBuilder::max_replica_reads`] (a key with one replica, or
    /// `max_replica_reads(1)`, has nothing to move to). Counted in
    /// `binval_consumer_replica_read_timeouts_total` ([`crate::Stats::replica_read_timeouts`]).
    ///
    /// Why: a Redis master that stops answering (frozen, its host swapping, a network black
    /// hole) does not reset its connections, so without a bound below the hard one every read
    /// sent to it waits the whole `redis_response_timeout` and, with both reads of a fill on
    /// slow paths, fails (issue #22: 504s while one of three masters was frozen). The
    /// trade-off: a low value moves away from a slow master sooner, at the cost of one extra
    /// read on another master for every read slower than it — under a hot-key overload that
    /// is the tail of the overloaded master's reads going to the others, which is the point,
    /// but a value near your normal p99 doubles reads for nothing. Keep it several times your
    /// Redis p99 (a healthy Redis answers in well under a millisecond), and below the
    /// request deadline of your app minus one Redis round trip.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.replica_read_timeout(Duration::from_millis(50));
    /// ```
    pub fn replica_read_timeout(mut self, timeout: Duration) -> Self {
        self.replica_read_timeout = timeout;
        self
    }

    /// Bound of one Redis connection attempt. Default 1 s. `build()` fails if it cannot
    /// connect within three times this.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_connection_timeout(Duration::from_millis(500));
    /// ```
    pub fn redis_connection_timeout(mut self, timeout: Duration) -> Self {
        self.redis_connection_timeout = timeout;
        self
    }

    /// Bound of each Kafka metadata / watermark request: at `build()`, on the metadata
    /// refresh, and for the fail safe's watermark observations (there at most
    /// [`ConsumerBuilder::max_staleness`]: a later answer could not confirm anything within the
    /// bound). Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_request_timeout(Duration::from_secs(2));
    /// ```
    pub fn kafka_request_timeout(mut self, timeout: Duration) -> Self {
        self.kafka_request_timeout = timeout;
        self
    }

    /// The longest invalidation message the listener takes, bytes. A longer one is not
    /// parsed: like a message that is not an event, it is logged (topic, partition, offset,
    /// size), counted in `binval_consumer_bad_messages_total` ([`crate::Stats::bad_messages`])
    /// and skipped, and the stream goes on. Default 1 MiB (Kafka's default
    /// `message.max.bytes`); binval's events are a few hundred bytes. At least 1.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_message_bytes(64 * 1024);
    /// ```
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Prefix of the listener's unique Kafka `group.id` (the rest is pid, time and a random
    /// number). Default `binval-consumer`. Useful to recognise instances in broker tooling.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.group_id_prefix("shop-api");
    /// ```
    pub fn group_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.group_id_prefix = prefix.into();
        self
    }

    /// How long [`Consumer::shutdown`](crate::Consumer::shutdown) waits for the listener (and
    /// librdkafka's teardown) before giving up on it. Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.shutdown_timeout(Duration::from_secs(2));
    /// ```
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Let fills read suffix replicas from the **replica nodes** of a Redis Cluster's masters,
    /// not only from the masters: each read goes to the replica's master or one of its
    /// replica nodes, chosen uniformly (with 1 replica node per master, half the reads). The
    /// connections send `READONLY`, which lets a replica node answer reads of its master's
    /// slots (Redis Cluster specification, "Scaling reads using replica nodes"). Default off;
    /// a [`ConsumerBuilder::redis_standalone`] target refuses it ([`ConsumerError::Config`]).
    /// Metrics: `binval_consumer_redis_reads_total{command="replica_node"}` per master.
    ///
    /// **Staleness.** Redis replicates asynchronously: a replica node may answer with an older
    /// record than its master holds, by its replication lag (`master_repl_offset` minus the
    /// replica's offset; usually milliseconds). What a fill caches stays exact — the record
    /// is written whole, so its payload and position `p` belong to the same change — and the
    /// evict rule keeps working on that pair: a change newer than `p` has a higher version,
    /// its event evicts the entry, and when the event was applied *before* the lagging read
    /// landed the fill-race guard refuses it (for [`ConsumerBuilder::fill_guard_ttl`], default
    /// 30 s). What the lag adds: (1) a fill may answer a value up to the lag older than the
    /// masters hold; (2) a replica node more than `fill_guard_ttl` behind (a broken
    /// replication link while `replica-serve-stale-data` is `yes`, Redis's default), or an
    /// instance that started listening after the event of a change its replica node has not
    /// received yet, can cache an old value that no further event evicts, until its TTL. Set
    /// `replica-serve-stale-data no` on the replica nodes (they then refuse reads while their
    /// link is down, and the fill moves to another master) and keep the TTL short where that
    /// matters.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_cluster(["redis://10.0.0.1:7000"]).read_from_replica_nodes(true);
    /// ```
    ///
    /// [`ConsumerError::Config`]: crate::ConsumerError::Config
    pub fn read_from_replica_nodes(mut self, on: bool) -> Self {
        self.read_from_replica_nodes = on;
        self
    }
}
