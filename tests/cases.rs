//! ../shared/cases: public failure reports of other binlog readers as SQL reproductions with
//! expected values. Each value case runs on the real MariaDB, and binval's decoder (the offline
//! reader over the server's own binlog file) must produce the expected row images. Cases that
//! need MySQL-only features are covered by tests/offline.rs over ../shared/binlogs instead.

mod support;

use std::path::PathBuf;

use base64::Engine as _;
use binval_testkit as tk;
use serde_json::Value;

fn case(name: &str) -> (String, Vec<Value>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/cases").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let block = |lang: &str| -> String {
        let start = text.find(&format!("```{lang}")).unwrap_or_else(|| panic!("{name}: no {lang} block"));
        let body = &text[start + 3 + lang.len()..];
        body[..body.find("```").unwrap()].to_string()
    };
    // A stream of JSON objects (some span two lines).
    // Labelled blocks (`E1 {...}`) are parsed by their own tests.
    let json = block("json");
    let expected = if json.trim_start().starts_with('{') {
        serde_json::Deserializer::from_str(&json).into_iter::<Value>().map(|v| v.unwrap()).collect()
    } else {
        Vec::new()
    };
    (block("sql"), expected)
}

/// Run `sql` in a fresh database and return the after images of its inserted rows, in order.
fn inserted_rows(db: &tk::MariaDb, sql: &str) -> Result<Vec<Value>, binval::offline::OfflineError> {
    let name = db.create_database("case").unwrap();
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut it = status.split('\t');
    let (file, pos): (String, u64) = (it.next().unwrap().to_string(), it.next().unwrap().trim().parse().unwrap());
    db.sql(&format!("USE `{name}`;\nSET time_zone = '+00:00';\n{sql}")).unwrap();
    let mut rows = Vec::new();
    binval::offline::read_file(&db.datadir.join(&file), Some(pos), None, |l| {
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
        ("u" | "v", Value::String(hex)) => {
            let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        _ => v.clone(),
    });
}

#[test]
fn case_06_timestamp_time_zone() {
    check("06-timestamp-time-zone.md", same);
}

#[test]
fn case_07_mariadb_legacy_hires_temporal() {
    // SET GLOBAL mysql56_temporal_format: on a server of its own, not the shared one. The case's
    // trailing SHOW diagnostics (show_old_temporals is not in 10.11) are left out.
    // Known gap (issue #3): mysql_common 0.37 cannot parse MariaDB's legacy (pre-5.6) hires
    // DATETIME/TIME/TIMESTAMP images. binval must stop loudly at the row, naming the table and
    // the position, never emit a wrong value; when the gap is closed, compare with
    // `check_on(&db, NAME, edit, same)` instead.
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let (sql, _) = case("07-mariadb-legacy-hires-temporal.md");
    let sql: String = sql.lines().filter(|l| !l.contains("show_old_temporals") && !l.starts_with("SHOW CREATE")).collect::<Vec<_>>().join("\n");
    let e = inserted_rows(&db, &sql).unwrap_err().to_string();
    assert!(e.contains(".mh") && e.contains("at position"), "{e}");
}

#[test]
fn case_18_ddl_add_column_midstream() {
    // Column names follow each ALTER exactly, since every TABLE_MAP carries them.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/cases/18-ddl-add-column-midstream.md");
    let text = std::fs::read_to_string(path).unwrap();
    let (sql, _) = case("18-ddl-add-column-midstream.md");
    let expected_block = {
        let s = text.find("```json").unwrap() + 7;
        text[s..s + text[s..].find("```").unwrap()].to_string()
    };
    let objects: Vec<Value> = expected_block
        .lines()
        .filter_map(|l| l.find('{').map(|i| serde_json::from_str(&l[i..]).unwrap()))
        .collect();
    let db = tk::mariadb();
    let name = db.create_database("case18").unwrap();
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut it = status.split('\t');
    let (file, pos): (String, u64) = (it.next().unwrap().to_string(), it.next().unwrap().trim().parse().unwrap());
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let mut images = Vec::new();
    binval::offline::read_file(&db.datadir.join(&file), Some(pos), None, |l| {
        if l["table"].as_str() == Some(&format!("{name}.pe")) && l.get("kind").is_some() {
            if let Some(b) = l.get("before") {
                images.push(b.clone());
            }
            if let Some(a) = l.get("after") {
                images.push(a.clone());
            }
        }
    })
    .unwrap();
    assert_eq!(images, objects, "E1..E5 row images with the column names of their time");
}

/// The five row changes of case 23 (`mz`), as [`support::row_json`] values.
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
    let db = tk::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10", "--binlog-annotate-row-events=ON"]).unwrap();
    let (sql, _) = case("23-mariadb-specific-and-compressed-events.md");
    let name = db.create_database("case23").unwrap();
    let table = format!("{name}.mz");
    let from = support::binlog_now(&db);
    let gtid_before = db.sql("SELECT @@gtid_binlog_pos").unwrap().trim().to_string();
    let mut live = support::Live::at(&db, &[table.clone()], &from);
    db.sql(&format!("USE `{name}`;\n{sql}")).unwrap();
    let want = case_23_expected(&table);
    assert_eq!(live.rows(5, 30).await, want, "live, from {}:{}", from.0, from.1);
    live.stop().await;

    // The binlog really holds compressed events (else this test proves nothing).
    let mut names = std::collections::BTreeSet::new();
    let mut files: Vec<String> = db.sql("SHOW BINARY LOGS").unwrap().lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    files.retain(|f| *f >= from.0);
    for f in &files {
        binval::offline::read_file(&db.datadir.join(f), None, None, |l| {
            names.insert(l["event"].as_str().unwrap_or_default().to_string());
        })
        .unwrap();
    }
    for n in ["MARIADB_QUERY_COMPRESSED", "MARIADB_WRITE_ROWS_COMPRESSED_V1", "MARIADB_UPDATE_ROWS_COMPRESSED_V1", "MARIADB_DELETE_ROWS_COMPRESSED_V1", "MARIADB_ANNOTATE_ROWS"] {
        assert!(names.contains(n), "{n} not in the binlog: {names:?}");
    }
    assert_eq!(support::offline_rows(&db, &from, &name).unwrap(), want, "offline");

    // Restart from a MariaDB GTID position taken before the first INSERT.
    let mut live = support::Live::start(&db, &[table.clone()], binval::source::Resume::Gtid(gtid_before.clone()));
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
    let from = support::binlog_now(&db);
    let mut live = support::Live::at(&db, &[table.clone()], &from);
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
    support::assert_same(&rows[0]["after"], &one, "insert 1");
    support::assert_same(&rows[1]["after"], &serde_json::json!({"id": 2, "t": "", "m": "", "b": "", "j": "[]"}), "insert 2");
    support::assert_same(&rows[2]["after"], &serde_json::json!({"id": 3, "t": null, "m": null, "b": null, "j": null}), "insert 3");
    support::assert_same(&rows[3]["before"], &one, "update before");
    support::assert_same(&rows[3]["after"]["m"], &serde_json::json!(format!("{}!", "abcdefghij".repeat(100000))), "update after");
    support::assert_same(&Value::Array(support::offline_rows(&db, &from, &name).unwrap()), &Value::Array(rows), "offline reader agrees");
    // A TRUNCATE of the mapped table, written as QUERY_COMPRESSED, reaches the DDL check.
    db.sql(&format!("TRUNCATE TABLE `{name}`.big")).unwrap();
    let e = live.error(30).await.to_string();
    assert!(e.contains("TRUNCATE") && e.contains(&table), "{e}");
}
