//! The docs checked against the code, without any service: the metrics table of
//! docs/operating.md names exactly the metrics `src/telemetry.rs` declares, its alerts table
//! exactly the alerts of the rule files under deploy/, the README stays a short front door
//! whose Quick start holds its two commands, and every relative link of README.md and
//! docs/*.md points at a file that exists.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The repository root: the root package's manifest folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every file under `dir`, at any depth, whose name ends with one of `endings`, sorted.
fn files_under(dir: &Path, endings: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display())) {
            let path = entry.unwrap_or_else(|e| panic!("listing {}: {e}", d.display())).path();
            let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            if path.is_dir() {
                dirs.push(path);
            } else if endings.iter().any(|e| name.ends_with(e)) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The first column of the markdown table rows `` | `NAME` | ... `` of `text` whose name starts
/// with `prefix`.
fn table_names(text: &str, prefix: &str) -> BTreeSet<String> {
    let rows = text.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|rest| rest.split('`').next());
    rows.filter(|name| name.starts_with(prefix)).map(str::to_string).collect()
}

/// Where binval declares its metric names: `src/telemetry.rs`, and the files of
/// `src/telemetry/` should it become a folder.
fn telemetry_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let file = root().join("src/telemetry.rs");
    if file.is_file() {
        files.push(file);
    }
    let dir = root().join("src/telemetry");
    if dir.is_dir() {
        files.extend(files_under(&dir, &[".rs"]));
    }
    assert!(!files.is_empty(), "neither src/telemetry.rs nor src/telemetry/ exists");
    files
}

/// The metric names declared as `pub const NAME: &str = "binval_...";`.
fn declared_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in telemetry_sources() {
        for line in read(&file).lines() {
            let value = line.trim().strip_prefix("pub const ").and_then(|rest| rest.split_once(": &str = \"")).map(|(_, v)| v);
            if let Some(name) = value.and_then(|v| v.split('"').next()).filter(|n| n.starts_with("binval_")) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The alert names of the Prometheus rule files under deploy/ (`- alert: NAME`).
fn alert_rules() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in files_under(&root().join("deploy"), &[".yml", ".yaml"]) {
        for line in read(&file).lines() {
            let item = line.trim();
            let item = item.strip_prefix("- ").unwrap_or(item);
            if let Some(name) = item.strip_prefix("alert:") {
                names.insert(name.trim().trim_matches('"').to_string());
            }
        }
    }
    names
}

/// Panics naming what only one side of a comparison has.
fn assert_same(what: &str, code: &BTreeSet<String>, docs: &BTreeSet<String>) {
    assert!(!code.is_empty(), "{what}: nothing found in the code");
    let undocumented: Vec<&String> = code.difference(docs).collect();
    let unknown: Vec<&String> = docs.difference(code).collect();
    assert!(undocumented.is_empty() && unknown.is_empty(), "{what}: not in the docs {undocumented:?}, not in the code {unknown:?}");
}

#[test]
fn the_metrics_table_names_every_declared_metric() {
    let documented = table_names(&read(&root().join("docs/operating.md")), "binval_");
    assert_same("metrics of src/telemetry.rs against docs/operating.md", &declared_metrics(), &documented);
}

#[test]
fn the_alerts_table_names_every_alert_rule() {
    let documented = table_names(&read(&root().join("docs/operating.md")), "Binval");
    assert_same("alerts of deploy/ against docs/operating.md", &alert_rules(), &documented);
}

#[test]
fn the_readme_is_short_and_its_quick_start_has_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 220, "README.md has {} lines: keep it at most 220, the manual is docs/", lines.len());
    let start = lines.iter().position(|l| l.trim() == "## Quick start").expect("README.md has a `## Quick start` section");
    let section: Vec<&str> = lines[start + 1..].iter().copied().take_while(|l| !l.starts_with("## ")).collect();
    let open = section.iter().position(|l| l.starts_with("```")).expect("the Quick start section has a code block");
    let block = section[open + 1..].iter().copied().take_while(|l| !l.starts_with("```"));
    let commands: Vec<&str> = block.map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(commands, ["scripts/demo.sh", "scripts/test.sh"], "the Quick start code block holds exactly these two commands");
}

/// The targets of the inline links `[text](target)` of one markdown line, outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    let outside_code: String = line.split('`').step_by(2).collect();
    let mut targets = Vec::new();
    let mut rest = outside_code.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let target = rest.split(')').next().unwrap_or_default();
        targets.push(target.split_whitespace().next().unwrap_or_default().to_string());
    }
    targets
}

#[test]
fn every_relative_link_of_the_readme_and_docs_points_at_a_file() {
    let mut pages = vec![root().join("README.md")];
    for entry in fs::read_dir(root().join("docs")).expect("docs/ exists") {
        let path = entry.expect("listing docs/").path();
        if path.extension().is_some_and(|x| x == "md") {
            pages.push(path);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let mut in_code_block = false;
        for (n, line) in read(page).lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code_block = !in_code_block;
                continue;
            }
            if in_code_block {
                continue;
            }
            for target in link_targets(line) {
                if target.is_empty() || target.starts_with('#') || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let file = target.split('#').next().unwrap_or_default();
                checked += 1;
                if !page.parent().unwrap().join(file).exists() {
                    broken.push(format!("{}:{}: {target}", page.display(), n + 1));
                }
            }
        }
    }
    assert!(checked > 0, "no relative link found in README.md and docs/*.md");
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}
