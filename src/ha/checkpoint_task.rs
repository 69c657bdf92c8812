//! The checkpoint task of `binval run`: waits for every Kafka delivery of each transaction, in
//! commit order, and only then moves the acknowledged position past it (invariant I3: the
//! checkpoint never runs ahead of the sinks). It saves at most once per
//! `checkpoint.interval_ms` while transactions flow, and once more when the pipeline stops for
//! any reason other than a failure of its own.
//!
//! A failed save is not an error (a restart only re-applies more, and the next save retries),
//! except a refused one: a lost lease ends the tenure. A failed delivery ends the pipeline with
//! the error [`crate::error::classify_kafka`] gives it (definite: the event can never be
//! delivered; transient: restart from the checkpoint).

use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_protocol::SourcePosition;
use tokio::sync::{mpsc, Mutex};

use crate::error::{Error, TransientError};
use crate::ha::checkpoint::{checkpoint_at, CheckpointStoreImpl, GtidState};
use crate::mapping::TableNames;
use crate::telemetry::names;
use crate::write::apply::Pending;
use crate::write::kafka_sink::KafkaSink;

/// Counters the checkpoint task keeps (shared with the pipeline's progress log).
pub trait CheckpointStats: Send + Sync {
    /// One event acknowledged by Kafka.
    fn event_acked(&self);
    /// Every event of the transaction ending at `position` acknowledged.
    fn acked(&self, position: &SourcePosition);
    /// One checkpoint saved.
    fn saved(&self);
}

/// What the checkpoint task starts from.
pub struct CheckpointTask {
    /// Where checkpoints go (shared: the pipeline saves the start position before it).
    pub store: Arc<Mutex<CheckpointStoreImpl>>,
    /// Awaits the deliveries.
    pub kafka: Arc<KafkaSink>,
    /// GTID state of the saved checkpoint.
    pub gtids: GtidState,
    /// Renamed-table state of the saved checkpoint.
    pub names: TableNames,
    /// `checkpoint.interval_ms`.
    pub interval: Duration,
    /// Counters.
    pub stats: Arc<dyn CheckpointStats>,
}

impl CheckpointTask {
    /// Run until `rx` closes (the apply task ended) or a delivery or a save fails; saves the
    /// last acknowledged position on the way out unless it failed.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Pending>) -> Result<(), Error> {
        let mut acked: Option<SourcePosition> = None;
        let mut last_save = Instant::now();
        let mut dirty = false;
        let failure = loop {
            let next = if dirty {
                match tokio::time::timeout_at((last_save + self.interval).into(), rx.recv()).await {
                    Ok(n) => n,
                    Err(_) => {
                        if let Err(e) = self.save(acked.as_ref().expect("dirty")).await {
                            break Some(e);
                        }
                        last_save = Instant::now();
                        dirty = false;
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            let Some(p) = next else { break None };
            if let Err(e) = self.acknowledge(p, &mut acked).await {
                break Some(e);
            }
            dirty = true;
            if last_save.elapsed() >= self.interval {
                if let Err(e) = self.save(acked.as_ref().expect("acknowledged")).await {
                    break Some(e);
                }
                last_save = Instant::now();
                dirty = false;
            }
        };
        match (failure, dirty, acked.as_ref()) {
            (Some(e), _, _) => Err(e),
            (None, true, Some(a)) => self.save(a).await,
            (None, _, _) => Ok(()),
        }
    }

    /// Await every delivery of `p`, in order, then move the acknowledged state past it.
    async fn acknowledge(&mut self, p: Pending, acked: &mut Option<SourcePosition>) -> Result<(), Error> {
        let had_events = !p.deliveries.is_empty();
        for (key, d) in p.deliveries {
            self.kafka.delivered(&key, d).await?;
            self.stats.event_acked();
            metrics::counter!(names::EVENTS_ACKED).increment(1);
        }
        if let Some(g) = &p.position.gtid {
            self.gtids.record(g);
        }
        if let Some(n) = &p.table_names {
            self.names = (**n).clone();
        }
        if p.commit_time_ms > 0 {
            metrics::gauge!(names::ACKED_COMMIT_TS).set(p.commit_time_ms as f64 / 1000.0);
            if had_events {
                metrics::histogram!(names::COMMIT_TO_ACK_S).record(crate::now_ms().saturating_sub(p.commit_time_ms) as f64 / 1000.0);
            }
        }
        self.stats.acked(&p.position);
        *acked = Some(p.position);
        Ok(())
    }

    /// Save; only a lost lease is an error (a failed save only means a restart re-applies more,
    /// and the next save retries).
    async fn save(&self, pos: &SourcePosition) -> Result<(), Error> {
        let cp = checkpoint_at(pos, &self.gtids, &self.names);
        crate::failpoint::hit("checkpoint.before_save");
        match self.store.lock().await.save(&cp).await {
            Ok(()) => {
                crate::failpoint::hit("checkpoint.after_save");
                self.stats.saved();
                metrics::counter!(names::CHECKPOINTS).increment(1);
                tracing::debug!(file = %cp.file, pos = cp.pos, "checkpoint saved");
                Ok(())
            }
            Err(e @ Error::Transient(TransientError::LeaseLost { .. })) => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint save failed; will retry");
                Ok(())
            }
        }
    }
}
