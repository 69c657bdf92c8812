//! Decoder throughput (issue #3): replays one large binlog file written by a real MariaDB and
//! prints row events/s and MiB/s for (a) binval's offline reader (decode to canonical JSON) and
//! (b) a plain loop over mysql_common's own row decoding (values parsed, not converted), same
//! file, same run. Numbers, not assertions: `cargo bench --bench decode`.
//! `BINVAL_BENCH_ROW_EVENTS` (default 100000) sets the size.

use std::io::BufReader;
use std::time::Instant;

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::EventData;
use mysql_common::binlog::BinlogFile;

fn main() {
    let n: usize = std::env::var("BINVAL_BENCH_ROW_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let db = binval_testkit::mariadb();
    let name = binval_testkit::unique_name("bench");
    db.sql(&format!(
        "CREATE DATABASE {name}; CREATE TABLE {name}.items (id INT PRIMARY KEY, title VARCHAR(100), price DECIMAL(10,2), qty MEDIUMINT, \
         updated DATETIME(3), note TEXT, flags SET('a','b','c'), state ENUM('new','old'));"
    ))
    .unwrap();
    db.sql("FLUSH BINARY LOGS").unwrap();
    let file = db.sql("SHOW MASTER STATUS").unwrap().split('\t').next().unwrap().to_string();
    // One single-row INSERT per statement: one row event each; 1000 statements per transaction.
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
    let path = db.datadir.join(&file);
    let bytes = std::fs::metadata(&path).unwrap().len() as f64;
    let mib = bytes / (1024.0 * 1024.0);

    // Warm the page cache.
    let _ = std::fs::read(&path).unwrap();

    let mut results = Vec::new();
    for round in 0..3 {
        let t = Instant::now();
        let s = binval::offline::read_file(&path, None, None, |l| {
            std::hint::black_box(l);
        })
        .unwrap();
        let a = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mut row_events = 0u64;
        let mut rows = 0u64;
        let f = BinlogFile::new(BinlogVersion::Version4, BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
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
        let b = t.elapsed().as_secs_f64();
        assert_eq!(s.row_events, row_events);
        assert_eq!(s.rows, rows);
        results.push((round, s.row_events, a, b));
    }
    println!("binlog file: {:.1} MiB, {} row events", mib, results[0].1);
    println!("{:<6} {:>28} {:>12} {:>28} {:>12} {:>7}", "round", "binval (JSON) row events/s", "MiB/s", "mysql_common loop events/s", "MiB/s", "ratio");
    for (round, ev, a, b) in results {
        println!(
            "{:<6} {:>28.0} {:>12.1} {:>28.0} {:>12.1} {:>7.2}",
            round,
            ev as f64 / a,
            mib / a,
            ev as f64 / b,
            mib / b,
            b / a
        );
    }
}
