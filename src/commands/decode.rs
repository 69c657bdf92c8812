//! `binval decode`: a binlog file as JSON lines on stdout (the offline reader), with a summary
//! on stderr.
//!
//! A TABLE_MAP without column names (the source wrote it with `binlog_row_metadata=MINIMAL`,
//! or is MySQL before 8.0.1) cannot be decoded the way `binval run` decodes (run refuses such a
//! source at its preflight): the rows of such a table come out positionally, and a note on
//! stderr says so once per table. The fallback: columns are named `@0`, `@1`, ... in table
//! order; an ENUM value is its index (1 = the first label, 0 = the empty error value); a SET
//! value is the list of its bit numbers as `"#0"`, `"#1"`, ... (bit 0 = the first label).
//! Everything else (numbers, signedness, text in its charset, temporal values) is exact: the
//! MINIMAL metadata carries signedness and charsets.

use std::collections::HashSet;
use std::process::ExitCode;

use crate::binlog::offline::DecodeOptions;

/// Decode `file` per `opts`; exit 1 with the file and position when it cannot be read to the
/// end, 2 for a bad range.
pub fn decode(file: &std::path::Path, opts: &DecodeOptions) -> ExitCode {
    use std::io::Write;
    if let (Some(a), Some(b)) = (opts.start, opts.stop) {
        if b <= a {
            eprintln!("error: --stop {b} is not after --start {a}");
            return ExitCode::from(2);
        }
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut broken_pipe = false;
    let mut positional: HashSet<String> = HashSet::new();
    let r = crate::binlog::offline::read_file_with(file, opts, |line| {
        if line["column_names"] == serde_json::json!(false) {
            let table = line["table"].as_str().unwrap_or_default().to_string();
            if positional.insert(table.clone()) {
                eprintln!(
                    "note: table {table}: its TABLE_MAP has no column names (the source wrote it with binlog_row_metadata=MINIMAL, or is MySQL before 8.0.1): its columns are named @0, @1, ... in table order, an ENUM value is its index (1 = the first label) and a SET value the list of its bit numbers (\"#0\" = the first label); set binlog_row_metadata=FULL on the source for names and labels"
                );
            }
        }
        if !broken_pipe && writeln!(out, "{line}").is_err() {
            broken_pipe = true;
        }
    });
    let _ = out.flush();
    match r {
        Ok(s) => {
            eprintln!(
                "{}: {} events, {} row events, {} rows, read to position {}",
                file.display(),
                s.events,
                s.row_events,
                s.rows,
                s.end_pos
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
