//! `binval decode`: a binlog file as JSON lines on stdout (the offline reader), with a summary
//! on stderr.

use std::process::ExitCode;

/// Decode `file` from `start` to `stop`; exit 1 with the file and position when it cannot be
/// read to the end, 2 for a bad range.
pub fn decode(file: &std::path::Path, start: Option<u64>, stop: Option<u64>) -> ExitCode {
    use std::io::Write;
    if let (Some(a), Some(b)) = (start, stop) {
        if b <= a {
            eprintln!("error: --stop {b} is not after --start {a}");
            return ExitCode::from(2);
        }
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut broken_pipe = false;
    let r = crate::binlog::offline::read_file(file, start, stop, |line| {
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
