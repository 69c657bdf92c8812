//! Decoder throughput (issue #3): replays one large binlog file written by a real MariaDB and
//! prints row events/s and MiB/s for (a) binval's decoder (`decode_rows`: canonical JSON rows,
//! what the live source runs per row event), (o) binval's offline reader (the decoder plus
//! CRC32 checks and one JSON line per event and per row), and (b) a plain loop over
//! mysql_common's own row decoding (values parsed, not converted), same file, same run. Numbers, not assertions: `cargo bench --bench decode`.
//! `BINVAL_BENCH_ROW_EVENTS` (default 100000) sets the size.

use std::io::BufReader;
use std::time::Instant;

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::EventData;
use mysql_common::binlog::BinlogFile;

fn main() {
    let n: usize = std::env::var("BINVAL_BENCH_ROW_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let db = binval_testkit::mariadb();
    let path = write_binlog(db, n);
    let mib = std::fs::metadata(&path).unwrap().len() as f64 / (1024.0 * 1024.0);
    // Warm the page cache.
    let _ = std::fs::read(&path).unwrap();

    let mut results = Vec::new();
    for round in 0..3 {
        let (s, a) = timed(|| {
            binval::binlog::offline::read_file(&path, None, None, |l| {
                std::hint::black_box(l);
            })
            .unwrap()
        });
        let (decoded, d) = timed(|| binval_decoder_rows(&path));
        let ((row_events, rows), b) = timed(|| plain_mysql_common_rows(&path));
        assert_eq!(s.row_events, row_events);
        assert_eq!(s.rows, rows);
        assert_eq!(decoded, rows);
        results.push((round, s.row_events, a, d, b));
    }
    print_table(mib, &results);
}

/// Writes `n` single-row INSERTs (one row event each; 1000 statements per transaction) of an
/// 8-column table into a binlog file of its own; returns the file's path.
fn write_binlog(db: &binval_testkit::MariaDb, n: usize) -> std::path::PathBuf {
    let name = binval_testkit::unique_name("bench");
    db.sql(&format!(
        "CREATE DATABASE {name}; CREATE TABLE {name}.items (id INT PRIMARY KEY, title VARCHAR(100), price DECIMAL(10,2), qty MEDIUMINT, \
         updated DATETIME(3), note TEXT, flags SET('a','b','c'), state ENUM('new','old'));"
    ))
    .unwrap();
    db.sql("FLUSH BINARY LOGS").unwrap();
    let file = db.sql("SHOW MASTER STATUS").unwrap().split('\t').next().unwrap().to_string();
    eprintln!("writing {n} row events ...");
    let t = Instant::now();
    let mut sql = String::with_capacity(n * 120);
    for i in 0..n {
        if i % 1000 == 0 {
            sql.push_str("BEGIN;\n");
        }
        sql.push_str(&format!(
            "INSERT INTO {name}.items VALUES ({i}, 'product number {i} with a title', {}.{:02}, {}, '2026-11-30 12:00:00.{:03}', 'note {i}', 'a,c', 'old');\n",
            i % 10_000,
            i % 100,
            (i % 16_000_000) as i64 - 8_000_000,
            i % 1000
        ));
        if i % 1000 == 999 || i == n - 1 {
            sql.push_str("COMMIT;\n");
        }
    }
    db.sql(&sql).unwrap();
    db.sql("FLUSH BINARY LOGS").unwrap();
    eprintln!("written in {:.1} s", t.elapsed().as_secs_f64());
    db.datadir.join(&file)
}

/// The result of `f` and the seconds it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// binval's decoder as the live source uses it: the same event loop as the plain one, each
/// row event decoded to canonical JSON rows by `decode_rows`. Returns the rows decoded.
fn binval_decoder_rows(path: &std::path::Path) -> u64 {
    let mut decoded = 0u64;
    let f = BinlogFile::new(BinlogVersion::Version4, BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut tables = std::collections::HashMap::new();
    let mut out = Vec::new();
    for ev in f {
        let ev = ev.unwrap();
        match ev.read_data().unwrap() {
            Some(EventData::TableMapEvent(t)) => {
                // As the live source: an identical TABLE_MAP keeps its prepared schema.
                let same = tables.get(&t.table_id()).is_some_and(|s: &binval::binlog::decode::TableSchema| s.same_table_map(&t));
                if !same {
                    let s = binval::binlog::decode::TableSchema::from_table_map(t.into_owned(), true).unwrap();
                    tables.insert(s.tme.table_id(), s);
                }
            }
            Some(EventData::RowsEvent(r)) => {
                binval::binlog::decode::decode_rows(&tables[&r.table_id()], &r, &mut out).unwrap();
                decoded += out.len() as u64;
                std::hint::black_box(&out);
                out.clear();
            }
            _ => {}
        }
    }
    decoded
}

/// A plain loop over mysql_common's own row decoding (values parsed, not converted). Returns
/// (row events, rows).
fn plain_mysql_common_rows(path: &std::path::Path) -> (u64, u64) {
    let (mut row_events, mut rows) = (0u64, 0u64);
    let f = BinlogFile::new(BinlogVersion::Version4, BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut tmes = std::collections::HashMap::new();
    for ev in f {
        let ev = ev.unwrap();
        match ev.read_data().unwrap() {
            Some(EventData::TableMapEvent(t)) => {
                tmes.insert(t.table_id(), t.into_owned());
            }
            Some(EventData::RowsEvent(r)) => {
                row_events += 1;
                let tme = &tmes[&r.table_id()];
                for row in r.rows(tme) {
                    let (b, a) = row.unwrap();
                    std::hint::black_box((b, a));
                    rows += 1;
                }
            }
            _ => {}
        }
    }
    (row_events, rows)
}

/// One line per round: row events/s and MiB/s of each reader, and the ratios.
fn print_table(mib: f64, results: &[(usize, u64, f64, f64, f64)]) {
    println!("binlog file: {:.1} MiB, {} row events", mib, results[0].1);
    println!("(a) binval decoder (decode_rows, canonical JSON rows, as the live source)");
    println!("(o) binval offline reader (a + CRC32 check + one JSON line per event and per row)");
    println!("(b) plain mysql_common loop (RowsEventData::rows, values parsed, not converted)");
    println!(
        "{:<6} {:>16} {:>9} {:>16} {:>9} {:>16} {:>9} {:>7} {:>7}",
        "round", "(a) events/s", "MiB/s", "(o) events/s", "MiB/s", "(b) events/s", "MiB/s", "a/b", "o/b"
    );
    for &(round, ev, a, d, b) in results {
        println!(
            "{:<6} {:>16.0} {:>9.1} {:>16.0} {:>9.1} {:>16.0} {:>9.1} {:>7.2} {:>7.2}",
            round,
            ev as f64 / d,
            mib / d,
            ev as f64 / a,
            mib / a,
            ev as f64 / b,
            mib / b,
            b / d,
            b / a
        );
    }
}
