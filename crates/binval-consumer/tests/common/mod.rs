//! Helpers shared by the integration tests: topics, a producer, events, Redis writes in the
//! writer's order and record format (binval_protocol::fence scripts), waiting for eviction
//! notices.
#![allow(dead_code)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use binval_consumer::{Consumer, ConsumerBuilder, EvictionNotice};
use binval_protocol::{InvalidationEvent, Op, SourcePosition};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::sync::broadcast;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// Create a fresh topic with `partitions` partitions on the shared tansu broker.
pub async fn create_topic(bootstrap: &str, partitions: i32) -> anyhow::Result<String> {
    let name = binval_testkit::unique_name("inval");
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().context("admin client")?;
    let res = admin
        .create_topics(
            &[NewTopic::new(&name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .context("create_topics")?;
    for r in res {
        if let Err((t, e)) = r {
            bail!("create topic {t}: {e}");
        }
    }
    Ok(name)
}

/// What most tests start from: a fresh topic on the shared tansu broker, a key no other test
/// uses (`<prefix>_<unique>:<id>`), a connection to the shared standalone Redis, and a producer
/// made on first use. The consumer under test comes from [`Scene::consumer`]; Redis writes and
/// events are for [`Scene::key`] unless a method takes a key.
pub struct Scene {
    pub topic: String,
    pub key: String,
    pub redis: redis::aio::MultiplexedConnection,
    producer: std::sync::OnceLock<FutureProducer>,
}

impl Scene {
    /// A topic of `partitions` partitions and the key `<prefix>_<unique>:<id>`.
    pub async fn new(prefix: &str, id: impl std::fmt::Display, partitions: i32) -> anyhow::Result<Scene> {
        init_tracing();
        let topic = create_topic(&binval_testkit::broker().bootstrap(), partitions).await?;
        let key = format!("{}:{id}", binval_testkit::unique_name(prefix));
        Ok(Scene { topic, key, redis: redis_conn().await?, producer: std::sync::OnceLock::new() })
    }

    /// [`builder`] for this topic over the shared standalone Redis, `replicas` replicas per key.
    pub fn consumer(&self, replicas: u32) -> ConsumerBuilder {
        builder(&self.topic).redis_standalone(binval_testkit::redis().url()).replicas(replicas)
    }

    /// [`write_fenced`] of this scene's key: `replicas` replicas, then the version token.
    pub async fn write(&mut self, replicas: u32, payload: &str, version: u64) -> anyhow::Result<()> {
        write_fenced(&mut self.redis, &self.key, replicas, payload, version).await
    }

    /// The scene's producer ([`producer`] settings), made on first use.
    pub fn producer(&self) -> anyhow::Result<&FutureProducer> {
        if self.producer.get().is_none() {
            let _ = self.producer.set(producer(&binval_testkit::broker().bootstrap())?);
        }
        Ok(self.producer.get().expect("set above"))
    }

    /// Publish this key's [`event`] at `version`; returns when the broker acknowledged.
    pub async fn publish(&self, version: u64) -> anyhow::Result<()> {
        publish(self.producer()?, &self.topic, &event(&self.key, version)).await
    }

    /// Publish raw bytes keyed by this scene's key (same partition as its events).
    pub async fn publish_raw(&self, payload: &[u8]) -> anyhow::Result<()> {
        publish_raw(self.producer()?, &self.topic, &self.key, payload).await
    }
}

pub fn builder(topic: &str) -> ConsumerBuilder {
    Consumer::builder()
        .brokers(binval_testkit::broker().bootstrap())
        .topic(topic)
        // tansu answers a waiting fetch only when fetch.wait.max.ms expires.
        .kafka_property("fetch.wait.max.ms", "5")
        .shutdown_timeout(Duration::from_secs(5))
}

pub fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    Ok(ClientConfig::new().set("bootstrap.servers", bootstrap).set("message.timeout.ms", "10000").set("linger.ms", "0").create()?)
}

pub fn event(key: &str, version: u64) -> InvalidationEvent {
    InvalidationEvent {
        schema: 1,
        key: key.to_string(),
        version,
        op: Op::Update,
        table: "shop.items".into(),
        position: SourcePosition { file: "mysql-bin.000001".into(), pos: 4 + version, gtid: None },
        commit_time_ms: now_ms() / 1000 * 1000,
        publish_time_ms: now_ms(),
    }
}

/// Publish raw bytes keyed by `key`; returns when the broker acknowledged.
pub async fn publish_raw(p: &FutureProducer, topic: &str, key: &str, payload: &[u8]) -> anyhow::Result<()> {
    p.send(FutureRecord::to(topic).key(key).payload(payload), Duration::from_secs(10))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("produce to {topic}: {e}"))?;
    Ok(())
}

pub async fn publish(p: &FutureProducer, topic: &str, ev: &InvalidationEvent) -> anyhow::Result<()> {
    publish_raw(p, topic, &ev.key, &ev.to_json()).await
}

/// A progress message of source `source` for `partition`, as binval sends it.
pub fn progress(source: &str, partition: i32, lag_ms: u64, fencing_token: u64) -> binval_protocol::ProgressMessage {
    binval_protocol::ProgressMessage {
        schema: binval_protocol::PROGRESS_SCHEMA_VERSION,
        source: source.to_string(),
        partition,
        position: Some(SourcePosition { file: "mysql-bin.000001".into(), pos: 4, gtid: None }),
        commit_time_ms: now_ms() / 1000 * 1000,
        lag_ms,
        fencing_token,
        publish_time_ms: now_ms(),
        masters: None,
    }
}

/// Publish raw bytes to `partition` with the header `binval.kind` = `kind` (what binval's
/// progress task does when `kind` is `progress`); returns when the broker acknowledged.
pub async fn publish_kind(p: &FutureProducer, topic: &str, partition: i32, kind: &str, payload: &[u8]) -> anyhow::Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    let headers = OwnedHeaders::new().insert(Header { key: binval_protocol::KIND_HEADER, value: Some(kind) });
    p.send(FutureRecord::to(topic).partition(partition).key("src").payload(payload).headers(headers), Duration::from_secs(10))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("produce to {topic}: {e}"))?;
    Ok(())
}

/// Publish progress message `m` to its partition, as binval does.
pub async fn publish_progress(p: &FutureProducer, topic: &str, m: &binval_protocol::ProgressMessage) -> anyhow::Result<()> {
    publish_kind(p, topic, m.partition, binval_protocol::KIND_PROGRESS, &m.to_json()).await
}

/// Wait for the notice of (`key`, `version`), skipping others; fail after `timeout`.
pub async fn wait_notice(
    rx: &mut broadcast::Receiver<EvictionNotice>,
    key: &str,
    version: u64,
    timeout: Duration,
) -> anyhow::Result<EvictionNotice> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Err(_) => bail!("no eviction notice for {key} v{version} within {timeout:?}"),
            Ok(Err(e)) => bail!("eviction channel: {e}"),
            Ok(Ok(n)) if n.key == key && n.version == version => return Ok(n),
            Ok(Ok(_)) => {}
        }
    }
}

/// Write like binval does, in its fenced record format: every replica `K:rN` through
/// [`binval_protocol::fence::replica_write_script`] (a hash: `d` payload, `p` position, `f`
/// fencing token), then the version token through `version_bump_script`. Works on a
/// standalone connection and on a Cluster connection (each script touches one key). A write
/// older than what a replica holds is a no-op, as in binval.
pub async fn write_fenced<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    replicas: u32,
    payload: &str,
    version: u64,
) -> anyhow::Result<()> {
    write_record(conn, key, 0..replicas, "set", payload, version).await
}

/// Write a tombstone (row deleted) to every replica, then bump the version token.
pub async fn write_tombstone<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    replicas: u32,
    version: u64,
) -> anyhow::Result<()> {
    write_record(conn, key, 0..replicas, "del", "", version).await
}

/// Write the given replicas only (the others stay as they are), then the version token.
pub async fn write_record<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    replicas: impl IntoIterator<Item = u32>,
    kind: &str,
    payload: &str,
    version: u64,
) -> anyhow::Result<()> {
    let replica_script = redis::Script::new(&binval_protocol::fence::replica_write_script());
    let version_script = redis::Script::new(&binval_protocol::fence::version_bump_script());
    for i in replicas {
        let r: i64 = replica_script
            .key(binval_protocol::replica_key(key, i))
            .arg(version)
            .arg(1) // fencing token
            .arg(kind)
            .arg(payload)
            .arg(60_000) // tombstone TTL, ms
            .invoke_async(conn)
            .await?;
        if r < 0 {
            bail!("replica write of {key} r{i} refused by the fencing token");
        }
    }
    let _: i64 = version_script.key(binval_protocol::version_key(key)).arg(version).invoke_async(conn).await?;
    Ok(())
}

/// [`write_fenced`] on the shared standalone Redis connection (the name the tests grew up with).
pub async fn write_standalone(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    replicas: u32,
    payload: &str,
    version: u64,
) -> anyhow::Result<()> {
    write_fenced(conn, key, replicas, payload, version).await
}

/// The master index of each hash slot of the cluster at `urls` (binval-testkit's
/// [`binval_testkit::SlotOwners`] of the first node; `usize::MAX` for an uncovered slot).
pub fn cluster_master_of(urls: &[String]) -> anyhow::Result<impl Fn(u16) -> usize> {
    let port: u16 = urls[0].rsplit(':').next().and_then(|p| p.parse().ok()).context("port of the first URL")?;
    let owners = binval_testkit::SlotOwners::read(port)?;
    Ok(move |slot: u16| owners.master_of(slot))
}

pub async fn redis_conn() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(binval_testkit::redis().url())?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Publishes real invalidation events ([`event`] JSON) at a steady rate until
/// [`SteadyPublisher::finish`], with binval's producer settings (idempotent, `acks=all`,
/// `linger.ms=1`): the load a busy `binval run` puts on the topic. Keys cycle over `keys`;
/// each event of a key has the next version.
pub struct SteadyPublisher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl SteadyPublisher {
    /// Start publishing `rate` events per second to `topic` (sends are not awaited one by one:
    /// every 10 ms the events due by then are handed to the producer).
    pub fn start(bootstrap: &str, topic: &str, rate: u32, keys: Vec<String>) -> anyhow::Result<SteadyPublisher> {
        use futures::StreamExt as _;
        use std::sync::atomic::Ordering::SeqCst;
        let p: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("message.timeout.ms", "30000")
            .create()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop2, topic) = (stop.clone(), topic.to_string());
        let task = tokio::spawn(async move {
            let mut acks = futures::stream::FuturesUnordered::new();
            let (mut sent, mut acked) = (0u64, 0u64);
            let mut versions = vec![1_000u64; keys.len()];
            let t0 = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !stop2.load(SeqCst) {
                tick.tick().await;
                let due = (t0.elapsed().as_secs_f64() * f64::from(rate)) as u64;
                while sent < due {
                    let i = (sent % keys.len() as u64) as usize;
                    versions[i] += 1;
                    let payload = event(&keys[i], versions[i]).to_json();
                    let rec = FutureRecord::to(&topic).key(keys[i].as_str()).payload(&payload);
                    match p.send_result(rec) {
                        Ok(f) => acks.push(f),
                        Err((e, _)) => bail!("produce to {topic}: {e}"),
                    }
                    sent += 1;
                }
                // Collect the acks that are in, without waiting.
                while let Some(Some(r)) = futures::FutureExt::now_or_never(acks.next()) {
                    r?.map_err(|(e, _)| anyhow::anyhow!("delivery to {topic}: {e}"))?;
                    acked += 1;
                }
            }
            while let Some(r) = acks.next().await {
                r?.map_err(|(e, _)| anyhow::anyhow!("delivery to {topic}: {e}"))?;
                acked += 1;
            }
            anyhow::ensure!(acked == sent, "{acked} of {sent} events acknowledged");
            Ok(acked)
        });
        Ok(SteadyPublisher { stop, task })
    }

    /// Stop, wait for every outstanding acknowledgement; the number of events published.
    pub async fn finish(self) -> anyhow::Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await?
    }
}
