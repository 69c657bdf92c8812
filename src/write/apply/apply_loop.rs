//! [`apply_loop`]: the apply task of `binval run`: groups of transactions, their Redis writes
//! overlapped while a master is slow, handed on to the checkpoint task in order.

use super::*;
use std::sync::Arc;
use std::time::Instant;

use binval_protocol::SourcePosition;
use tokio::sync::mpsc;

use crate::binlog::txn::Transaction;
use crate::error::Error;
use crate::kafka::DeliveryFuture;
use crate::mapping::TableNames;
use crate::telemetry::names;
use crate::write::group::Group;
use crate::write::redis_sink::Applied;

/// Transactions whose Redis writes are done and whose events are in flight: what the apply
/// task hands the checkpoint task (`ha::checkpoint_task`), one per group (or per chunk of a
/// large transaction).
#[derive(Default)]
pub struct Pending {
    /// Binlog position after the group's last transaction; `None` for a chunk of a large
    /// transaction that is not its last (the checkpoint never moves inside a transaction).
    pub position: Option<SourcePosition>,
    /// The GTIDs of the group's transactions, in commit order.
    pub gtids: Vec<String>,
    /// MySQL: the GTID set of a PREVIOUS_GTIDS event read before one of the group's
    /// transactions (a new binlog file began), see [`Transaction::gtid_previous`].
    pub gtid_previous: Option<Arc<binval_protocol::MysqlGtidSet>>,
    /// Commit time of the last transaction, Unix ms (0: unknown); from the heartbeat row when
    /// the group's last heartbeat is its last transaction (µs precision), else the binlog
    /// header's whole seconds.
    pub commit_time_ms: u64,
    /// The `NOW(6)` of the group's last heartbeat row, Unix µs.
    pub heartbeat_us: Option<u64>,
    /// The renamed-table state after the group, when it changed.
    pub table_names: Option<Arc<TableNames>>,
    /// The MariaDB JSON columns known after the group, when they changed.
    pub json_columns: Option<Arc<crate::binlog::json_columns::JsonColumns>>,
    /// The prepared XA transactions after the group, when they changed (`binlog::xa`).
    pub xa: Option<Arc<crate::binlog::xa::XaCheckpoint>>,
    /// Transactions of the group (0 for a chunk that is not the last of its transaction).
    pub transactions: u64,
    /// Messages in flight (an event, or a batch of the batched format), each named by its
    /// (first) key.
    pub deliveries: Vec<(String, DeliveryFuture)>,
}

impl Pending {
    /// What the checkpoint task needs of a group's transactions, with its deliveries.
    fn of(txns: &mut [Transaction], deliveries: Vec<(String, DeliveryFuture)>) -> Self {
        let last = txns.last().expect("a group has a transaction");
        let heartbeat_us = txns.iter().rev().find_map(|t| t.heartbeat_us);
        let commit_time_ms = match last.heartbeat_us {
            Some(us) => us / 1000,
            None => last.commit_time_ms,
        };
        Pending {
            position: Some(last.position.clone()),
            gtids: txns.iter().filter_map(|t| t.position.gtid.clone()).collect(),
            gtid_previous: txns.iter_mut().rev().find_map(|t| t.gtid_previous.take()),
            commit_time_ms,
            heartbeat_us,
            table_names: txns.iter_mut().rev().find_map(|t| t.table_names.take()),
            json_columns: txns.iter_mut().rev().find_map(|t| t.json_columns.take()),
            xa: txns.iter_mut().rev().find_map(|t| t.xa.take()),
            transactions: txns.len() as u64,
            deliveries,
        }
    }
}

/// Counters the apply task keeps (shared with the pipeline's progress log).
pub trait ApplyStats: Send + Sync {
    /// A group of `transactions` transactions applied, with `rows` rows decoded and
    /// `key_changes` key changes written.
    fn applied(&self, transactions: u64, rows: u64, key_changes: u64);
    /// A large transaction was applied alone, in chunks; `spilled`: its row events went to a
    /// temporary file.
    fn large(&self, _spilled: bool) {}
    /// Every transaction up to and including the one ending at `position` (committed at
    /// `commit_time_ms`, Unix ms, 0: unknown) is in Redis and its events are enqueued in the
    /// producer (not yet acknowledged by Kafka): what a progress message enqueued after this
    /// call may announce (events of one partition are delivered in the order enqueued).
    fn enqueued(&self, _position: &SourcePosition, _commit_time_ms: u64) {}
}

/// The apply task of `binval run`: takes every transaction already queued in `rx` (up to
/// `writer.max_group_rows` rows, see [`crate::write::group`]) as one group, writes it to Redis
/// and, in commit order, enqueues its events and hands its deliveries to the checkpoint task
/// through `acks` (bounded: the apply task waits while the checkpoint task is behind). A large
/// transaction is applied alone, in chunks. Returns when `rx` closes or the checkpoint task
/// stopped.
///
/// # Groups in Redis at once
///
/// Normally one group is in Redis at a time, and the transactions that arrive meanwhile form
/// the next, larger group. When a group's writes take longer than [`OVERLAP_AFTER`] (a master
/// is slow, frozen, or failing over), the next group is sent without waiting, and so on every
/// [`OVERLAP_AFTER`], up to [`MAX_GROUPS_IN_FLIGHT`] groups and [`MAX_KEYS_IN_FLIGHT`] key
/// changes: the masters that answer keep receiving every change, so readers of replicas there
/// (an app whose fail safe bypasses its local cache) see fresh values while one master does
/// not answer. Nothing else changes: every write is fenced by position (a replica or token
/// only moves forward, whichever group's write lands first), each group's version tokens are
/// written only after all of that group's replicas (I1), and events are enqueued and
/// acknowledged strictly in group order (per-key order on the topic, I3).
///
/// A group with table-wide invalidations, and a large transaction, wait until every group
/// before them is done and are applied alone.
pub async fn apply_loop(
    mut writer: Writer,
    rx: mpsc::Receiver<Transaction>,
    acks: mpsc::Sender<Pending>,
    stats: Arc<dyn ApplyStats>,
) -> Result<(), Error> {
    let mut flight = InFlight::default();
    let mut resizes = writer.resizes.take();
    let mut intake = Intake { rx, held: None, closed: false, linger: Linger::new(writer.linger) };
    loop {
        let first = if flight.may_start() {
            match intake.held.take() {
                Some(t) => Some(t),
                None if intake.closed => None,
                None => tokio::select! {
                    biased;
                    done = flight.next(), if !flight.is_empty() => {
                        if !finish_group(&writer, done, &acks, &*stats).await? {
                            return Ok(());
                        }
                        continue;
                    }
                    Some(cmd) = next_resize(&mut resizes) => {
                        if !resize(&writer, &mut flight, cmd, &acks, &*stats).await? {
                            return Ok(());
                        }
                        continue;
                    }
                    t = intake.rx.recv() => match t {
                        Some(t) => {
                            intake.linger.arrived(arrival(&t));
                            Some(t)
                        }
                        None => {
                            intake.closed = true;
                            continue;
                        }
                    },
                },
            }
        } else {
            let (at, below_caps) = (flight.next_start_at(), flight.below_caps());
            tokio::select! {
                biased;
                done = flight.next() => {
                    if !finish_group(&writer, done, &acks, &*stats).await? {
                        return Ok(());
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(at.into()), if below_caps => continue,
            }
        };
        let Some(first) = first else {
            // The source is done: finish what is in Redis, then stop.
            if flight.is_empty() {
                return Ok(());
            }
            let done = flight.next().await;
            if !finish_group(&writer, done, &acks, &*stats).await? {
                return Ok(());
            }
            continue;
        };
        if is_large(&first) {
            if !drain(&writer, &mut flight, &acks, &*stats).await? {
                return Ok(());
            }
            if !apply_large_alone(&mut writer, first, &acks, &*stats).await? {
                return Ok(());
            }
            continue;
        }
        let mut group = Group::new();
        group.add(first, &writer.mapper, &writer.fence)?;
        intake.take_ready(&writer, &mut group)?;
        if flight.is_empty() && intake.held.is_none() && !intake.closed {
            if let Some(until) = intake.linger.gather_until(Instant::now()) {
                intake.gather(&writer, &mut group, until).await?;
            }
        }
        if group.txns.iter().any(|t| !t.invalidate_tables.is_empty()) {
            if !drain(&writer, &mut flight, &acks, &*stats).await? {
                return Ok(());
            }
            intake.linger.sent(Instant::now());
            let o = writer.apply_group(&mut group, &mut |_| {}).await?;
            if !hand_on(group, o, &acks, &*stats).await {
                return Ok(());
            }
            continue;
        }
        intake.linger.sent(Instant::now());
        group.finish();
        flight.push(&writer, group);
    }
}

/// Whether `group` may take another transaction: below `apply.max_group_rows` rows and
/// [`MAX_GROUP_TRANSACTIONS`], and not ended by a DDL.
fn group_has_room(writer: &Writer, group: &Group) -> bool {
    group.rows < writer.max_group_rows && group.txns.len() < MAX_GROUP_TRANSACTIONS && !group.ends_with_ddl()
}

/// When `txn` arrived, for the linger's rate: when the live reader passed it on, else now.
fn arrival(txn: &Transaction) -> Instant {
    txn.read_at.unwrap_or_else(Instant::now)
}

/// Where the apply loop takes its transactions from.
struct Intake {
    /// The reader's transactions, in commit order.
    rx: mpsc::Receiver<Transaction>,
    /// A large transaction taken from `rx` while a group was gathering: it is applied next,
    /// alone.
    held: Option<Transaction>,
    /// `rx` closed (the source is done).
    closed: bool,
    /// When a group may gather more ([`Linger`]).
    linger: Linger,
}

impl Intake {
    /// Add to `group` every transaction already in the channel, while it has room
    /// ([`group_has_room`]); a large transaction is held for after it.
    fn take_ready(&mut self, writer: &Writer, group: &mut Group) -> Result<(), Error> {
        use mpsc::error::TryRecvError;
        while group_has_room(writer, group) {
            let txn = match self.rx.try_recv() {
                Ok(txn) => txn,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            };
            self.linger.arrived(arrival(&txn));
            if is_large(&txn) {
                self.held = Some(txn);
                break;
            }
            group.add(txn, &writer.mapper, &writer.fence)?;
        }
        Ok(())
    }

    /// Let `group` take the transactions that arrive until `until` (`apply.linger_ms`, see
    /// [`Linger`]): it sleeps until then and takes them all at once ([`Intake::take_ready`]).
    ///
    /// Taking them at `until` polls the apply task once per group instead of once per
    /// transaction (each poll runs its `select!` and the linger's timer). Measured at 1,000
    /// commits/s this saved no context switch (about 2.1 per transaction before and after)
    /// and no CPU beyond the run-to-run spread (docs/benchmarks.md, "Where the wake-ups come
    /// from (stop 35)"); it is kept because the loop is simpler. The price: a
    /// group that fills up (`apply.max_group_rows`) before `until` is sent at `until`, not at
    /// once. With the defaults (4,096 rows, 5 ms) that takes over 800,000 rows/s, beyond what
    /// one reader reads.
    async fn gather(&mut self, writer: &Writer, group: &mut Group, until: Instant) -> Result<(), Error> {
        tokio::time::sleep_until(until.into()).await;
        self.take_ready(writer, group)
    }
}

/// The next replica-count step, never when there is no channel (or it closed).
pub(super) async fn next_resize(
    rx: &mut Option<mpsc::Receiver<crate::replicas::task::CountCommand>>,
) -> Option<crate::replicas::task::CountCommand> {
    match rx {
        Some(r) => match r.recv().await {
            Some(c) => Some(c),
            None => {
                *rx = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Take a replica-count step (`crate::replicas`, "How a count changes without readers
/// noticing"): the key's changes mapped from now on write the new count; the groups in flight,
/// mapped with the old one, are finished first; then the copies, announcements or removals
/// run, so none of them races a change of the key. `false` when the checkpoint task stopped;
/// a lost lease ends the tenure, any other failure goes back to the leader's task, which tries
/// the step again.
pub(super) async fn resize(
    writer: &Writer,
    flight: &mut InFlight,
    cmd: crate::replicas::task::CountCommand,
    acks: &mpsc::Sender<Pending>,
    stats: &dyn ApplyStats,
) -> Result<bool, Error> {
    writer.mapper.counts().set(&cmd.key, cmd.op.after(cmd.min));
    if !drain(writer, flight, acks, stats).await? {
        return Ok(false);
    }
    let r = crate::replicas::task::apply(&writer.redis, &writer.source_name, writer.fencing_token, &cmd.key, cmd.op).await;
    match r {
        Err(e @ Error::Transient(crate::error::TransientError::LeaseLost { .. })) => Err(e),
        r => {
            let _ = cmd.done.send(r);
            Ok(true)
        }
    }
}

/// A group whose Redis writes are under way: it gives the group back with what each change did.
pub(super) type GroupWrites = std::pin::Pin<Box<dyn std::future::Future<Output = (Group, Result<Vec<Applied>, Error>)> + Send>>;

/// The groups whose Redis writes are under way, oldest first (see [`apply_loop`]).
#[derive(Default)]
pub(super) struct InFlight {
    groups: futures::stream::FuturesOrdered<GroupWrites>,
    /// Key changes of the groups in flight.
    keys: usize,
    /// When the newest group in flight was sent.
    newest: Option<Instant>,
}

impl InFlight {
    fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Below [`MAX_GROUPS_IN_FLIGHT`] and [`MAX_KEYS_IN_FLIGHT`].
    fn below_caps(&self) -> bool {
        self.groups.len() < MAX_GROUPS_IN_FLIGHT && self.keys < MAX_KEYS_IN_FLIGHT
    }

    /// When another group may be sent: at once when none is in flight, else
    /// [`OVERLAP_AFTER`] after the newest.
    fn next_start_at(&self) -> Instant {
        self.newest.map_or_else(Instant::now, |t| t + OVERLAP_AFTER)
    }

    fn may_start(&self) -> bool {
        self.is_empty() || (self.below_caps() && Instant::now() >= self.next_start_at())
    }

    fn push(&mut self, writer: &Writer, group: Group) {
        self.keys += group.changes.len();
        self.newest = Some(Instant::now());
        if group.changes.is_empty() {
            self.groups.push_back(Box::pin(std::future::ready((group, Ok(Vec::new())))));
        } else {
            self.groups.push_back(Box::pin(writer.redis_writes(group)));
        }
        metrics::gauge!(names::GROUPS_IN_FLIGHT).set(self.groups.len() as f64);
    }

    /// The oldest group, once its writes are done.
    async fn next(&mut self) -> (Group, Result<Vec<Applied>, Error>) {
        use futures::StreamExt;
        let done = self.groups.next().await.expect("a group is in flight");
        self.keys -= done.0.changes.len();
        if self.groups.is_empty() {
            self.newest = None;
        }
        metrics::gauge!(names::GROUPS_IN_FLIGHT).set(self.groups.len() as f64);
        done
    }
}

/// Enqueue the events of a group whose Redis writes are done and hand it to the checkpoint
/// task; `false` when the checkpoint task stopped.
pub(super) async fn finish_group(
    writer: &Writer,
    (group, applied): (Group, Result<Vec<Applied>, Error>),
    acks: &mpsc::Sender<Pending>,
    stats: &dyn ApplyStats,
) -> Result<bool, Error> {
    let mut o = TxnOutcome { rows: group.rows as u64, key_changes: group.changes.len() as u64, ..TxnOutcome::default() };
    if !group.changes.is_empty() {
        writer.announce(&group, applied?, &mut o).await?;
    }
    Ok(hand_on(group, o, acks, stats).await)
}

/// Count a group applied and send its [`Pending`]; `false` when the checkpoint task stopped.
pub(super) async fn hand_on(mut group: Group, o: TxnOutcome, acks: &mpsc::Sender<Pending>, stats: &dyn ApplyStats) -> bool {
    let n = group.txns.len() as u64;
    stats.applied(n, o.rows, o.key_changes);
    metrics::counter!(names::TRANSACTIONS).increment(n);
    metrics::counter!(names::ROWS).increment(o.rows);
    crate::telemetry::group_applied(n, o.key_changes);
    let pending = Pending::of(&mut group.txns, o.deliveries);
    stats.enqueued(pending.position.as_ref().expect("a group of whole transactions"), pending.commit_time_ms);
    acks.send(pending).await.is_ok()
}

/// Finish every group in flight, oldest first; `false` when the checkpoint task stopped.
pub(super) async fn drain(
    writer: &Writer,
    flight: &mut InFlight,
    acks: &mpsc::Sender<Pending>,
    stats: &dyn ApplyStats,
) -> Result<bool, Error> {
    while !flight.is_empty() {
        let done = flight.next().await;
        if !finish_group(writer, done, acks, stats).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A large transaction, applied alone in chunks ([`Writer::apply_large`]); `false` when the
/// checkpoint task stopped.
pub(super) async fn apply_large_alone(
    writer: &mut Writer,
    mut txn: Transaction,
    acks: &mpsc::Sender<Pending>,
    stats: &dyn ApplyStats,
) -> Result<bool, Error> {
    stats.large(txn.rows.spilled());
    if txn.rows.spilled() {
        metrics::counter!(names::TRANSACTIONS_SPILLED).increment(1);
    }
    let meta = Transaction {
        position: txn.position.clone(),
        commit_time_ms: txn.commit_time_ms,
        heartbeat_us: txn.heartbeat_us,
        table_names: txn.table_names.take(),
        json_columns: txn.json_columns.take(),
        xa: txn.xa.take(),
        gtid_previous: txn.gtid_previous.take(),
        ..Transaction::default()
    };
    let o = writer.apply_large(txn, &mut |_| {}, Some(acks.clone())).await?;
    stats.applied(1, o.rows, o.key_changes);
    metrics::counter!(names::TRANSACTIONS).increment(1);
    metrics::counter!(names::ROWS).increment(o.rows);
    let pending = Pending::of(&mut [meta], o.deliveries);
    stats.enqueued(pending.position.as_ref().expect("a whole transaction"), pending.commit_time_ms);
    Ok(acks.send(pending).await.is_ok())
}

/// How long a group may be in Redis before the next one is sent without waiting for it.
pub const OVERLAP_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Groups in Redis at once, at most (at one every [`OVERLAP_AFTER`]: about 50 s of a master
/// that does not answer).
pub const MAX_GROUPS_IN_FLIGHT: usize = 1024;

/// Key changes in Redis at once, at most (their payloads are in memory until the group's
/// events are enqueued; invariant I6).
pub const MAX_KEYS_IN_FLIGHT: usize = 100_000;

/// How long a group's transient Redis failures are retried before the tenure ends
/// ([`Writer::redis_writes`]): longer than a master's freeze or failover usually lasts, short
/// enough that a master that was killed and restarted (its connection does not always recover
/// in place) is reconnected by the new tenure soon.
pub const REDIS_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Transactions per group at most, whatever their rows (transactions of unmapped tables have
/// none): bounds the metadata a group holds.
pub(super) const MAX_GROUP_TRANSACTIONS: usize = 10_000;
