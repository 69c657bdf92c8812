//! The offline reader over the real MySQL/MariaDB test binlogs in ../shared/binlogs/mysql-test:
//! every file is read to its end, or stops with an error naming the file and the position;
//! row counts and the values each file's SQL makes knowable are asserted.

use std::path::PathBuf;

use binval::binlog::offline::{read_file, OfflineError, Summary};
use serde_json::{json, Value};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test")
}

fn read(name: &str) -> (Result<Summary, OfflineError>, Vec<Value>) {
    let mut lines = Vec::new();
    let r = read_file(&dir().join(name), None, None, |l| lines.push(l));
    (r, lines)
}

fn rows(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l.get("kind").is_some()).collect()
}

/// (file, Ok(rows) | Err(substring of the error))
const EXPECTED: &[(&str, Result<u64, &str>)] = &[
    ("binlog_56_gtid_reserved_word.000001", Ok(1)),
    ("binlog_savepoint.000001", Ok(0)),
    ("binlog_transaction.000001", Ok(0)),
    ("binlog_transaction_previous_GTID_no_tag.000001", Ok(0)),
    ("binlog_transaction_with_GTID.000001", Ok(0)),
    ("binlog_transaction_with_anonymous_GTID.000001", Ok(0)),
    ("binlog_truncated_event.000001", Err("truncated event at position 4")),
    ("binlog_truncated_prev_gtid_event.000001", Err("truncated event at position 120")),
    ("bug11747887-bin.000003", Ok(0)),
    ("bug16266.000001", Ok(0)),
    ("bug27213339-bin.000001", Ok(0)),
    ("bug32407.001", Ok(2)),
    ("bug33029-slave-relay-bin.000001", Ok(0)),
    ("bug40482-bin.000001", Ok(0)),
    ("corrupt-relay-bin.000624", Err("corrupt event at position 91204")),
    ("json-opaque.binlog", Ok(8)),
    // MySQL PARTIAL_JSON diffs written with a MINIMAL before image (case 15 E): there is no
    // document to apply them to, so binval stops at the event instead of guessing.
    ("json.binlog.000001", Err("partial JSON update cannot be applied: the before image does not hold the column")),
    ("mariadb-bin.000001", Ok(2)),
    ("master-bin.000001", Ok(0)),
    ("minimal_row_metadata.000001", Ok(1)),
    ("mysql_type_bit.000001", Ok(1)),
    ("rpl_atomic_ddl_rollback_full.000001", Ok(0)),
    ("rpl_atomic_ddl_rollback_table.000001", Ok(0)),
    ("rpl_atomic_ddl_rollback_view.000001", Ok(0)),
    ("rpl_cross_version_default_utf8mb4_collation.000001", Ok(0)),
    ("slave-relay-bin.000001", Ok(0)),
    ("time_issue.000001", Ok(1)),
    ("transaction_compression.000001", Ok(1)),
    ("update-full-row.binlog", Ok(7)),
    ("vector.binlog", Ok(10)),
    // A MySQL 5.1 file whose XID event mysql_common 0.37 cannot parse: reported, not skipped.
    ("ver_5_1-wl2325_r.001", Err("corrupt event at position 428")),
    ("ver_5_1-wl2325_s.001", Ok(0)),
    ("ver_5_1_23.001", Ok(5)),
    ("ver_trunk_row_v2.001", Ok(5)),
    ("write-full-row.binlog", Ok(7)),
    ("write-partial-row.binlog", Ok(7)),
];

#[test]
fn every_shared_binlog_is_read_to_its_end_or_reported() {
    let mut names: Vec<String> = std::fs::read_dir(dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let listed: Vec<&str> = EXPECTED.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, listed, "every shared binlog has an expectation");
    for (name, want) in EXPECTED {
        let (got, lines) = read(name);
        let len = std::fs::metadata(dir().join(name)).unwrap().len();
        match (got, want) {
            (Ok(s), Ok(n)) => {
                assert_eq!(s.rows, *n, "{name}: rows");
                assert_eq!(s.end_pos, len, "{name}: read to the end");
                assert_eq!(rows(&lines).len() as u64, *n);
            }
            (Err(e), Err(sub)) => {
                let m = e.to_string();
                assert!(m.contains(sub) && m.contains(name), "{name}: error `{m}` names the file and `{sub}`");
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn values_the_files_make_knowable() {
    // time_issue: a negative TIME (the case of ../shared/cases/02).
    let (_, l) = read("time_issue.000001");
    assert_eq!(rows(&l)[0]["after"]["@0"], json!("-507:48:27"));
    // BIT(3) b'100' = 4, BIT(6) = 32, with a VARCHAR between.
    let (_, l) = read("mysql_type_bit.000001");
    assert_eq!(rows(&l)[0]["after"], json!({"a": 4, "b": "foo", "c": 32}));
    // MySQL binary JSON with opaque DATE / DATETIME / TIME scalars.
    let (_, l) = read("json-opaque.binlog");
    let r = rows(&l);
    assert_eq!(r[1]["after"]["a"], json!({"b": "2012-03-18"}));
    assert_eq!(r[3]["after"]["a"], json!({"c": "87:31:46.654321"}));
    // TRANSACTION_PAYLOAD (zstd) unwrapped: the inner row is decoded.
    let (s, l) = read("transaction_compression.000001");
    assert!(l.iter().any(|e| e["event"] == "TRANSACTION_PAYLOAD_EVENT"));
    assert_eq!(s.unwrap().rows, 1);
    assert_eq!(rows(&l)[0]["table"], json!("test.tb1"));
    // MINIMAL row metadata: positional names, UNSIGNED INT beyond i32 kept exact.
    let (_, l) = read("minimal_row_metadata.000001");
    assert_eq!(rows(&l)[0]["after"]["@4"], json!(3230202323u64));
    // VECTOR as float32 values, shortest form.
    let (_, l) = read("vector.binlog");
    assert_eq!(rows(&l)[0]["after"]["vector_column"], json!([1.1, 2.2, 3.3]));
    // MariaDB binlog: TIMESTAMP as a UTC instant, MariaDB GTID events named.
    let (_, l) = read("mariadb-bin.000001");
    assert_eq!(rows(&l)[0]["after"]["created"], json!("2022-04-20T22:18:04Z"));
    assert!(l.iter().any(|e| e["event"] == "MARIADB_GTID" && e["gtid"].is_string()));
}

#[test]
fn start_and_stop_positions() {
    let f = dir().join("update-full-row.binlog");
    // Events: TABLE_MAP test.ba @170, TABLE_MAP mysql.ndb_apply_status @213, rows @275 (ndb),
    // rows @334/@415/@471 (test.ba).
    let s = read_file(&f, Some(170), None, |_| {}).unwrap();
    assert_eq!(s.rows, 7, "from the first TABLE_MAP every row is decoded");
    let s = read_file(&f, None, Some(334), |_| {}).unwrap();
    assert_eq!(s.rows, 1, "stop before the test.ba row events");
    // Starting after test.ba's TABLE_MAP: its rows cannot be decoded, and are not skipped.
    let e = read_file(&f, Some(213), None, |_| {}).unwrap_err().to_string();
    assert!(e.contains("position 334") && e.contains("without a preceding TABLE_MAP"), "{e}");
}

#[test]
fn not_a_binlog_is_reported() {
    let e = read_file(&dir().join("../README.md"), None, None, |_| {}).unwrap_err().to_string();
    assert!(e.contains("not a binlog"), "{e}");
}

/// A copy of `src` in a fresh temp directory, with `edit` applied to its bytes.
fn corrupted_copy(src: &std::path::Path, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let dir = std::env::temp_dir().join(binval_testkit::unique_name("binval-corrupt"));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join(src.file_name().unwrap());
    let mut bytes = std::fs::read(src).unwrap();
    edit(&mut bytes);
    std::fs::write(&dst, bytes).unwrap();
    dst
}

#[test]
fn corrupt_compressed_event_and_bad_checksum_are_reported() {
    // MariaDB log_bin_compress=ON without checksums: a damaged zlib stream inside a compressed
    // row event is a decompression error naming the file and the event's position.
    let db =
        binval_testkit::MariaDb::start_with(&["--log-bin-compress=ON", "--log-bin-compress-min-len=10", "--binlog-checksum=NONE"]).unwrap();
    let name = db.create_database("zcorrupt").unwrap();
    db.sql(&format!("CREATE TABLE `{name}`.t (id INT PRIMARY KEY, v TEXT); INSERT INTO `{name}`.t VALUES (1, REPEAT('abc', 1000));"))
        .unwrap();
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let file = db.datadir.join(status.split('\t').next().unwrap());
    let mut lines = Vec::new();
    read_file(&file, None, None, |l| lines.push(l)).unwrap();
    let ev = lines.iter().rev().find(|l| l["event"] == "MARIADB_WRITE_ROWS_COMPRESSED_V1").expect("a compressed row event");
    let (pos, end) = (ev["pos"].as_u64().unwrap(), ev["next_pos"].as_u64().unwrap());
    let bad = corrupted_copy(&file, |b| b[end as usize - 2] ^= 0xff);
    let e = read_file(&bad, None, None, |_| {}).unwrap_err().to_string();
    assert!(
        e.contains(&bad.display().to_string())
            && e.contains(&format!("position {pos}"))
            && e.contains("Write_rows_compressed_v1 cannot be decompressed"),
        "{e}"
    );

    // With CRC32 checksums (the default), a flipped byte anywhere in an event is a checksum
    // mismatch at that event.
    let f = dir().join("mariadb-bin.000001");
    let mut lines = Vec::new();
    read_file(&f, None, None, |l| lines.push(l)).unwrap();
    let row_ev = lines.iter().find(|l| l.get("rows").is_some()).unwrap();
    let (pos, end) = (row_ev["pos"].as_u64().unwrap(), row_ev["next_pos"].as_u64().unwrap());
    let bad = corrupted_copy(&f, |b| b[(pos + end) as usize / 2] ^= 0x01);
    let e = read_file(&bad, None, None, |_| {}).unwrap_err().to_string();
    assert!(e.contains(&format!("corrupt event at position {pos}")) && e.contains("checksum mismatch"), "{e}");
}

#[test]
fn damaged_transaction_payload_stops_the_reader_and_emits_none_of_its_rows() {
    // A copy of the MySQL 8 file with binlog_transaction_compression=ON whose zstd payload is
    // damaged (and the event's CRC32 recomputed, so only the payload is wrong).
    let f = dir().join("transaction_compression.000001");
    let (_, lines) = read("transaction_compression.000001");
    let ev = lines.iter().find(|l| l["event"] == "TRANSACTION_PAYLOAD_EVENT").unwrap();
    let (pos, end) = (ev["pos"].as_u64().unwrap() as usize, ev["next_pos"].as_u64().unwrap() as usize);
    let bad = corrupted_copy(&f, |b| {
        b[end - 4 - 3] ^= 0x5a;
        let mut crc = flate2::Crc::new();
        crc.update(&b[pos..end - 4]);
        b[end - 4..end].copy_from_slice(&crc.sum().to_le_bytes());
    });
    let mut rows_seen = 0;
    let e = read_file(&bad, None, None, |l| rows_seen += l.get("kind").is_some() as usize).unwrap_err().to_string();
    assert!(
        e.contains(&bad.display().to_string())
            && e.contains(&format!("position {pos}"))
            && e.contains("TRANSACTION_PAYLOAD cannot be read"),
        "{e}"
    );
    assert_eq!(rows_seen, 0, "no row of the damaged transaction is emitted");
}

#[test]
fn unknown_event_types_are_not_passed_over() {
    // A row event whose type byte is changed to one nobody knows (CRC32 recomputed): the reader
    // stops there; marked ignorable (LOG_EVENT_IGNORABLE_F), it is passed over.
    let f = dir().join("mariadb-bin.000001");
    let (_, lines) = read("mariadb-bin.000001");
    let ev = lines.iter().find(|l| l.get("rows").is_some()).unwrap();
    let (pos, end) = (ev["pos"].as_u64().unwrap() as usize, ev["next_pos"].as_u64().unwrap() as usize);
    let retype = |flags: Option<u16>| {
        corrupted_copy(&f, |b| {
            b[pos + 4] = 200;
            if let Some(fl) = flags {
                b[pos + 17..pos + 19].copy_from_slice(&fl.to_le_bytes());
            }
            let mut crc = flate2::Crc::new();
            crc.update(&b[pos..end - 4]);
            b[end - 4..end].copy_from_slice(&crc.sum().to_le_bytes());
        })
    };
    let e = read_file(&retype(None), None, None, |_| {}).unwrap_err().to_string();
    assert!(e.contains(&format!("position {pos}")) && e.contains("unknown event type 200"), "{e}");
    let s = read_file(&retype(Some(0x80)), None, None, |_| {}).unwrap();
    assert_eq!(s.rows, 1, "the ignorable event's rows are not decoded; the other row is");
    // MySQL's INCIDENT event is reported with its message (the live source stops on it).
    let (_, l) = read("bug40482-bin.000001");
    assert!(l.iter().any(|e| e["event"] == "INCIDENT_EVENT" && e["incident"].is_string()), "incident reported");
}

/// The binlog file and position where `db` writes next.
fn mariadb_now(db: &binval_testkit::MariaDb) -> (PathBuf, u64) {
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut it = status.split('\t');
    (db.datadir.join(it.next().unwrap()), it.next().unwrap().trim().parse().unwrap())
}

#[test]
fn a_start_that_is_not_an_event_boundary_is_named_as_such() {
    // Issue #12 (6): `decode --start` in the middle of an event read the bytes there as an event
    // header and reported "truncated event of 673207109 bytes".
    let db = binval_testkit::mariadb();
    let name = db.create_database("boundary").unwrap();
    let (file, pos) = mariadb_now(db);
    db.sql(&format!("CREATE TABLE `{name}`.t (id INT PRIMARY KEY, v TEXT); INSERT INTO `{name}`.t VALUES (1, REPEAT('x', 300));")).unwrap();
    let mut lines = Vec::new();
    read_file(&file, Some(pos), None, |l| lines.push(l)).unwrap();
    let ev = lines.iter().find(|l| l.get("rows").is_some() && l["table"] == format!("{name}.t")).expect("a row event");
    let (at, end) = (ev["pos"].as_u64().unwrap(), ev["next_pos"].as_u64().unwrap());
    let e = read_file(&file, Some(at + 11), None, |_| {}).unwrap_err().to_string();
    assert!(
        e.contains(&format!("position {} is not an event boundary", at + 11))
            && e.contains(&at.to_string())
            && e.contains(&end.to_string()),
        "{e}"
    );
    let len = std::fs::metadata(&file).unwrap().len();
    let e = read_file(&file, Some(len + 100), None, |_| {}).unwrap_err().to_string();
    assert!(e.contains("beyond the end of the file"), "{e}");
    // At a boundary, reading works as before.
    assert!(read_file(&file, Some(at), None, |_| {}).is_err(), "a row event without its TABLE_MAP is still refused");
    assert!(read_file(&file, Some(pos), Some(end), |_| {}).is_ok());
}

#[test]
fn mariadb_hidden_hash_columns_are_left_out_unless_asked_for() {
    // Issue #12 (4): MariaDB's hidden long-UNIQUE hash column (DB_ROW_HASH_1) was in `decode`'s rows.
    let db = binval_testkit::mariadb();
    let name = db.create_database("rowhash").unwrap();
    let (file, pos) = mariadb_now(db);
    db.sql(&format!("CREATE TABLE `{name}`.t (id INT PRIMARY KEY, body TEXT, UNIQUE KEY (body)); INSERT INTO `{name}`.t VALUES (1, 'x');"))
        .unwrap();
    let after = |hidden_columns: bool| {
        let mut rows = Vec::new();
        let opts = binval::binlog::offline::DecodeOptions { start: Some(pos), stop: None, hidden_columns };
        binval::binlog::offline::read_file_with(&file, &opts, |l| {
            // Other tests write to the shared server meanwhile: only this database's rows count.
            if l.get("kind").is_some() && l["table"] == format!("{name}.t") {
                rows.push(l["after"].clone())
            }
        })
        .unwrap();
        rows
    };
    assert_eq!(after(false), vec![json!({"id": 1, "body": "x"})]);
    let shown = after(true);
    assert_eq!(shown.len(), 1);
    assert!(shown[0]["DB_ROW_HASH_1"].is_u64(), "shown when asked for: {}", shown[0]);
}

#[test]
fn without_column_metadata_decode_says_so_and_falls_back_to_positions() {
    // Issue #12 (5): with binlog_row_metadata=MINIMAL, `decode` printed `@0..` names, ENUM
    // indexes and SET bit numbers without a word. The TABLE_MAP line now says it, and `binval
    // decode` explains the fallback (naming the setting) once per table on stderr.
    let db = binval_testkit::MariaDb::start_with(&["--binlog-row-metadata=MINIMAL"]).unwrap();
    let name = db.create_database("minimal").unwrap();
    let (file, pos) = mariadb_now(&db);
    db.sql(&format!(
        "CREATE TABLE `{name}`.t (id INT PRIMARY KEY, e ENUM('red','green'), s SET('a','b','c')); INSERT INTO `{name}`.t VALUES (1, 'green', 'a,c');"
    ))
    .unwrap();
    let mut lines = Vec::new();
    read_file(&file, Some(pos), None, |l| lines.push(l)).unwrap();
    let tm = lines.iter().find(|l| l["event"] == "TABLE_MAP_EVENT").unwrap();
    assert_eq!(tm["column_names"], json!(false), "{tm}");
    assert_eq!(rows(&lines)[0]["after"], json!({"@0": 1, "@1": 2, "@2": ["#0", "#2"]}), "the documented fallback");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_binval"))
        .args(["decode", "--binlog-file"])
        .arg(&file)
        .args(["--start", &pos.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("binlog_row_metadata=FULL").count(), 1, "one note per table: {err}");
    assert!(err.contains(&format!("{name}.t")) && err.contains("@0") && err.contains("ENUM") && err.contains("SET"), "{err}");
}

/// ../shared/binlogs/more: more real MySQL test-suite binlogs.
fn more_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/more")
}

/// Read `name` of ../shared/binlogs/more to its end and check its rows against `want` (the
/// values `mariadb-binlog -vv --base64-output=decode-rows` prints for the file, written as
/// binval's canonical values and column names; `mariadb-binlog` was run once by hand, it is not
/// needed at run time): each row event's count of rows, each image's column count, and every
/// value. Returns the file's JSON lines.
fn check_more(name: &str, want: Value) -> Vec<Value> {
    let path = more_dir().join(name);
    let mut lines = Vec::new();
    let s = read_file(&path, None, None, |l| lines.push(l)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(s.end_pos, std::fs::metadata(&path).unwrap().len(), "{name}: read to the end");
    let want = want.as_array().unwrap();
    let got: Vec<Value> = rows(&lines)
        .into_iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("pos");
            r
        })
        .collect();
    assert_eq!(s.rows as usize, want.len(), "{name}: rows");
    let per_event: u64 = lines.iter().filter_map(|l| l.get("rows").and_then(Value::as_u64)).sum();
    assert_eq!(per_event, s.rows, "{name}: the row events' counts");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for image in ["before", "after"] {
            let n = |v: &Value| v.get(image).and_then(Value::as_object).map(|o| o.len());
            assert_eq!(n(g), n(w), "{name}: row {i}: columns of the {image} image");
        }
        assert_eq!(g, w, "{name}: row {i}");
    }
    lines
}

#[test]
fn more_binlog_invisible_columns() {
    // MySQL 8.0.26, t1 (f1 INT UNSIGNED INVISIBLE, f2 INT UNSIGNED INVISIBLE, f3 INT, f4 TEXT,
    // f5 BLOB, f6 BIGINT UNSIGNED INVISIBLE): invisible columns are in every row image (six
    // columns) and decoded under their names, f3 signed (mariadb-binlog: -3 (4294967293)), the
    // BLOB as base64 ('\x05', 'U'). Case 30's MySQL INVISIBLE columns.
    let t = "mysql.t1";
    let r1 = json!({"f1": null, "f2": null, "f3": -33, "f4": "44", "f5": "VQ==", "f6": null});
    check_more(
        "binlog-invisible-columns.000001",
        json!([
            {"kind": "insert", "table": t, "after": {"f1": 1, "f2": 2, "f3": -3, "f4": "4", "f5": "BQ==", "f6": 6000000000u64}},
            {"kind": "insert", "table": t, "after": r1},
            {"kind": "update", "table": t, "before": r1,
             "after": {"f1": 111, "f2": 222, "f3": -333, "f4": "444", "f5": "VQ==", "f6": null}},
        ]),
    );
}

#[test]
fn more_tagged_gtid() {
    // MySQL 9.6 GTID_TAGGED_LOG_EVENT (type 42): mariadb-binlog cannot read it ("Found invalid
    // event in binary log" at 245) and stops there; `mariadb-binlog --start-position=328` reads
    // the rest (3, 100, 250.00). binval reads the whole file: the event is named, its GTID in
    // MySQL's form uuid:tag:gno (the tag kept, see binlog::events::mysql_gtid_text), and the row
    // after it (MINIMAL metadata: positional names) is decoded.
    let lines = check_more(
        "binlog_transaction_with_GTID_TAG.000001",
        json!([{"kind": "insert", "table": "test.orders", "after": {"@0": 3, "@1": 100, "@2": "250.00"}}]),
    );
    let g = lines.iter().find(|l| l["event"] == "GTID_TAGGED_LOG_EVENT").expect("the tagged GTID event");
    assert_eq!(g["pos"], 245);
    assert_eq!(g["gno"], 3);
    // The server UUID and tag are in plain bytes in the file's PREVIOUS_GTIDS event (at 127:
    // 55778904-0299-11f1-b1b8-4ef0c4956feb, tag "mytag"); the tagged event encodes them in
    // MySQL's serialization format.
    assert_eq!(g["gtid"], "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3");
}

#[test]
fn more_enum_and_set_strings() {
    // MySQL 8.0.28, t (f1 CHAR(128), f2 VARCHAR(300), f3 ENUM('var1','variant2','foo'),
    // f4 SET('one','two','three','four'), f5 TEXT), full row metadata: ENUM and SET (logged as
    // STRING with the real type in the metadata) as labels. mariadb-binlog shows the ENUM
    // index (1, 2) and the SET bitmap (b'00000101', b'00001010').
    let t = "mysql.t";
    let long = "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456780123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456780123456789012345678901234567890123456789";
    assert_eq!(long.len(), 298);
    let first = json!({"f1": "0123456789".repeat(10), "f2": long, "f3": "var1", "f4": ["one", "three"], "f5": "0123456789"});
    let second = json!({"f1": "field1", "f2": "field_2", "f3": "variant2", "f4": ["two", "four"], "f5": long});
    check_more(
        "mysql-enum-string-set.000001",
        json!([
            {"kind": "insert", "table": t, "after": first},
            {"kind": "update", "table": t, "before": first, "after": second},
            {"kind": "delete", "table": t, "before": second},
        ]),
    );
}

#[test]
fn more_hidden_generated_column() {
    // MySQL 8.0.17, t (a INT, INDEX i((a+1))) then ADD COLUMN b TEXT: the functional index's
    // hidden generated column (the table's 2nd column) is not in the row image, which holds
    // columns 1 and 3 (mariadb-binlog: @1=1, @3='1'); MINIMAL metadata, positional names.
    // The file is a relay log: two ROTATE events (one fake) before the first transaction.
    let lines =
        check_more("rpl_unfiltered_hidden_gcol.000001", json!([{"kind": "insert", "table": "test.t", "after": {"@0": 1, "@2": "1"}}]));
    assert_eq!(lines.iter().filter(|l| l["event"] == "ROTATE_EVENT").count(), 2);
}

#[test]
fn more_ndb_partial_row_image() {
    // MySQL Cluster 5.1 (NDB): one transaction with rows of mysql.ndb_apply_status and test.ba
    // in v1 row events; the UPDATE's images hold only columns 1 and 3 and the DELETE's only
    // the key column 1, as NDB writes them (mariadb-binlog prints the same columns). An
    // absent column stays absent (never null); no names in a 5.1 TABLE_MAP.
    let ba = "test.ba";
    let row = |v: i64| json!({"kind": "insert", "table": ba, "after": {"@0": v, "@1": v, "@2": v}});
    check_more(
        "update-partial-row.binlog",
        json!([
            {"kind": "insert", "table": "mysql.ndb_apply_status", "after": {"@0": 3, "@1": 25769803786u64, "@2": "", "@3": 0, "@4": 0}},
            row(3), row(1), row(2), row(4),
            {"kind": "update", "table": ba, "before": {"@0": 4, "@2": 4}, "after": {"@0": 4, "@2": 40}},
            {"kind": "delete", "table": ba, "before": {"@0": 2}},
        ]),
    );
}

#[test]
fn binval_decode_reads_every_more_binlog_to_its_end() {
    // The CLI over each file of ../shared/binlogs/more: exit 0, one JSON line per event and per
    // row on stdout, and the summary on stderr names the file's length as the end position.
    let mut names: Vec<String> = std::fs::read_dir(more_dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 5, "{names:?}");
    for name in names {
        let path = more_dir().join(&name);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_binval")).args(["decode", "--binlog-file"]).arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {:?}: {err}", out.status);
        let s = read_file(&path, None, None, |_| {}).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count() as u64, s.events + s.rows, "{name}");
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(err.contains(&format!("{} rows, read to position {len}", s.rows)), "{name}: {err}");
    }
}
