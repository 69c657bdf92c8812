//! `binval inspect`: one key in full, for an operator asking "what does Redis hold for this
//! key, where, and is it right?". For the logical key (given, or rendered from the row of
//! `--table` / `--pk`): each suffix replica's name, hash slot, owning master and that master's
//! Redis replicas, fence position, fencing token, payload size and TTL; the version token;
//! whether they agree; and the database row the key should hold (read in a consistent
//! snapshot, by the key template's columns or by the primary key) with the verdict of
//! `binval verify`'s rules ([`super::verify::compare`]). A human table by default, `--json`
//! for scripts. Read-only.

mod render;
pub mod topology;

use serde::Serialize;

use super::verify::compare::{compare, Expected, Finding};
use crate::config::{Config, MappingConfig, MappingMode};
use crate::error::{DefiniteError, Error};
use crate::mapping::KeyChange;
use crate::redis::RedisConn;
use crate::scan::keyspace::KeyResolver;
use crate::scan::table::ScannedRow;
use crate::scan::Scanner;
use crate::write::key_state::{KeyState, ReplicaState};
use topology::{SlotOwner, Topology};

/// The arguments of `binval inspect` (clap; the field docs are the `--help` text).
#[derive(Debug, Clone, clap::Args)]
pub struct InspectCli {
    /// The logical key (e.g. item:detail:6666), without a replica suffix.
    #[arg(value_name = "KEY", required_unless_present = "table", conflicts_with_all = ["table", "pk"])]
    pub key: Option<String>,
    /// The mapped table of the row (`schema.table`), with --pk: inspect every key it maps to.
    #[arg(long, value_name = "SCHEMA.TABLE", requires = "pk")]
    pub table: Option<String>,
    /// The row's primary key value; repeat for each column of a composite key, in key order.
    #[arg(long, value_name = "VALUE", requires = "table")]
    pub pk: Vec<String>,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Everything `inspect` found.
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The keys, one per key template of the row (one for a given key).
    pub keys: Vec<KeyReport>,
    /// The database row (canonical JSON), when one was found.
    pub row: Option<serde_json::Value>,
    /// The snapshot the row was read in (`file:pos`), or why it could not be read.
    pub row_source: String,
}

/// One logical key.
#[derive(Debug, Serialize)]
pub struct KeyReport {
    /// The logical key.
    pub key: String,
    /// Its mapped table, key template, mode and replica count.
    pub table: String,
    /// See `table`.
    pub template: String,
    /// `write-through` or `invalidate`.
    pub mode: &'static str,
    /// Suffix replicas of this key now: the mapping's `replicas`, or with an adaptive mapping
    /// the count the leader gave the key (`crate::replicas`).
    pub replica_count: u32,
    /// The mapping's setting: `8`, or `1..=16` for an adaptive one.
    pub replica_setting: String,
    /// Why the key has `replica_count` copies (adaptive mappings): the leader's reason, with
    /// the fleet read rate it saw; `None` for a static count or a key at its `min`.
    pub replica_count_why: Option<String>,
    /// The version token.
    pub version: NodeReport,
    /// The suffix replicas, `K:r0` first.
    pub replicas: Vec<NodeReport>,
    /// Whether the replicas and the token agree with each other and with the row.
    pub agree: bool,
    /// What does not agree (empty when `agree`).
    pub findings: Vec<Finding>,
    /// The payload the row makes for this key (write-through), when a row was read.
    pub expected_payload: Option<String>,
}

/// One Redis key of a logical key (a replica or the version token).
#[derive(Debug, Serialize)]
pub struct NodeReport {
    /// The Redis key.
    pub name: String,
    /// Its hash slot.
    pub slot: u16,
    /// The master serving the slot, and that master's replicas.
    pub node: Option<SlotOwner>,
    /// The key exists.
    pub exists: bool,
    /// Replica: the fence position of its last write. Token: its value.
    pub position: Option<u64>,
    /// Replica: the fencing token of the writer.
    pub fencing_token: Option<u64>,
    /// Replica: a tombstone.
    pub tombstone: bool,
    /// Replica: payload size, bytes.
    pub payload_bytes: Option<usize>,
    /// Replica: the payload.
    pub payload: Option<String>,
    /// Milliseconds to live (`None`: no TTL or missing).
    pub ttl_ms: Option<i64>,
}

/// `binval inspect` from the command line: print the table or the JSON.
pub async fn cli(cfg: &Config, args: InspectCli) -> Result<(), Error> {
    let ins = inspect(cfg, &args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ins).expect("inspection serializes"));
    } else {
        print!("{}", render::table(&ins));
    }
    Ok(())
}

/// Gather the inspection (module docs).
///
/// Errors: a key of no mapping's template (`KEY`), an unknown `--table`, a `--pk` of the
/// wrong arity or of no row, Redis failures. A table that cannot be read leaves the row out
/// (`row_source` says why) and judges the key by Redis alone.
pub async fn inspect(cfg: &Config, args: &InspectCli) -> Result<Inspection, Error> {
    let resolver = KeyResolver::new(&cfg.mappings);
    let redis = RedisConn::connect(&cfg.redis).await?;
    let (mapping, key) = match &args.key {
        Some(k) => {
            let o = resolver.owner(k).ok_or_else(|| {
                let all: Vec<&str> = cfg.mappings.iter().flat_map(|m| m.keys.iter().map(String::as_str)).collect();
                Error::config("KEY", format!("`{k}` fits no mapping's key template ({})", all.join(", ")))
            })?;
            (
                resolver.mappings[o.mapping].clone(),
                Some((k.clone(), o.template, o.values.iter().map(|(c, v)| (c.clone(), v.to_string())).collect::<Vec<_>>())),
            )
        }
        None => {
            let table = args.table.as_deref().unwrap_or_default();
            (crate::scan::selected_mappings(cfg, &[table.to_string()])?.remove(0), None)
        }
    };
    let (row, changes, row_source) = read_row(cfg, &redis, &mapping, &resolver, key.as_ref(), &args.pk).await?;
    let mut keys: Vec<KeyChange> = match &key {
        Some((k, _, _)) => vec![changes.iter().find(|c| c.key == *k).cloned().unwrap_or_else(|| delete_change(&mapping, k))],
        None => changes,
    };
    // Adaptive mappings: each key's count as the leader stored it.
    let stored: std::collections::HashMap<String, crate::replicas::counts::Stored> = if mapping.replicas.is_adaptive() {
        crate::replicas::counts::load(&redis, &cfg.source.name).await?.into_iter().collect()
    } else {
        Default::default()
    };
    for c in &mut keys {
        match stored.get(&c.key) {
            Some(s) => (c.replicas, c.count) = (s.w.max(s.n), s.n),
            None => (c.replicas, c.count) = (mapping.replicas.min, mapping.replicas.min),
        }
    }
    let states = redis.read_key_states(&keys.iter().map(|c| (c.key.as_str(), c.replicas)).collect::<Vec<_>>()).await?;
    let topo = Topology::read(&redis, &topology::host_port(cfg.redis.urls.first().map(String::as_str).unwrap_or_default())).await?;
    let mut reports = Vec::with_capacity(keys.len());
    for (c, state) in keys.iter().zip(states) {
        let mut report = key_report(&redis, &topo, &mapping, c, &state, row.is_some() || !row_source.starts_with("not read")).await?;
        report.replica_count_why = stored.get(&c.key).map(|s| format!("{} (fleet reads {:.0}/s when decided)", s.why, s.reads_per_sec));
        reports.push(report);
    }
    Ok(Inspection { keys: reports, row: row.map(|r| serde_json::Value::Object(r.row)), row_source })
}

/// A given key: the key, its template's index in its mapping, the column texts it splits into.
type KeyArg = (String, usize, Vec<(String, String)>);

/// The row the key should hold (by the key's template columns, or by `--pk`), the key
/// changes it makes, and where it was read (or why not).
async fn read_row(
    cfg: &Config,
    redis: &RedisConn,
    mapping: &MappingConfig,
    resolver: &KeyResolver,
    key: Option<&KeyArg>,
    pk: &[String],
) -> Result<(Option<ScannedRow>, Vec<KeyChange>, String), Error> {
    let renamed = crate::ha::checkpoint::followed_renames(cfg, redis).await?;
    let mut scanner = match Scanner::open(cfg, std::slice::from_ref(mapping), &renamed).await {
        Ok(s) => s,
        Err(e) if key.is_some() => return Ok((None, Vec::new(), format!("not read: {e}"))),
        Err(e) => return Err(e),
    };
    let snap = scanner.snap.begin().await?;
    let layout = scanner.tables[0].layout.clone();
    let rows = match key {
        Some((_, t, values)) => {
            let m = resolver.mappings.iter().position(|m| m.table == mapping.table).unwrap_or(0);
            let tpl = &resolver.templates[m][*t];
            if layout.has_columns(tpl) {
                let v: Vec<(&str, &str)> = values.iter().map(|(c, v)| (c.as_str(), v.as_str())).collect();
                layout.by_columns(scanner.snap.conn(), &v, 2).await?
            } else {
                Vec::new()
            }
        }
        None => {
            if pk.len() != layout.key.len() {
                return Err(Error::config(
                    "--pk",
                    format!(
                        "{} has a {}-column key ({}): give --pk once per column, in that order",
                        mapping.table,
                        layout.key.len(),
                        layout.key.join(", ")
                    ),
                ));
            }
            let values: Vec<mysql_async::Value> = pk.iter().map(|v| mysql_async::Value::Bytes(v.as_bytes().to_vec())).collect();
            let rows = layout.by_keys(scanner.snap.conn(), &[values]).await?;
            if rows.is_empty() {
                return Err(DefiniteError::Scan {
                    table: mapping.table.clone(),
                    message: format!("no row has {} = ({})", layout.key_name, pk.join(", ")),
                }
                .into());
            }
            rows
        }
    };
    let mut changes = Vec::new();
    let wanted = key.map(|k| k.0.as_str());
    let row = rows.into_iter().find(|r| {
        changes.clear();
        scanner.row_keys(0, &r.row, &mut changes);
        wanted.is_none_or(|k| changes.iter().any(|c| c.key == k))
    });
    if row.is_none() {
        changes.clear();
    }
    // Shown as the payload holds it: a MariaDB JSON column (text holding a document) as the
    // document, not as an escaped string beside a replica that holds the document.
    let json = scanner.mapper.json_columns(&mapping.table).to_vec();
    let row = row.map(|mut r| {
        for c in &json {
            if let Some(v) = r.row.get_mut(c) {
                if let Some(doc) = v.as_str().and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()) {
                    *v = doc;
                }
            }
        }
        r
    });
    scanner.snap.close().await;
    Ok((row, changes, snap.position.to_string()))
}

/// The change that says "no row maps to `key`".
fn delete_change(m: &MappingConfig, key: &str) -> KeyChange {
    KeyChange {
        key: key.to_string(),
        op: binval_protocol::Op::Delete,
        table: m.table.as_str().into(),
        payload: None,
        replicas: m.replicas.min,
        count: m.replicas.min,
        ttl_secs: m.ttl_secs,
    }
}

/// The report of one key; `row_known`: the database was read (a key without row is then
/// judged as one).
async fn key_report(
    redis: &RedisConn,
    topo: &Topology,
    m: &MappingConfig,
    c: &KeyChange,
    state: &KeyState,
    row_known: bool,
) -> Result<KeyReport, Error> {
    let names: Vec<String> =
        (0..c.replicas).map(|r| binval_protocol::replica_key(&c.key, r)).chain([binval_protocol::version_key(&c.key)]).collect();
    let ttls = redis.read_ttls(&names).await?;
    let node = |name: &str, r: Option<&ReplicaState>, position: Option<u64>, ttl: i64| {
        let slot = binval_protocol::hash_slot(name.as_bytes());
        NodeReport {
            name: name.to_string(),
            slot,
            node: topo.owner(slot),
            exists: ttl != -2,
            position,
            fencing_token: r.and_then(|r| r.fencing_token),
            tombstone: r.is_some_and(|r| r.tombstone),
            payload_bytes: r.and_then(|r| r.payload.as_ref().map(Vec::len)),
            payload: r.and_then(|r| r.payload.as_ref().map(|p| String::from_utf8_lossy(p).into_owned())),
            ttl_ms: (ttl >= 0).then_some(ttl),
        }
    };
    let replicas = state.replicas.iter().enumerate().map(|(i, r)| node(&names[i], Some(r), r.position, ttls[i])).collect();
    let version = node(&names[c.replicas as usize], None, state.version, ttls[c.replicas as usize]);
    let findings = if row_known {
        let expected =
            Expected { payload: c.payload.as_deref(), row: c.op != binval_protocol::Op::Delete, mode: m.mode, ttl: m.ttl_secs > 0 };
        compare(&expected, state)
    } else {
        redis_only_findings(state)
    };
    Ok(KeyReport {
        key: c.key.clone(),
        table: m.table.clone(),
        template: m
            .keys
            .iter()
            .find(|k| binval_protocol::KeyTemplate::parse(k).is_ok_and(|t| t.split_key(&c.key).is_some()))
            .cloned()
            .unwrap_or_default(),
        mode: if m.mode == MappingMode::WriteThrough { "write-through" } else { "invalidate" },
        replica_count: c.replicas,
        replica_setting: m.replicas.to_string(),
        replica_count_why: None,
        version,
        replicas,
        agree: findings.is_empty(),
        findings,
        expected_payload: c.payload.clone(),
    })
}

/// Without the row: the replicas must agree with each other (one payload, one position) and
/// the token must not be older than them.
fn redis_only_findings(state: &KeyState) -> Vec<Finding> {
    use super::verify::compare::Kind;
    let mut out = Vec::new();
    let present: Vec<(usize, &ReplicaState)> = state.replicas.iter().enumerate().filter(|(_, r)| r.exists).collect();
    if let Some((_, first)) = present.first() {
        for (i, r) in &present[1..] {
            if r.payload != first.payload || r.position != first.position || r.tombstone != first.tombstone {
                out.push(Finding {
                    kind: Kind::Stale,
                    replica: Some(*i as u32),
                    detail: "differs from the first replica present".into(),
                    fields: Vec::new(),
                });
            }
        }
    }
    let newest = state.replicas.iter().filter_map(|r| r.position).max();
    if let (Some(p), Some(v)) = (newest, state.version) {
        if v < p {
            out.push(Finding {
                kind: Kind::Version,
                replica: None,
                detail: format!("version token {v} is older than a replica's position {p}"),
                fields: Vec::new(),
            });
        }
    }
    out
}
