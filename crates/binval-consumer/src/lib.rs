//! `binval-consumer`: the in-process local cache of an app instance, kept in step with the
//! database by binval's invalidation events.
//!
//! binval (the service) reads the binlog and, per changed logical key `K`, writes the payload to
//! every suffix replica `K:r0..K:r{N-1}` (each records the change's fence position), then moves
//! the version token `K:ver` to that position, then publishes one invalidation event
//! `{key, version, …}` to a Kafka topic. This crate is the other end: [`Consumer::get`] serves
//! a key from a bounded local cache, fills misses from one replica (never from a single key
//! such as `K:ver`: that would be the next hot key), and a background listener evicts entries
//! as events arrive.
//!
//! ```no_run
//! # #[derive(serde::Deserialize)] struct Item { id: u64 }
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//! use binval_consumer::{CacheMode, OnSourceBehind};
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_cluster(["redis://10.0.0.1:7001"])       // or .redis_standalone(url)
//!     .brokers("10.0.0.5:9092")
//!     .topic("binval.invalidations")
//!     .replicas(1)                                     // replica count a key starts with ...
//!     .replicas_for_prefix("item:detail:", 8)          // ... (longest prefix wins); records correct it
//!     .max_entries(100_000)                            // local cache bound, entries ...
//!     .max_bytes(64 << 20)                             // ... and estimated bytes
//!     .ttl(Duration::from_secs(60))                    // safety-net TTL
//!     .ttl_jitter(0.1)                                 // each entry lives 54..66 s
//!     .refresh_ahead(0.8)                              // re-read busy keys in the background
//!     .cache_mode(CacheMode::Prefixes(vec!["item:".into()])) // or All (default), HotOnly
//!     .hot_key_threshold(1000.0)                       // reads/s at which a key is hot
//!     .max_fills_per_key_per_sec(10)                   // miss rate limits ...
//!     .max_fills_per_sec(5_000)                        // ... with stale fallback
//!     .max_replica_reads(2)                            // a missing key costs at most 2 reads ...
//!     .missing_ttl(Duration::from_secs(1))             // ... and is cached as "no row" for 1 s
//!     .loader(|key: String| async move {               // last resort: the replicas read are missing
//!         let _ = key;                                 // e.g. SELECT from the primary
//!         Ok::<Option<String>, String>(None)
//!     })
//!     .max_staleness(Some(Duration::from_secs(2)))     // fail safe: bypass past this lag
//!     .on_source_behind(OnSourceBehind::LoadOrRefuse)  // binval's side behind: loader, else an error
//!     .replica_read_timeout(Duration::from_millis(100)) // a slow master: read another one's replica too
//!     .kafka_property("fetch.wait.max.ms", "250")      // librdkafka passthrough (large Kafka cluster)
//!     .build()
//!     .await?;                                         // listener assigned at newest offsets
//!
//! let text: Option<String> = consumer.get("item:detail:6666").await?;
//! let item: Option<Item> = consumer.get_json("item:detail:6666").await?;
//! println!("{:?} {:?}", consumer.stats(), consumer.hot_keys());
//! consumer.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! An HTTP example app (axum) is `examples/product_api.rs`. Create **one** [`Consumer`] per
//! process: it is cheap to clone, and clones share the cache and the listener.
//!
//! The sections below go by use case; each says what to call, why it works the way it does,
//! and which builder options change it ([`ConsumerBuilder`] lists every option with its
//! default).
//!
//! - [Reading through a hot key](#reading-through-a-hot-key): the record format, why a fill
//!   caches the replica's own position, master-balanced replica choice, missing keys,
//!   replica nodes, single-flight, TTL jitter and refresh-ahead, the per-thread front.
//! - [Typed reads and the loader](#typed-reads-and-the-loader).
//! - [Invalidation and the fail safe](#invalidation-and-the-fail-safe): the evict rule, the fill
//!   race, batches, why no consumer group, the fail safe, the source side (binval's progress
//!   messages) and what a read does while it is behind.
//! - [Adaptive replica counts](#adaptive-replica-counts): why a reader needs no count
//!   configuration, the replica-0 rule, the hot set, heat reports and the ACL they need.
//! - [Hot-key detection](#hot-key-detection) and what to cache.
//! - [Bounds](#bounds): entries, bytes, the miss rate limits and the stale fallback.
//! - [Metrics](#metrics).
//!
//! Where the code is: [`Consumer`] (`consumer.rs`: the handle and the synchronous part of a
//! read), `single_flight.rs` (one fill per key in flight), `read.rs` (the read-through fill:
//! replicas in master-balanced order, loader, caching), `redis_conn.rs` and `slot_map.rs`
//! (where a read goes: the Cluster slot map the client routes by, replica nodes),
//! `masters.rs` (reads per master), `state.rs` (what the read path and the listener
//! share: local cache, fill-race guard, fail-safe flag), `listener.rs` (the invalidation
//! listener thread), `fail_safe.rs` (the lag checker thread and the fail safe's decision),
//! `front.rs`, `hot.rs`, `counts.rs` (the replica counts learned from the records),
//! `heat.rs` (heat reports and the hot set), and `builder/` (the options, grouped like these
//! sections).
//!
//! # Reading through a hot key
//!
//! [`Consumer::get`] (or [`Consumer::get_shared`], which does not copy the payload out of the
//! cache) is the whole read path: a local hit returns at once; a miss fills from Redis, shared
//! by every concurrent reader of the key in this instance.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .replicas_for_prefix("item:detail:", 8) // spread the hot key over 8 replicas
//!     .ttl(Duration::from_secs(60))
//!     .ttl_jitter(0.1)                        // entries filled together expire apart
//!     .refresh_ahead(0.8)                     // a busy key never expires into a miss
//!     .build()
//!     .await?;
//!
//! // Every request of a product page: a local hit nearly always, one Redis fill per miss.
//! let page: Option<Arc<str>> = consumer.get_shared("item:detail:6666").await?;
//! assert_eq!(consumer.replicas_for("item:detail:6666"), 8);
//! # let _ = page;
//! # Ok(()) }
//! ```
//!
//! ## The record format
//!
//! A suffix replica `K:rN` is a Redis hash written by binval's version-fenced script
//! ([`binval_protocol::fence`]): `d` the payload, `p` the fence position of the change, `t` =
//! `1` for a tombstone (row deleted), `f` the writer's fencing token, `n` the key's replica
//! count ("Adaptive replica counts" below). The script writes the record whole, so `d` and `p`
//! always belong to the same change. A fill reads one replica with `HMGET K:rN d t p n` (one
//! call) and finds:
//!
//! - a value: the answer, cached at that replica's position `p`;
//! - a tombstone: the row does not exist — `None`, cached at its position `p`, and neither
//!   another replica nor the loader is asked (the tombstone is newer than anything they could
//!   say);
//! - missing (never written, expired, lost, or a replica the key does not have now): replica 0
//!   next when it was not read yet (it exists whenever the key does), else a replica on another
//!   master, at most [`ConsumerBuilder::max_replica_reads`] reads in all (default 2; one more
//!   for replica 0 if need be), then the loader if one is set, else `None`, cached for
//!   [`ConsumerBuilder::missing_ttl`] (default 1 s).
//!
//! The version token `K:ver` (a decimal `u64`, the position of the newest change) is for
//! binval's writers, `binval replay`, verification and operators; no read of this crate
//! touches it.
//!
//! ## Why a fill caches the replica's own position
//!
//! The version token is one key on one master. An earlier read path read it first on every
//! fill, which moved the hot-key incident from `K` to `K:ver`: with local caching off for a
//! key, the token's master took half of all reads (max/mean 1.87 over 3 masters, issue #10).
//! The pair (value, position) of one replica record makes it unnecessary:
//!
//! - **The pair is exact.** `p` is the version of the change that wrote `d`, so the entry
//!   (value, `p`) says what the key was at version `p` — never a value under a version newer
//!   than the value. (Reading a version from anywhere else and then a replica could pair a
//!   value with a version it is not; the other order, replica then token, could pair an old
//!   value with a newer version that no event would ever evict.)
//! - **A later change evicts it.** Every later change of the key has a higher fence position,
//!   and binval publishes its event only after all N replicas hold it; the evict rule (`c <
//!   v`) removes the entry when that event arrives. A replica that is a change behind (the
//!   writer is between replicas, or the read went to a lagging Redis replica node) just
//!   yields an older exact pair, which the pending event evicts.
//! - **The fill-race guard refuses it when an event overtook the fill.** If the event of the
//!   newer change was applied while the fill was in flight (before its value landed in the
//!   cache), the guard holds that event's version, higher than `p`, and the fill is returned
//!   but not cached (see "The fill race" below).
//! - **An event at `p` itself does not evict it** (`p < p` is false): the entry already shows
//!   that change, so duplicates and replays of it evict nothing.
//!
//! ## Master-balanced replica choice
//!
//! A replica's master is the one that owns its hash slot, and slots are effectively random:
//! 8 replicas on 3 masters land 4/2/2 as easily as 3/3/2, and a uniformly random replica then
//! gives the master with 4 of them half of the key's reads (max/mean 1.5). So a fill groups the
//! key's N replicas by master — with the slot map the Cluster client itself routes by, which
//! follows `MOVED`/`ASK` redirects and topology changes (`slot_map.rs`) — picks a **master**
//! uniformly among those holding a replica, then a replica on it
//! ([`binval_protocol::placement`]). A missing replica moves the next read to another master
//! first: replicas on one master share its fate. On standalone Redis every replica is on the
//! one server and a replica is picked uniformly. The grouping costs N slot computations per
//! fill (a table-driven CRC16 of each replica key, well under a microsecond for N = 8 next to a
//! Redis round trip of tens of microseconds), so it is not cached. The share can only be even
//! over the masters that hold one of the key's replicas: `binval check` reports, per mapping,
//! how sampled keys spread and warns when N is below the number of masters.
//!
//! ## A master that does not answer in time
//!
//! A Redis master that stops answering without resetting its connections (frozen, its host
//! swapping, a network black hole) would make every read sent to it wait the whole
//! [`ConsumerBuilder::redis_response_timeout`] (200 ms). So each read also has a soft bound,
//! [`ConsumerBuilder::replica_read_timeout`] (default 100 ms): when it passes, the fill reads
//! the next replica in its order as well — on another master — and takes whichever value or
//! tombstone arrives first (the slow read may still win, until its hard bound). With one of
//! three masters SIGSTOPped, reads of a key with replicas on the others take about the soft
//! bound instead of failing or waiting the hard one (`tests/frozen_master.rs`);
//! [`Stats::replica_read_timeouts`] counts the slow reads. The caching rules do not change: any
//! answer is one replica record's exact (value, position) pair, and the fill-race guard refuses
//! it when an event with a newer version was applied meanwhile. Within
//! [`ConsumerBuilder::max_replica_reads`]; a key whose replicas are all on the frozen master
//! has nothing to move to. Redis Cluster itself marks a frozen master failed after
//! `cluster-node-timeout`; with `cluster-require-full-coverage yes` (Redis's default) the
//! others then refuse every key (`CLUSTERDOWN`) until it is back or failed over, so the
//! replicas on other masters help until then, and for good with
//! `cluster-require-full-coverage no`.
//!
//! ## Missing keys and the bound on reads
//!
//! A key whose row does not exist — a deleted product still linked from a feed after its
//! tombstone expired, a crawler probing ids — is missing from every replica. A fill of it costs
//! at most [`ConsumerBuilder::max_replica_reads`] reads (default 2: one, then one on another
//! master; never 1 + N), and its "no row" is cached for [`ConsumerBuilder::missing_ttl`].
//! A key so confirmed missing is then re-read with one read per fill until an event of it
//! arrives (or [`ConsumerBuilder::fill_guard_ttl`] passes): a hot missing key costs one read
//! per `missing_ttl` per instance. The entry is cached at
//! position 0 (any event of the key evicts it; the fill-race guard refuses it while a recent
//! event of the key is remembered), or at the position of an invalidate-mode record (binval's
//! `mode = "invalidate"` writes the position of each change and no payload). Why a second read
//! by default: one master that lost its data misses its replicas until `binval replay`
//! restores them; a single read would answer "no row" for existing rows on that master's
//! share of fills. A tombstone is different: it is a change with a position, cached like a
//! value (normal TTL) after one read.
//!
//! With a [`ConsumerBuilder::loader`]: the missing key goes to the loader, once per fill
//! (single-flight, after the miss rate limits); its value is cached at the same position
//! (normal TTL) and its `None` for `missing_ttl`, so a hot missing key reaches the loader at
//! most once per `missing_ttl` per instance. Nothing is cached after a loader error, and with
//! [`ConsumerBuilder::cache_loaded`]`(false)` nothing the loader says is cached.
//!
//! ## Reads from replica nodes
//!
//! [`ConsumerBuilder::read_from_replica_nodes`] (Cluster only, default off) lets each read go
//! to the replica's master or to one of its replica nodes (`READONLY`), chosen uniformly, for
//! deployments whose masters have replica nodes to spare. The pair a fill caches stays exact,
//! so eviction stays correct; what it costs is staleness up to the replication lag, and two
//! corner cases bounded only by the entry TTL (a replica node more than
//! [`ConsumerBuilder::fill_guard_ttl`] behind, and an instance started after an event whose
//! change its replica node has not received yet): the option's documentation says what to set
//! on the Redis side.
//!
//! ## Single-flight
//!
//! Concurrent misses of one key in one instance share one fill: the first starts it as a tokio
//! task and registers it in a small map (key -> shared future); the others await the same
//! outcome ([`Stats::coalesced`]). The entry is removed when the task ends, so the map holds
//! only keys being filled right now. The fill-race guard still decides whether the value is
//! cached; a refused fill's value is returned to every waiter all the same.
//!
//! ## TTL jitter and refresh-ahead
//!
//! [`ConsumerBuilder::ttl_jitter`] spreads each entry's TTL uniformly over
//! `ttl × [1 - j, 1 + j]`, so entries filled together do not expire together.
//! With [`ConsumerBuilder::refresh_ahead`]`(f)`, a hit on an entry past `f` of its TTL returns
//! the cached value at once and starts one background fill (at most one per entry, joined with
//! any fill of the key in flight), which replaces the entry with a fresh TTL: a busy key never
//! expires into a miss that all its readers wait for.
//!
//! ## Local hit cost: the per-thread front
//!
//! A hit through moka alone costs ~200 ns on the project's 2-core machine, about half of it in
//! moka's read path (hash lookup, read buffer, per-read clock, maintenance). In front of moka,
//! each reading thread keeps its last entries in 64 direct-mapped slots
//! ([`ConsumerBuilder::thread_front`], default on), so a thread re-reading a hot key costs
//! ~85-100 ns. Correctness does not depend on it: a front entry is tagged with a generation
//! read *before* the entry was read from moka, and every change that may make a remembered
//! entry wrong — each applied event batch (even one that evicted nothing: the key may have
//! left moka by size), each fill cached or removed again by the fill-race guard, each
//! fail-safe clear — bumps the generation *after* the change. A front entry is served only at
//! its generation and before its own expiry (taken just before moka's), so it is exactly as
//! fresh as a moka hit at the same moment. Every 32nd hit of a slot reads moka anyway, so its
//! frequency sketch still sees the key as hot. Numbers: `docs/benchmarks.md`.
//!
//! # Typed reads and the loader
//!
//! [`Consumer::get_json`] deserializes the payload text with serde_json,
//! [`Consumer::get_with`] with any decoder; the text is what is cached, so every call decodes.
//! A payload that does not decode is [`ConsumerError::Decode`] naming the key.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Item { id: u64, name: String, price_cents: i64 }
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .loader(|key: String| async move {
//!         // Every replica is missing: read the primary, render binval's payload JSON.
//!         let id: u64 = key.rsplit(':').next().and_then(|s| s.parse().ok()).ok_or("bad key")?;
//!         Ok::<_, &str>(Some(format!(r#"{{"id":{id},"name":"?","price_cents":0}}"#)))
//!     })
//!     .loader_timeout(Duration::from_millis(300))
//!     .build()
//!     .await?;
//!
//! let item: Option<Item> = consumer.get_json("item:detail:6666").await?;
//! let len: Option<usize> = consumer.get_with("item:detail:6666", |t| Ok::<_, std::convert::Infallible>(t.len())).await?;
//! # let _ = (item, len);
//! # Ok(()) }
//! ```
//!
//! ## The app-supplied loader
//!
//! [`ConsumerBuilder::loader`] is the last resort when the replicas a fill read are missing
//! (e.g. Redis lost them, or binval runs in invalidate-only mode for the table). It runs inside
//! the key's single fill, after the miss rate limits, bounded by
//! [`ConsumerBuilder::loader_timeout`]. Its value is cached at the newest position the missing
//! records carried (an invalidate-mode record has one), else 0: a loader that reads the primary
//! returns something at least as new as that, so the next change's event evicts the entry, and
//! the fill-race guard refuses it when an event overtook the fill. Its `None` is cached like a
//! missing key, for [`ConsumerBuilder::missing_ttl`]. A loader reading a lagging database
//! replica should not be cached: [`ConsumerBuilder::cache_loaded`]`(false)`.
//!
//! **The loader's payload must be the one binval writes**, byte for byte, or a DB-loaded entry
//! and a binval-written one of the same row differ. Don't re-implement the format: with this
//! crate's feature `mysql`, `payload::result_set::row_payload` turns a row read with a
//! prepared SELECT (mysql_async / mysql_common values) into exactly that payload, with the same
//! per-type rules (dates, DECIMAL scale, TIMESTAMP in UTC, BIT, SET, binary as base64, JSON
//! documents); its docs say what the query must do (`SET NAMES utf8mb4`, `time_zone =
//! '+00:00'`, MariaDB UUID/INET columns cast to their bytes). [`payload::render`] does the rest
//! for rows you already hold as JSON values.
//!
//! # Invalidation and the fail safe
//!
//! Nothing to call: `build()` starts the listener, and it evicts as events arrive.
//! [`Consumer::subscribe_evictions`] shows each applied event, [`Consumer::is_serving_local`]
//! whether the fail safe currently bypasses the local cache.
//!
//! ```no_run
//! # async fn f(consumer: binval_consumer::Consumer) -> Result<(), Box<dyn std::error::Error>> {
//! let mut notices = consumer.subscribe_evictions();
//! let n = notices.recv().await?; // one notice per applied event, evicting or not
//! println!("{} at version {}: evicted {}", n.key, n.version, n.evicted);
//! if !consumer.is_serving_local() {
//!     // the stream is lost or behind: every get reads Redis and caches nothing
//! }
//! # Ok(()) }
//! ```
//!
//! ## The evict rule
//!
//! An event with version `v` evicts a cached entry filled at version `c` exactly when `c < v`
//! ([`binval_protocol::should_evict`]). An entry at `c ≥ v` already reflects that change, so
//! duplicates, replays and out-of-order deliveries after a restart evict nothing needlessly.
//!
//! ## The fill race ("stale set")
//!
//! A fill can read a replica at position 9, then be slow; meanwhile the writer moves `K` to
//! 10 and the event arrives and is applied — to a cache that does not hold `K` yet. Then the
//! slow fill lands and would cache (old value, 9) with nothing left to evict it. The listener
//! therefore remembers the newest event version per recently invalidated key (a bounded moka
//! cache, default 100 000 entries for 30 s), and a fill whose version is lower than that is
//! returned to its caller but not cached ([`Stats::fills_refused`]). The fill re-checks after
//! inserting, so an event applied between its check and its insert still removes it.
//!
//! ## Invalidation in batches
//!
//! The listener thread waits up to 100 ms for a message, then takes everything already queued
//! (up to 1024 messages) and applies it as one batch: per distinct key one guard update and at
//! most one eviction (a row updated 50 times in a burst costs one eviction), then one
//! [`EvictionNotice`] per event. Readers are never blocked by it: the local cache and the
//! guard are concurrent maps, and no lock is held across a batch.
//!
//! ## Batch messages
//!
//! binval with `kafka.event_format = "batched"` publishes one binary message per partition per
//! apply group (header `binval.kind: batch`, [`binval_protocol::batch`]); the listener reads
//! both formats, on one topic, in partition order (per-key events read before a batch are
//! applied first). A batch is checked in one scan without allocating ([`decode_batch`]) and
//! applied in one pass: each key is looked up by the `&str` borrowed from the payload, and a
//! key this instance neither caches, nor is filling, nor has confirmed missing costs those
//! lookups and nothing else (no guard entry: a fill that starts after the batch was taken
//! reads Redis after the batch's writes). A cached key is applied like its per-key event. With
//! [`ConsumerBuilder::read_from_replica_nodes`] every key raises the guard, as per key (a
//! replica node may be behind). A malformed batch is counted in [`Stats::bad_messages`],
//! logged with topic, partition and offset, and skipped. Cost per key:
//! `cargo bench -p binval-consumer --bench apply_batch` (docs/benchmarks.md).
//!
//! ## Why no shared consumer group
//!
//! A Kafka consumer group splits partitions among its members: each event would reach one app
//! instance, and every other instance would keep its stale entry. Every instance must see every
//! event of every partition, so the listener `assign()`s all partitions itself, under a unique
//! `group.id` per instance, and never commits offsets. It starts at the newest offsets (read
//! explicitly as high watermarks, so nothing published after `build()` returns is skipped) —
//! a new instance has an empty cache and nothing older to evict. Every 5 s the lag checker
//! re-reads the metadata, and the listener assigns partitions added since from their low
//! watermark (they are younger than the listener, so everything in them is new to it).
//!
//! ## Fail safe
//!
//! While the listener cannot see the stream, entries may go stale without an event to evict
//! them. So the consumer measures how far behind the stream it is (and, from binval's
//! progress messages, how far behind binval itself is: "The source side" below), and stops
//! serving locally when that lag exceeds [`ConsumerBuilder::max_staleness`] (default 2 s) less
//! its eighth, at most 250 ms (the checks run up to 100 ms apart, and a value served between
//! two must still be within the bound): [`Consumer::get`] then reads Redis every time and caches nothing ([`Consumer::is_serving_local`] is `false`,
//! metric `binval_consumer_serving_local` 0, [`Stats::fail_safe_engaged`] counts the stops).
//!
//! **The lag.** A lag checker thread, with a librdkafka client of its own, asks the broker for
//! every partition's high watermark every quarter of the bound. An observation taken at `t`
//! says: every event acknowledged before `t` lies below these offsets. Once the listener's
//! next offset of every partition is at or past them, the observation is *confirmed*: every
//! event acknowledged before `t` has been applied. The lag ([`Consumer::stream_lag`], gauge
//! `binval_consumer_stream_lag_ms`) is the time since the newest confirmed `t`. Several
//! observations can wait at once, so a busy stream is confirmed continuously: its lag stays
//! at about a quarter of the bound plus one fetch, whatever the event rate, and it never trips
//! the bound. (The first version of the check required the position to *equal* the high
//! watermark at the moment of the check, which a flowing stream rarely does: under a steady
//! 200-300 events/s it bypassed the local cache in most samples, issue #15.)
//!
//! **What trips it.** A broker that hangs or a network that drops packets without resetting
//! connections (no observation succeeds), a listener that falls behind (observations are not
//! reached), a wedged connection of the listener's own consumer (observations succeed but are
//! not reached). The listener applies the bound after every poll (at most 100 ms apart) and the
//! checker after every observation. When the lag is back under half the bound, the listener
//! clears the whole local cache and serves locally again. So a value served locally at time
//! `now` has seen every event the broker acknowledged before `now - bound` (invariant I5); the
//! time binval itself takes from commit to the broker's ack is not part of this bound.
//!
//! **Errors.** When librdkafka reports that all brokers are down (or a fatal error) the
//! consumer stops serving locally at once, without waiting for the bound, and resumes only
//! after an observation taken after the error is confirmed. When the listener thread ends for
//! any reason (and after [`Consumer::shutdown`]) it never serves locally again.
//!
//! **A wedged consumer.** When the broker answers the checker with events the listener's
//! consumer has not received, and the consumer received nothing at all for four bounds, its
//! connections are presumed wedged: it is replaced by a new one, started at the last confirmed
//! high watermarks (a few events are re-read; harmless, the evict rule is idempotent), and
//! [`Stats::listener_rebuilds`] counts it. A busy stream or a frozen broker never causes one.
//!
//! ## The source side: binval's progress messages
//!
//! The lag above is the stream's: it says nothing about binval itself. With one Redis master
//! frozen, binval's writes wait for it, no events arrive, the stream "looks caught up" — and
//! the local values, and the replicas a fill reads, grow old (issue #22). So binval (with
//! `kafka.progress_interval_ms`, default 200) sends a progress message
//! ([`binval_protocol::ProgressMessage`], header `binval.kind: progress`) to every partition:
//! how far what it has in Redis and enqueued is behind the source (`lag_ms`, 0 when caught up
//! at the end of the binlog). The listener tells them from events by the header, never applies
//! them as invalidations (one that does not decode is a bad message, like a bad event), and
//! keeps, per source and partition, the newest one's `lag_ms` and when it received it.
//!
//! **The source lag** ([`Consumer::source_lag`], gauge `binval_consumer_source_lag_ms`) is the
//! worst, over them, of `lag_ms` + the time since it was received: the instance's own
//! monotonic clock, never another host's. It grows by itself when the messages stop (binval
//! frozen or cut off, the broker gone) and jumps when binval reports a stall. It counts once a
//! progress message has been seen — an instance on the topic of an older binval, which sends
//! none, keeps today's behaviour — or from `build()` on with
//! [`ConsumerBuilder::require_progress`]. A message of an older tenure of its source (a lower
//! fencing token: an old leader not yet aware it lost the lease) is ignored.
//!
//! **Past the bound** ([`ConsumerBuilder::max_staleness`]) the local cache is bypassed, as for
//! the stream lag, and a Redis read is not served as fresh either: the replicas hold what
//! binval wrote before the stall, and nothing in a record says it is too old.
//! [`ConsumerBuilder::on_source_behind`] says what a read does instead
//! ([`OnSourceBehind`]): by default the [`ConsumerBuilder::loader`] (the database) when one is
//! set, else [`ConsumerError::SourceBehind`]; or a Redis value flagged stale
//! ([`Consumer::get_flagged`] returns [`Stale::SourceBehind`]); or always an error. Nothing is
//! cached meanwhile. Local serving resumes (cache cleared) once the stream lag and the source
//! lag are both back under half the bound. With per-slot-range lags in the messages
//! (`masters`, which a binval may fill in), each replica has the lag of its slot: a replica on
//! a master within the bound is read, as fresh, and one on a master past it is skipped when the
//! key has another.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use binval_consumer::{OnSourceBehind, Stale};
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .on_source_behind(OnSourceBehind::ServeStale) // an old value rather than none ...
//!     .require_progress(true)                       // every binval on the topic sends progress
//!     .build()
//!     .await?;
//! let read = consumer.get_flagged("item:detail:6666").await?;
//! if let Some(Stale::SourceBehind { lag }) = read.stale {
//!     println!("... said so: may be {} ms old", lag.as_millis());
//! }
//! println!("source lag {:?}", consumer.source_lag());
//! # Ok(()) }
//! ```
//!
//! What it does not cover: the time a progress message spends between binval's producer and
//! this listener (milliseconds; binval keeps at most one round in flight, and a slow broker
//! shows in the stream lag). Its resolution: binval dates changes by binlog commit times,
//! whole seconds, so a binval that keeps up reports up to about a second under a steady
//! stream of commits (and after a quiet commit until the primary's next heartbeat,
//! `source.heartbeat_ms`, default 1 s): keep [`ConsumerBuilder::max_staleness`] at 2 s or more
//! (`tests/progress.rs` checks that a busy source never trips the default).
//!
//! ## Gaps and truncates
//!
//! A gap in a partition's offsets (events deleted by retention before they were read, a
//! broker that lost its log) clears the local cache at once ([`Stats::stream_gaps`]): an event
//! that would have evicted an entry may be among the missing ones. The listener starts a
//! partition only at a high or low watermark, which Kafka puts at record batch boundaries.
//! tansu 0.6 does not always (its ListOffsets(latest) can point inside its newest batch, and
//! it answers a fetch from inside a batch with the next one), so a jump before a partition's
//! first message of a new consumer is not a gap: nothing was cached yet.
//! There is no consumer group, so no rebalance can move partitions away from an instance.
//!
//! A `truncate` event (TRUNCATE / DROP TABLE of a mapped table; its `key` is the key template)
//! evicts every cached key with the template's literal prefix and an older version, and the
//! fill-race guard refuses older fills of such keys for `fill_guard_ttl`.
//!
//! # Adaptive replica counts
//!
//! binval keeps a key of an adaptive mapping (`replicas = { min = 1, max = 16 }`) in as many
//! suffix replicas as the fleet's reads of it need ([`binval_protocol::adaptive`], issue
//! #23): it grows a hot key's count within about two seconds of its rise and shrinks it when
//! the key cools. Nothing to call: a reader follows by itself.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_cluster(["redis://10.0.0.1:7001"])
//!     .brokers("10.0.0.5:9092")
//!     .topic("binval.invalidations")
//!     .instance_id("product-api-7")                   // its heat report's field (default: host-pid-random)
//!     .heat_report_interval(Duration::from_secs(1))   // default
//!     .build()
//!     .await?;                                        // the hot set is loaded by now
//! consumer.get("item:detail:6666").await?;
//! println!("read over {} replicas", consumer.replica_count("item:detail:6666"));
//! # Ok(()) }
//! ```
//!
//! **The count comes from the data.** Every replica record carries the key's current count in
//! field `n`; each read learns it at once ([`Consumer::replica_count`]), so a key that grew
//! spreads from the next fill on, and one that shrank stops being read on its removed
//! replicas. The configured counts ([`ConsumerBuilder::replicas`],
//! [`ConsumerBuilder::replicas_for_prefix`]) are only where a key starts; a reader needs none
//! (records of a binval older than adaptive counts carry no `n`: for those the configured
//! count is still what is used). Only counts that differ from the configured one take an entry
//! ([`LEARNED_COUNT_ENTRIES`] at most, [`Stats::learned_counts`]).
//!
//! **The replica-0 rule.** A read of replica `i > 0` that finds no record at all (never
//! written, removed by a shrink after its grace period, not yet copied by a grow) sends the
//! next read of the fill to replica 0, which exists whenever the key exists (every count is at
//! least 1), before any other replica, one read past [`ConsumerBuilder::max_replica_reads`] if
//! need be ([`Stats::replica_zero_fallbacks`]). No fill concludes "missing" without replica 0
//! having answered (a failed read of it is the fill's error, as for any unreachable replica),
//! so a reader that believes a larger count than binval writes — configured with 16 while
//! binval writes 8, or still on the count before a shrink — never answers "no row" for an
//! existing row; one that believes a smaller count spreads less until its next read. When the
//! source lag leaves replica 0 out (its master is past [`ConsumerBuilder::max_staleness`]) and
//! the other replicas read are missing, the read follows [`ConsumerBuilder::on_source_behind`]
//! as if every replica were behind.
//!
//! **The hot set.** `binval:hot` (a hash: logical key -> count, kept by binval's leader for
//! keys spread above 1) is loaded once by `build()` and again every
//! [`ConsumerBuilder::hot_set_refresh`] (default 30 s), so the first reads of a key that is
//! already hot spread at once. A record's `n` wins over it. A failure is a warning, never a
//! failed build ([`Stats::hot_set_load_failures`]); a bad entry is a warning naming the key and
//! value, and is skipped ([`ConsumerBuilder::hot_set`] turns it off).
//!
//! **Heat reports.** How binval's leader knows what the fleet reads: every
//! [`ConsumerBuilder::heat_report_interval`] (default 1 s) each instance writes its top keys
//! ([`ConsumerBuilder::heat_report_top_keys`], default 32) read at least
//! [`ConsumerBuilder::heat_report_min_rate`] times a second (default 100), every `get`
//! counted, local hits included, as `HSET binval:heat:{b} <instance id> <report JSON>`
//! ([`binval_protocol::adaptive::HeatReport`]), and removes it at [`Consumer::shutdown`]. The
//! rates come from hot-key detection, over a 150 ms and a 2 s window (not the hot-key window),
//! so a key that goes from idle to 30,000 reads/s is reported at its rate within about 0.2 s
//! of the step (one report later at most), and a key whose reads stop is reported cool within
//! about 4 s; an instance that reads nothing above the minimum writes
//! nothing. [`Stats::heat_reports_sent`] and [`Stats::heat_reports_failed`] count them; a
//! failure is logged once per kind and retried at the next interval, never a failed read.
//!
//! **The ACL.** Besides `HMGET` on the replicas, an app instance's Redis user needs `HGETALL`
//! on `binval:hot` and `HSET`, `HDEL` on `binval:heat:*`, e.g. (Redis 7)
//! `ACL SETUSER app on >PASSWORD resetkeys %R~item:* %R~binval:hot ~binval:heat:*
//! resetchannels -@all +ping +hmget +hgetall +hset +hdel +cluster|slots`. Without them
//! everything still reads, and binval's leader does not see this instance's reads
//! ([`ConsumerBuilder::heat_reports`]`(false)` and [`ConsumerBuilder::hot_set`]`(false)` keep
//! the logs quiet).
//!
//! # Hot-key detection
//!
//! [`Consumer::hot_keys`] lists the keys this instance reads most, with their read rates;
//! [`CacheMode::HotOnly`] caches only those at or above the threshold.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//! use binval_consumer::CacheMode;
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .cache_mode(CacheMode::HotOnly)            // cache only hot keys
//!     .hot_key_threshold(500.0)                  // reads/s of this instance
//!     .hot_key_window(Duration::from_secs(5))
//!     .build()
//!     .await?;
//!
//! for k in consumer.hot_keys() {
//!     println!("{}: ~{:.0} reads/s (at least {:.0}), hot: {}", k.key, k.reads_per_sec, k.min_reads_per_sec, k.hot);
//! }
//! # Ok(()) }
//! ```
//!
//! ## What to cache, and hot keys
//!
//! [`ConsumerBuilder::cache_mode`]: [`CacheMode::All`] keys (default), [`CacheMode::Prefixes`]
//! or [`CacheMode::HotOnly`] — only keys this instance reads at or above
//! [`ConsumerBuilder::hot_key_threshold`] reads/s. Keys not cached still go through
//! single-flight, the miss rate limits and Redis ([`Stats::uncached_reads`]).
//!
//! Hot-key detection counts each instance's reads per key in a sliding window
//! ([`ConsumerBuilder::hot_key_window`], default 10 s) with a SpaceSaving top-K sketch
//! (bounded: [`ConsumerBuilder::hot_key_capacity`] counters), sampling one read in
//! [`ConsumerBuilder::hot_key_sample_every`] per thread to keep hits cheap. The hot decision
//! uses the sketch's *guaranteed* count, so the sketch's over-count never makes a cold key
//! hot. [`Consumer::hot_keys`] returns the top K with rates; the gauges below export them.
//!
//! # Bounds
//!
//! Everything the consumer keeps is bounded: the local cache by entries and bytes, the fills
//! by optional rate limits with a stale fallback.
//!
//! ```no_run
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .max_entries(100_000)                 // entries ...
//!     .max_bytes(64 << 20)                  // ... and estimated bytes (64 MiB)
//!     .max_fills_per_sec(5_000)             // Redis fills of the whole instance
//!     .max_fills_per_key_per_sec(10)        // ... and of one key
//!     .stale_ttl(Duration::from_secs(10))   // over the limit: serve what was evicted ≤ 10 s ago
//!     .build()
//!     .await?;
//!
//! match consumer.get("item:detail:6666").await {
//!     Err(binval_consumer::ConsumerError::Overloaded { key }) => println!("{key}: over the miss rate limit"),
//!     other => println!("{:?}", other?),
//! }
//! println!("{} entries, ~{} bytes", consumer.local_entries(), consumer.local_weighted_size());
//! # Ok(()) }
//! ```
//!
//! ## Bounds of the local cache
//!
//! The local cache is bounded by entries ([`ConsumerBuilder::max_entries`]) and optionally by
//! estimated bytes ([`ConsumerBuilder::max_bytes`]): an entry weighs its key length + payload
//! length + [`ENTRY_OVERHEAD_BYTES`], at least `max_bytes / max_entries`, and moka keeps the
//! total weight within `max_bytes` — which then also caps the entries. The fill guard, stale
//! copies, per-key limiters and the hot-key sketch are bounded too (invariant I6).
//!
//! ## Miss rate limit and stale fallback
//!
//! Optional GCRA limits (`governor`) on fills: per instance
//! ([`ConsumerBuilder::max_fills_per_sec`]) and per key
//! ([`ConsumerBuilder::max_fills_per_key_per_sec`]). A refused fill reads nothing
//! ([`Stats::limiter_rejections`]); its callers get the key's stale copy — the value of an
//! entry that an event, its TTL or a fail-safe clear removed within
//! [`ConsumerBuilder::stale_ttl`] ([`Stats::stale_served`]) — or
//! [`ConsumerError::Overloaded`]. A stale copy is by definition possibly out of date: it trades
//! freshness for protecting Redis, only while over the limit. A cached "no row" (tombstone or
//! missing key) leaves no stale copy when it goes.
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade, so any installed recorder (e.g.
//! `metrics-exporter-prometheus`) exports them; every counter is also in [`Consumer::stats`].
//! Install the recorder **before** `build()`: the hit counter's handle is registered once at
//! build time (a local hit does not pay for the recorder's name lookup).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?; // first
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_standalone("redis://127.0.0.1:6379")
//!     .brokers("127.0.0.1:9092")
//!     .topic("binval.invalidations")
//!     .build()
//!     .await?;
//! consumer.get("item:detail:6666").await?;
//! println!("{}", prometheus.render()); // binval_consumer_hits_total, ..._misses_total, ...
//! println!("{:?}", consumer.stats()); // the same counters, without a recorder
//! # Ok(()) }
//! ```
//!
//! The names are constants of [`metric_names`] (declared once; a test keeps this table and
//! them the same).
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `binval_consumer_hits_total` | counter | `get` served from the local cache |
//! | `binval_consumer_misses_total` | counter | `get` of a cacheable key not in the local cache |
//! | `binval_consumer_uncached_reads_total` | counter | `get` of a key the cache mode does not cache |
//! | `binval_consumer_bypass_reads_total` | counter | `get` while the fail-safe bypasses the cache |
//! | `binval_consumer_fills_total` | counter | fills that found a replica value (cached or not) |
//! | `binval_consumer_missing_total` | counter | fills whose replica reads all found the key missing (then the loader, if set) |
//! | `binval_consumer_negative_hits_total` | counter | `get` answered "no row" from the local cache (a cached tombstone or missing key; also in hits) |
//! | `binval_consumer_fills_refused_total` | counter | fills the fill-race guard did not cache |
//! | `binval_consumer_coalesced_total` | counter | misses that joined a fill in flight |
//! | `binval_consumer_limiter_rejections_total` | counter | fills refused by the miss rate limit |
//! | `binval_consumer_stale_served_total` | counter | `get` answered with a stale copy |
//! | `binval_consumer_tombstones_total` | counter | fills that found a tombstone |
//! | `binval_consumer_loader_fills_total` | counter | fills answered by the loader |
//! | `binval_consumer_loader_errors_total` | counter | loader calls that failed or timed out |
//! | `binval_consumer_refreshes_total` | counter | refresh-ahead fills started |
//! | `binval_consumer_events_total` | counter | invalidation events applied |
//! | `binval_consumer_evictions_total` | counter | events that removed a held entry |
//! | `binval_consumer_capacity_evictions_total` | counter | entries removed by the entry/byte bound |
//! | `binval_consumer_expirations_total` | counter | entries removed by their TTL |
//! | `binval_consumer_bad_messages_total` | counter | topic messages skipped: no payload, longer than `max_message_bytes`, not an event, a `binval.kind: progress` message that is not a valid progress message, an unknown `binval.kind` |
//! | `binval_consumer_invalidation_lag_ms{from}` | histogram | ms from the event's commit (`from="commit"`: binval's commit time, to the ms when it keeps up, see [`Stats::nines`]) or publish (`from="publish"`) to its eviction here |
//! | `binval_consumer_timed_invalidations_total` | counter | invalidations applied whose event carried a commit time ([`Stats::timed_invalidations`]) |
//! | `binval_consumer_applied_within_total{within_ms}` | counter | of those, applied within 50, 200 or 1000 ms of the commit; the consistency as nines is `-log10(1 - rate(within) / rate(timed))` ([`Stats::nines`]) |
//! | `binval_consumer_fail_safe_engaged_total` | counter | times the fail safe stopped local serving (stream lost or lagging, or the source lag past the bound) |
//! | `binval_consumer_listener_rebuilds_total` | counter | librdkafka consumers replaced (connections presumed wedged) |
//! | `binval_consumer_stream_gaps_total` | counter | jumps in a partition's offsets (each cleared the local cache) |
//! | `binval_consumer_serving_local` | gauge | 1 while serving locally, 0 while bypassed |
//! | `binval_consumer_stream_lag_ms` | gauge | the fail safe's lag: ms since the newest confirmed watermark observation |
//! | `binval_consumer_source_lag_ms` | gauge | the source lag: worst progress `lag_ms` + ms since it was received (set once progress counts) |
//! | `binval_consumer_progress_messages_total` | counter | binval progress messages taken (invalid ones count as bad messages) |
//! | `binval_consumer_source_behind_reads_total{outcome}` | counter | `get` calls decided by the source lag: `refused` ([`ConsumerError::SourceBehind`]), `flagged` (Redis value, [`Stale::SourceBehind`]), `loaded` (the loader instead of Redis) |
//! | `binval_consumer_messages_total` | counter | topic messages the listener received, of any kind (one per per-key event, one per batch, progress and bad ones too) |
//! | `binval_consumer_message_bytes_total` | counter | payload bytes of those messages (after decompression; no keys, headers or framing) |
//! | `binval_consumer_replica_read_timeouts_total` | counter | replica reads that did not answer within `replica_read_timeout` (the fill then read another master's replica too, when one was left) |
//! | `binval_consumer_replica_zero_fallbacks_total` | counter | reads of replica 0 made because a replica read before it had no record (the replica-0 rule, "Adaptive replica counts") |
//! | `binval_consumer_learned_counts` | gauge | keys whose learned replica count differs from the configured one (set every heat report interval and on [`Consumer::stats`]) |
//! | `binval_consumer_heat_reports_total{outcome}` | counter | heat reports written (`sent`) or not (`failed`: `NOPERM`, timeout, connection; the removal at shutdown too) |
//! | `binval_consumer_hot_set_load_failures_total` | counter | loads of `binval:hot` (at start, at each refresh) that failed |
//! | `binval_consumer_hot_keys` | gauge | keys of the top K at or above the threshold |
//! | `binval_consumer_hot_key_reads_per_sec{key}` | gauge | estimated read rate of each top-K key (0 once it left the top) |
//! | `binval_consumer_hot_key_rank_reads_per_sec{rank}` | gauge | estimated read rate of the key at rank 1..K of the top K (0 for an empty rank): K series whatever the churn |
//! | `binval_consumer_partition_lag_messages{partition}` | gauge | messages between the listener's position and the partition's high watermark, at each watermark observation of the fail safe (every quarter of `max_staleness`) |
//! | `binval_consumer_redis_reads_total{master, command}` | counter | Redis reads of fills per master (`host:port`; Cluster: by the slot map, see below) and `command` (`replica`: `HMGET K:rN d t p n` served by the master; `replica_node`: served by one of its replica nodes) |
//!
//! The hot-key gauges are set once per hot-key window by the listener thread and on every
//! [`Consumer::hot_keys`] call. The `rank` gauge is the bounded view (K series), for
//! dashboards and alerts; the `key` gauge names the keys: at most K `key` labels are non-zero
//! at any time, but a key that left the top K stays exported at 0, so its label set grows with
//! the churn of hot keys (show it as an instant table, `... > 0`, rather than as a series).
//!
//! Per-master reads: each read is counted under the master of the replica key's hash slot in
//! the consumer's slot map — the map the Cluster client routes by (handed over by the client at
//! connect and after every refresh it makes on a `MOVED` redirect or a failed connection), and
//! `CLUSTER SLOTS` at build time and at most every 30 s after; the labels are bounded by the
//! cluster's masters.
//!
//! Histograms are exported as the recorder is configured: with [`HISTOGRAM_BUCKETS`] they
//! have buckets, which `deploy/grafana/binval-consumer.json` uses.
//!
//! # Not yet
//!
//! Cross-instance single-flight; a stale fallback on Redis errors (only a rate-limit refusal
//! falls back).

#[doc(hidden)]
pub mod bench_support;
mod builder;
mod consumer;
mod counts;
mod error;
mod fail_safe;
mod front;
#[doc(hidden)]
pub mod fuzzing;
mod heat;
mod hot;
mod listener;
mod loader;
mod masters;
pub mod metric_names;
mod read;
mod redis_conn;
mod single_flight;
mod slot_map;
mod state;
mod stats;

/// The settings of secure connections ([`ConsumerBuilder::redis_tls`], [`ConsumerBuilder::redis_user`],
/// [`ConsumerBuilder::kafka_tls`], [`ConsumerBuilder::kafka_sasl`]), shared with the binval service.
pub use binval_security::{FileError, KafkaSasl, SaslMechanism, Secret, TlsMode, TlsSettings, UnknownValue};
pub use builder::ConsumerBuilder;
pub use consumer::{CacheMode, Consumer, Flagged, OnSourceBehind, Stale};
pub use counts::LEARNED_COUNT_ENTRIES;
pub use error::ConsumerError;
pub use hot::HotKey;
pub use listener::{decode_batch, decode_message, decode_topic_message, BadMessage, TopicMessage};
pub use loader::LoaderFuture;
pub use redis_conn::RedisTarget;
pub use state::{EvictionNotice, ENTRY_OVERHEAD_BYTES};
pub use stats::{Stats, CONSISTENCY_THRESHOLDS_MS, HISTOGRAM_BUCKETS};

/// The payload format binval writes, for loaders (`binval_protocol::payload`): see "The
/// app-supplied loader" above. `payload::result_set` needs this crate's feature `mysql`.
pub use binval_protocol::payload;
