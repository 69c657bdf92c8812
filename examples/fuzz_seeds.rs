//! Build the seed corpora of binval's cargo-fuzz targets (`scripts/fuzz.sh` runs this first):
//!
//! ```text
//! cargo run --example fuzz_seeds -- <out dir> <binlog dir> <repository root>
//! ```
//!
//! Writes `<out>/<target>/` for each target, from scratch:
//! - `binlog_file`: every file of `<binlog dir>` as it is;
//! - `binlog_events`: each binlog file cut by [`binval::fuzzing::binlog_event_seeds`] (the cut
//!   `tests/fuzz_corpus.rs` replays), named `<file>.<NNNN>`;
//! - `config`: `config/*` of the repository;
//! - `invalidation_message`: `fuzz/seeds/invalidation_message/*`;
//! - and into each target, its committed crash inputs `fuzz/regressions/<target>/*`, named
//!   `regression-<name>`.
//!
//! Prints the number of seeds per target. A missing binlog folder gives no binlog seeds; any
//! other I/O error ends the run with a message naming the path.

use std::fs;
use std::path::{Path, PathBuf};

const TARGETS: [&str; 4] = ["binlog_file", "binlog_events", "invalidation_message", "config"];

/// The files (not folders) of `dir`, sorted by name; none if `dir` does not exist.
fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    fs::copy(from, to).map(|_| ()).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))
}

fn name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn run(out: &Path, binlogs: &Path, root: &Path) -> Result<(), String> {
    if out.exists() {
        fs::remove_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    for t in TARGETS {
        fs::create_dir_all(out.join(t)).map_err(|e| format!("{}: {e}", out.join(t).display()))?;
    }
    for file in files(binlogs)? {
        let n = name(&file);
        copy(&file, &out.join("binlog_file").join(&n))?;
        let bytes = fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (i, seed) in binval::fuzzing::binlog_event_seeds(&bytes).into_iter().enumerate() {
            let to = out.join("binlog_events").join(format!("{n}.{i:04}"));
            fs::write(&to, seed).map_err(|e| format!("{}: {e}", to.display()))?;
        }
    }
    for file in files(&root.join("config"))? {
        copy(&file, &out.join("config").join(name(&file)))?;
    }
    for file in files(&root.join("fuzz/seeds/invalidation_message"))? {
        copy(&file, &out.join("invalidation_message").join(name(&file)))?;
    }
    for t in TARGETS {
        for file in files(&root.join("fuzz/regressions").join(t))? {
            let n = name(&file);
            if n != "README.md" && n != ".gitkeep" {
                copy(&file, &out.join(t).join(format!("regression-{n}")))?;
            }
        }
    }
    let mut sorted = TARGETS;
    sorted.sort();
    for t in sorted {
        println!("   {t}: {} seeds", files(&out.join(t))?.len());
    }
    Ok(())
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [out, binlogs, root] = args.as_slice() else {
        eprintln!("usage: fuzz_seeds <out dir> <binlog dir> <repository root>");
        std::process::exit(2);
    };
    if let Err(e) = run(out, binlogs, root) {
        eprintln!("fuzz_seeds: {e}");
        std::process::exit(1);
    }
}
