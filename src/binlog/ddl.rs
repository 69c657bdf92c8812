//! DDL that matters to the cache: statements that change rows without row events would leave
//! cached keys stale with no event to evict them.
//!
//! * TRUNCATE, DROP TABLE, CREATE OR REPLACE TABLE, ALTER TABLE ... TRUNCATE/DROP/EXCHANGE
//!   PARTITION of a mapped table invalidate every cached key of the table
//!   ([`TableDdl::invalidates`]): binval marks every replica of the table's keys stale at the
//!   statement's position and publishes one `truncate` event per key template (see
//!   `redis_sink::RedisConn::invalidate_template`).
//! * Column changes (ALTER TABLE ... ADD/DROP/MODIFY/CHANGE/RENAME COLUMN, FIRST/AFTER, CONVERT
//!   TO CHARACTER SET, with any ALGORITHM/LOCK): the database rewrites (or, with INSTANT,
//!   reinterprets) every row of the table without row events, like a TRUNCATE: the TABLE_MAP of
//!   the next row event carries the new columns, but every key *not* written after the ALTER
//!   would keep the old payload (the dropped column still served, the new one missing). So an
//!   ALTER of a mapped table is treated like TRUNCATE (same path, same event) unless every one
//!   of its clauses is known to leave every row's payload as it was
//!   ([`TableDdl::column_change`] names the first clause that is not): index and key changes
//!   (ADD/DROP/RENAME/ALTER INDEX|KEY, ADD UNIQUE|FULLTEXT|SPATIAL|FOREIGN KEY, DROP PRIMARY
//!   KEY|FOREIGN KEY; not ADD PRIMARY KEY, which makes its columns NOT NULL and, outside strict
//!   mode, turns their NULLs into the type's zero value),
//!   `ALTER [COLUMN] c SET DEFAULT | DROP DEFAULT` (a default applies to later inserts only;
//!   MariaDB docs, "ALTER TABLE"), table options that do not touch values (COMMENT,
//!   AUTO_INCREMENT, ROW_FORMAT, KEY_BLOCK_SIZE, STATS_*, PACK_KEYS, CHECKSUM, MAX_ROWS,
//!   MIN_ROWS, AVG_ROW_LENGTH, DELAY_KEY_WRITE, PAGE_CHECKSUM, TRANSACTIONAL, the table's
//!   default CHARACTER SET / COLLATE, which only new columns take), ENGINE=InnoDB|MyISAM|Aria,
//!   ALGORITHM, LOCK, FORCE, ORDER BY, ENABLE/DISABLE KEYS, and partition maintenance that keeps
//!   every row (ADD, ANALYZE, CHECK, OPTIMIZE, REPAIR, REBUILD, COALESCE, REORGANIZE PARTITION,
//!   PARTITION BY, REMOVE PARTITIONING). Anything else is treated as a column change, on
//!   purpose: ENGINE=BLACKHOLE empties the table, CONVERT PARTITION moves rows out, DISCARD or
//!   IMPORT TABLESPACE swap the data, and adding or dropping a CHECK constraint (also `DROP
//!   CONSTRAINT`, which may name one) can change which columns binval renders as MariaDB JSON
//!   (a `json_valid` check, see `binlog::json_columns`). `ALTER IGNORE TABLE` always counts:
//!   it deletes rows that would break a new unique key, without row events.
//! * RENAME TABLE and ALTER TABLE ... RENAME, judged per statement
//!   (`mapping::TableNames::rename_statement`, saved in the checkpoint): a mapped table whose
//!   name is left empty is followed (its rule applies to the new name from then on); a mapped
//!   name that gets another table (an online schema change cut-over, a swap) keeps its rule and
//!   every key of it is marked stale; a mapped table moved onto the name of another mapping
//!   stops the source with a definite error naming both mappings, the position and the
//!   statement. An ALTER that renames and changes columns does both: the rename is followed,
//!   then every key of the mapping (under its new name) is marked stale.

/// A statement that affects whole tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDdl {
    /// `TRUNCATE`, `DROP TABLE`, `CREATE OR REPLACE TABLE`, `RENAME TABLE`, `ALTER TABLE ...
    /// RENAME`, an `ALTER TABLE ... TRUNCATE|DROP|EXCHANGE PARTITION`, or `ALTER TABLE` (a
    /// column change, see [`TableDdl::column_change`]).
    pub kind: &'static str,
    /// Tables named, as `schema.table` (the statement's default schema filled in); for the
    /// renames, (from, to) pairs.
    pub tables: Vec<String>,
    /// For an ALTER TABLE that may have changed every row's payload (module docs): the first
    /// clause that binval does not know to be harmless, as written (shortened to 80
    /// characters), for the log line saying why the keys were marked stale. `None` for the
    /// other statements.
    pub column_change: Option<String>,
}

impl TableDdl {
    /// Whether binval acts on it by invalidating every key of the named mapped tables (all but
    /// the renames, which are followed instead).
    pub fn invalidates(&self) -> bool {
        !self.kind.contains("RENAME")
    }
}

/// Recognise a table-level DDL statement. `default_schema` is the QUERY event's schema.
/// Returns `None` for anything else (DML, CREATE, an ALTER TABLE known to leave every row's
/// payload as it was, ...).
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
            Some(TableDdl { kind: "CREATE OR REPLACE TABLE", tables: vec![t], column_change: None })
        }
        "TRUNCATE" => {
            let i = if kw(&toks, 1) == "TABLE" { 2 } else { 1 };
            let (t, _) = name_at(&toks, i, default_schema)?;
            Some(TableDdl { kind: "TRUNCATE", tables: vec![t], column_change: None })
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
        "ALTER" => match alter_head(&toks) {
            Some((at, _)) => i = at,
            None => return Vec::new(),
        },
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
    (!tables.is_empty()).then_some(TableDdl { kind: "DROP TABLE", tables, column_change: None })
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
    (!tables.is_empty()).then_some(TableDdl { kind: "RENAME TABLE", tables, column_change: None })
}

/// `ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS]`: the index of the table name, and whether
/// IGNORE was given (MariaDB docs, "ALTER TABLE"). `None` when not an ALTER TABLE.
fn alter_head(toks: &[String]) -> Option<(usize, bool)> {
    let mut i = 1;
    let mut ignore = false;
    loop {
        match kw(toks, i).as_str() {
            "ONLINE" => i += 1,
            "IGNORE" => {
                ignore = true;
                i += 1;
            }
            _ => break,
        }
    }
    if kw(toks, i) != "TABLE" {
        return None;
    }
    i += 1;
    if kw(toks, i) == "IF" && kw(toks, i + 1) == "EXISTS" {
        i += 2;
    }
    Some((i, ignore))
}

/// `ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS] t [WAIT n | NOWAIT] ...` with a RENAME, a
/// partition operation that removes or swaps rows, or a clause that may change every row's
/// payload (module docs).
fn alter_table(toks: &[String], default_schema: &str) -> Option<TableDdl> {
    let (i, ignore) = alter_head(toks)?;
    let (t, mut next) = name_at(toks, i, default_schema)?;
    match kw(toks, next).as_str() {
        "WAIT" => next += 2,
        "NOWAIT" => next += 1,
        _ => {}
    }
    let rest = toks.get(next..).unwrap_or_default();
    // A partition operation is the statement's only clause, and lists partitions with commas.
    let partition_op = kw(rest, 1) == "PARTITION" && kw(rest, 0) != "DROP";
    let clauses: Vec<&[String]> = if partition_op { vec![rest] } else { split_clauses(rest) };
    let mut column_change = clauses.iter().find(|c| !harmless_clause(c)).map(|c| clause_text(c));
    if ignore && column_change.is_none() && !clauses.is_empty() {
        column_change = Some("IGNORE (deletes the rows a new unique key would refuse, without row events)".to_string());
    }
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
                return Some(TableDdl { kind: "ALTER TABLE ... RENAME", tables, column_change });
            }
        }
    }
    let mut tables = vec![t];
    // MariaDB 10.7: CONVERT TABLE x TO PARTITION p moves x's rows in (x is gone), CONVERT
    // PARTITION p TO TABLE x moves them out (to a new x): both tables' keys are stale.
    if kw(rest, 0) == "CONVERT" && matches!(kw(rest, 1).as_str(), "TABLE" | "PARTITION") {
        if let Some(at) = (1..rest.len()).find(|&x| rest[x].eq_ignore_ascii_case("TABLE")) {
            if let Some((other, _)) = name_at(rest, at + 1, default_schema) {
                tables.push(other);
            }
        }
    }
    column_change.map(|c| TableDdl { kind: "ALTER TABLE", tables, column_change: Some(c) })
}

/// The clauses of an ALTER TABLE after the table name: split at the commas outside
/// parentheses (empty clauses dropped).
fn split_clauses(toks: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (j, t) in toks.iter().enumerate() {
        match t.as_str() {
            "(" => depth += 1,
            ")" => depth = depth.saturating_sub(1),
            "," | ";" if depth == 0 => {
                out.push(&toks[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    out.push(&toks[start..]);
    out.retain(|c| !c.is_empty());
    out
}

/// One ALTER TABLE clause as written (identifiers in backquotes, strings in quotes), cut at 80
/// characters.
fn clause_text(c: &[String]) -> String {
    let words: Vec<String> = c
        .iter()
        .map(|t| {
            if let Some(id) = t.strip_prefix('`') {
                format!("`{id}`")
            } else if let Some(s) = t.strip_prefix('\'') {
                format!("'{s}'")
            } else {
                t.clone()
            }
        })
        .collect();
    let text = words.join(" ");
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// Whether an ALTER TABLE clause is known to leave every row's payload as it was (module
/// docs); anything not recognised is not.
fn harmless_clause(c: &[String]) -> bool {
    let (w0, w1) = (kw(c, 0), kw(c, 1));
    match w0.as_str() {
        "ADD" => match w1.as_str() {
            "INDEX" | "KEY" | "UNIQUE" | "FULLTEXT" | "SPATIAL" | "FOREIGN" | "PARTITION" => true,
            // ADD CONSTRAINT [IF NOT EXISTS] [name] UNIQUE|FOREIGN KEY|PRIMARY KEY|CHECK: a
            // CHECK may be a `json_valid` one, which changes how binval renders the column.
            "CONSTRAINT" => !c.iter().any(|t| t.eq_ignore_ascii_case("CHECK") || t.eq_ignore_ascii_case("PRIMARY")),
            // ADD PRIMARY KEY (NULLs become zero values outside strict mode), ADD [COLUMN]
            // [IF NOT EXISTS] c ..., ADD (c ..., d ...), ADD CHECK, ADD PERIOD, ADD SYSTEM
            // VERSIONING.
            _ => false,
        },
        // DROP CONSTRAINT / DROP CHECK may drop a `json_valid` check; DROP [COLUMN] c,
        // DROP SYSTEM VERSIONING, DROP PERIOD change rows.
        "DROP" => matches!(w1.as_str(), "INDEX" | "KEY" | "PRIMARY" | "FOREIGN"),
        "ALTER" => {
            if matches!(w1.as_str(), "INDEX" | "KEY") {
                return true;
            }
            // ALTER [COLUMN] c SET DEFAULT ... | DROP DEFAULT: later inserts only.
            let j = if w1 == "COLUMN" { 3 } else { 2 };
            matches!((kw(c, j).as_str(), kw(c, j + 1).as_str()), ("SET", "DEFAULT") | ("DROP", "DEFAULT"))
        }
        // RENAME INDEX|KEY; RENAME [TO|AS] t is the table rename, followed separately;
        // RENAME COLUMN changes the payload's field name.
        "RENAME" => w1 != "COLUMN",
        "FORCE" => c.len() == 1,
        "ENABLE" | "DISABLE" => w1 == "KEYS" && c.len() == 2,
        "ORDER" => w1 == "BY",
        "ANALYZE" | "CHECK" | "OPTIMIZE" | "REPAIR" | "REBUILD" | "COALESCE" | "REORGANIZE" => w1 == "PARTITION",
        "REMOVE" => w1 == "PARTITIONING" && c.len() == 2,
        "PARTITION" => w1 == "BY",
        _ => harmless_options(c),
    }
}

/// Table options (`name [=] value`, space separated) that leave every row's values as they
/// are, with ALGORITHM and LOCK; a trailing `PARTITION BY ...` too.
fn harmless_options(c: &[String]) -> bool {
    let mut j = 0;
    while j < c.len() {
        let mut w = kw(c, j);
        if w == "PARTITION" && kw(c, j + 1) == "BY" {
            return true;
        }
        if w == "DEFAULT" {
            j += 1;
            w = kw(c, j);
        }
        if w == "CHARACTER" && kw(c, j + 1) == "SET" {
            j += 1;
            w = "CHARSET".into();
        }
        let known = matches!(
            w.as_str(),
            "ALGORITHM"
                | "LOCK"
                | "COMMENT"
                | "AUTO_INCREMENT"
                | "ROW_FORMAT"
                | "KEY_BLOCK_SIZE"
                | "STATS_PERSISTENT"
                | "STATS_AUTO_RECALC"
                | "STATS_SAMPLE_PAGES"
                | "PACK_KEYS"
                | "CHECKSUM"
                | "TABLE_CHECKSUM"
                | "DELAY_KEY_WRITE"
                | "MAX_ROWS"
                | "MIN_ROWS"
                | "AVG_ROW_LENGTH"
                | "PAGE_CHECKSUM"
                | "TRANSACTIONAL"
                | "CHARSET"
                | "COLLATE"
                | "ENGINE"
        );
        if !known {
            return false;
        }
        j += 1;
        if c.get(j).map(String::as_str) == Some("=") {
            j += 1;
        }
        let Some(value) = c.get(j) else { return false };
        // Engines that keep every row (BLACKHOLE keeps none, CONNECT or FEDERATED others').
        if w == "ENGINE" && !["INNODB", "MYISAM", "ARIA"].contains(&value.to_ascii_uppercase().as_str()) {
            return false;
        }
        j += 1;
    }
    true
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
    TableDdl { kind, tables, column_change: None }
}

/// Split into words, identifiers (`` `name``: a backquote, then the name unquoted), strings
/// (`'text`: a quote, then the text unescaped; `"` strings alike) and `.` `,` `;` `(` `)` `=`
/// tokens; comments are dropped, the text of executable comments kept.
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
            '\'' | '"' => {
                flush(&mut cur, &mut out);
                let mut text = String::new();
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            text.push(e);
                        }
                    } else if d == c {
                        if chars.peek() == Some(&c) {
                            chars.next();
                            text.push(c);
                        } else {
                            break;
                        }
                    } else {
                        text.push(d);
                    }
                }
                out.push(format!("'{text}"));
            }
            '.' | ',' | ';' | '(' | ')' | '=' => {
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
mod tests;
