//! `binval check`: preflight of everything `run` needs, read-only: the source's binlog
//! settings and schema, Redis (and, on a Cluster, how the mappings' replicas spread over the
//! masters: [`super::placement`]), the checkpoint `run` would resume from (or the start
//! position it would use), and the Kafka brokers.

use crate::config::{Config, StartForms, StartPoint};
use crate::error::Error;

/// Check the source, the mappings against its schema, Redis, the checkpoint and Kafka, printing
/// one line per part. Errors name what failed (a definite config error for mapping problems).
pub async fn check(cfg: Config) -> Result<(), Error> {
    let mut conn = crate::binlog::server::connect(&cfg.source).await?;
    let info = crate::binlog::server::preflight(&mut conn).await?;
    println!("source: {} ok (binlog at {}:{})", info.version, info.current.file, info.current.pos);
    let problems = crate::binlog::server::check_mappings(&mut conn, &cfg.mappings).await?;
    for p in &problems {
        println!("mapping problem: {p}");
    }
    if !problems.is_empty() {
        return Err(Error::config("mappings", format!("{} problem(s) against the source schema (listed above)", problems.len())));
    }
    let mut redis = crate::redis_conn::RedisConn::connect(&cfg.redis).await?;
    let pong: String = redis.query(&redis::cmd("PING")).await.map_err(|e| crate::error::TransientError::Redis(e.to_string()))?;
    println!("redis: {pong}");
    let placements = super::placement::report(&redis, &cfg.mappings).await?;
    if placements.is_empty() {
        println!("placement: standalone Redis, every replica on one server (nothing to spread over)");
    }
    for p in &placements {
        println!("{}", p.line());
        for w in p.warnings() {
            println!("{w}");
        }
    }
    // Where `run` would start: the checkpoint (it must be readable), else source.start (its
    // binlog file must still exist on the source).
    let mut store = crate::ha::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis);
    match store.load().await? {
        Some(cp) => println!("checkpoint: {}:{} in {} (run resumes there; source.start is ignored)", cp.file, cp.pos, store.location()),
        None => {
            if let Ok(StartPoint::Binlog(p)) = StartPoint::parse(&cfg.source.start, StartForms::SOURCE_START) {
                let mut conn = crate::binlog::server::connect(&cfg.source).await?;
                let logs = crate::binlog::server::binary_logs(&mut conn).await?;
                crate::binlog::server::require_binlog_file(&logs, &p, "source.start")?;
            }
            println!("checkpoint: none in {}; run starts at source.start = {}", store.location(), cfg.source.start);
        }
    }
    // Read-only: check never creates the topic (run does, when kafka.create_topic is true).
    let mut kc = cfg.kafka.clone();
    kc.create_topic = false;
    let k = crate::write::kafka_sink::KafkaSink::connect(&kc).await?;
    println!("kafka: brokers {} reachable (topic {})", cfg.kafka.brokers, k.topic());
    println!("mappings: {} table(s)", cfg.mappings.len());
    Ok(())
}
