//! ../shared/cases: public failure reports of other binlog readers as SQL reproductions with
//! expected values. Each value case runs on the real MariaDB, and binval's decoder (the offline
//! reader over the server's own binlog file) must produce the expected row images. Cases that
//! need MySQL-only features are covered by tests/offline.rs over ../shared/binlogs instead.

mod binlog_rows;

use std::path::PathBuf;

use base64::Engine as _;
use binval_testkit as tk;
use serde_json::Value;

/// The first ```` ```lang ```` block of case file `name`.
fn block(name: &str, lang: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/cases").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find(&format!("```{lang}")).unwrap_or_else(|| panic!("{name}: no {lang} block"));
    let body = &text[start + 3 + lang.len()..];
    body[..body.find("```").unwrap()].to_string()
}

fn case(name: &str) -> (String, Vec<Value>) {
    // A stream of JSON objects (some span two lines).
    // Labelled blocks (`E1 {...}`, `insert t {...}`) are parsed by their own tests.
    let json = block(name, "json");
    let expected = if json.trim_start().starts_with('{') {
        serde_json::Deserializer::from_str(&json).into_iter::<Value>().map(|v| v.unwrap()).collect()
    } else {
        Vec::new()
    };
    (block(name, "sql"), expected)
}

/// The expected row changes of a case whose json block is labelled lines: `[kind] table {..}`
/// (kind `insert` when left out) or `update table before {..} after {..}`, as
/// [`binlog_rows::row_json`] values with the table in database `db`. Lines without a JSON
/// object (`rename a->b`) are left out; `-- comments` after the object are ignored.
fn labelled_changes(name: &str, db: &str) -> Vec<Value> {
    let object = |s: &str| -> Value {
        let s = &s[s.find('{').unwrap()..];
        serde_json::Deserializer::from_str(s).into_iter::<Value>().next().unwrap().unwrap()
    };
    let mut out = Vec::new();
    for line in block(name, "json").lines() {
        let Some(i) = line.find('{') else { continue };
        let words: Vec<&str> = line[..i].split_whitespace().collect();
        let (kind, table) = match words[..] {
            [t] => ("insert", t),
            [k, t, ..] => (k, t),
            _ => panic!("{name}: unlabelled line {line}"),
        };
        let mut v = serde_json::json!({"kind": kind, "table": format!("{db}.{table}")});
        match kind {
            "insert" => v["after"] = object(line),
            "delete" => v["before"] = object(line),
            "update" => {
                let (b, a) = line.split_once(" after ").unwrap();
                v["before"] = object(b);
                v["after"] = object(a);
            }
            _ => panic!("{name}: unknown kind in {line}"),
        }
        out.push(v);
    }
    out
}

/// The server's own values of `cols` for every row of `table` (`db.t`, ORDER BY id), read
/// with SELECT and converted by binval's canonical rules ([`binlog_rows::canonical`]): what a
/// case's expected values are checked against (where a case file and the server disagree,
/// the server wins).
fn server_rows(db: &tk::MariaDb, table: &str, cols: &[(&str, binlog_rows::Conv)]) -> Vec<Value> {
    let exprs: Vec<String> = cols.iter().map(|(c, conv)| binlog_rows::select_expr(*conv, &format!("`{c}`"))).collect();
    let out = db.sql(&format!("SET time_zone = '+00:00'; SELECT {} FROM {table} ORDER BY id", exprs.join(", "))).unwrap();
    out.lines()
        .map(|l| {
            let row = cols
                .iter()
                .zip(l.split('\t'))
                .map(|((c, conv), v)| (c.to_string(), binlog_rows::canonical(*conv, (v != "NULL").then(|| v.to_string()))))
                .collect();
            Value::Object(row)
        })
        .collect()
}

/// Run `sql` in a fresh database and return the after images of its inserted rows, in order.
fn inserted_rows(db: &tk::MariaDb, sql: &str) -> Result<Vec<Value>, binval::binlog::offline::OfflineError> {
    let name = db.create_database("case").unwrap();
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut it = status.split('\t');
    let (file, pos): (String, u64) = (it.next().unwrap().to_string(), it.next().unwrap().trim().parse().unwrap());
    db.sql(&format!("USE `{name}`;\nSET time_zone = '+00:00';\n{sql}")).unwrap();
    let mut rows = Vec::new();
    binval::binlog::offline::read_file(&db.datadir.join(&file), Some(pos), None, |l| {
        if l["kind"] == "insert" && l["table"].as_str().is_some_and(|t| t.starts_with(&format!("{name}."))) {
            rows.push(l["after"].clone());
        }
    })?;
    Ok(rows)
}

fn check(name: &str, normalize: impl Fn(&str, &Value) -> Value) {
    check_on(tk::mariadb(), name, |s| s.to_string(), normalize)
}

fn check_on(db: &tk::MariaDb, name: &str, edit_sql: impl Fn(&str) -> String, normalize: impl Fn(&str, &Value) -> Value) {
    let (sql, expected) = case(name);
    let got = inserted_rows(db, &edit_sql(&sql)).unwrap();
    assert_eq!(got.len(), expected.len(), "{name}: rows inserted vs expected\n{got:#?}");
    for (g, e) in got.iter().zip(&expected) {
        let e: serde_json::Map<String, Value> = e.as_object().unwrap().iter().map(|(k, v)| (k.clone(), normalize(k, v))).collect();
        assert_eq!(g, &Value::Object(e), "{name}");
    }
}

fn same(_: &str, v: &Value) -> Value {
    v.clone()
}

#[test]
fn case_01_decimal_negative_and_edge_values() {
    check("01-decimal-negative-and-edge-values.md", same);
}

#[test]
fn case_02_time2_negative_fractional() {
    check("02-time2-negative-fractional.md", same);
}

#[test]
fn case_04_year_zero() {
    check("04-year-zero.md", same);
}

#[test]
fn case_08_unsigned_integers() {
    check("08-unsigned-integers.md", same);
}

#[test]
fn case_11_bit_columns() {
    check("11-bit-columns.md", same);
}

#[test]
fn case_12_binary_trailing_zero_bytes() {
    // The case writes binary values as hex; binval's canonical form for binary is base64.
    check("12-binary-trailing-zero-bytes.md", |col, v| match (col, v) {
        ("u" | "v", Value::String(hex)) => hex_to_base64(hex),
        _ => v.clone(),
    });
}

#[test]
fn case_06_timestamp_time_zone() {
    check("06-timestamp-time-zone.md", same);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_07_mariadb_legacy_hires_temporal() {
    // SET GLOBAL mysql56_temporal_format: on a server of its own, not the shared one. The case's
    // trailing SHOW diagnostics (show_old_temporals is not in 10.11) are left out.
    // MariaDB logs legacy-format columns with the old DATETIME/TIME/TIMESTAMP type codes and no
    // metadata: the fraction digits (and so the size of each value) are not in the binlog, and
    // MariaDB's own mariadb-binlog cannot decode these rows either. The case's acceptable
    // alternative: binval refuses the table at its TABLE_MAP with a clear error naming the table,
    // the columns, the position and the fix, live and offline, and never emits a value.
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let (sql, _) = case("07-mariadb-legacy-hires-temporal.md");
    let sql: String =
        sql.lines().filter(|l| !l.contains("show_old_temporals") && !l.starts_with("SHOW CREATE")).collect::<Vec<_>>().join("\n");
    let name = db.create_database("case07").unwrap();
    let from = binlog_rows::binlog_now(&db);
    let live = binlog_rows::Live::at(&db, &[format!("{name}.mh")], &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let e = live.error(30).await.to_string();
    assert!(
        e.contains(&format!("{name}.mh")) && e.contains("dt6, dt3, t3, ts6") && e.contains("legacy") && e.contains("mysql-bin.000001:"),
        "{e}"
    );
    let e = binlog_rows::offline_rows(&db, &from, &name).unwrap_err().to_string();
    assert!(e.contains(&format!("{name}.mh")) && e.contains("legacy") && e.contains("at position"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_18_ddl_add_column_midstream() {
    // Column names follow each ALTER exactly, since every TABLE_MAP carries them (and a
    // TABLE_MAP that changed is never served by the schema prepared for the previous one): on
    // the live path and in the offline reader.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/cases/18-ddl-add-column-midstream.md");
    let text = std::fs::read_to_string(path).unwrap();
    let (sql, _) = case("18-ddl-add-column-midstream.md");
    let expected_block = {
        let s = text.find("```json").unwrap() + 7;
        text[s..s + text[s..].find("```").unwrap()].to_string()
    };
    let objects: Vec<Value> = expected_block.lines().filter_map(|l| l.find('{').map(|i| serde_json::from_str(&l[i..]).unwrap())).collect();
    let db = tk::mariadb();
    let name = db.create_database("case18").unwrap();
    let from = binlog_rows::binlog_now(db);
    let mut live = binlog_rows::Live::at(db, &[format!("{name}.pe")], &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let offline = binlog_rows::offline_rows(db, &from, &name).unwrap();
    let images = |rows: &[Value]| -> Vec<Value> {
        rows.iter().flat_map(|r| [r.get("before").cloned(), r.get("after").cloned()]).flatten().collect()
    };
    assert_eq!(images(&offline), objects, "offline: E1..E5 row images with the column names of their time");
    let got = live.rows(offline.len(), 30).await;
    live.stop().await;
    assert_eq!(images(&got), objects, "live: E1..E5 row images with the column names of their time");
}

/// The five row changes of case 23 (`mz`), as [`binlog_rows::row_json`] values.
fn case_23_expected(table: &str) -> Vec<Value> {
    let (x, y, z) = ("x".repeat(400), "y".repeat(450), "z".repeat(400));
    vec![
        serde_json::json!({"kind": "insert", "table": table, "after": {"id": 1, "v": x}}),
        serde_json::json!({"kind": "insert", "table": table, "after": {"id": 2, "v": "short"}}),
        serde_json::json!({"kind": "update", "table": table, "before": {"id": 1, "v": x}, "after": {"id": 1, "v": y}}),
        serde_json::json!({"kind": "delete", "table": table, "before": {"id": 2, "v": "short"}}),
        serde_json::json!({"kind": "insert", "table": table, "after": {"id": 3, "v": z}}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_23_mariadb_compressed_events() {
    // MariaDB with log_bin_compress=ON: QUERY_COMPRESSED and compressed row events, decoded on
    // the live replica connection (from a file:pos and from a MariaDB GTID position) and by the
    // offline reader, to the same values as uncompressed events.
    let db =
        tk::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10", "--binlog-annotate-row-events=ON"]).unwrap();
    let (sql, _) = case("23-mariadb-specific-and-compressed-events.md");
    let name = db.create_database("case23").unwrap();
    let table = format!("{name}.mz");
    let from = binlog_rows::binlog_now(&db);
    let gtid_before = db.sql("SELECT @@gtid_binlog_pos").unwrap().trim().to_string();
    let mut live = binlog_rows::Live::at(&db, std::slice::from_ref(&table), &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let want = case_23_expected(&table);
    assert_eq!(live.rows(5, 30).await, want, "live, from {}:{}", from.0, from.1);
    live.stop().await;

    // The binlog really holds compressed events (else this test proves nothing).
    let mut names = std::collections::BTreeSet::new();
    let mut files: Vec<String> = db.sql("SHOW BINARY LOGS").unwrap().lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    files.retain(|f| *f >= from.0);
    for f in &files {
        binval::binlog::offline::read_file(&db.datadir.join(f), None, None, |l| {
            names.insert(l["event"].as_str().unwrap_or_default().to_string());
        })
        .unwrap();
    }
    for n in [
        "MARIADB_QUERY_COMPRESSED",
        "MARIADB_WRITE_ROWS_COMPRESSED_V1",
        "MARIADB_UPDATE_ROWS_COMPRESSED_V1",
        "MARIADB_DELETE_ROWS_COMPRESSED_V1",
        "MARIADB_ANNOTATE_ROWS",
    ] {
        assert!(names.contains(n), "{n} not in the binlog: {names:?}");
    }
    assert_eq!(binlog_rows::offline_rows(&db, &from, &name).unwrap(), want, "offline");

    // Restart from a MariaDB GTID position taken before the first INSERT.
    let mut live =
        binlog_rows::Live::start(&db, std::slice::from_ref(&table), binval::binlog::resume::Resume::Gtid(gtid_before.parse().unwrap()));
    assert_eq!(live.rows(5, 30).await, want, "live, from gtid {gtid_before}");
    live.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_events_large_values_and_ddl() {
    // Values whose compressed record needs a 3-byte (big-endian) length, every text and blob
    // size class, and a DDL on a mapped table that arrives as a QUERY_COMPRESSED event.
    // (MariaDB's JSON is LONGTEXT: its value is the JSON text, see schemas/README.md.)
    let db = tk::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10"]).unwrap();
    let name = db.create_database("zbig").unwrap();
    let table = format!("{name}.big");
    db.sql(&format!("CREATE TABLE `{name}`.big (id INT PRIMARY KEY, t TEXT, m MEDIUMTEXT, b LONGBLOB, j JSON)")).unwrap();
    let from = binlog_rows::binlog_now(&db);
    let mut live = binlog_rows::Live::at(&db, std::slice::from_ref(&table), &from);
    db.sql(&format!(
        "USE `{name}`;\n\
         INSERT INTO big VALUES (1, REPEAT('é', 20000), REPEAT('abcdefghij', 100000), REPEAT(x'00ff', 300000), JSON_OBJECT('k', REPEAT('q', 70000)));\n\
         INSERT INTO big VALUES (2, '', '', x'', '[]'), (3, NULL, NULL, NULL, NULL);\n\
         UPDATE big SET m = CONCAT(m, '!') WHERE id = 1;"
    ))
    .unwrap();
    let rows = live.rows(4, 60).await;
    assert_eq!(rows.len(), 4, "{}", serde_json::to_string(&rows).unwrap().chars().take(3000).collect::<String>());
    let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
    let one = serde_json::json!({"id": 1, "t": "é".repeat(20000), "m": "abcdefghij".repeat(100000), "b": b64([0u8, 0xff].repeat(300000)), "j": format!("{{\"k\": \"{}\"}}", "q".repeat(70000))});
    binlog_rows::assert_same(&rows[0]["after"], &one, "insert 1");
    binlog_rows::assert_same(&rows[1]["after"], &serde_json::json!({"id": 2, "t": "", "m": "", "b": "", "j": "[]"}), "insert 2");
    binlog_rows::assert_same(&rows[2]["after"], &serde_json::json!({"id": 3, "t": null, "m": null, "b": null, "j": null}), "insert 3");
    binlog_rows::assert_same(&rows[3]["before"], &one, "update before");
    binlog_rows::assert_same(&rows[3]["after"]["m"], &serde_json::json!(format!("{}!", "abcdefghij".repeat(100000))), "update after");
    binlog_rows::assert_same(
        &Value::Array(binlog_rows::offline_rows(&db, &from, &name).unwrap()),
        &Value::Array(rows),
        "offline reader agrees",
    );
    // A TRUNCATE of the mapped table, written as QUERY_COMPRESSED, reaches the DDL check: the
    // table is invalidated, in order, before the row that follows it.
    db.sql(&format!("TRUNCATE TABLE `{name}`.big; INSERT INTO `{name}`.big (id) VALUES (9)")).unwrap();
    live.rows(5, 30).await;
    let kinds: Vec<Value> = live.changes().iter().skip(4).map(|c| c["kind"].clone()).collect();
    assert_eq!(kinds, vec![serde_json::json!("invalidate"), serde_json::json!("insert")]);
    assert_eq!(live.changes()[4]["tables"], serde_json::json!([table]));
    live.stop().await;
}

/// Run `sql` (in database `name`, time zone UTC) on `db` and return the row changes of the
/// database's tables, read both live (binval's source stage) and offline; they must agree.
async fn changes(db: &tk::MariaDb, name: &str, tables: &[&str], sql: &str, want: usize) -> Vec<Value> {
    let from = binlog_rows::binlog_now(db);
    let tables: Vec<String> = tables.iter().map(|t| format!("{name}.{t}")).collect();
    let mut live = binlog_rows::Live::at(db, &tables, &from);
    db.sql(&format!("USE `{name}`;\nSET time_zone = '+00:00';\n{sql}")).unwrap();
    let got = live.rows(want, 30).await;
    live.stop().await;
    let offline = binlog_rows::offline_rows(db, &from, name).unwrap();
    binlog_rows::assert_same(&Value::Array(offline), &Value::Array(got.clone()), "offline reader vs live");
    got
}

/// `{"kind", "before"?, "after"?}` of each change (the table left out).
fn images(rows: &[Value]) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("table");
            r
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_09_minimal_and_noblob_row_images() {
    // MariaDB honours binlog_row_image per session: MINIMAL and NOBLOB images carry only some
    // columns; an absent column stays absent (never null), a real NULL stays null. The live
    // pipeline requires FULL globally (preflight); a session may still write partial images,
    // and the decoder keeps them exact.
    let db = tk::mariadb();
    let name = db.create_database("case09").unwrap();
    let (sql, _) = case("09-minimal-noblob-row-image.md");
    // SET GLOBAL binlog_row_metadata = 'FULL' is already the server's setting.
    let sql: String = sql.lines().filter(|l| !l.starts_with("SET GLOBAL")).collect::<Vec<_>>().join("\n");
    let got = changes(db, &name, &["w", "m"], &sql, 7).await;
    let full =
        serde_json::json!({"id": 1, "c1": 1, "c2": 2, "c3": 3, "c4": "a", "c5": "b", "c6": 6, "c7": 7, "c8": 8, "c9": 9, "big": "blob-1"});
    let want = serde_json::json!([
        {"kind": "insert", "after": full},
        {"kind": "update", "before": {"id": 1}, "after": {"c9": null}},
        {"kind": "update", "before": {"id": 1}, "after": {"c1": 44}},
        {"kind": "insert", "after": {"id": 2, "c4": "x"}},
        {"kind": "delete", "before": {"id": 2}},
        {"kind": "update",
         "before": {"id": 1, "c1": 44, "c2": 2, "c3": 3, "c4": "a", "c5": "b", "c6": 6, "c7": 7, "c8": 8, "c9": null},
         "after": {"id": 1, "c1": 44, "c2": 22, "c3": 3, "c4": "a", "c5": "b", "c6": 6, "c7": 7, "c8": 8, "c9": null}},
        {"kind": "insert", "after": {"col_1": 1, "col_3": "a", "col_5": 3230202323u64}},
    ]);
    binlog_rows::assert_same(&Value::Array(images(&got)), &want, "A..F");
}

fn hex_to_base64(hex: &str) -> Value {
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_17_geometry_srid_wkb() {
    // MariaDB has no `SRID n` column attribute: the case's p4326 column is left out, and a second
    // row puts an SRID 4326 point in the GEOMETRY column instead. Canonical form: {"srid", "wkb"}
    // with the WKB in base64; the raw bytes are stored x then y as given (no axis swap on
    // MariaDB), which the server's own ST_AsWKB confirms.
    let db = tk::mariadb();
    let name = db.create_database("case17").unwrap();
    let (sql, _) = case("17-geometry-srid-wkb.md");
    let sql: String = sql
        .lines()
        .filter(|l| !l.contains("p4326 POINT SRID") && !l.contains("ST_GeomFromText('POINT(45 10)', 4326),"))
        .collect::<Vec<_>>()
        .join("\n");
    let sql = format!("{sql}\nINSERT INTO geo VALUES (2, NULL, NULL, ST_GeomFromText('POINT(45 10)', 4326), 8);");
    let got = changes(db, &name, &["geo"], &sql, 2).await;
    let server = db.sql(&format!("SELECT ST_SRID(g), HEX(ST_AsWKB(g)) FROM `{name}`.geo ORDER BY id")).unwrap();
    let g: Vec<(u32, String)> = server
        .lines()
        .map(|l| {
            let (a, b) = l.split_once('\t').unwrap();
            (a.parse().unwrap(), b.to_string())
        })
        .collect();
    let want = serde_json::json!([
        {"kind": "insert", "after": {
            "id": 1,
            "p": {"srid": 0, "wkb": hex_to_base64("0101000000000000000000F03F000000000000F03F")},
            "ls": {"srid": 0, "wkb": hex_to_base64("01020000000300000000000000000000000000000000000000000000000000F03F000000000000F03F00000000000000400000000000000040")},
            "g": {"srid": g[0].0, "wkb": hex_to_base64(&g[0].1)},
            "tail": 7}},
        {"kind": "insert", "after": {"id": 2, "p": null, "ls": null, "g": {"srid": 4326, "wkb": hex_to_base64(&g[1].1)}, "tail": 8}},
    ]);
    assert_eq!(g[1], (4326, "01010000000000000000804640".to_string() + "0000000000002440"));
    binlog_rows::assert_same(&Value::Array(images(&got)), &want, "geo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_20_truncate_of_a_mapped_table() {
    // TRUNCATE and ALTER TABLE ... TRUNCATE PARTITION remove rows with no row events: the
    // source passes on a table-level invalidation of the mapped table, in commit order between
    // the row changes around it.
    let db = tk::mariadb();
    let name = db.create_database("case20").unwrap();
    let (sql, _) = case("20-truncate-table.md");
    let from = binlog_rows::binlog_now(db);
    let (tt, tp) = (format!("{name}.tt"), format!("{name}.tp"));
    let mut live = binlog_rows::Live::at(db, &[tt.clone(), tp.clone()], &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    live.rows(8, 30).await;
    let got: Vec<Value> = live
        .changes()
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.as_object_mut().unwrap().remove("table");
            c
        })
        .collect();
    live.stop().await;
    let want = serde_json::json!([
        {"kind": "insert", "after": {"id": 1, "val": "a"}},
        {"kind": "insert", "after": {"id": 2, "val": "a"}},
        {"kind": "update", "before": {"id": 2, "val": "a"}, "after": {"id": 2, "val": "b"}},
        {"kind": "invalidate", "tables": [tt]},
        {"kind": "insert", "after": {"id": 1, "val": "again"}},
        {"kind": "delete", "before": {"id": 1, "val": "again"}},
        {"kind": "insert", "after": {"id": 1, "k": 5}},
        {"kind": "insert", "after": {"id": 2, "k": 50}},
        {"kind": "invalidate", "tables": [tp]},
        {"kind": "insert", "after": {"id": 3, "k": 6}},
    ]);
    binlog_rows::assert_same(&Value::Array(got), &want, "case 20");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_24_idle_source_with_heartbeats_and_annotate_rows() {
    // MariaDB sends HEARTBEAT (27) while idle and ANNOTATE_ROWS (160) before row events (its
    // counterpart of MySQL's ROWS_QUERY); both are passed over, the connection stays up (no
    // reconnect), and rows after the idle time arrive. MySQL's HEARTBEAT_LOG_EVENT_V2 (41) is
    // never written to a file and no MySQL server runs here: the source skips type 41 like the
    // MariaDB types mysql_common does not know, and stops on any other unknown type that is not
    // marked ignorable (src/binlog/framing.rs).
    let db = tk::mariadb();
    let name = db.create_database("case24").unwrap();
    let from = binlog_rows::binlog_now(db);
    let mut live = binlog_rows::Live::at(db, &[format!("{name}.hb")], &from);
    db.sql(&format!("USE `{name}`; CREATE TABLE hb (id INT PRIMARY KEY, v INT); INSERT INTO hb VALUES (1, 1);")).unwrap();
    assert_eq!(live.rows(1, 30).await.len(), 1);
    // Six heartbeat periods (500 ms) without events.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    db.sql(&format!("INSERT INTO `{name}`.hb VALUES (2, 2)")).unwrap();
    let rows = live.rows(2, 30).await;
    assert_eq!(
        Value::Array(images(&rows)),
        serde_json::json!([{"kind": "insert", "after": {"id": 1, "v": 1}}, {"kind": "insert", "after": {"id": 2, "v": 2}}])
    );
    assert_eq!(live.stats.reconnects.load(std::sync::atomic::Ordering::Relaxed), 0, "no reconnect while idle");
    live.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_26_gtid_resume_and_purged_position() {
    // MariaDB GTID positions: resume after a GTID delivers exactly what follows it, also after
    // older binlogs were purged; a position whose binlogs are purged fails loudly (ER 1236),
    // never silently starts elsewhere. MySQL GTID sets, tagged GTIDs (8.4) and several source
    // UUIDs are MySQL-only: tests/offline.rs reads binlog_transaction_with_GTID.000001,
    // binlog_transaction_previous_GTID_no_tag.000001 and binlog_56_gtid_reserved_word.000001.
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let name = db.create_database("case26").unwrap();
    let gtid = || db.sql("SELECT @@gtid_binlog_pos").unwrap().trim().to_string();
    db.sql(&format!("USE `{name}`; CREATE TABLE g (id INT PRIMARY KEY, v INT);")).unwrap();
    let at_start = gtid();
    db.sql(&format!("USE `{name}`; INSERT INTO g VALUES (1,1); INSERT INTO g VALUES (2,2);")).unwrap();
    let after_2 = gtid();
    db.sql(&format!("USE `{name}`; INSERT INTO g VALUES (3,3);")).unwrap();
    let table = vec![format!("{name}.g")];
    let ids = |rows: &[Value]| rows.iter().map(|r| r["after"]["id"].as_i64().unwrap()).collect::<Vec<_>>();
    let mut live = binlog_rows::Live::start(&db, &table, binval::binlog::resume::Resume::Gtid(after_2.parse().unwrap()));
    assert_eq!(ids(&live.rows(1, 30).await), vec![3]);
    db.sql(&format!("USE `{name}`; INSERT INTO g VALUES (4,4); INSERT INTO g VALUES (5,5);")).unwrap();
    assert_eq!(ids(&live.rows(3, 30).await), vec![3, 4, 5]);
    live.stop().await;
    let after_5 = gtid();
    // Purge every older binlog (MariaDB keeps one until its binlog checkpoint has passed it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        db.sql("FLUSH BINARY LOGS").unwrap();
        let (current, _) = binlog_rows::binlog_now(&db);
        let logs = db.sql(&format!("PURGE BINARY LOGS TO '{current}'; SHOW BINARY LOGS")).unwrap();
        if logs.lines().count() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "binlogs not purged: {logs}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    db.sql(&format!("INSERT INTO `{name}`.g VALUES (6,6);")).unwrap();
    let mut live = binlog_rows::Live::start(&db, &table, binval::binlog::resume::Resume::Gtid(after_5.parse().unwrap()));
    assert_eq!(ids(&live.rows(1, 30).await), vec![6], "resume after the purge");
    live.stop().await;
    let live = binlog_rows::Live::start(&db, &table, binval::binlog::resume::Resume::Gtid(at_start.parse().unwrap()));
    let e = live.error(30).await.to_string();
    assert!(e.contains("does not have binlog position") && e.contains(&at_start), "{e}");
}

#[test]
fn case_03_time_hours_over_255() {
    // TIME is a duration up to ±838:59:59: hours past 255 (mysql_common < 0.35.4 wrapped them
    // into 8 bits) and past 24 print as days*24 + hours. The case's values are the server's.
    use binlog_rows::Conv::*;
    let db = tk::mariadb();
    check_on(db, "03-time-hours-over-255.md", |s| s.to_string(), same);
    let name = db.create_database("case03").unwrap();
    db.sql(&format!("USE `{name}`;\n{}", case("03-time-hours-over-255.md").0)).unwrap();
    assert_eq!(server_rows(db, &format!("`{name}`.th"), &[("id", Int), ("c", Text), ("c6", Text)]), case("03-time-hours-over-255.md").1);
}

#[test]
fn case_05_zero_and_partial_zero_dates() {
    // Zero and partial-zero DATE/DATETIME(n) keep MySQL's own text (month or day 0 included),
    // a zero DATETIME(6) still takes its fraction bytes (the DATETIME(6) after it is exact), and
    // a zero TIMESTAMP is `0000-00-00 00:00:00[.fff]`, never 1970-01-01. Checked against the
    // server's own values too.
    use binlog_rows::Conv::*;
    let db = tk::mariadb();
    let file = "05-zero-and-partial-zero-dates.md";
    check_on(db, file, |s| s.to_string(), same);
    let name = db.create_database("case05").unwrap();
    db.sql(&format!("USE `{name}`;\n{}", case(file).0)).unwrap();
    let cols = [("id", Int), ("d", Text), ("dt", Text), ("dt6a", Text), ("dt6b", Text), ("ts", Utc), ("ts3", Utc)];
    assert_eq!(server_rows(db, &format!("`{name}`.z"), &cols), case(file).1);
}

/// Case 10's SET values as binval's canonical list of labels (the file writes them as MySQL's
/// comma-separated text).
fn set_as_list(col: &str, v: &Value) -> Value {
    match (col, v) {
        ("s" | "s18", Value::String(s)) => Value::Array(s.split(',').filter(|l| !l.is_empty()).map(|l| Value::String(l.into())).collect()),
        _ => v.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_10_enum_set_labels() {
    // ENUM as its label (index 0, the invalid value, is '' and never the last label), SET as
    // the list of its labels in definition order (a 3-byte bitmap for 18 members; the empty
    // set [] is not NULL), labels with commas and quotes from the TABLE_MAP's FULL metadata,
    // and an ENUM of 300 members (2-byte index). With binlog_row_metadata=MINIMAL there are no
    // labels in the binlog: `binval run` refuses such a source at its preflight, and the offline
    // reader's documented positional fallback (index, bit numbers) is tested in tests/offline.rs
    // `without_column_metadata_decode_says_so_and_falls_back_to_positions`.
    use binlog_rows::Conv::*;
    let db = tk::mariadb();
    let name = db.create_database("case10").unwrap();
    let file = "10-enum-set-mapping.md";
    let (sql, expected) = case(file);
    let labels: Vec<String> = (1..=300).map(|i| format!("'v{i}'")).collect();
    let sql = format!(
        "{sql}\nCREATE TABLE e300 (id INT PRIMARY KEY, e ENUM({}));\nINSERT INTO e300 VALUES (1, 'v1'), (2, 'v255'), (3, 'v256'), (4, 'v300'), (5, 'nope');",
        labels.join(", ")
    );
    let got = changes(db, &name, &["es", "e300"], &sql, 10).await;
    let rows: Vec<Value> = expected
        .iter()
        .map(|e| Value::Object(e.as_object().unwrap().iter().map(|(k, v)| (k.clone(), set_as_list(k, v))).collect()))
        .collect();
    let mut updated = rows[0].clone();
    updated["e"] = serde_json::json!("a");
    updated["s"] = serde_json::json!([]);
    let mut want: Vec<Value> = rows.iter().map(|r| serde_json::json!({"kind": "insert", "after": r})).collect();
    want.push(serde_json::json!({"kind": "update", "before": rows[0], "after": updated}));
    for (id, e) in [(1, "v1"), (2, "v255"), (3, "v256"), (4, "v300"), (5, "")] {
        want.push(serde_json::json!({"kind": "insert", "after": {"id": id, "e": e}}));
    }
    binlog_rows::assert_same(&Value::Array(images(&got)), &Value::Array(want), "es, e300");
    // The server agrees with the last image of every row.
    let cols = [("id", Int), ("e", Text), ("s", Set), ("s18", Set), ("ec", Text), ("tail", Int)];
    let mut last = rows.clone();
    last[0] = updated;
    assert_eq!(server_rows(db, &format!("`{name}`.es"), &cols), last);
}

#[test]
fn case_13_charsets_gbk_latin1_ucs2() {
    // Each column decoded from its own charset (gbk, latin1 = Windows-1252 with 0x80 = '€',
    // utf8mb4, utf8mb3, ucs2) whatever the table's default; VARBINARY as bytes (base64, the
    // case writes hex). The stored bytes are the case's oracle (HEX() on the server), which
    // is the expected text encoded in the column's charset.
    let db = tk::mariadb();
    let file = "13-charsets-gbk-latin1-ucs2.md";
    check_on(
        db,
        file,
        |s| s.to_string(),
        |col, v| match (col, v) {
            ("b", Value::String(hex)) => hex_to_base64(hex),
            _ => v.clone(),
        },
    );
    let name = db.create_database("case13").unwrap();
    db.sql(&format!("USE `{name}`;\n{}", case(file).0)).unwrap();
    let hex = db.sql(&format!("SELECT HEX(g), HEX(l), HEX(w), HEX(tx) FROM `{name}`.cs WHERE id = 1")).unwrap();
    let hex: Vec<&str> = hex.trim().split('\t').collect();
    let enc = |e: &'static encoding_rs::Encoding, s: &str| -> String { e.encode(s).0.iter().map(|b| format!("{b:02X}")).collect() };
    let ucs2: String = "Ωmega".encode_utf16().map(|u| format!("{u:04X}")).collect();
    assert_eq!(hex, [enc(encoding_rs::GBK, "中国"), enc(encoding_rs::WINDOWS_1252, "café €"), ucs2, enc(encoding_rs::GBK, "美国")]);
    assert_eq!(hex[0], "D6D0B9FA");
    assert_eq!(hex[1], "636166E92080");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_16_json_opaque_scalars() {
    // MySQL binary JSON with opaque scalars is MySQL-only: json-opaque.binlog (MySQL 9.0) holds
    // opaque binary, DATE, DATETIME, TIME and DECIMAL values inside documents. binval renders
    // them as MySQL's own text does (`base64:type15:...`, temporals with six fraction digits),
    // except DECIMAL, which is a JSON string with its exact digits (schemas/README.md: JSON,
    // "opaque DECIMAL/DATE/TIME scalars as text"), not the JSON number the case file asks for:
    // a documented representation, so no f64 rounding. On MariaDB (JSON is LONGTEXT, and
    // there is no CAST(... AS JSON): rows 2 and 3 of the case are left out) the decoded value
    // is the server's own text of the document, digit for digit.
    use binlog_rows::Conv::*;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test/json-opaque.binlog");
    let mut docs = Vec::new();
    binval::binlog::offline::read_file(&path, None, None, |l| {
        if l.get("kind").is_some() {
            docs.push(l["after"]["a"].clone());
        }
    })
    .unwrap();
    assert_eq!(
        docs,
        serde_json::json!([
            {"a": "base64:type15:VQ=="},
            {"b": "2012-03-18"},
            {"c": "2012-03-18 11:30:45.000000"},
            {"c": "87:31:46.654321"},
            {"d": "123.456"},
            {"e": "9.00"},
            {"e": [0, 1, true, false]},
            {"e": null},
        ])
        .as_array()
        .unwrap()
        .clone()
    );

    let db = tk::mariadb();
    let name = db.create_database("case16").unwrap();
    let (sql, _) = case("16-json-opaque-scalars.md");
    let sql: String = sql.lines().filter(|l| !l.contains("AS JSON)")).collect::<Vec<_>>().join("\n");
    let got = changes(db, &name, &["jo"], &sql, 3).await;
    let server = server_rows(db, &format!("`{name}`.jo"), &[("id", Int), ("doc", Str)]);
    let want: Vec<Value> = server.iter().map(|r| serde_json::json!({"kind": "insert", "after": r})).collect();
    assert_eq!(server.iter().map(|r| r["id"].as_i64().unwrap()).collect::<Vec<_>>(), vec![1, 4, 5]);
    binlog_rows::assert_same(&Value::Array(images(&got)), &Value::Array(want), "jo: the server's own text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_19_table_id_reuse_after_restart_and_ddl() {
    // After a server restart table ids are handed out again from the start, and a DDL or
    // FLUSH TABLES gives a table a new id: rows go to the table of the TABLE_MAP right before
    // them, never to an earlier table of the same id. The binlog really has one id for two
    // tables (asserted), read live and offline from before the restart.
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let name = db.create_database("case19").unwrap();
    let file = "19-table-id-reuse.md";
    let (sql, _) = case(file);
    let (before, after) = sql.split_once("-- stop the CDC service").unwrap();
    let after = after.split_once('\n').unwrap().1;
    let from = binlog_rows::binlog_now(&db);
    db.sql(&format!("USE `{name}`;\n{before}")).unwrap();
    db.stop();
    db.start_again().unwrap();
    db.sql(&format!("USE `{name}`;\n{after}")).unwrap();

    let mut ids: std::collections::BTreeMap<u64, std::collections::BTreeSet<String>> = Default::default();
    for l in binlog_rows::offline_lines(&db, &from).unwrap() {
        if l["event"] == "TABLE_MAP_EVENT" && l["table"].as_str().unwrap().starts_with(&format!("{name}.")) {
            ids.entry(l["table_id"].as_u64().unwrap()).or_default().insert(l["table"].as_str().unwrap().to_string());
        }
    }
    assert!(ids.values().any(|t| t.len() == 2), "one table id names both tables: {ids:?}");

    let want = labelled_changes(file, &name);
    assert_eq!(want.len(), 6);
    binlog_rows::assert_same(&Value::Array(binlog_rows::offline_rows(&db, &from, &name).unwrap()), &Value::Array(want.clone()), "offline");
    let mut live = binlog_rows::Live::at(&db, &[format!("{name}.ta"), format!("{name}.tb")], &from);
    let got = live.rows(6, 30).await;
    live.stop().await;
    binlog_rows::assert_same(&Value::Array(got), &Value::Array(want), "live");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_21_rename_table_swap() {
    // The online-schema-change cut-over `RENAME TABLE acct TO acct_old, acct_new TO acct`,
    // then `ALTER TABLE acct RENAME TO account`. Offline (no mappings): every row under the
    // name of its TABLE_MAP, as the case lists them. Live, with `acct` mapped: the mapping
    // stays with the name `acct`, which now holds another table, so every key of it is
    // invalidated at the statement (acct key 1 is bal = 100 again, not the cached 150); the
    // ALTER ... RENAME is followed (the rows of `account` go on under the `acct` rule). Two
    // mapped tables in a swap: tests/pipeline.rs `a_rename_swap_between_two_mapped_tables_is_never_silent`.
    let db = tk::mariadb();
    let name = db.create_database("case21").unwrap();
    let file = "21-rename-table-swap.md";
    let (sql, _) = case(file);
    let want = labelled_changes(file, &name);
    let acct = format!("{name}.acct");
    let from = binlog_rows::binlog_now(db);
    let mut live = binlog_rows::Live::at(db, std::slice::from_ref(&acct), &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    binlog_rows::assert_same(&Value::Array(binlog_rows::offline_rows(db, &from, &name).unwrap()), &Value::Array(want.clone()), "offline");
    live.rows(6, 30).await;
    let got = live.changes();
    live.stop().await;
    let mut live_want: Vec<Value> = want.iter().filter(|c| c["table"] != format!("{name}.acct_new")).cloned().collect();
    live_want.insert(3, serde_json::json!({"kind": "invalidate", "tables": [acct]}));
    live_want[6]["table"] = Value::String(acct.clone());
    binlog_rows::assert_same(&Value::Array(got), &Value::Array(live_want), "live, acct mapped");
}

/// The row events of `table` in the offline reader's `lines` (of binlog `file`): `((file, pos), next_pos)`.
fn row_events(lines: &[Value], file: &str, table: &str) -> Vec<((String, u64), u64)> {
    lines
        .iter()
        .filter(|l| l.get("rows").is_some() && l["table"] == table)
        .map(|l| ((file.to_string(), l["pos"].as_u64().unwrap()), l["next_pos"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_25_checksum_off_and_on_rotation_and_seven_digit_files() {
    // Binlog files with and without CRC32 checksums one after the other, empty files between,
    // read live (the server's fake ROTATE first, since the start is an older file) and offline;
    // each transaction's position names its real file, and resuming from it delivers exactly
    // what follows. Then the file number crosses mysql-bin.999999 -> mysql-bin.1000000 (the
    // server's binlog renamed to .999998 while it is stopped): positions name the 7-digit file,
    // resume works across the boundary, and files order by number, not as text.
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let name = db.create_database("case25").unwrap();
    let file = "25-checksum-rotate-and-filenames.md";
    let (sql, _) = case(file);
    let table = vec![format!("{name}.rt")];
    let from = binlog_rows::binlog_now(&db);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    // The files really differ: the checksum algorithm of each file's FORMAT_DESCRIPTION event
    // (its last byte without checksums, 0 = NONE; else the byte before the CRC32, 1 = CRC32).
    let algs: std::collections::BTreeSet<u8> = db
        .sql("SHOW BINARY LOGS")
        .unwrap()
        .lines()
        .map(|l| {
            let b = std::fs::read(db.datadir.join(l.split('\t').next().unwrap())).unwrap();
            let len = u32::from_le_bytes(b[4 + 9..4 + 13].try_into().unwrap()) as usize;
            let fde = &b[4..4 + len];
            if fde[len - 1] == 0 {
                0
            } else {
                fde[len - 5]
            }
        })
        .collect();
    assert_eq!(algs, [0, 1].into(), "files without checksums and with CRC32");
    let want = labelled_changes(file, &name);
    binlog_rows::assert_same(&Value::Array(binlog_rows::offline_rows(&db, &from, &name).unwrap()), &Value::Array(want.clone()), "offline");
    let mut live = binlog_rows::Live::at(&db, &table, &from);
    binlog_rows::assert_same(&Value::Array(live.rows(3, 30).await), &Value::Array(want.clone()), "live");
    let positions: Vec<(String, u64)> =
        live.transactions.iter().filter(|(_, r)| !r.is_empty()).map(|(t, _)| (t.position.file.clone(), t.position.pos)).collect();
    live.stop().await;
    let files: std::collections::BTreeSet<&str> = positions.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(files.len(), 3, "three rows in three files: {positions:?}");
    for (i, p) in positions.iter().enumerate() {
        let mut live = binlog_rows::Live::at(&db, &table, p);
        db.sql(&format!("INSERT INTO `{name}`.rt VALUES ({}, 0)", 100 + i)).unwrap();
        let got = live.rows(3, 30).await;
        live.stop().await;
        let ids: Vec<i64> = got.iter().map(|r| r["after"]["id"].as_i64().unwrap()).collect();
        let mut want_ids: Vec<i64> = (i as i64 + 2..=3).collect();
        want_ids.extend(100..=100 + i as i64);
        assert_eq!(ids, want_ids, "resumed at {}:{}", p.0, p.1);
    }

    // Past mysql-bin.999999.
    db.stop();
    let index = db.datadir.join("mysql-bin.index");
    let listed: Vec<String> = std::fs::read_to_string(&index).unwrap().lines().map(|l| l.trim_start_matches("./").to_string()).collect();
    let last = listed.last().unwrap();
    std::fs::rename(db.datadir.join(last), db.datadir.join("mysql-bin.999998")).unwrap();
    for f in &listed[..listed.len() - 1] {
        std::fs::remove_file(db.datadir.join(f)).unwrap();
    }
    std::fs::write(&index, "./mysql-bin.999998\n").unwrap();
    db.start_again().unwrap();
    let from = binlog_rows::binlog_now(&db);
    assert_eq!(from.0, "mysql-bin.999999");
    db.sql(&format!("INSERT INTO `{name}`.rt VALUES (4, 4); FLUSH BINARY LOGS; INSERT INTO `{name}`.rt VALUES (5, 5);")).unwrap();
    assert_eq!(binlog_rows::binlog_now(&db).0, "mysql-bin.1000000");
    let mut live = binlog_rows::Live::at(&db, &table, &from);
    let ids: Vec<i64> = live.rows(2, 30).await.iter().map(|r| r["after"]["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![4, 5]);
    let with_rows: Vec<&binval::binlog::txn::Transaction> =
        live.transactions.iter().filter(|(_, r)| !r.is_empty()).map(|(t, _)| t).collect();
    let files: Vec<&str> = with_rows.iter().map(|t| t.position.file.as_str()).collect();
    assert_eq!(files, vec!["mysql-bin.999999", "mysql-bin.1000000"]);
    let at_4 = (with_rows[0].position.file.clone(), with_rows[0].position.pos);
    live.stop().await;
    let mut live = binlog_rows::Live::at(&db, &table, &at_4);
    assert_eq!(live.rows(1, 30).await[0]["after"]["id"], 5, "resume from mysql-bin.999999 into mysql-bin.1000000");
    live.stop().await;
    let offline: Vec<Value> = binlog_rows::offline_rows(&db, &from, &name).unwrap().iter().map(|r| r["after"]["id"].clone()).collect();
    assert_eq!(offline, vec![serde_json::json!(4), serde_json::json!(5)], "files in the server's order");
    let a = binval_protocol::BinlogPosition::new("mysql-bin.999999", 4);
    assert!(a < binval_protocol::BinlogPosition::new("mysql-bin.1000000", 4), "positions compare by file number");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_27_resume_mid_transaction() {
    // Only transaction boundaries are resume points: binval passes on whole transactions (the
    // multi-row transaction arrives as one, with its 3-row event whole) and checkpoints the
    // position after the commit, so a restart repeats at most the transaction in flight
    // (at-least-once) and misses nothing. A replica connection opened at a row event inside
    // the transaction (its TABLE_MAP and BEGIN before it) stops with an error rather than
    // decode rows without a TABLE_MAP or drop them; so does the offline reader. (The pipeline
    // moves such a start back to the transaction: tests/pipeline.rs
    // `a_start_position_inside_a_transaction_starts_at_the_transaction`; a dropped connection
    // resumes at the last whole transaction: `a_dropped_replica_connection_reconnects_and_misses_nothing`.)
    let db = tk::mariadb();
    let name = db.create_database("case27").unwrap();
    let file = "27-resume-mid-transaction.md";
    let (sql, _) = case(file);
    let want = labelled_changes(file, &name);
    let table = vec![format!("{name}.mt")];
    let from = binlog_rows::binlog_now(db);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let mut live = binlog_rows::Live::at(db, &table, &from);
    binlog_rows::assert_same(&Value::Array(live.rows(7, 30).await), &Value::Array(want.clone()), "live");
    let sizes: Vec<usize> = live.transactions.iter().map(|(_, r)| r.len()).filter(|n| *n > 0).collect();
    assert_eq!(sizes, vec![6, 1], "the transaction arrives whole");
    let after_txn = live.transactions.iter().find(|(_, r)| r.len() == 6).map(|(t, _)| (t.position.file.clone(), t.position.pos)).unwrap();
    live.stop().await;

    // Resume from the checkpoint of the big transaction: exactly the row after it.
    let mut live = binlog_rows::Live::at(db, &table, &after_txn);
    binlog_rows::assert_same(&Value::Array(live.rows(1, 30).await), &Value::Array(want[6..].to_vec()), "resumed after the transaction");
    live.stop().await;

    // Inside the transaction: at the 2nd row event (after id=1 was emitted) and at the 3-row
    // event (after its first row would have been emitted).
    let lines = binlog_rows::offline_lines(db, &from).unwrap();
    let inside = row_events(&lines, &from.0, &table[0]);
    assert_eq!(inside.len(), 5, "four row events in the transaction, one after it");
    for (at, end) in [&inside[1], &inside[3]] {
        // The live reader names an event by its end position (where it resumes).
        let e = binlog_rows::Live::at(db, &table, at).error(30).await.to_string();
        assert!(e.contains("started inside a transaction") && e.contains(&format!("a row event at {}:{end}", at.0)), "{e}");
        let e = binval::binlog::offline::read_file(&db.datadir.join(&at.0), Some(at.1), None, |_| {}).unwrap_err().to_string();
        assert!(e.contains("without a preceding TABLE_MAP") && e.contains(&format!("position {}", at.1)), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_30_invisible_and_hidden_columns() {
    // MariaDB: an INVISIBLE column is in the row image and in the TABLE_MAP's column names,
    // so it is decoded under its name (not left out, no shifted values); the hidden hash
    // column of a long UNIQUE (DB_ROW_HASH_1) is left out and never mapped onto a real column.
    // MySQL's generated invisible primary key (sql_generate_invisible_primary_key, my_row_id)
    // is MySQL-only and none of the shared binlogs has one; MySQL 8 INVISIBLE columns:
    // binlog-invisible-columns.000001 (tests/offline.rs `more_binlog_invisible_columns`).
    use binlog_rows::Conv::*;
    let db = tk::mariadb();
    let name = db.create_database("case30").unwrap();
    let (sql, _) = case("30-hidden-and-invisible-columns.md");
    let sql: String =
        sql.lines().filter(|l| !l.contains("nopk") && !l.contains("sql_generate_invisible_primary_key")).collect::<Vec<_>>().join("\n");
    let got = changes(db, &name, &["inv", "lu"], &sql, 2).await;
    let inv = server_rows(db, &format!("`{name}`.inv"), &[("id", Int), ("v", Int), ("created", Utc)]);
    assert!(inv[0]["created"].as_str().unwrap().ends_with('Z'), "{inv:?}");
    let want = serde_json::json!([
        {"kind": "insert", "table": format!("{name}.inv"), "after": inv[0]},
        {"kind": "insert", "table": format!("{name}.lu"), "after": {"id": 1, "body": "q".repeat(5000)}},
    ]);
    binlog_rows::assert_same(&Value::Array(got), &want, "inv, lu");
}

// Shared cases the server here cannot run (MySQL-only features), covered by the real MySQL
// binlogs of ../shared/binlogs/mysql-test through the offline reader instead:
//
// - 14 (binary JSON over 64 KiB): MariaDB's JSON is LONGTEXT (large documents decode as text:
//   tests/cases.rs `compressed_events_large_values_and_ddl` has a 70 000-byte document). MySQL
//   binary JSON: json-opaque.binlog and json.binlog.000001 (tests/offline.rs); none of the
//   shared files holds a document over 64 KiB (mysql_common parses the large format; not
//   checked against a real file here).
// - 16 (binary JSON opaque scalars): json-opaque.binlog, in `case_16_json_opaque_scalars`
//   above (with the MariaDB rows the server can write).
// - 26's tagged GTIDs (MySQL 8.4+): ../shared/binlogs/more/binlog_transaction_with_GTID_TAG.000001
//   (tests/offline.rs `more_tagged_gtid`: the GTID keeps its tag, `uuid:tag:gno`).
// - 30's generated invisible primary key (my_row_id): MySQL 8.0.30+ only, and no shared binlog
//   has one; MySQL INVISIBLE columns: tests/offline.rs `more_binlog_invisible_columns`.
// - 15 (partial JSON): MySQL-only. Diffs are applied to the before image's value
//   (src/binlog/decode/json_diff.rs `apply_json_diffs`; unit test `json_diffs_apply_to_the_before_value` holds
//   the case's A-D). json.binlog.000001 writes its diffs with a MINIMAL before image (case
//   15 E): binval stops there, naming the table, the column and the position
//   (tests/offline.rs), rather than guess; rebuilding from the cache's own state needs the
//   redis sink (see the report of issue #3).
// - 22 (TRANSACTION_PAYLOAD): transaction_compression.000001 (tests/offline.rs: the inner row
//   is decoded; a damaged payload stops the reader and emits none of its rows). The live path
//   unwraps payloads with the same framing (src/binlog/framing/payload.rs
//   `transaction_payload_events`, unit test `transaction_payload_unwraps_and_fails_loudly`).
// - 28 (stale connection): not a decoder case; tests/pipeline.rs
//   `a_dropped_replica_connection_reconnects_and_misses_nothing` and the source's silence limit
//   (three heartbeat periods).
// - 29 (> 4 GiB binlog): needs ~10 GB of disk; opt-in test `case_29_binlog_over_4gib` below
//   (not run here). binval stops loudly when positions of one file stop growing (they wrap at
//   4 GiB in the replication protocol) instead of checkpointing a wrapped position.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ~10 GB of disk: BINVAL_BIG_TESTS=1 cargo test --test cases case_29 -- --ignored"]
async fn case_29_binlog_over_4gib() {
    // One ~4.5 GiB transaction, then small ones past the 4 GiB offset of the same file. Binlog
    // positions are 32-bit in the replication protocol: past 4 GiB they wrap, and binval (which
    // checkpoints file:pos after every transaction, also after a GTID start) could not name a
    // resume position. It stops loudly at the first event past 4 GiB, before passing on any row
    // of the transaction that crosses it, rather than checkpoint a wrapped position.
    if std::env::var_os("BINVAL_BIG_TESTS").is_none() {
        eprintln!("skipped: set BINVAL_BIG_TESTS=1");
        return;
    }
    let db = tk::MariaDb::start_with(&["--max-binlog-cache-size=18446744073709547520", "--max-allowed-packet=1073741824"]).unwrap();
    let name = db.create_database("case29").unwrap();
    db.sql(&format!("USE `{name}`; CREATE TABLE big (id INT PRIMARY KEY, pad LONGTEXT);")).unwrap();
    let from = binlog_rows::binlog_now(&db);
    let live = binlog_rows::Live::at(&db, &[format!("{name}.big")], &from);
    db.sql(&format!(
        "USE `{name}`; SET SESSION max_recursive_iterations = 100000; \
         INSERT INTO big SELECT n, REPEAT(CHAR(65 + n % 26), 65536) FROM (WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM s WHERE n < 70000) SELECT n FROM s) x; \
         INSERT INTO big VALUES (100001, 'after-1'); UPDATE big SET pad = 'after-2' WHERE id = 1; DELETE FROM big WHERE id = 2;"
    ))
    .unwrap();
    let e = live.error(3600).await.to_string();
    assert!(e.contains("grew past 4 GiB") && e.contains(&from.0), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_compressed_event_stops_the_live_source() {
    // A compressed row event whose zlib data is damaged in the server's own binlog file (no
    // checksums, so the server sends it as it is): the live source stops with a definite error
    // naming the event and the binlog position, after passing on the rows before it.
    let db = tk::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10", "--binlog-checksum=NONE"]).unwrap();
    let name = db.create_database("zlive").unwrap();
    db.sql(&format!("CREATE TABLE `{name}`.t (id INT PRIMARY KEY, v TEXT)")).unwrap();
    let from = binlog_rows::binlog_now(&db);
    db.sql(&format!("INSERT INTO `{name}`.t VALUES (1, REPEAT('a', 500)); INSERT INTO `{name}`.t VALUES (2, REPEAT('b', 500));")).unwrap();
    let path = db.datadir.join(&from.0);
    let mut events = Vec::new();
    binval::binlog::offline::read_file(&path, Some(from.1), None, |l| {
        if l["event"] == "MARIADB_WRITE_ROWS_COMPRESSED_V1" {
            events.push(l["next_pos"].as_u64().unwrap());
        }
    })
    .unwrap();
    assert_eq!(events.len(), 2, "two compressed row events");
    let end = events[1];
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(end - 2)).unwrap();
        let mut b = [0u8; 1];
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(end - 2)).unwrap();
        f.write_all(&[b[0] ^ 0xff]).unwrap();
    }
    let mut live = binlog_rows::Live::at(&db, &[format!("{name}.t")], &from);
    assert_eq!(live.rows(1, 30).await[0]["after"]["id"], 1);
    let e = live.error(30).await.to_string();
    assert!(e.contains("Write_rows_compressed_v1 cannot be decompressed") && e.contains(&format!("{}:{end}", from.0)), "{e}");
}
