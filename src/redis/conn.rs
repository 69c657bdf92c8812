//! [`RedisConn`]: the connection every step shares (module docs of [`crate::redis`] say how
//! it batches, routes and fails).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use binval_protocol::fence;
use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncCommands, RedisError, RedisResult, Value};

use super::SlotMap;

use crate::config::{RedisConfig, RedisMode};
use crate::error::{classify_redis, Error, TransientError};

/// A connection to standalone Redis or a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, reconnecting connection manager.
    Standalone(ConnectionManager),
    /// Cluster, slot-routed multiplexed connection, and binval's copy of the slot map (for
    /// per-master batches) with the settings of per-master connections.
    Cluster(ClusterConnection, Arc<ClusterState>),
}

/// What binval keeps beside a Cluster connection.
pub struct ClusterState {
    /// binval's copy of the slot map.
    map: RwLock<SlotMap>,
    /// The Redis settings: TLS and the ACL user of the per-master connections `SCAN` opens.
    cfg: RedisConfig,
}

/// Commands per pipeline: a master answers a pipeline in one go, so a very long one delays
/// the reads queued behind it.
const PIPELINE_MAX: usize = 512;

impl RedisConn {
    /// Connect per `cfg`. Connection failures are transient, TLS and authentication failures
    /// definite naming the setting; a server of the other mode is a definite error naming
    /// `redis.mode`.
    pub async fn connect(cfg: &RedisConfig) -> Result<Self, Error> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let transient = |e| crate::security::redis::connect_error(e, cfg);
        match cfg.mode {
            RedisMode::Standalone => {
                let client = crate::security::redis::client(cfg, &cfg.urls[0], "redis.urls[0]")?;
                let mc = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2);
                let mut cm = client.get_connection_manager_with_config(mc).await.map_err(transient)?;
                let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut cm).await.map_err(transient)?;
                if info.contains("cluster_enabled:1") {
                    return Err(mode_mismatch("standalone", "is a Redis Cluster node; set redis.mode = \"cluster\""));
                }
                let conn = RedisConn::Standalone(cm);
                conn.load_scripts().await.map_err(transient)?;
                Ok(conn)
            }
            RedisMode::Cluster => {
                let client = crate::security::redis::cluster_builder(cfg)?
                    .response_timeout(timeout)
                    .connection_timeout(timeout)
                    .build()
                    .map_err(transient)?;
                match client.get_async_connection().await {
                    Ok(c) => {
                        let conn = RedisConn::Cluster(c, Arc::new(ClusterState { map: RwLock::default(), cfg: cfg.clone() }));
                        conn.refresh_slots().await.map_err(transient)?;
                        conn.load_scripts().await.map_err(transient)?;
                        Ok(conn)
                    }
                    Err(e) if e.to_string().contains("cluster support disabled") => {
                        Err(mode_mismatch("cluster", "is a standalone server (cluster support disabled); set redis.mode = \"standalone\""))
                    }
                    Err(e) => Err(transient(e)),
                }
            }
        }
    }

    /// Run one command, routed by its key in cluster mode.
    pub async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, RedisError> {
        match self {
            RedisConn::Standalone(c) => cmd.query_async(c).await,
            RedisConn::Cluster(c, _) => cmd.query_async(c).await,
        }
    }

    /// GET a string key.
    pub async fn get(&mut self, key: &str) -> Result<Option<String>, RedisError> {
        match self {
            RedisConn::Standalone(c) => c.get(key).await,
            RedisConn::Cluster(c, _) => c.get(key).await,
        }
    }

    /// SET a string key.
    pub async fn set(&mut self, key: &str, value: &str) -> Result<(), RedisError> {
        match self {
            RedisConn::Standalone(c) => c.set(key, value).await,
            RedisConn::Cluster(c, _) => c.set(key, value).await,
        }
    }

    /// Run a Lua script (EVALSHA, loading it on NOSCRIPT), routed by its first key.
    pub async fn eval<T: redis::FromRedisValue>(&mut self, code: &str, keys: &[String], args: &[String]) -> Result<T, RedisError> {
        let script = redis::Script::new(code);
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        match self {
            RedisConn::Standalone(c) => inv.invoke_async(c).await,
            RedisConn::Cluster(c, _) => inv.invoke_async(c).await,
        }
    }

    /// Every key matching the glob `pattern`: `SCAN MATCH` over the server, or over every
    /// master of a cluster, in no particular order. `SCAN` may return a key more than once (a
    /// rehash, a slot moving between masters): callers that need each key once sort and dedup.
    /// Errors are classified per [`classify_redis`], naming the pattern.
    pub async fn scan_match(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let mut keys: Vec<String> = Vec::new();
        self.scan_each(pattern, &mut |batch| keys.extend(batch)).await?;
        Ok(keys)
    }

    /// [`RedisConn::scan_match`] without holding the keys: each batch `SCAN` returns is handed
    /// to `f` as it comes (a key may come more than once).
    pub async fn scan_each(&self, pattern: &str, f: &mut (dyn FnMut(Vec<String>) + Send)) -> Result<(), Error> {
        match self {
            RedisConn::Standalone(c) => scan_into(&mut c.clone(), pattern, f).await?,
            RedisConn::Cluster(..) => {
                for mut node in self.cluster_masters().await? {
                    scan_into(&mut node, pattern, f).await?;
                }
            }
        }
        Ok(())
    }

    /// The first key matching the glob `pattern` found by `SCAN` on the server, or on each
    /// master of a cluster in turn, visiting at most about `budget` keys per server (`SCAN`
    /// visits every key; `MATCH` filters after): `None` when none was found within the budget.
    /// For "does anything of this kind exist?" on a keyspace of any size. Errors are classified
    /// per [`classify_redis`], naming the pattern.
    pub async fn scan_first(&self, pattern: &str, budget: u64) -> Result<Option<String>, Error> {
        match self {
            RedisConn::Standalone(c) => scan_first_on(&mut c.clone(), pattern, budget).await,
            RedisConn::Cluster(..) => {
                for mut node in self.cluster_masters().await? {
                    if let Some(k) = scan_first_on(&mut node, pattern, budget).await? {
                        return Ok(Some(k));
                    }
                }
                Ok(None)
            }
        }
    }

    /// A plain connection to every Cluster master (`CLUSTER SLOTS`); empty for standalone.
    pub async fn cluster_masters(&self) -> Result<Vec<redis::aio::MultiplexedConnection>, Error> {
        let RedisConn::Cluster(_, state) = self else { return Ok(Vec::new()) };
        let cfg = &state.cfg;
        let map = self.refresh_slots().await.map_err(transient)?;
        let mut masters: Vec<&String> = map.masters().iter().collect();
        masters.sort();
        let mut out = Vec::new();
        for m in masters {
            let client = crate::security::redis::node_client(cfg, m)?;
            out.push(client.get_multiplexed_async_connection().await.map_err(|e| crate::security::redis::connect_error(e, cfg))?);
        }
        Ok(out)
    }

    /// Read `CLUSTER SLOTS` into binval's slot map (cluster; a no-op for standalone) and
    /// return it.
    pub async fn refresh_slots(&self) -> RedisResult<SlotMap> {
        let RedisConn::Cluster(c, map) = self else { return Ok(SlotMap::default()) };
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c.clone()).await?;
        let fresh = SlotMap::from_cluster_slots(&reply);
        *map.map.write().expect("slot map lock") = fresh.clone();
        Ok(fresh)
    }

    /// `f` of binval's copy of the slot map (cluster), as last read; `None` for standalone
    /// Redis.
    pub fn with_slot_map<R>(&self, f: impl FnOnce(&SlotMap) -> R) -> Option<R> {
        match self {
            RedisConn::Standalone(_) => None,
            RedisConn::Cluster(_, state) => Some(f(&state.map.read().expect("slot map lock"))),
        }
    }

    /// Replace binval's copy of the slot map (cluster; a no-op for standalone): for tests of a
    /// stale map (a pipeline that fails refreshes it).
    #[doc(hidden)]
    pub fn replace_slot_map(&self, fresh: SlotMap) {
        if let RedisConn::Cluster(_, map) = self {
            *map.map.write().expect("slot map lock") = fresh;
        }
    }

    /// `SCRIPT LOAD` binval's fenced-write scripts (`binval_protocol::fence`) on the server,
    /// or on every master of a cluster, so batches can call them by hash (`EVALSHA`).
    pub async fn load_scripts(&self) -> RedisResult<()> {
        for code in [fence::key_apply_script(), fence::replica_write_script(), fence::version_bump_script()] {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(code);
            match self {
                RedisConn::Standalone(c) => {
                    let _: String = cmd.query_async(&mut c.clone()).await?;
                }
                RedisConn::Cluster(c, _) => {
                    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(ResponsePolicy::AllSucceeded)));
                    c.clone().route_command(cmd, all).await?;
                }
            }
        }
        Ok(())
    }

    /// Run the `n` commands `make(0..n)` as one batch: each is paired with the hash slot of
    /// the one key it touches ([`binval_protocol::hash_slot`]). On a cluster, one pipeline per
    /// master (at most [`PIPELINE_MAX`] commands each), every master at once (see the module
    /// docs); on standalone Redis, pipelines of [`PIPELINE_MAX`]. Returns each command's reply,
    /// index for index (an error reply as `Err`). The commands of a pipeline that fails as a
    /// whole are made again with `make` and sent one by one through the cluster client, after
    /// a slot map refresh; on standalone Redis its error is every command's.
    ///
    /// `ack_point`: a crash point (`crate::failpoint`) passed once per command as soon as the
    /// pipeline holding it is acknowledged, while other masters' pipelines may still be open.
    pub async fn run_batch(
        &self,
        n: usize,
        make: &(dyn Fn(usize) -> (u16, redis::Cmd) + Sync),
        ack_point: Option<&'static str>,
    ) -> Vec<RedisResult<Value>> {
        let mut out: Vec<Option<RedisResult<Value>>> = (0..n).map(|_| None).collect();
        // (indexes, slot of the first, pipeline)
        let mut pipelines: Vec<(Vec<usize>, u16, redis::Pipeline)> = Vec::new();
        {
            let map = match self {
                RedisConn::Standalone(_) => None,
                RedisConn::Cluster(_, state) => Some(state.map.read().expect("slot map lock")),
            };
            // The open pipeline of each master (one master for standalone Redis).
            let masters = map.as_ref().map_or(1, |m| m.masters().len().max(1));
            let mut open: Vec<Option<usize>> = vec![None; masters];
            for i in 0..n {
                let (slot, cmd) = make(i);
                let m = map.as_ref().map_or(0, |m| m.master_of_slot(slot));
                let at = match open[m] {
                    Some(p) if pipelines[p].0.len() < PIPELINE_MAX => p,
                    _ => {
                        pipelines.push((Vec::with_capacity(PIPELINE_MAX.min(n)), slot, redis::pipe()));
                        open[m] = Some(pipelines.len() - 1);
                        pipelines.len() - 1
                    }
                };
                pipelines[at].0.push(i);
                pipelines[at].2.add_command(cmd);
            }
        }
        let mut pending: FuturesUnordered<_> = pipelines.into_iter().map(|(idx, slot, pipe)| self.run_pipeline(idx, slot, pipe)).collect();
        let mut failed: Vec<(Vec<usize>, RedisError)> = Vec::new();
        while let Some((idx, result)) = pending.next().await {
            match result {
                Ok(values) if values.len() == idx.len() => {
                    for (i, v) in idx.into_iter().zip(values) {
                        if let Some(p) = ack_point {
                            crate::failpoint::hit(p);
                        }
                        out[i] = Some(match v {
                            Value::ServerError(e) => Err(e.into()),
                            v => Ok(v),
                        });
                    }
                }
                Ok(values) => {
                    let e = RedisError::from((redis::ErrorKind::Io, "pipeline reply count", format!("{} for {}", values.len(), idx.len())));
                    failed.push((idx, e))
                }
                Err(e) => failed.push((idx, e)),
            }
        }
        drop(pending);
        if !failed.is_empty() {
            self.resend_one_by_one(failed, make, ack_point, &mut out).await;
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(RedisError::from((redis::ErrorKind::Io, "no reply"))))).collect()
    }

    /// One pipeline, to the master of `slot` (the slot of its first command's key).
    async fn run_pipeline(&self, idx: Vec<usize>, slot: u16, pipe: redis::Pipeline) -> (Vec<usize>, RedisResult<Vec<Value>>) {
        let n = idx.len();
        let r = match self {
            RedisConn::Standalone(c) => c.clone().req_packed_commands(&pipe, 0, n).await,
            RedisConn::Cluster(c, _) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                c.clone().route_pipeline(pipe, 0, n, route).await
            }
        };
        (idx, r)
    }

    /// The commands of failed pipelines, again: refresh the slot map (cluster) and send each on
    /// its own through the cluster client (it follows MOVED/ASK), 64 at a time. Standalone:
    /// the pipeline's error is each command's.
    async fn resend_one_by_one(
        &self,
        failed: Vec<(Vec<usize>, RedisError)>,
        make: &(dyn Fn(usize) -> (u16, redis::Cmd) + Sync),
        ack_point: Option<&'static str>,
        out: &mut [Option<RedisResult<Value>>],
    ) {
        let RedisConn::Cluster(c, _) = self else {
            for (idx, e) in failed {
                for i in idx {
                    out[i] = Some(Err(e.clone()));
                }
            }
            return;
        };
        if let Some((_, e)) = failed.first() {
            tracing::debug!(error = %e, pipelines = failed.len(), "Redis pipeline failed; refreshing the slot map and resending its commands one by one");
        }
        let _ = self.refresh_slots().await;
        let mut results: Vec<(usize, RedisResult<Value>)> = Vec::new();
        let mut in_flight = FuturesUnordered::new();
        for i in failed.iter().flat_map(|(idx, _)| idx.iter().copied()) {
            let (mut c, cmd) = (c.clone(), make(i).1);
            in_flight.push(async move { (i, cmd.query_async::<Value>(&mut c).await) });
            if in_flight.len() >= 64 {
                results.extend(in_flight.next().await);
            }
        }
        while let Some(r) = in_flight.next().await {
            results.push(r);
        }
        for (i, r) in results {
            if r.is_ok() {
                if let Some(p) = ack_point {
                    crate::failpoint::hit(p);
                }
            }
            out[i] = Some(r);
        }
    }
}

/// `SCAN MATCH pattern` over one node, handing each batch of keys found to `f`.
async fn scan_into<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    pattern: &str,
    f: &mut (dyn FnMut(Vec<String>) + Send),
) -> Result<(), Error> {
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| classify_redis(e, pattern))?;
        f(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// [`RedisConn::scan_first`] on one server.
async fn scan_first_on<C: redis::aio::ConnectionLike>(conn: &mut C, pattern: &str, budget: u64) -> Result<Option<String>, Error> {
    const COUNT: u64 = 1000;
    let (mut cursor, mut visited) = (0u64, 0u64);
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(COUNT)
            .query_async(conn)
            .await
            .map_err(|e| classify_redis(e, pattern))?;
        if let Some(k) = batch.into_iter().next() {
            return Ok(Some(k));
        }
        visited += COUNT;
        cursor = next;
        if cursor == 0 || visited >= budget {
            return Ok(None);
        }
    }
}

fn mode_mismatch(mode: &str, what: &str) -> Error {
    Error::config("redis.mode", format!("is \"{mode}\" but the server {what}"))
}

/// A connection-level failure: always transient.
fn transient(e: RedisError) -> Error {
    crate::telemetry::error_classified("redis", false);
    TransientError::Redis(e.to_string()).into()
}
