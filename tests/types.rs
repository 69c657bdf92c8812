//! The type matrix against the real MariaDB (issue #3): for every column type, edge values are
//! inserted, updated and deleted; binval's decoded row images (live replica connection and
//! offline reader) must equal what the server itself returns for that row right after each
//! statement (SELECT, as text / HEX() / CAST), converted by the canonical rules of
//! schemas/README.md. Run three ways: the default server, `--binlog-checksum=NONE`, and
//! `--log-bin-compress=ON`.

mod binlog_rows;

use binlog_rows::{canonical, select_expr, Conv};
use binval_testkit as tk;
use mysql_async::prelude::Queryable;
use serde_json::{json, Map, Value};

/// A column type and the SQL literals of its edge values.
struct TypeCase {
    ty: &'static str,
    conv: Conv,
    values: Vec<String>,
}

fn lits(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn cases() -> Vec<TypeCase> {
    use Conv::*;
    let mut c = vec![
        TypeCase { ty: "TINYINT", conv: Int, values: lits(&["-128", "127", "0", "-1", "NULL"]) },
        TypeCase { ty: "TINYINT UNSIGNED", conv: Int, values: lits(&["0", "255", "128"]) },
        TypeCase { ty: "SMALLINT", conv: Int, values: lits(&["-32768", "32767", "-1"]) },
        TypeCase { ty: "SMALLINT UNSIGNED", conv: Int, values: lits(&["65535", "32768", "0"]) },
        TypeCase { ty: "MEDIUMINT", conv: Int, values: lits(&["-8388608", "8388607", "-1", "0", "NULL"]) },
        TypeCase { ty: "MEDIUMINT UNSIGNED", conv: Int, values: lits(&["16777215", "8388608", "0"]) },
        TypeCase { ty: "INT", conv: Int, values: lits(&["-2147483648", "2147483647", "-1"]) },
        TypeCase { ty: "INT UNSIGNED", conv: Int, values: lits(&["4294967295", "2147483648", "0"]) },
        TypeCase { ty: "BIGINT", conv: Int, values: lits(&["-9223372036854775808", "9223372036854775807", "-1", "0"]) },
        TypeCase { ty: "BIGINT UNSIGNED", conv: Int, values: lits(&["18446744073709551615", "9223372036854775808", "0", "NULL"]) },
        TypeCase { ty: "DECIMAL(1,0)", conv: Text, values: lits(&["-9", "9", "0"]) },
        TypeCase { ty: "DECIMAL(5,2)", conv: Text, values: lits(&["-999.99", "999.99", "0.01", "-0.5", "0", "NULL"]) },
        TypeCase { ty: "DECIMAL(10,10)", conv: Text, values: lits(&["0.9999999999", "-0.0000000001", "0"]) },
        TypeCase { ty: "DECIMAL(20,0) UNSIGNED", conv: Text, values: lits(&["99999999999999999999", "0", "18446744073709551616"]) },
        TypeCase { ty: "DECIMAL(38,9)", conv: Text, values: lits(&["-12345678901234567890123456789.123456789", "0.000000001", "100"]) },
        TypeCase {
            ty: "DECIMAL(65,30)",
            conv: Text,
            values: lits(&[
                "-99999999999999999999999999999999999.999999999999999999999999999999",
                "1.000000000000000000000000000001",
                "-0.1",
            ]),
        },
        TypeCase {
            ty: "FLOAT",
            conv: Float,
            values: lits(&["0", "-1.5", "3.40282e38", "-1.17549e-38", "0.1", "123456.7", "1e-45", "NULL"]),
        },
        TypeCase {
            ty: "DOUBLE",
            conv: Double,
            values: lits(&[
                "0",
                "-1.5",
                "1.7976931348623157e308",
                "2.2250738585072014e-308",
                "0.1",
                "0.30000000000000004",
                "-4.9e-324",
                "1e22",
                "NULL",
            ]),
        },
        TypeCase { ty: "BIT(1)", conv: Num, values: lits(&["b'0'", "b'1'", "NULL"]) },
        TypeCase { ty: "BIT(8)", conv: Num, values: lits(&["b'11111111'", "b'10000000'", "0"]) },
        TypeCase { ty: "BIT(17)", conv: Num, values: lits(&["b'11111111111111111'", "b'10000000000000001'", "1"]) },
        TypeCase { ty: "BIT(64)", conv: Num, values: lits(&["x'FFFFFFFFFFFFFFFF'", "x'8000000000000000'", "x'0000000000000001'", "0"]) },
        TypeCase {
            ty: "DATE",
            conv: Text,
            values: lits(&["'1000-01-01'", "'9999-12-31'", "'0000-00-00'", "'2024-02-29'", "'2024-00-15'", "'2024-05-00'", "NULL"]),
        },
        TypeCase { ty: "YEAR", conv: Num, values: lits(&["0", "1901", "2155", "2024", "NULL"]) },
    ];
    for fsp in 0..=6 {
        c.push(TypeCase {
            ty: leak(format!("DATETIME({fsp})")),
            conv: Text,
            values: lits(&[
                "'1000-01-01 00:00:00'",
                "'9999-12-31 23:59:59.999999'",
                "'0000-00-00 00:00:00'",
                "'2024-02-29 12:34:56.123456'",
                "'2024-00-00 00:00:00.000001'",
                "NULL",
            ]),
        });
        c.push(TypeCase {
            ty: leak(format!("TIMESTAMP({fsp}) NULL")),
            conv: Utc,
            values: lits(&[
                "'1970-01-01 00:00:01'",
                "'2038-01-19 03:14:07.999999'",
                "'0000-00-00 00:00:00'",
                "'2024-02-29 12:34:56.100001'",
                "NULL",
            ]),
        });
        c.push(TypeCase {
            ty: leak(format!("TIME({fsp})")),
            conv: Text,
            values: lits(&[
                "'-838:59:59'",
                "'838:59:59'",
                "'00:00:00'",
                "'-00:00:00.5'",
                "'-00:00:01.000001'",
                "'12:34:56.789012'",
                "'-100:00:00.654321'",
                "NULL",
            ]),
        });
    }
    let texts = |ty: &'static str, extra: &[&str]| {
        let mut v = lits(&["''", "'a'", "'multi\\nline\\ttab \\\\ end'", "NULL", "'trailing  '"]);
        v.extend(extra.iter().map(|s| s.to_string()));
        TypeCase { ty, conv: Str, values: v }
    };
    c.push(texts("VARCHAR(255) CHARACTER SET utf8mb4", &["'héllo 🎉 中文'", "REPEAT('🎉', 255)"]));
    c.push(texts("CHAR(10) CHARACTER SET utf8mb4", &["'🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉'", "'é'"]));
    c.push(texts("CHAR(255) CHARACTER SET utf8mb4", &["REPEAT('é', 255)"]));
    c.push(texts("TINYTEXT CHARACTER SET utf8mb4", &["REPEAT('x', 255)"]));
    c.push(texts("TEXT CHARACTER SET utf8mb4", &["REPEAT('ü', 30000)"]));
    c.push(texts("MEDIUMTEXT CHARACTER SET utf8mb4", &["REPEAT('abc', 100000)"]));
    c.push(texts("VARCHAR(20) CHARACTER SET utf8mb3", &["'héllo 中文'"]));
    c.push(texts(
        "VARCHAR(20) CHARACTER SET latin1",
        &["'café €‚ƒ'", "_latin1 x'81'", "_latin1 x'8D8F909D'", "_latin1 x'FF'", "REPEAT('é', 20)"],
    ));
    c.push(texts("CHAR(5) CHARACTER SET latin1", &["'Œ'"]));
    c.push(texts("TEXT CHARACTER SET latin1", &["'ÿ‰™'"]));
    c.push(texts("VARCHAR(20) CHARACTER SET gbk", &["'中文'", "'汉字—·「」'", "'￥€'", "REPEAT('龘', 20)"]));
    c.push(texts("TEXT CHARACTER SET gbk", &["'简体中文繁體'"]));
    c.push(texts("VARCHAR(20) CHARACTER SET ucs2", &["'é中'", "REPEAT('Ω', 20)"]));
    c.push(texts("CHAR(4) CHARACTER SET ucs2", &["'ab'"]));
    c.push(texts("VARCHAR(20) CHARACTER SET utf16", &["'🎉 é'"]));
    c.push(texts("VARCHAR(20) CHARACTER SET utf32", &["'🎉 é'"]));
    c.push(texts("VARCHAR(20) CHARACTER SET ascii", &["'plain'"]));
    c.push(TypeCase { ty: "VARCHAR(10) CHARACTER SET binary", conv: Hex, values: lits(&["''", "x'00'", "x'00ff00'", "'abc'", "NULL"]) });
    c.push(TypeCase { ty: "BINARY(4)", conv: Hex, values: lits(&["''", "x'00'", "x'61620000'", "x'FFFFFFFF'", "'a'", "NULL"]) });
    c.push(TypeCase { ty: "BINARY(1)", conv: Hex, values: lits(&["x'00'", "x'01'"]) });
    c.push(TypeCase { ty: "BINARY(255)", conv: Hex, values: lits(&["x'00'", "REPEAT(x'ff', 255)"]) });
    c.push(TypeCase { ty: "VARBINARY(8)", conv: Hex, values: lits(&["x''", "x'00ff00'", "x'0000'", "x'0102030405060708'"]) });
    for b in ["TINYBLOB", "BLOB", "MEDIUMBLOB", "LONGBLOB"] {
        c.push(TypeCase { ty: b, conv: Hex, values: lits(&["x''", "x'00'", "REPEAT(x'00ff', 100)", "NULL"]) });
    }
    c.push(TypeCase { ty: "ENUM('a','b','c','é')", conv: Text, values: lits(&["'a'", "'c'", "'é'", "'not a label'", "NULL"]) });
    c.push(TypeCase { ty: "SET('x','y','z')", conv: Set, values: lits(&["''", "'x'", "'x,z'", "'x,y,z'", "NULL"]) });
    c.push(TypeCase {
        ty: leak(format!("SET({})", (0..64).map(|i| format!("'s{i}'")).collect::<Vec<_>>().join(","))),
        conv: Set,
        values: lits(&["'s0,s63'", "'s31,s32'", "''"]),
    });
    c.push(TypeCase {
        ty: "JSON",
        conv: Text,
        values: lits(&["'{\"a\": 1, \"b\": [true, null, \"é\"]}'", "'[]'", "'\"str\"'", "'null'", "'1.50'", "NULL"]),
    });
    c.push(TypeCase {
        ty: "GEOMETRY",
        conv: Geo,
        values: lits(&[
            "ST_GeomFromText('POINT(1 2)')",
            "ST_GeomFromText('POINT(-1.5 2e10)', 4326)",
            "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)')",
            "ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))', 3857)",
            "NULL",
        ]),
    });
    c.push(TypeCase { ty: "POINT", conv: Geo, values: lits(&["ST_GeomFromText('POINT(0 0)')", "POINT(3, 4)"]) });
    c.push(TypeCase {
        ty: "UUID",
        conv: BinCast(16),
        values: lits(&[
            "'00000000-0000-0000-0000-000000000000'",
            "'123e4567-e89b-12d3-a456-426655440000'",
            "'ffffffff-ffff-4fff-bfff-ffffffffff00'",
            "'01234567-89ab-7def-8123-456789abcd00'",
            "NULL",
        ]),
    });
    c.push(TypeCase {
        ty: "INET6",
        conv: BinCast(16),
        values: lits(&["'::'", "'::1'", "'2001:db8::'", "'ffff::ff00'", "'::ffff:1.2.3.0'", "NULL"]),
    });
    c.push(TypeCase { ty: "INET4", conv: BinCast(4), values: lits(&["'0.0.0.0'", "'255.255.255.255'", "'10.0.0.0'", "NULL"]) });
    c
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// One table per type: `t{k} (id INT PRIMARY KEY, v TYPE)`, plus one table of generated and
/// invisible columns.
struct Matrix {
    db: String,
    cases: Vec<TypeCase>,
}

impl Matrix {
    fn table(&self, k: usize) -> String {
        format!("{}.t{k}", self.db)
    }

    fn tables(&self) -> Vec<String> {
        let mut t: Vec<String> = (0..self.cases.len()).map(|k| self.table(k)).collect();
        t.push(format!("{}.gen", self.db));
        t
    }

    fn create(&self, db: &tk::MariaDb) {
        let mut sql = format!("USE `{}`;\n", self.db);
        for (k, c) in self.cases.iter().enumerate() {
            sql += &format!("CREATE TABLE t{k} (id INT PRIMARY KEY, v {});\n", c.ty);
        }
        // Also: a GEOMETRY column before text columns (MariaDB gives GEOMETRY an entry in the
        // charset metadata; the latin1 and gbk columns must keep their own charsets).
        sql += "CREATE TABLE gen (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL, s VARCHAR(20) AS (CONCAT('x', a)) STORED, h INT INVISIBLE DEFAULT 7, d DECIMAL(6,3) INVISIBLE, pt POINT, l VARCHAR(10) CHARACTER SET latin1, k TEXT CHARACTER SET gbk);\n";
        db.sql(&sql).unwrap();
    }

    /// Insert every value, update each row to the next value of its type, delete all; return
    /// the expected row changes (from the server's own answers after each step).
    async fn run(&self, db: &tk::MariaDb) -> Vec<Value> {
        let url = format!("{}/{}?prefer_socket=false", db.root_url(), self.db);
        let mut c = mysql_async::Conn::from_url(url).await.unwrap();
        c.query_drop("SET NAMES utf8mb4, time_zone = '+00:00', sql_mode = ''").await.unwrap();
        let mut inserts = Vec::new();
        let mut updates = Vec::new();
        let mut deletes = Vec::new();
        for (k, tc) in self.cases.iter().enumerate() {
            let t = self.table(k);
            let n = tc.values.len();
            for (i, v) in tc.values.iter().enumerate() {
                c.query_drop(format!("INSERT INTO t{k} VALUES ({}, {v})", i + 1))
                    .await
                    .unwrap_or_else(|e| panic!("{}: insert {v}: {e}", tc.ty));
            }
            let snap1 = self.snapshot(&mut c, k).await;
            for i in 0..n {
                let next = &tc.values[(i + 1) % n];
                c.query_drop(format!("UPDATE t{k} SET v = {next} WHERE id = {}", i + 1))
                    .await
                    .unwrap_or_else(|e| panic!("{}: update {next}: {e}", tc.ty));
            }
            let snap2 = self.snapshot(&mut c, k).await;
            c.query_drop(format!("DELETE FROM t{k}")).await.unwrap();
            for i in 0..n {
                inserts.push(json!({"kind": "insert", "table": t, "after": snap1[i]}));
                // An UPDATE that changes nothing writes no row event.
                if snap1[i] != snap2[i] {
                    updates.push(json!({"kind": "update", "table": t, "before": snap1[i], "after": snap2[i]}));
                }
                deletes.push(json!({"kind": "delete", "table": t, "before": snap2[i]}));
            }
        }
        // Generated (virtual and stored) and invisible columns.
        let t = format!("{}.gen", self.db);
        c.query_drop("INSERT INTO gen (id, a, h, d, pt, l, k) VALUES (1, 5, 8, -1.5, POINT(1, 2), 'é€', '中文'), (2, NULL, NULL, NULL, NULL, NULL, NULL)").await.unwrap();
        let g1 = self.gen_snapshot(&mut c).await;
        c.query_drop("UPDATE gen SET a = a + 1, h = 9, l = CONCAT(l, 'ÿ')").await.unwrap();
        let g2 = self.gen_snapshot(&mut c).await;
        c.query_drop("DELETE FROM gen").await.unwrap();
        c.disconnect().await.ok();
        let mut all = Vec::new();
        // Rows come per type: inserts, updates, deletes of t0, then of t1, ...
        let mut ins = inserts.into_iter().peekable();
        let mut upd = updates.into_iter().peekable();
        let mut del = deletes.into_iter().peekable();
        for k in 0..self.cases.len() {
            let t = Value::String(self.table(k));
            while ins.peek().is_some_and(|r| r["table"] == t) {
                all.push(ins.next().unwrap());
            }
            while upd.peek().is_some_and(|r| r["table"] == t) {
                all.push(upd.next().unwrap());
            }
            while del.peek().is_some_and(|r| r["table"] == t) {
                all.push(del.next().unwrap());
            }
        }
        for g in &g1 {
            all.push(json!({"kind": "insert", "table": t, "after": g}));
        }
        for i in 0..2 {
            if g1[i] != g2[i] {
                all.push(json!({"kind": "update", "table": t, "before": g1[i], "after": g2[i]}));
            }
        }
        for g in g2 {
            all.push(json!({"kind": "delete", "table": t, "before": g}));
        }
        all
    }

    async fn snapshot(&self, c: &mut mysql_async::Conn, k: usize) -> Vec<Value> {
        let conv = self.cases[k].conv;
        let rows: Vec<(i64, Option<String>)> =
            c.query(format!("SELECT id, {} FROM t{k} ORDER BY id", select_expr(conv, "v"))).await.unwrap();
        rows.into_iter().map(|(id, v)| json!({"id": id, "v": canonical(conv, v)})).collect()
    }

    async fn gen_snapshot(&self, c: &mut mysql_async::Conn) -> Vec<Value> {
        let rows: Vec<mysql_async::Row> = c
            .query(format!(
                "SELECT id, CAST(a AS CHAR), CAST(v AS CHAR), s, CAST(h AS CHAR), CAST(d AS CHAR), {}, l, k FROM gen ORDER BY id",
                select_expr(Conv::Geo, "pt")
            ))
            .await
            .unwrap();
        rows.into_iter()
            .map(|r| {
                let g = |i: usize| r.get::<Option<String>, _>(i).unwrap();
                let (id, a, v, s, h, d) = (r.get::<i64, _>(0).unwrap(), g(1), g(2), g(3), g(4), g(5));
                let mut m = Map::new();
                m.insert("id".into(), json!(id));
                m.insert("a".into(), canonical(Conv::Int, a));
                m.insert("v".into(), canonical(Conv::Int, v));
                m.insert("s".into(), canonical(Conv::Str, s));
                m.insert("h".into(), canonical(Conv::Int, h));
                m.insert("d".into(), canonical(Conv::Text, d));
                m.insert("pt".into(), canonical(Conv::Geo, g(6)));
                m.insert("l".into(), canonical(Conv::Str, g(7)));
                m.insert("k".into(), canonical(Conv::Str, g(8)));
                Value::Object(m)
            })
            .collect()
    }
}

async fn type_matrix(db: &tk::MariaDb) {
    let m = Matrix { db: db.create_database("types").unwrap(), cases: cases() };
    m.create(db);
    let from = binlog_rows::binlog_now(db);
    let mut live = binlog_rows::Live::at(db, &m.tables(), &from);
    let want = m.run(db).await;
    assert!(want.len() > 600, "{} row changes expected", want.len());
    if std::env::var_os("BINVAL_SHOW_TYPES").is_some() {
        for w in &want {
            eprintln!("{}", w.to_string().chars().take(300).collect::<String>());
        }
    }
    let got = live.rows(want.len(), 60).await;
    live.stop().await;
    compare(&got, &want, &m, "live");
    let offline = binlog_rows::offline_rows(db, &from, &m.db).unwrap();
    compare(&offline, &want, &m, "offline");
}

/// Compare row by row, naming the column type of the first mismatches.
fn compare(got: &[Value], want: &[Value], m: &Matrix, how: &str) {
    let ty = |r: &Value| -> String {
        let t = r["table"].as_str().unwrap_or_default();
        t.rsplit_once(".t").and_then(|(_, k)| k.parse::<usize>().ok()).map(|k| m.cases[k].ty.to_string()).unwrap_or_else(|| t.to_string())
    };
    let mut problems = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if let Some(d) = binlog_rows::first_difference(g, w) {
            problems.push(format!("#{i} {} ({}): {d}", ty(w), w["kind"]));
        }
    }
    if got.len() != want.len() {
        problems.push(format!("got {} row changes, want {}", got.len(), want.len()));
    }
    assert!(
        problems.is_empty(),
        "{how}: {} mismatches:\n{}",
        problems.len(),
        problems.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_matrix_default_server() {
    type_matrix(tk::mariadb()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_matrix_without_checksums() {
    let db = tk::MariaDb::start_with(&["--binlog-checksum=NONE"]).unwrap();
    type_matrix(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_matrix_with_log_bin_compress() {
    let db = tk::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10"]).unwrap();
    type_matrix(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gbk_matches_the_server_for_every_two_byte_code() {
    // binval decodes gbk with encoding_rs's table; the server's own gbk -> utf8mb4 conversion
    // is the reference, for every two-byte code (lead 0x81-0xFE, trail 0x40-0x7E, 0x80-0xFE).
    // Codes the server cannot convert (it answers '?') must be an error in binval, not a guess.
    let db = tk::mariadb();
    let name = db.create_database("gbk").unwrap();
    let url = format!("{}/{}", db.root_url(), name);
    let mut c = mysql_async::Conn::from_url(url).await.unwrap();
    c.query_drop("SET NAMES utf8mb4").await.unwrap();
    let mut codes = Vec::new();
    for lead in 0x81u16..=0xFE {
        for trail in (0x40u16..=0x7E).chain(0x80..=0xFE) {
            codes.push((lead << 8) | trail);
        }
    }
    let mut mismatches = Vec::new();
    for chunk in codes.chunks(2000) {
        let sel = chunk.iter().map(|c| format!("CONVERT(CONVERT(x'{c:04X}' USING gbk) USING utf8mb4)")).collect::<Vec<_>>().join(", ");
        let row: mysql_async::Row = c.query_first(format!("SELECT {sel}")).await.unwrap().unwrap();
        for (i, code) in chunk.iter().enumerate() {
            let server: Option<String> = row.get(i).unwrap();
            let server = server.unwrap_or_default();
            let ours = binval::binlog::decode::charset::decode(28, code.to_be_bytes().to_vec());
            let ok = match &ours {
                Ok(s) => *s == server,
                Err(_) => server == "?",
            };
            if !ok {
                mismatches.push(format!("{code:04X}: server {server:?} binval {ours:?}"));
            }
        }
    }
    c.disconnect().await.ok();
    assert!(
        mismatches.is_empty(),
        "{} gbk codes differ:\n{}",
        mismatches.len(),
        mismatches.iter().take(50).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Issue #11: rows read by a table scan (`binval bootstrap`, `verify`, `inspect`: a SELECT
/// through the binary protocol) come out exactly as the binlog decoder gives them, for every
/// type of the matrix: the same canonical values, so a bootstrapped payload and one written
/// from a row event are byte for byte the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_scans_read_the_same_canonical_values_as_the_binlog() {
    use binval::scan::table::{ChunkQuery, TableLayout};
    let db = tk::mariadb();
    let m = Matrix { db: db.create_database("scantypes").unwrap(), cases: cases() };
    m.create(db);
    let url = format!("{}/{}?prefer_socket=false", db.root_url(), m.db);
    let mut c = mysql_async::Conn::from_url(url.clone()).await.unwrap();
    c.query_drop("SET NAMES utf8mb4, time_zone = '+00:00', sql_mode = ''").await.unwrap();
    // The scan's own session, as binval sets it up (scan::snapshot).
    let mut scan = mysql_async::Conn::from_url(url).await.unwrap();
    scan.query_drop("SET NAMES utf8mb4, time_zone = '+00:00'").await.unwrap();
    let mut problems = Vec::new();
    for (k, tc) in m.cases.iter().enumerate() {
        for (i, v) in tc.values.iter().enumerate() {
            c.query_drop(format!("INSERT INTO t{k} VALUES ({}, {v})", i + 1))
                .await
                .unwrap_or_else(|e| panic!("{}: insert {v}: {e}", tc.ty));
        }
        let want = m.snapshot(&mut c, k).await;
        let layout = TableLayout::read(&mut scan, &m.table(k)).await.unwrap();
        let got = layout
            .chunk(&mut scan, &ChunkQuery { limit: 1000, ..ChunkQuery::default() })
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", tc.ty));
        assert_eq!(got.len(), want.len(), "{}", tc.ty);
        for (g, w) in got.iter().zip(&want) {
            if let Some(d) = binlog_rows::first_difference(&Value::Object(g.row.clone()), w) {
                problems.push(format!("{}: {d}", tc.ty));
            }
        }
    }
    c.query_drop("INSERT INTO gen (id, a, h, d, pt, l, k) VALUES (1, 5, 8, -1.5, POINT(1, 2), 'é€', '中文'), (2, NULL, NULL, NULL, NULL, NULL, NULL)").await.unwrap();
    let want = m.gen_snapshot(&mut c).await;
    let layout = TableLayout::read(&mut scan, &format!("{}.gen", m.db)).await.unwrap();
    let got = layout.chunk(&mut scan, &ChunkQuery { limit: 10, ..ChunkQuery::default() }).await.unwrap();
    for (g, w) in got.iter().zip(&want) {
        if let Some(d) = binlog_rows::first_difference(&Value::Object(g.row.clone()), w) {
            problems.push(format!("generated and invisible columns: {d}"));
        }
    }
    assert!(problems.is_empty(), "{} values differ from the canonical form:\n{}", problems.len(), problems.join("\n"));
}
