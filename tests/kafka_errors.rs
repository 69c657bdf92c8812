//! Kafka errors retrying cannot fix (definite, per `binval::error::classify_kafka`), injected on
//! librdkafka's mock cluster: `binval run` stops naming key and topic instead of restarting
//! forever.
//!
//! A test binary of its own, so the mock cluster of this test never shares a process (and the
//! CPU) with `tests/faults.rs`'s mock-cluster outage test.

mod pipeline_env;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use binval::config::Config;
use pipeline_env::*;

const MAPPING: &str = items_mapping!(2);

/// A produce error retrying cannot fix (here the broker's ACLs refuse the topic, injected on
/// librdkafka's mock cluster) stops `binval run` with a definite error naming key and topic,
/// instead of restarting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definite_kafka_error_stops_run_naming_key_and_topic() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mock = MockCluster::new(1).unwrap();
    let env = Env::new("kafkarefused", RedisKind::Standalone);
    mock.create_topic(&env.topic, 3, 1).unwrap();
    env.exec(pipeline_env::items::ID_COUNTER).await;
    let start = env.binlog_now().await;
    let text = env
        .config_toml(&start, MAPPING)
        .replace(&format!("brokers = \"{}\"", tk::broker().bootstrap()), &format!("brokers = \"{}\"", mock.bootstrap_servers()));
    mock.request_errors(RDKafkaApiKey::Produce, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 50]);
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    env.exec("INSERT INTO items VALUES (1, 1)").await;
    let started = Instant::now();
    let stats = run.stats.clone();
    let e = run.expect_error(60).await;
    let text = e.to_string();
    assert!(!e.is_transient(), "definite: {text}");
    assert!(text.contains(&format!("{}:item:1", env.prefix)) && text.contains(&env.topic), "names key and topic: {text}");
    assert!(matches!(e, binval::error::Error::Definite(binval::error::DefiniteError::KafkaRefused { .. })), "{text}");
    assert_eq!(stats.restarts.load(Relaxed), 0, "no restart loop");
    println!("stopped after {:?}: {text}", started.elapsed());
}
