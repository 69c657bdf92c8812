//! Least privilege on the source: the MySQL/MariaDB privileges each binval command needs, and
//! `binval check`'s test of them against the account it connects as.
//!
//! | command | privilege | on | why |
//! |---|---|---|---|
//! | run, replay | `REPLICATION SLAVE` | `*.*` | read the binlog (`COM_BINLOG_DUMP`) |
//! | run, replay | `BINLOG MONITOR` (MariaDB 10.5+; `REPLICATION CLIENT` on MySQL and older MariaDB, an alias there) | `*.*` | `SHOW MASTER STATUS`, `SHOW BINARY LOGS`: start position, purged-position check, bytes behind |
//! | run, replay, check | `SELECT` | each mapped table | its columns in `information_schema` (schema checks, MariaDB JSON columns); tables without any privilege are invisible there |
//! | run with `source.heartbeat_table` | `INSERT`, `UPDATE` (and `CREATE` until the table exists) | the heartbeat table | the heartbeat row |
//! | bootstrap, verify | `SELECT` | each mapped table | the table scan; `START TRANSACTION WITH CONSISTENT SNAPSHOT` and `SHOW STATUS LIKE 'binlog_snapshot_%'` (MariaDB) need no privilege |
//!
//! Nothing else: no `SUPER`, `RELOAD`, `PROCESS` or `REPLICATION SLAVE ADMIN`. binval reads
//! session variables (`@@binlog_format`, ...) and sets user variables (`@master_heartbeat_period`,
//! `@slave_connect_state`), which need no privilege.
//!
//! The check parses `SHOW GRANTS` (the current account with its active roles: MariaDB lists
//! the grants of the current role too) into [`Grants`]; a `SELECT` or `BINLOG MONITOR` it does
//! not find is then tried (`SELECT 1 FROM t LIMIT 0`, `SHOW BINARY LOGS`), so privileges that
//! come through a role are not reported missing. `REPLICATION SLAVE` cannot be tried without
//! starting a replica connection: a role holding it is named as a possible source.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::config::Config;
use crate::error::{classify_mysql, Error};

/// Where a grant applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `*.*`
    Global,
    /// `` `db`.* ``: `db` is a `LIKE` pattern (MariaDB and MySQL allow `_` and `%` in
    /// database-level grants).
    Schema(String),
    /// `` `db`.`table` ``, with the columns when the grant is column-level.
    Table(String, String, Option<Vec<String>>),
}

/// One privilege of one grant line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Upper case: `SELECT`, `REPLICATION SLAVE`, `ALL PRIVILEGES`.
    pub privilege: String,
    /// Where.
    pub scope: Scope,
}

/// The parsed `SHOW GRANTS` output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Every privilege of every line.
    pub grants: Vec<Grant>,
    /// Roles granted to the account (`GRANT role TO user`).
    pub roles: Vec<String>,
}

impl Grants {
    /// Parse the lines of `SHOW GRANTS`. Lines it does not understand (`GRANT PROXY`,
    /// routines) are skipped.
    pub fn parse<S: AsRef<str>>(lines: &[S]) -> Grants {
        let mut out = Grants::default();
        for line in lines {
            let Some(body) = line.as_ref().trim().strip_prefix("GRANT ") else { continue };
            match find_top_level(body, " ON ") {
                Some(on) => {
                    let (privs, rest) = (&body[..on], &body[on + 4..]);
                    let Some(to) = find_top_level(rest, " TO ") else { continue };
                    let Some(target) = parse_target(rest[..to].trim()) else { continue };
                    for p in split_top_level(privs) {
                        let (name, cols) = match p.find('(') {
                            Some(i) => (p[..i].trim(), Some(p[i + 1..].trim_end_matches(')').split(',').map(unquote).collect::<Vec<_>>())),
                            None => (p.trim(), None),
                        };
                        let scope = match (&target, cols) {
                            (Scope::Table(d, t, _), Some(c)) => Scope::Table(d.clone(), t.clone(), Some(c)),
                            (s, _) => s.clone(),
                        };
                        out.grants.push(Grant { privilege: name.to_ascii_uppercase(), scope });
                    }
                }
                None => {
                    if let Some(to) = find_top_level(body, " TO ") {
                        out.roles.extend(split_top_level(&body[..to]).into_iter().map(unquote));
                    }
                }
            }
        }
        out
    }

    /// Whether one of `privileges` (alternatives, upper case) is held for table `db.table`
    /// (`None`: globally), at the table's level or above; column-level grants do not count.
    pub fn has(&self, privileges: &[&str], db: Option<&str>, table: Option<&str>) -> bool {
        self.grants.iter().any(|g| {
            let p = g.privilege.as_str();
            let named = privileges.contains(&p) || p == "ALL PRIVILEGES" || p == "ALL";
            named
                && match (&g.scope, db, table) {
                    (Scope::Global, _, _) => true,
                    (Scope::Schema(pat), Some(d), _) => like(pat, d),
                    (Scope::Table(gd, gt, None), Some(d), Some(t)) => gd == d && gt.eq_ignore_ascii_case(t),
                    _ => false,
                }
        })
    }
}

/// What one command needs: alternatives of one privilege, on a table or globally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Alternatives (any one is enough), upper case; the first is the one to grant.
    pub privileges: &'static [&'static str],
    /// `None` = `*.*`; else `(schema, table)`.
    pub table: Option<(String, String)>,
    /// The commands that need it.
    pub commands: &'static str,
    /// What for.
    pub why: &'static str,
}

impl Requirement {
    /// `GRANT ... ON ... TO <account>`.
    pub fn grant_statement(&self, account: &str) -> String {
        let on = self.table.as_ref().map(|(d, t)| format!("`{d}`.`{t}`")).unwrap_or_else(|| "*.*".into());
        format!("GRANT {} ON {on} TO {account}", self.privileges[0])
    }
}

/// The privileges `run` and `replay` need for `cfg` (see the module docs), MariaDB or MySQL.
pub fn requirements(cfg: &Config, mariadb: bool) -> Vec<Requirement> {
    let mut out = vec![
        Requirement { privileges: &["REPLICATION SLAVE"], table: None, commands: "run, replay", why: "read the binlog" },
        Requirement {
            privileges: if mariadb { &["BINLOG MONITOR", "REPLICATION CLIENT", "SUPER"] } else { &["REPLICATION CLIENT", "SUPER"] },
            table: None,
            commands: "run, replay, check",
            why: "SHOW MASTER STATUS and SHOW BINARY LOGS",
        },
    ];
    for m in &cfg.mappings {
        if let Some((d, t)) = m.table.split_once('.') {
            out.push(Requirement {
                privileges: &["SELECT"],
                table: Some((d.into(), t.into())),
                commands: "run, replay, bootstrap, verify",
                why: "the table's columns (and its rows for bootstrap and verify)",
            });
        }
    }
    if let Some((d, t)) = cfg.source.heartbeat_table.as_deref().and_then(|h| h.split_once('.')) {
        for p in [&["INSERT"][..], &["UPDATE"][..]] {
            out.push(Requirement { privileges: p, table: Some((d.into(), t.into())), commands: "run", why: "the heartbeat row" });
        }
    }
    out
}

/// The outcome of [`check`]: what is held, what is missing (with the statement to grant it).
#[derive(Debug, Clone, Default)]
pub struct GrantCheck {
    /// The account (`CURRENT_USER()`).
    pub account: String,
    /// Requirements met.
    pub held: Vec<Requirement>,
    /// Requirements not met.
    pub missing: Vec<Requirement>,
    /// Roles granted to the account (their privileges count only while active).
    pub roles: Vec<String>,
}

/// Check [`requirements`] against the account `conn` is logged in as: `SHOW GRANTS`, then a
/// try of each `SELECT` and `BINLOG MONITOR` not found there.
pub async fn check(conn: &mut Conn, cfg: &Config, mariadb: bool) -> Result<GrantCheck, Error> {
    let q = |e| classify_mysql(e, "SHOW GRANTS");
    let account: String = conn.query_first("SELECT CURRENT_USER()").await.map_err(q)?.unwrap_or_default();
    let lines: Vec<String> = conn.query("SHOW GRANTS").await.map_err(q)?;
    let grants = Grants::parse(&lines);
    let mut out = GrantCheck { account: quote_account(&account), roles: grants.roles.clone(), ..Default::default() };
    for r in requirements(cfg, mariadb) {
        let (d, t) = r.table.as_ref().map(|(d, t)| (Some(d.as_str()), Some(t.as_str()))).unwrap_or((None, None));
        let mut ok = grants.has(r.privileges, d, t);
        if !ok && r.privileges[0] == "SELECT" {
            ok = conn.query_drop(format!("SELECT 1 FROM `{}`.`{}` LIMIT 0", d.unwrap_or(""), t.unwrap_or(""))).await.is_ok();
        }
        if !ok && r.why.starts_with("SHOW MASTER") {
            ok = conn.query_drop("SHOW BINARY LOGS").await.is_ok();
        }
        if ok {
            out.held.push(r);
        } else {
            out.missing.push(r);
        }
    }
    Ok(out)
}

/// `user@host` -> `'user'@'host'`.
fn quote_account(a: &str) -> String {
    match a.rsplit_once('@') {
        Some((u, h)) => format!("'{u}'@'{h}'"),
        None => a.to_string(),
    }
}

/// Byte index of `needle` in `s` outside backticks, quotes and parentheses.
fn find_top_level(s: &str, needle: &str) -> Option<usize> {
    let (mut depth, mut quote) = (0i32, None::<char>);
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '`' | '\'' | '"') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => depth -= 1,
            (None, _) if depth == 0 && s[i..].starts_with(needle) => return Some(i),
            _ => {}
        }
    }
    None
}

/// Split at top-level commas.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = find_top_level(rest, ",") {
        out.push(rest[..i].trim());
        rest = &rest[i + 1..];
    }
    if !rest.trim().is_empty() {
        out.push(rest.trim());
    }
    out
}

/// `` `a``b` `` -> ``a`b``, `'x'` -> `x`, `x` -> `x`.
fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['`', '\'', '"'] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].replace(&format!("{q}{q}"), &q.to_string());
        }
    }
    s.to_string()
}

/// `*.*`, `` `db`.* ``, `` `db`.`t` `` (routines and proxies: `None`).
fn parse_target(t: &str) -> Option<Scope> {
    if t.starts_with("FUNCTION ") || t.starts_with("PROCEDURE ") || t.starts_with("PACKAGE ") {
        return None;
    }
    if t == "*.*" || t == "*" {
        return Some(Scope::Global);
    }
    let dot = find_top_level(t, ".")?;
    let (d, table) = (unquote(&t[..dot]), t[dot + 1..].trim());
    if table == "*" {
        Some(Scope::Schema(d))
    } else {
        Some(Scope::Table(d, unquote(table), None))
    }
}

/// SQL `LIKE` of a database-level grant: `%` any run, `_` any one character, `\` escapes.
fn like(pattern: &str, s: &str) -> bool {
    fn go(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('%') => (0..=s.len()).any(|i| go(&p[1..], &s[i..])),
            Some('_') => !s.is_empty() && go(&p[1..], &s[1..]),
            Some('\\') if p.len() > 1 => s.first() == Some(&p[1]) && go(&p[2..], &s[1..]),
            Some(c) => s.first() == Some(c) && go(&p[1..], &s[1..]),
        }
    }
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    go(&p, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_grants_of_mariadb_and_mysql() {
        let g = Grants::parse(&[
            "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `binval`@`%` IDENTIFIED BY PASSWORD '*ABC'",
            "GRANT SELECT ON `shop`.`items` TO `binval`@`%`",
            "GRANT SELECT, INSERT, UPDATE ON `binval\\_hb`.* TO `binval`@`%`",
            "GRANT SELECT (`id`, `title`) ON `shop`.`secret` TO `binval`@`%`",
            "GRANT `cdc_reader`,`other` TO `binval`@`%`",
            "GRANT EXECUTE ON PROCEDURE `shop`.`p` TO `binval`@`%`",
            "GRANT USAGE ON *.* TO `binval`@`%` REQUIRE SSL",
        ]);
        assert!(g.has(&["REPLICATION SLAVE"], None, None));
        assert!(g.has(&["REPLICATION CLIENT", "BINLOG MONITOR"], None, None));
        assert!(g.has(&["SELECT"], Some("shop"), Some("items")));
        assert!(!g.has(&["SELECT"], Some("shop"), Some("orders")));
        assert!(!g.has(&["SELECT"], Some("shop"), Some("secret")), "column-level grants do not count");
        assert!(g.has(&["INSERT"], Some("binval_hb"), Some("heartbeat")));
        assert!(!g.has(&["INSERT"], Some("binvalxhb"), Some("heartbeat")), "an escaped _ is literal");
        assert_eq!(g.roles, vec!["cdc_reader".to_string(), "other".into()]);
        let all = Grants::parse(&["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"]);
        assert!(all.has(&["REPLICATION SLAVE"], None, None) && all.has(&["SELECT"], Some("a"), Some("b")));
        let db = Grants::parse(&["GRANT SELECT ON `shop%`.* TO 'u'@'%'"]);
        assert!(db.has(&["SELECT"], Some("shop_eu"), Some("t")) && !db.has(&["SELECT"], Some("blog"), Some("t")));
        assert!(!Grants::parse(&["GRANT USAGE ON *.* TO `u`@`%`"]).has(&["SELECT"], Some("a"), Some("b")));
    }

    #[test]
    fn grant_statements_name_account_and_target() {
        let r = Requirement { privileges: &["SELECT"], table: Some(("shop".into(), "items".into())), commands: "run", why: "x" };
        assert_eq!(r.grant_statement("'binval'@'%'"), "GRANT SELECT ON `shop`.`items` TO 'binval'@'%'");
        assert_eq!(quote_account("binval@%"), "'binval'@'%'");
    }
}
