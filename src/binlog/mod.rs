//! Reading the binlog: from the replica connection (or a binlog file) to committed
//! transactions, whose row events are decoded after their commit.
//!
//! | module | step |
//! |---|---|
//! | [`server`] | the source server: connect, preflight, binary logs, schema checks |
//! | [`boundary`] | an operator's start position checked: moved back to the start of the transaction it lies in, refused inside an event |
//! | [`start_plan`] | where a tenure starts: the checkpoint's position on the same server, else its GTIDs (failover), else `source.start`; the one owner of that decision |
//! | [`resume`] | the start of a replica connection as a type, the reader's counters |
//! | [`gtid`] | MySQL GTIDs of events as text and sets, and the GTID set a replica sends |
//! | [`reader`] | the replica connection: start/resume, heartbeats, reconnect, events -> transactions |
//! | `events` | the live reader's handler per event type (rotate, TABLE_MAP, rows, XID, GTID, query...) |
//! | [`framing`] | events as stored -> events to handle, shared by both readers: MariaDB GTID, compressed events, TRANSACTION_PAYLOAD, skippable unknown events, the TABLE_MAP cache |
//! | [`decode`] | TABLE_MAP + row events -> rows with named columns, canonical JSON values |
//! | [`json_columns`] | MariaDB JSON columns as of each place in the binlog (read again after each DDL on a mapped table) |
//! | [`ddl`] | table-level DDL (TRUNCATE, DROP, RENAME) on mapped tables |
//! | [`row_events`] | the row events of one transaction, held raw (in memory, then in a temporary file) until its commit, decoded in chunks |
//! | [`txn`] | row events grouped by transaction; only committed transactions go on |
//! | [`xa`] | two-phase XA transactions held from XA PREPARE to XA COMMIT (applied) or XA ROLLBACK (dropped); the checkpoint held back meanwhile |
//! | [`heartbeat`] | binval's heartbeat row on the primary (`source.heartbeat_table`), for a sub-second lag |
//! | [`offline`] | the same decoding over a binlog file (`binval decode`) |

pub mod boundary;
pub mod ddl;
pub mod decode;
pub(crate) mod events;
pub mod framing;
pub mod gtid;
pub mod heartbeat;
pub mod json_columns;
pub mod offline;
pub mod reader;
pub mod resume;
pub mod row_events;
pub mod server;
pub mod start_plan;
pub mod txn;
pub mod xa;
