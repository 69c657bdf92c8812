//! DDL that matters to the cache. Column changes (ALTER TABLE ADD/DROP/MODIFY COLUMN) need
//! nothing: every TABLE_MAP carries the table's current columns. Statements that remove or
//! swap rows without row events would leave cached keys stale with no event to evict them:
//!
//! * TRUNCATE, DROP TABLE, ALTER TABLE ... TRUNCATE/DROP/EXCHANGE PARTITION of a mapped table
//!   invalidate every cached key of the table ([`TableDdl::invalidates`]): binval marks every
//!   replica of the table's keys stale at the statement's position and publishes one `truncate`
//!   event per key template (see `redis_sink::RedisConn::invalidate_template`).
//! * RENAME TABLE and ALTER TABLE ... RENAME, judged per statement
//!   (`mapping::TableNames::rename_statement`, saved in the checkpoint): a mapped table whose
//!   name is left empty is followed (its rule applies to the new name from then on); a mapped
//!   name that gets another table (an online schema change cut-over, a swap) keeps its rule and
//!   every key of it is marked stale; a mapped table moved onto the name of another mapping
//!   stops the source with a definite error naming both mappings, the position and the
//!   statement.

/// A statement that affects whole tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDdl {
    /// `TRUNCATE`, `DROP TABLE`, `RENAME TABLE`, `ALTER TABLE ... RENAME`, or an
    /// `ALTER TABLE ... TRUNCATE|DROP|EXCHANGE PARTITION`.
    pub kind: &'static str,
    /// Tables named, as `schema.table` (the statement's default schema filled in).
    pub tables: Vec<String>,
}

impl TableDdl {
    /// Whether binval acts on it by invalidating every key of the named mapped tables (all but
    /// the renames, which are followed instead).
    pub fn invalidates(&self) -> bool {
        !self.kind.contains("RENAME")
    }
}

/// Recognise a table-level DDL statement. `default_schema` is the QUERY event's schema.
/// Returns `None` for anything else (DML, CREATE, column-level ALTER, ...).
pub fn classify(query: &str, default_schema: &str) -> Option<TableDdl> {
    let toks = tokenize(query);
    match kw(&toks, 0).as_str() {
        // MariaDB: CREATE OR REPLACE TABLE drops the table and creates it anew.
        "CREATE" if kw(&toks, 1) == "OR" && kw(&toks, 2) == "REPLACE" && kw(&toks, 3) == "TABLE" => {
            let mut i = 4;
            if kw(&toks, i) == "IF" && kw(&toks, i + 1) == "NOT" && kw(&toks, i + 2) == "EXISTS" {
                i += 3;
            }
            let (t, _) = name_at(&toks, i, default_schema)?;
            Some(TableDdl { kind: "CREATE OR REPLACE TABLE", tables: vec![t] })
        }
        "TRUNCATE" => {
            let i = if kw(&toks, 1) == "TABLE" { 2 } else { 1 };
            let (t, _) = name_at(&toks, i, default_schema)?;
            Some(TableDdl { kind: "TRUNCATE", tables: vec![t] })
        }
        "DROP" => drop_table(&toks, default_schema),
        "RENAME" if kw(&toks, 1) == "TABLE" => rename_table(&toks, default_schema),
        "ALTER" => alter_table(&toks, default_schema),
        _ => None,
    }
}

/// The tables a DDL statement creates, alters, renames or removes (`schema.table`, the
/// statement's default schema filled in): what binval knows of them (their JSON columns, see
/// `binlog::json_columns`) must be read again after it. Empty for anything else (DML,
/// temporary tables, other objects).
pub fn tables_named(query: &str, default_schema: &str) -> Vec<String> {
    if let Some(d) = classify(query, default_schema) {
        return d.tables;
    }
    let toks = tokenize(query);
    let mut i = 1;
    match kw(&toks, 0).as_str() {
        "CREATE" => {
            if kw(&toks, 1) == "OR" && kw(&toks, 2) == "REPLACE" {
                i = 3;
            }
            if kw(&toks, i) != "TABLE" {
                return Vec::new();
            }
            i += 1;
            if kw(&toks, i) == "IF" && kw(&toks, i + 1) == "NOT" && kw(&toks, i + 2) == "EXISTS" {
                i += 3;
            }
        }
        "ALTER" => {
            if kw(&toks, i) == "ONLINE" || kw(&toks, i) == "IGNORE" {
                i += 1;
            }
            if kw(&toks, i) != "TABLE" {
                return Vec::new();
            }
            i += 1;
        }
        _ => return Vec::new(),
    }
    name_at(&toks, i, default_schema).map(|(t, _)| vec![t]).unwrap_or_default()
}

/// Token `i` in upper case; empty past the end.
fn kw(toks: &[String], i: usize) -> String {
    toks.get(i).map(|t| t.to_ascii_uppercase()).unwrap_or_default()
}

/// `DROP TABLE [IF EXISTS] t1[, t2...]` (not `DROP TEMPORARY TABLE`).
fn drop_table(toks: &[String], default_schema: &str) -> Option<TableDdl> {
    let mut i = 1;
    if kw(toks, i) == "TEMPORARY" {
        return None;
    }
    if kw(toks, i) != "TABLE" {
        return None;
    }
    i += 1;
    if kw(toks, i) == "IF" && kw(toks, i + 1) == "EXISTS" {
        i += 2;
    }
    let mut tables = Vec::new();
    while let Some((t, next)) = name_at(toks, i, default_schema) {
        tables.push(t);
        if toks.get(next).map(String::as_str) == Some(",") {
            i = next + 1;
        } else {
            break;
        }
    }
    (!tables.is_empty()).then_some(TableDdl { kind: "DROP TABLE", tables })
}

/// `RENAME TABLE a TO b[, c TO d...]`: the tables in (from, to) pairs.
fn rename_table(toks: &[String], default_schema: &str) -> Option<TableDdl> {
    let mut i = 2;
    let mut tables = Vec::new();
    while let Some((from, next)) = name_at(toks, i, default_schema) {
        tables.push(from);
        if kw(toks, next) != "TO" {
            break;
        }
        let Some((to, after)) = name_at(toks, next + 1, default_schema) else { break };
        tables.push(to);
        if toks.get(after).map(String::as_str) == Some(",") {
            i = after + 1;
        } else {
            break;
        }
    }
    (!tables.is_empty()).then_some(TableDdl { kind: "RENAME TABLE", tables })
}

/// `ALTER [ONLINE|IGNORE] TABLE t ...` with a RENAME or a partition operation that removes or
/// swaps rows.
fn alter_table(toks: &[String], default_schema: &str) -> Option<TableDdl> {
    let mut i = 1;
    if kw(toks, i) == "ONLINE" || kw(toks, i) == "IGNORE" {
        i += 1;
    }
    if kw(toks, i) != "TABLE" {
        return None;
    }
    let (t, next) = name_at(toks, i + 1, default_schema)?;
    // RENAME anywhere at clause level (not RENAME COLUMN / RENAME INDEX / RENAME KEY);
    // partition operations that remove or swap rows without row events.
    for j in next..toks.len() {
        let w = toks[j].to_ascii_uppercase();
        if matches!(w.as_str(), "TRUNCATE" | "DROP" | "EXCHANGE") && kw(toks, j + 1) == "PARTITION" {
            return Some(partition_ddl(toks, j, &w, t, default_schema));
        }
        if toks[j].eq_ignore_ascii_case("RENAME") {
            let nk = kw(toks, j + 1);
            if !matches!(nk.as_str(), "COLUMN" | "INDEX" | "KEY") {
                let k = if nk == "TO" || nk == "AS" { j + 2 } else { j + 1 };
                let mut tables = vec![t];
                if let Some((to, _)) = name_at(toks, k, default_schema) {
                    tables.push(to);
                }
                return Some(TableDdl { kind: "ALTER TABLE ... RENAME", tables });
            }
        }
    }
    None
}

/// `ALTER TABLE t TRUNCATE|DROP|EXCHANGE PARTITION ...` with `w` (upper case) at token `j`;
/// EXCHANGE names the other table too.
fn partition_ddl(toks: &[String], j: usize, w: &str, t: String, default_schema: &str) -> TableDdl {
    let kind = match w {
        "TRUNCATE" => "ALTER TABLE ... TRUNCATE PARTITION",
        "DROP" => "ALTER TABLE ... DROP PARTITION",
        _ => "ALTER TABLE ... EXCHANGE PARTITION",
    };
    let mut tables = vec![t];
    if w == "EXCHANGE" {
        // EXCHANGE PARTITION p WITH TABLE other
        if let Some(w2) = (j + 2..toks.len()).find(|&x| toks[x].eq_ignore_ascii_case("TABLE")) {
            if let Some((other, _)) = name_at(toks, w2 + 1, default_schema) {
                tables.push(other);
            }
        }
    }
    TableDdl { kind, tables }
}

/// Split into identifiers (backquotes removed), `.` and `,` tokens; comments and strings
/// are not expected in the statements recognised here.
fn tokenize(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = q.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            // Comments: `/* ... */` is skipped, but the text of MySQL/MariaDB executable
            // comments (`/*!50001 ... */`, `/*M!100100 ... */`) is SQL and is read on;
            // `-- ` and `#` run to the end of the line.
            '/' if chars.peek() == Some(&'*') => {
                flush(&mut cur, &mut out);
                chars.next();
                let executable = match chars.peek() {
                    Some('!') => {
                        chars.next();
                        true
                    }
                    Some('M') => {
                        let mut look = chars.clone();
                        look.next();
                        if look.peek() == Some(&'!') {
                            chars.next();
                            chars.next();
                            true
                        } else {
                            false
                        }
                    }
                    _ => false,
                };
                if executable {
                    while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                        chars.next();
                    }
                    // The executable text is tokenised normally; its closing `*/` is dropped below.
                } else {
                    let mut prev = ' ';
                    for d in chars.by_ref() {
                        if prev == '*' && d == '/' {
                            break;
                        }
                        prev = d;
                    }
                }
            }
            '*' if chars.peek() == Some(&'/') => {
                flush(&mut cur, &mut out);
                chars.next();
            }
            '-' if chars.peek() == Some(&'-') && cur.is_empty() => {
                flush(&mut cur, &mut out);
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '#' if cur.is_empty() => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '`' => {
                flush(&mut cur, &mut out);
                let mut id = String::new();
                while let Some(d) = chars.next() {
                    if d == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            id.push('`');
                        } else {
                            break;
                        }
                    } else {
                        id.push(d);
                    }
                }
                out.push(format!("`{id}"));
            }
            '.' | ',' | ';' | '(' | ')' => {
                flush(&mut cur, &mut out);
                out.push(c.to_string());
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    out
}

/// A possibly qualified table name at `i`; returns `schema.table` and the index after it.
fn name_at(toks: &[String], i: usize, default_schema: &str) -> Option<(String, usize)> {
    let ident = |t: &String| -> Option<String> {
        if let Some(s) = t.strip_prefix('`') {
            Some(s.to_string())
        } else if t.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            Some(t.clone())
        } else {
            None
        }
    };
    let first = ident(toks.get(i)?)?;
    if toks.get(i + 1).map(String::as_str) == Some(".") {
        let second = ident(toks.get(i + 2)?)?;
        Some((format!("{first}.{second}"), i + 3))
    } else {
        Some((format!("{default_schema}.{first}"), i + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(q: &str) -> Option<(&'static str, Vec<String>)> {
        classify(q, "shop").map(|d| (d.kind, d.tables))
    }

    #[test]
    fn comments_and_create_or_replace() {
        assert_eq!(t("/* app:cleanup */ TRUNCATE TABLE t5"), Some(("TRUNCATE", vec!["shop.t5".into()])));
        assert_eq!(t("-- why\n# and how\nTRUNCATE t5"), Some(("TRUNCATE", vec!["shop.t5".into()])));
        assert_eq!(t("/*!40000 TRUNCATE TABLE */ t5"), Some(("TRUNCATE", vec!["shop.t5".into()])));
        assert_eq!(t("DROP TABLE `t5` /* generated by server */"), Some(("DROP TABLE", vec!["shop.t5".into()])));
        assert_eq!(t("CREATE OR REPLACE TABLE x.t5 (id int primary key)"), Some(("CREATE OR REPLACE TABLE", vec!["x.t5".into()])));
        assert_eq!(t("CREATE OR REPLACE TEMPORARY TABLE t5 (id int)"), None);
        assert_eq!(t("CREATE TABLE t5 (id int)"), None);
        assert_eq!(t("UPDATE t SET a = 1 -- TRUNCATE t5"), None);
    }

    #[test]
    fn recognises_table_ddl() {
        assert_eq!(t("TRUNCATE items"), Some(("TRUNCATE", vec!["shop.items".into()])));
        assert_eq!(t("truncate table `my db`.`it``ems`"), Some(("TRUNCATE", vec!["my db.it`ems".into()])));
        assert_eq!(t("DROP TABLE IF EXISTS a, b.c /* generated by server */"), Some(("DROP TABLE", vec!["shop.a".into(), "b.c".into()])));
        assert_eq!(
            t("RENAME TABLE items TO items_old, new TO items"),
            Some(("RENAME TABLE", vec!["shop.items".into(), "shop.items_old".into(), "shop.new".into(), "shop.items".into()]))
        );
        assert_eq!(
            t("ALTER TABLE items RENAME TO goods"),
            Some(("ALTER TABLE ... RENAME", vec!["shop.items".into(), "shop.goods".into()]))
        );
        assert_eq!(t("ALTER TABLE tp TRUNCATE PARTITION p0"), Some(("ALTER TABLE ... TRUNCATE PARTITION", vec!["shop.tp".into()])));
        assert_eq!(t("alter table tp drop partition p0, p1"), Some(("ALTER TABLE ... DROP PARTITION", vec!["shop.tp".into()])));
        assert_eq!(
            t("ALTER TABLE tp EXCHANGE PARTITION p0 WITH TABLE x.t2"),
            Some(("ALTER TABLE ... EXCHANGE PARTITION", vec!["shop.tp".into(), "x.t2".into()]))
        );
        assert_eq!(
            t("ALTER TABLE items ADD COLUMN x INT, RENAME AS other.goods"),
            Some(("ALTER TABLE ... RENAME", vec!["shop.items".into(), "other.goods".into()]))
        );
    }

    #[test]
    fn tables_named_by_ddl() {
        let n = |q: &str| tables_named(q, "shop");
        assert_eq!(n("CREATE TABLE t (id INT)"), vec!["shop.t".to_string()]);
        assert_eq!(n("create table if not exists `x`.`t` like y"), vec!["x.t".to_string()]);
        assert_eq!(n("CREATE OR REPLACE TABLE t (id INT)"), vec!["shop.t".to_string()]);
        assert_eq!(n("ALTER ONLINE TABLE t ADD COLUMN j JSON"), vec!["shop.t".to_string()]);
        assert_eq!(n("RENAME TABLE a TO b"), vec!["shop.a".to_string(), "shop.b".to_string()]);
        assert!(n("CREATE TEMPORARY TABLE t (id INT)").is_empty());
        assert!(n("CREATE VIEW v AS SELECT 1").is_empty());
        assert!(n("INSERT INTO t VALUES (1)").is_empty());
    }

    #[test]
    fn ignores_the_rest() {
        assert_eq!(t("ALTER TABLE items ADD COLUMN x INT"), None);
        assert_eq!(t("ALTER TABLE items RENAME COLUMN a TO b"), None);
        assert_eq!(t("DROP TEMPORARY TABLE t"), None);
        assert_eq!(t("CREATE TABLE items (id INT)"), None);
        assert_eq!(t("BEGIN"), None);
        assert_eq!(t("DROP DATABASE shop"), None);
    }
}
