//! The Redis Cluster's masters, one plain connection each: command counters
//! (`INFO commandstats`), memory (`INFO memory`), key counts (`DBSIZE`) and which master holds
//! a key. Sync (`redis::Connection`): used from a sampler thread and between phases.

use anyhow::Context;

/// One connection per master, in the order of the URLs given.
pub struct Masters {
    conns: Vec<redis::Connection>,
}

/// `field:value` of an `INFO` section reply.
fn info_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
}

impl Masters {
    /// Connect to every master URL. Errors: a URL that does not open or connect (named).
    pub fn connect(urls: &[String]) -> anyhow::Result<Masters> {
        let mut conns = Vec::new();
        for u in urls {
            conns.push(redis::Client::open(u.as_str())?.get_connection().with_context(|| format!("Redis master {u}"))?);
        }
        Ok(Masters { conns })
    }

    /// `calls` of `cmdstat_<cmd>` (lowercase command name) per master since its start.
    pub fn calls(&mut self, cmd: &str) -> anyhow::Result<Vec<u64>> {
        let want = format!("cmdstat_{cmd}:calls=");
        let mut out = Vec::new();
        for c in &mut self.conns {
            let text: String = redis::cmd("INFO").arg("commandstats").query(c)?;
            let n = text
                .lines()
                .find_map(|l| l.strip_prefix(want.as_str()))
                .and_then(|rest| rest.split(',').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            out.push(n);
        }
        Ok(out)
    }

    /// The sum over masters of the calls of every command in `cmds`.
    pub fn total_calls(&mut self, cmds: &[&str]) -> anyhow::Result<u64> {
        let mut sum = 0;
        for c in cmds {
            sum += self.calls(c)?.iter().sum::<u64>();
        }
        Ok(sum)
    }

    /// `used_memory` summed over the masters, bytes.
    pub fn used_memory(&mut self) -> anyhow::Result<u64> {
        let mut sum = 0;
        for c in &mut self.conns {
            let text: String = redis::cmd("INFO").arg("memory").query(c)?;
            sum += info_field(&text, "used_memory").context("INFO memory without used_memory")?;
        }
        Ok(sum)
    }

    /// `DBSIZE` summed over the masters.
    pub fn keys(&mut self) -> anyhow::Result<u64> {
        let mut sum = 0u64;
        for c in &mut self.conns {
            sum += redis::cmd("DBSIZE").query::<u64>(c)?;
        }
        Ok(sum)
    }

    /// The index of the master serving `key`'s slot: the one that answers `EXISTS` instead of
    /// `MOVED` (the Cluster spec's redirection). None when every master redirects.
    pub fn owner(&mut self, key: &str) -> Option<usize> {
        self.conns.iter_mut().position(|c| redis::cmd("EXISTS").arg(key).query::<i64>(c).is_ok())
    }

    /// `HGET key field` on master `i` (its owner), as text.
    pub fn hget(&mut self, i: usize, key: &str, field: &str) -> Option<String> {
        redis::cmd("HGET").arg(key).arg(field).query::<Option<String>>(&mut self.conns[i]).ok().flatten()
    }

    /// `EXISTS key`, answered by its owner (the others redirect).
    pub fn exists(&mut self, key: &str) -> bool {
        self.conns.iter_mut().find_map(|c| redis::cmd("EXISTS").arg(key).query::<i64>(c).ok()) == Some(1)
    }
}
