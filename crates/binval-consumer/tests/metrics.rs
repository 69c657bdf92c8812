//! The metric names of the crate docs are what a Prometheus recorder actually sees. Its own
//! test binary: it installs a process-wide recorder (metrics-exporter-prometheus) once.

mod common;

use std::time::Duration;

use common::*;
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::test(flavor = "multi_thread")]
async fn metrics_reach_a_prometheus_recorder() -> anyhow::Result<()> {
    init_tracing();
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let broker = binval_testkit::broker();
    let topic = create_topic(&broker.bootstrap(), 1).await?;
    let key = format!("{}:1", binval_testkit::unique_name("metrics"));
    let mut r = redis_conn().await?;
    write_fenced(&mut r, &key, 2, "v1", 1).await?;
    let c = builder(&topic)
        .redis_standalone(binval_testkit::redis().url())
        .replicas(2)
        .hot_key_sample_every(1)
        .hot_key_threshold(1.0)
        .build()
        .await?;
    let mut rx = c.subscribe_evictions();
    assert_eq!(c.get(&key).await?.as_deref(), Some("v1")); // miss + fill
    for _ in 0..20 {
        assert_eq!(c.get(&key).await?.as_deref(), Some("v1")); // hits
    }
    write_fenced(&mut r, &key, 2, "v2", 2).await?;
    publish(&producer(&broker.bootstrap())?, &topic, &event(&key, 2)).await?;
    assert!(wait_notice(&mut rx, &key, 2, Duration::from_secs(15)).await?.evicted);
    let top = c.hot_keys();
    assert_eq!(top[0].key, key);

    let text = prometheus.render();
    println!("{text}");
    for name in [
        "binval_consumer_hits_total 20",
        "binval_consumer_misses_total 1",
        "binval_consumer_fills_total 1",
        "binval_consumer_events_total 1",
        "binval_consumer_evictions_total 1",
        "binval_consumer_serving_local 1",
        "binval_consumer_invalidation_lag_ms{from=\"commit\"",
        "binval_consumer_invalidation_lag_ms{from=\"publish\"",
        "binval_consumer_hot_keys 1",
        &format!("binval_consumer_hot_key_reads_per_sec{{key=\"{key}\"}}"),
    ] {
        assert!(text.contains(name), "`{name}` missing from:\n{text}");
    }
    c.shutdown().await;
    Ok(())
}
