//! `binval check`: preflight of everything `run` needs, read-only: the source's binlog
//! settings, schema and the account's privileges, Redis (and, on a Cluster, how the mappings'
//! replicas spread over the masters: [`super::placement`]), the checkpoint `run` would resume
//! from (or the start position it would use), and the Kafka brokers. Per service it also says
//! how the connection is secured: the TLS version and cipher (or `plaintext`) and whether the
//! server's certificate was verified (`security::probe`, `security::mysql::session_tls`).

use std::time::Duration;

use binval_security::TlsMode;

use crate::config::{Config, StartForms, StartPoint};
use crate::error::{DefiniteError, Error};
use crate::security;

/// Check the source, the mappings against its schema, the account's privileges, Redis, the
/// checkpoint and Kafka, printing one line per part. Errors name what failed (a definite config
/// error for mapping problems, [`DefiniteError::MissingPrivileges`] for missing grants).
pub async fn check(cfg: Config) -> Result<(), Error> {
    let mut conn = crate::binlog::server::connect(&cfg.source).await?;
    let info = match crate::binlog::server::preflight(&mut conn).await {
        Ok(info) => info,
        // Refused for want of a privilege (SHOW MASTER STATUS): list every missing one.
        Err(e @ Error::Definite(DefiniteError::SourceRefused(_))) => {
            use mysql_async::prelude::Queryable;
            let version: Option<String> = conn.query_first("SELECT @@version").await.unwrap_or(None);
            check_grants(&mut conn, &cfg, version.is_some_and(|v| v.to_ascii_lowercase().contains("mariadb"))).await?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    println!("source: {} ok (binlog at {}:{})", info.version, info.current.file, info.current.pos);
    let tls = security::mysql::session_tls(&mut conn).await?;
    println!("source tls: {}", describe(tls.map(|(v, c)| (v, c, "the connection itself")), cfg.source.tls.effective_mode()));
    // With the checkpoint's renames, as `run` checks them: a mapped table renamed while binval
    // followed it is checked under its live name. Redis is reported below; when it does not
    // answer here, the mappings are checked under their configured names.
    let early = crate::redis::RedisConn::connect(&cfg.redis).await.ok();
    let renamed = match &early {
        Some(r) => crate::ha::checkpoint::followed_renames(&cfg, r).await.ok(),
        None => None,
    };
    let problems = crate::binlog::server::check_mappings(&mut conn, &cfg.mappings, renamed.as_ref()).await?;
    for p in problems.all() {
        println!("mapping problem: {p}");
    }
    for w in &problems.waiting {
        println!("mapping note: {w}");
    }
    problems.refuse_keys()?;
    if !problems.schema.is_empty() {
        return Err(Error::config("mappings", format!("{} problem(s) against the source schema (listed above)", problems.schema.len())));
    }
    check_grants(&mut conn, &cfg, info.mariadb).await?;
    let mut redis = match early {
        Some(r) => r,
        None => crate::redis::RedisConn::connect(&cfg.redis).await?,
    };
    let pong: String = redis.query(&redis::cmd("PING")).await.map_err(|e| crate::error::TransientError::Redis(e.to_string()))?;
    println!("redis: {pong} ({})", cfg.redis.username.as_deref().map(|u| format!("ACL user {u}")).unwrap_or_else(|| "default user".into()));
    check_redis_tls(&cfg).await;
    let placements = super::placement::report(&redis, &cfg.mappings).await?;
    if placements.is_empty() {
        println!("placement: standalone Redis, every replica on one server (nothing to spread over)");
    }
    for p in &placements {
        println!("{}", p.line());
        for w in p.warnings() {
            println!("{w}");
        }
    }
    // Where `run` would start: the start plan (the same decision `run` makes, refusals
    // included): the checkpoint (or its newest copy), else what an earlier run left (recovered
    // from the topic, or refused), else source.start (its binlog file must still exist).
    let mut store = crate::ha::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis);
    let saved = store.load().await?;
    let loc = store.location();
    let logs = crate::binlog::server::binary_logs(&mut conn).await?;
    let copies = store.copy_keys();
    if !copies.is_empty() {
        println!("checkpoint copies: {} (one per master other than the checkpoint key's)", copies.join(", "));
    }
    match &saved {
        Some(cp) => {
            let plan = crate::binlog::start_plan::plan_start(&cfg, saved.as_ref(), &loc, &redis, &mut conn, &info, &logs).await?;
            let from = match store.loaded_from() {
                Some(copy) => format!("copy {copy} (the checkpoint key is missing)"),
                None => loc.clone(),
            };
            println!("checkpoint: {}:{} in {from}; run resumes at {} (source.start is ignored)", cp.file, cp.pos, plan.describe());
        }
        None => {
            if let Ok(StartPoint::Binlog(p)) = StartPoint::parse(&cfg.source.start, StartForms::SOURCE_START) {
                crate::binlog::server::require_binlog_file(&logs, &p, "source.start")?;
            }
            let earlier = crate::binlog::start_plan::Earlier::gather(&cfg, &redis, &loc).await?;
            for n in &earlier.notes {
                println!("note: {n}");
            }
            for t in &earlier.found {
                println!("earlier run: {t}");
            }
            let plan = crate::binlog::start_plan::plan(&cfg.source, None, &earlier, &mut conn, &info, &logs).await?;
            println!("checkpoint: none in {loc}; run starts at {}", plan.describe());
        }
    }
    // Read-only: check never creates the topic (run does, when kafka.create_topic is true).
    let mut kc = cfg.kafka.clone();
    kc.create_topic = false;
    let k = crate::kafka::KafkaSink::connect(&kc).await?;
    println!("kafka: brokers {} reachable (topic {})", cfg.kafka.brokers, k.topic());
    check_kafka_security(&cfg).await;
    println!("mappings: {} table(s)", cfg.mappings.len());
    Ok(())
}

/// `TLSv1.3 TLS13_AES_256_GCM_SHA384 (<source>); <verification>` or `plaintext`.
fn describe(tls: Option<(String, String, &str)>, mode: TlsMode) -> String {
    match tls {
        Some((v, c, from)) => format!("{v} {c} (as seen by {from}); {}", mode.verification()),
        None => "plaintext (no TLS)".into(),
    }
}

/// The source account's privileges for `run` and `replay` (`security::grants`): one line when
/// all are there, else one line per missing privilege with the statement to grant it, and an
/// error.
async fn check_grants(conn: &mut mysql_async::Conn, cfg: &Config, mariadb: bool) -> Result<(), Error> {
    let g = security::grants::check(conn, cfg, mariadb).await?;
    let list = |rs: &[security::grants::Requirement]| {
        rs.iter()
            .map(|r| {
                format!("{} on {}", r.privileges[0], r.table.as_ref().map(|(d, t)| format!("{d}.{t}")).unwrap_or_else(|| "*.*".into()))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if g.missing.is_empty() {
        println!("source grants: {} has what run and replay need ({})", g.account, list(&g.held));
        return Ok(());
    }
    for r in &g.missing {
        println!("source grants: missing {} (for {}: {}): {}", r.privileges.join(" or "), r.commands, r.why, r.grant_statement(&g.account));
    }
    let roles =
        if g.roles.is_empty() { String::new() } else { format!(" (roles granted: {}; only active roles count)", g.roles.join(", ")) };
    Err(DefiniteError::MissingPrivileges {
        account: g.account.clone(),
        missing: format!("{}{roles}; see the lines above", list(&g.missing)),
    }
    .into())
}

/// One `redis tls:` line per configured URL: a TLS handshake with `[redis.tls]`.
async fn check_redis_tls(cfg: &Config) {
    let mode = binval_security::redis_tls::effective_mode(&cfg.redis.urls, &cfg.redis.tls, "redis.tls", "redis.urls").unwrap_or_default();
    for u in &cfg.redis.urls {
        let Ok(addr) = crate::redis::NodeAddr::from_url(u) else { continue };
        let line = if mode.encrypted() {
            match security::probe::probe(&addr.host, addr.port, &cfg.redis.tls, mode, Duration::from_secs(5)).await {
                Ok(r) => describe(Some((r.version, r.cipher, "a TLS probe")), mode),
                Err(e) => format!("TLS probe failed: {e}"),
            }
        } else {
            describe(None, mode)
        };
        println!("redis tls: {addr} {line}");
    }
}

/// The `kafka security:` line: protocol, SASL user, and a TLS handshake with the first
/// bootstrap broker.
async fn check_kafka_security(cfg: &Config) {
    let k = &cfg.kafka;
    let mode = k.tls.effective_mode();
    let sasl = k.sasl.as_ref().map(|s| format!("SASL {} as {}", s.mechanism.as_str(), s.username)).unwrap_or_else(|| "no SASL".into());
    let tls = if mode.encrypted() {
        let first = k.brokers.split(',').next().unwrap_or_default().trim();
        match first.rsplit_once(':').and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?))) {
            Some((h, p)) => match security::probe::probe(&h, p, &k.tls, mode, Duration::from_secs(5)).await {
                Ok(r) => describe(Some((r.version, r.cipher, "a TLS probe of {first}")), mode).replace("{first}", first),
                Err(e) => format!("TLS probe of {first} failed: {e} (librdkafka connected)"),
            },
            None => format!("{} (broker {first} not host:port)", mode.verification()),
        }
    } else if k.properties.get("security.protocol").is_some_and(|p| p.to_ascii_uppercase().contains("SSL")) {
        "TLS through kafka.properties (not probed)".into()
    } else {
        describe(None, mode)
    };
    println!("kafka security: {sasl}; {tls}");
}
