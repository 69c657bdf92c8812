//! Version-fenced writes: the record layout of a suffix replica and of a version token, the
//! fence position that orders writes, and the Lua scripts that apply a write only when it is
//! newer than what a key already holds.
//!
//! # Why
//!
//! Redis Cluster gives no atomicity across the N suffix replicas of a key (they sit on
//! different masters on purpose), and binval re-applies changes after a crash, a replay or a
//! duplicate delivery. Correctness therefore cannot come from "exactly once"; it comes from
//! making every single-key write **conditional on its source position**: a replica or a version
//! token only ever moves forward. Re-applying an old change is a no-op; applying changes twice
//! in any interleaving converges to the newest one (invariant I2 of the design note).
//!
//! # Fence position
//!
//! A [`FencePosition`] is a `u64` that grows with the source's commit order:
//!
//! * `gtid` (MariaDB): the GTID sequence number of the transaction (`domain-server-seq`, the
//!   `seq` part). MariaDB keeps sequence numbers across a primary failover inside one replication
//!   domain (the new primary continues the domain's numbering), so versions stay comparable.
//! * `file_pos` (any source): `file_index << 32 | end_pos`, where `file_index` is the numeric
//!   suffix of the binlog file name (`mysql-bin.000042` -> 42) and `end_pos` the 4-byte event
//!   position after the commit. Positions of different servers are **not** comparable: after a
//!   failover to a server with other file names, raise the fence epoch (below).
//!
//! The top 8 bits carry the **fence epoch** (`source.fence_epoch` in the configuration,
//! default 0): writes of epoch `e + 1` always win over writes of epoch `e`. An operator raises
//! the epoch after a failover that broke position comparability, so the new primary's changes
//! are never refused as "older".
//!
//! The version token `K:ver` holds the fence position of the newest change applied to `K`, as
//! a decimal string (GET-able, parsed as `u64`). Versions are therefore not a change counter:
//! they are the source position of the last change, and an invalidation event carries the same
//! number. The evict rule ([`crate::should_evict`]) needs only that they grow.
//!
//! # Replica record
//!
//! A suffix replica `K:rN` is a Redis **hash**:
//!
//! | field | meaning |
//! |-------|---------|
//! | `d`   | the payload (canonical JSON of the row); absent in a tombstone |
//! | `p`   | fence position of the change that wrote the record (decimal) |
//! | `t`   | `1` when the record is a tombstone (the row was deleted) |
//! | `f`   | fencing token of the binval instance that wrote it (decimal, see HA in the README) |
//! | `n`   | the key's replica count (decimal; see [`crate::adaptive`]); absent in records written before adaptive counts existed |
//!
//! A delete writes a **tombstone** (`p`, `t`, `f`, with a TTL) instead of removing the key, so a
//! late, older write of the same key cannot resurrect the row: the tombstone's `p` refuses it.
//! Readers treat a tombstone as "no row" (and do not fall back to another replica or a loader).
//!
//! Readers read `d`, `t`, `p` and `n` together (`HMGET K:rN d t p n`, one call; `n` is the
//! key's replica count, see [`crate::adaptive`]) and cache what they
//! found *at `p`*: the record is written whole by one script, so the payload and the position
//! belong to the same change, and the evict rule ([`crate::should_evict`]) works on the pair
//! without the version token (which is one key on one master: reading it on every miss would
//! make it the next hot key).
//!
//! # Writing one key
//!
//! 1. Read the version token. If it is already newer than the change's position, a newer
//!    change of the key is fully applied: skip the key (writing the older value into a
//!    replica that happens to be missing would let a reader pair an old value with the newer
//!    version token, and no later event would evict it).
//! 2. Run [`replica_write_script`] on every replica (concurrently on a Cluster).
//! 3. Run [`version_bump_script`] on the token.
//!
//! On standalone Redis, [`key_apply_script`] does all three atomically.
//!
//! The scripts compare decimal strings numerically without converting them to Lua numbers
//! (which are doubles and lose precision above 2^53).

/// Hash field of a replica record holding the payload.
pub const FIELD_DATA: &str = "d";
/// Hash field of a replica record holding the fence position of its last write.
pub const FIELD_POSITION: &str = "p";
/// Hash field marking a tombstone (`"1"`).
pub const FIELD_TOMBSTONE: &str = "t";
/// Hash field holding the fencing token (`ha::lease`: the number of the writer's tenure) of
/// the replica record's last write; scripts refuse a write under an older token.
pub const FIELD_FENCING_TOKEN: &str = "f";
/// The former name of [`FIELD_FENCING_TOKEN`]: the field holds a fencing token, not a fence
/// position.
#[deprecated(note = "use FIELD_FENCING_TOKEN: the field holds the fencing token, not a fence position")]
pub const FIELD_FENCE: &str = FIELD_FENCING_TOKEN;

/// Number of low bits of a [`FencePosition`] below the fence epoch.
pub const EPOCH_SHIFT: u32 = 56;

/// A monotonic source position used to order writes of one key. See the module docs for how it
/// is built from a GTID or a binlog position, and for the fence epoch in its top 8 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FencePosition(pub u64);

impl FencePosition {
    /// From a MariaDB GTID sequence number. `None` when `seq` does not fit below the epoch bits
    /// (2^56, i.e. never in practice).
    pub fn from_gtid_seq(epoch: u8, seq: u64) -> Option<Self> {
        (seq < 1u64 << EPOCH_SHIFT).then(|| FencePosition(u64::from(epoch) << EPOCH_SHIFT | seq))
    }

    /// From a binlog file name and the 4-byte position after the commit event. `None` when the
    /// file name has no numeric suffix or the index does not fit in 24 bits.
    ///
    /// ```
    /// use binval_protocol::FencePosition;
    /// let p = FencePosition::from_file_pos(0, "mysql-bin.000042", 4711).unwrap();
    /// assert_eq!(p.0, 42 << 32 | 4711);
    /// assert!(FencePosition::from_file_pos(0, "mysql-bin.000043", 4).unwrap() > p);
    /// ```
    pub fn from_file_pos(epoch: u8, file: &str, pos: u32) -> Option<Self> {
        let idx = crate::position::file_index(file)?;
        (idx < 1 << 24).then(|| FencePosition(u64::from(epoch) << EPOCH_SHIFT | idx << 32 | u64::from(pos)))
    }

    /// The fence epoch (top 8 bits).
    pub fn epoch(self) -> u8 {
        (self.0 >> EPOCH_SHIFT) as u8
    }
}

impl std::fmt::Display for FencePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one replica read (`HMGET K:rN d t p n`; `n` parsed apart, [`crate::adaptive::parse_count`]) found, with the fence position of the write
/// that made the record: a reader caches the pair (value, position), which is exact — the
/// record is written whole by one script, so its `d` and `p` belong to the same change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaRecord {
    /// No payload and no tombstone: the key does not exist (never written, expired, or wiped;
    /// `position` is `None`), or it is an invalidate-mode record (`inv`: position only, the
    /// row lives in the database; `position` is `Some`). Readers try another replica, then
    /// their loader.
    Missing {
        /// The position of an invalidate-mode record, `None` when the key does not exist.
        position: Option<u64>,
    },
    /// A tombstone: the row was deleted by the change at `position`. Readers answer "no row".
    Deleted {
        /// The fence position of the delete (0 if the record has none).
        position: u64,
    },
    /// The payload bytes, written by the change at `position`.
    Value {
        /// The payload (field `d`).
        data: Vec<u8>,
        /// The fence position of the change (0 if the record has none: any event then evicts
        /// a value cached at it, the safe side).
        position: u64,
    },
}

impl ReplicaRecord {
    /// Interpret the `d`, `t`, `p` fields of a replica read, in that order. Errors
    /// ([`FieldError::Position`]) when `p` is present but not a decimal `u64` (the key was
    /// written by something other than binval); the error holds the value.
    ///
    /// ```
    /// use binval_protocol::ReplicaRecord;
    /// let r = ReplicaRecord::from_fields(Some(b"{}".to_vec()), None, Some(b"42".to_vec())).unwrap();
    /// assert_eq!(r, ReplicaRecord::Value { data: b"{}".to_vec(), position: 42 });
    /// ```
    pub fn from_fields(data: Option<Vec<u8>>, tombstone: Option<Vec<u8>>, position: Option<Vec<u8>>) -> Result<Self, FieldError> {
        let position = match position {
            None => None,
            Some(p) => Some(decimal(&p).ok_or_else(|| FieldError::Position(String::from_utf8_lossy(&p).into_owned()))?),
        };
        Ok(match (data, tombstone) {
            (Some(data), _) => ReplicaRecord::Value { data, position: position.unwrap_or(0) },
            (None, Some(_)) => ReplicaRecord::Deleted { position: position.unwrap_or(0) },
            (None, None) => ReplicaRecord::Missing { position },
        })
    }
}

/// Parse a version token as read by `GET K:ver` (`None` = never written = version 0). Writers,
/// replay and operators read the token; the consumer's read path does not (it caches each
/// replica's own position).
///
/// Errors ([`FieldError::Version`]) when the stored string is not a decimal `u64` (the key was
/// written by something other than binval); the error holds the value.
///
/// ```
/// use binval_protocol::{parse_version, FieldError};
/// assert_eq!(parse_version(Some(b"42")), Ok(42));
/// assert_eq!(parse_version(None), Ok(0));
/// assert_eq!(parse_version(Some(b"x")), Err(FieldError::Version("x".into())));
/// ```
pub fn parse_version(raw: Option<&[u8]>) -> Result<u64, FieldError> {
    match raw {
        None => Ok(0),
        Some(b) => decimal(b).ok_or_else(|| FieldError::Version(String::from_utf8_lossy(b).into_owned())),
    }
}

/// A value binval reads back from Redis that binval did not write (another writer shares the
/// keyspace, or a key was edited by hand). `Display` names the field and quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// A replica record's fence position (field `p`) is not a decimal `u64`.
    #[error("position (field `p`) is not a decimal integer: {0:?}")]
    Position(String),
    /// A version token (`K:ver`) is not a decimal `u64`.
    #[error("version token is not a decimal integer: {0:?}")]
    Version(String),
    /// A replica count (field `n`, or a hot set entry) is not a decimal in
    /// `1..=`[`crate::adaptive::MAX_REPLICAS`].
    #[error("replica count (field `n`) is not a decimal in 1..={max}: {0:?}", max = crate::adaptive::MAX_REPLICAS)]
    Count(String),
}

/// `raw` as a decimal `u64`, if it is one.
fn decimal(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

/// Lua helper shared by the scripts: numeric comparison of two decimal strings without leading
/// zeros (`a > b`).
pub(crate) const LUA_NEWER: &str = r#"
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"#;

/// Lua helper shared by the replica and whole-key scripts: write one replica record `k` (see
/// "Replica record") at position `pos` under fencing token `tok`, of `kind` `set` (payload
/// `data`), `del` or `inv`, with TTL `ttl` ms (`'0'` = none) and replica count `n` (field `n`;
/// left alone when the caller passes none). Returns `-1`, `0` or `1` as
/// [`replica_write_script`] does.
///
/// Cost, the reason for its shape: a change writes N replicas, so this runs N times per key
/// change and is most of the Redis CPU binval costs (docs/benchmarks.md, "Load benchmark").
/// One read (`HMGET p f t x`) and, in the common case (a `set` over a `set`, no TTL), one
/// `HSET` that overwrites the fields in place: no `DEL` and re-create of the hash, and a
/// replica node replays one command. Fields the new kind does not have are removed (`t` only
/// when the read found it), and `x` records that the key carries a TTL, so `PERSIST` runs only
/// when one must go. A tombstone (`t`) always counts as carrying one: records written before
/// `x` existed (binval 0.1) kept a TTL only on tombstones and invalidate-mode records; such an
/// invalidate-mode record overwritten by a `set` without TTL keeps its TTL once, and expiring
/// then only makes readers fall back to their loader.
const LUA_WRITE_REPLICA: &str = r#"
local function put(k, x, n, ...)
  if x and n then return redis.call('HSET', k, 'x', '1', 'n', n, ...) end
  if x then return redis.call('HSET', k, 'x', '1', ...) end
  if n then return redis.call('HSET', k, 'n', n, ...) end
  return redis.call('HSET', k, ...)
end
local function write_replica(k, pos, tok, kind, data, ttl, n)
  local cur = redis.call('HMGET', k, 'p', 'f', 't', 'x')
  if cur[2] and newer(cur[2], tok) then return -1 end
  if cur[1] and not newer(pos, cur[1]) then return 0 end
  local x = ttl ~= '0'
  if kind == 'set' then
    put(k, x, n, 'd', data, 'p', pos, 'f', tok)
    if cur[3] then redis.call('HDEL', k, 't') end
  elseif kind == 'del' then
    put(k, x, n, 'p', pos, 't', '1', 'f', tok)
    if not cur[3] then redis.call('HDEL', k, 'd') end
  else
    put(k, x, n, 'p', pos, 'f', tok)
    redis.call('HDEL', k, 'd', 't')
  end
  if x then
    redis.call('PEXPIRE', k, ttl)
  elseif cur[4] or cur[3] then
    redis.call('PERSIST', k)
    if cur[4] then redis.call('HDEL', k, 'x') end
  end
  return 1
end
"#;

/// The replica write script. `KEYS[1]` = `K:rN`; `ARGV` = position, fencing token, kind, payload
/// (ignored unless kind is `set`), TTL in ms (`0` = none), and optionally the key's replica
/// count (field `n`, see [`crate::adaptive`]).
///
/// Kinds: `set` stores the payload; `del` stores a tombstone (`t` = 1; readers answer "no row");
/// `inv` (invalidate mode) stores only the position, so readers see a missing replica and fall
/// back to their loader, while an older write is still refused. The record holds the fields of
/// its kind only, and a TTL only when the write asks for one, whatever was there before.
///
/// Returns `1` when applied, `0` when the record already holds this or a newer position (a
/// no-op re-apply), `-1` when the record was written under a newer fencing token (this writer
/// has lost its lease and must stop).
pub fn replica_write_script() -> String {
    format!(
        "{LUA_NEWER}{LUA_WRITE_REPLICA}
return write_replica(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
"
    )
}

/// The whole-key script for standalone Redis (all keys on one server, so one script can touch
/// them): `KEYS[1]` = `K:ver`, `KEYS[2..]` = the replicas; `ARGV` as for
/// [`replica_write_script`].
///
/// Skips the key entirely when its version token is already newer than the position (a newer
/// change is fully applied: writing an older value into a missing replica would pair an old
/// value with a newer version for readers). Otherwise applies every replica, then moves the
/// token. Returns `{replicas written, version moved (0|1), lost lease (0|1), skipped (0|1)}`.
pub fn key_apply_script() -> String {
    format!(
        "{LUA_NEWER}{LUA_WRITE_REPLICA}
local ver = redis.call('GET', KEYS[1])
if ver and newer(ver, ARGV[1]) then return {{0, 0, 0, 1}} end
local written, lost = 0, 0
for i = 2, #KEYS do
  local r = write_replica(KEYS[i], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  if r == -1 then lost = 1 elseif r == 1 then written = written + 1 end
end
if lost == 1 then return {{written, 0, 1, 0}} end
local moved = 0
if not ver or newer(ARGV[1], ver) then
  redis.call('SET', KEYS[1], ARGV[1])
  moved = 1
end
return {{written, moved, 0, 0}}
"
    )
}

/// The version token script. `KEYS[1]` = `K:ver`; `ARGV[1]` = position. Sets the token to the
/// position when it is newer than the stored one (or absent). Returns `1` when it moved, `0`
/// otherwise.
pub fn version_bump_script() -> String {
    format!(
        "{LUA_NEWER}
local cur = redis.call('GET', KEYS[1])
if cur and not newer(ARGV[1], cur) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_by_epoch_then_source_order() {
        let a = FencePosition::from_gtid_seq(0, u64::MAX >> 8).unwrap();
        let b = FencePosition::from_gtid_seq(1, 1).unwrap();
        assert!(b > a);
        assert_eq!(b.epoch(), 1);
        assert!(FencePosition::from_gtid_seq(0, 1 << 56).is_none());
        assert!(FencePosition::from_file_pos(0, "binlog", 4).is_none());
        assert!(FencePosition::from_file_pos(0, "b.016777216", 4).is_none());
        let f1 = FencePosition::from_file_pos(0, "b.000001", u32::MAX).unwrap();
        let f2 = FencePosition::from_file_pos(0, "b.000002", 4).unwrap();
        assert!(f2 > f1);
    }

    #[test]
    fn replica_records_and_versions_parse() {
        let p = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(ReplicaRecord::from_fields(None, None, None), Ok(ReplicaRecord::Missing { position: None }));
        assert_eq!(ReplicaRecord::from_fields(None, None, p("7")), Ok(ReplicaRecord::Missing { position: Some(7) }));
        assert_eq!(ReplicaRecord::from_fields(None, p("1"), p("9")), Ok(ReplicaRecord::Deleted { position: 9 }));
        assert_eq!(ReplicaRecord::from_fields(p("{}"), None, p("10")), Ok(ReplicaRecord::Value { data: b"{}".to_vec(), position: 10 }));
        assert_eq!(ReplicaRecord::from_fields(p("{}"), None, None), Ok(ReplicaRecord::Value { data: b"{}".to_vec(), position: 0 }));
        assert!(ReplicaRecord::from_fields(p("{}"), None, p("x")).unwrap_err().to_string().contains("\"x\""));
        assert_eq!(parse_version(None), Ok(0));
        assert_eq!(parse_version(Some(b"18446744073709551615")), Ok(u64::MAX));
        assert!(parse_version(Some(b"x")).unwrap_err().to_string().contains("\"x\""));
    }
}
