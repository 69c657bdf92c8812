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

use crate::binlog::reader::ReadState;
use crate::error::{Error, TransientError};
use crate::ha::checkpoint::{checkpoint_at, CheckpointStoreImpl, GtidState, Origin};
use crate::kafka::KafkaSink;
use crate::telemetry::names;
use crate::write::apply::Pending;

/// Counters the checkpoint task keeps (shared with the pipeline's progress log).
pub trait CheckpointStats: Send + Sync {
    /// One event acknowledged by Kafka.
    fn event_acked(&self);
    /// Every event of the `transactions` transactions ending at `position` acknowledged; the
    /// last one committed at `commit_time_ms` (Unix ms, 0: unknown).
    fn acked(&self, position: &SourcePosition, transactions: u64, commit_time_ms: u64);
    /// One checkpoint saved.
    fn saved(&self);
    /// A heartbeat row written at `now_us` (the primary's `NOW(6)`, Unix µs) acknowledged.
    fn heartbeat_acked(&self, _now_us: u64) {}
    /// The task began waiting for a group's deliveries at `since_ms` (Unix ms), or stopped
    /// waiting (`0`): how long Kafka has not acknowledged is watched by [`crate::monitor`].
    fn kafka_waiting(&self, _since_ms: u64) {}
}

/// What the checkpoint task starts from.
pub struct CheckpointTask {
    /// Where checkpoints go (shared: the pipeline saves the start position before it).
    pub store: Arc<Mutex<CheckpointStoreImpl>>,
    /// Awaits the deliveries.
    pub kafka: Arc<KafkaSink>,
    /// GTID state of the saved checkpoint.
    pub gtids: GtidState,
    /// The server the tenure reads and its fence epoch, saved with every checkpoint.
    pub origin: Origin,
    /// The reader's state (renamed tables, JSON columns) of the saved checkpoint, moved on by
    /// each acknowledged transaction that changed it.
    pub state: ReadState,
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
            match self.acknowledge(p, &mut acked).await {
                Err(e) => break Some(e),
                Ok(false) => continue,
                Ok(true) => dirty = true,
            }
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

    /// Await every delivery of `p`, in order, then move the acknowledged state past it (a
    /// chunk of a large transaction that is not its last has no position: nothing moves).
    /// Returns whether the acknowledged position moved.
    async fn acknowledge(&mut self, p: Pending, acked: &mut Option<SourcePosition>) -> Result<bool, Error> {
        let had_events = !p.deliveries.is_empty();
        let n = p.deliveries.len() as u64;
        if had_events {
            self.stats.kafka_waiting(crate::now_ms());
        }
        for (key, d) in p.deliveries {
            self.kafka.delivered(&key, d).await?;
            self.stats.event_acked();
        }
        if had_events {
            self.stats.kafka_waiting(0);
        }
        metrics::counter!(names::EVENTS_ACKED).increment(n);
        let Some(position) = p.position else { return Ok(false) };
        if let Some(previous) = &p.gtid_previous {
            self.gtids.record_previous(previous);
        }
        for g in &p.gtids {
            self.gtids.record(g);
        }
        if let Some(n) = &p.table_names {
            self.state.names = (**n).clone();
        }
        if let Some(j) = &p.json_columns {
            self.state.json = (**j).clone();
        }
        if let Some(x) = &p.xa {
            // The applied position of the checkpoint the run started from stays known.
            let applied = self.state.xa.applied.take();
            self.state.xa = (**x).clone();
            self.state.xa.applied = self.state.xa.applied.take().or(applied);
        }
        let now_ms = crate::now_ms();
        if p.commit_time_ms > 0 {
            metrics::gauge!(names::ACKED_COMMIT_TS).set(p.commit_time_ms as f64 / 1000.0);
            if had_events {
                metrics::histogram!(names::COMMIT_TO_ACK_S).record(now_ms.saturating_sub(p.commit_time_ms) as f64 / 1000.0);
            }
        }
        if let Some(us) = p.heartbeat_us {
            let now_us = now_ms.saturating_mul(1000);
            metrics::gauge!(names::HEARTBEAT_LAG).set(now_us.saturating_sub(us) as f64 / 1e6);
            self.stats.heartbeat_acked(us);
        }
        self.stats.acked(&position, p.transactions, p.commit_time_ms);
        *acked = Some(position);
        Ok(true)
    }

    /// Save; only a lost lease is an error (a failed save only means a restart re-applies more,
    /// and the next save retries).
    async fn save(&self, pos: &SourcePosition) -> Result<(), Error> {
        let cp = checkpoint_at(pos, &self.gtids, &self.state, &self.origin);
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
