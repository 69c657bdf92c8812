//! The docs checked against the code, without any service: the metrics table of
//! docs/operating.md names exactly the metrics `src/telemetry` declares, its alerts table
//! exactly the alerts of the rule files under deploy/; docs/cli.md names exactly the flags each
//! command's `--help` lists; docs/configuration.md's tables name exactly the keys of
//! `schemas/config.schema.json`, which holds every key of `config/binval.example.toml`; the
//! README stays a short front door whose Quick start holds its two commands, and every
//! relative link of README.md and docs/*.md points at a file that exists.

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

/// Where binval declares its metric names: the files of `src/telemetry/` (`names.rs`).
fn telemetry_sources() -> Vec<PathBuf> {
    let files = files_under(&root().join("src/telemetry"), &[".rs"]);
    assert!(!files.is_empty(), "src/telemetry/ holds no .rs file");
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
    assert_same("metrics of src/telemetry/names.rs against docs/operating.md", &declared_metrics(), &documented);
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

/// The `--long` flags named in `text` (`--dry-run`, `--from`...), without `--help`/`--version`.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 2..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-').collect();
        let word_start = before.is_none_or(|c| !c.is_alphanumeric() && c != '-');
        if word_start
            && name.len() > 1
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && !["help", "version"].contains(&name.as_str())
        {
            flags.insert(format!("--{}", name.trim_end_matches('-')));
        }
    }
    flags
}

/// `binval ARGS` run, its standard output.
fn binval(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_binval")).args(args).output().expect("binval runs");
    assert!(out.status.success(), "binval {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The sections `` ## `binval NAME` `` of docs/cli.md: name -> text.
fn cli_sections(doc: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in doc.lines() {
        if let Some(name) = line.strip_prefix("## `binval ").and_then(|r| r.strip_suffix('`')) {
            sections.push((name.to_string(), String::new()));
        } else if line.starts_with("## ") {
            sections.push((String::new(), String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    sections.retain(|(name, _)| !name.is_empty());
    sections
}

#[test]
fn the_cli_reference_names_every_flag_of_every_command() {
    let top = binval(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(commands.len() >= 9, "binval --help lists its commands: {commands:?}");
    let doc = read(&root().join("docs/cli.md"));
    let sections = cli_sections(&doc);
    let documented: Vec<&String> = sections.iter().map(|(n, _)| n).collect();
    assert_eq!(
        documented.iter().copied().collect::<BTreeSet<_>>(),
        commands.iter().collect::<BTreeSet<_>>(),
        "docs/cli.md has one `## `binval NAME`` section per command of `binval --help`"
    );
    // `--config` and `--log-format` are described once, above the sections.
    let shared: BTreeSet<String> = ["--config", "--log-format"].map(String::from).into();
    for (name, text) in &sections {
        let help: BTreeSet<String> = long_flags(&binval(&[name, "--help"])).difference(&shared).cloned().collect();
        let docs: BTreeSet<String> = long_flags(text).difference(&shared).cloned().collect();
        let (undocumented, unknown): (Vec<_>, Vec<_>) = (help.difference(&docs).collect(), docs.difference(&help).collect());
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "`binval {name}`: flags of --help not in docs/cli.md {undocumented:?}, flags in docs/cli.md --help lacks {unknown:?}"
        );
    }
}

/// The keys of each section of `schemas/config.schema.json`: `source`, `source.tls`,
/// `mappings`, ... -> key names (arrays of tables by their item's keys; `tls` by the shared
/// definition).
fn schema_sections() -> Vec<(String, BTreeSet<String>)> {
    let schema: serde_json::Value = serde_json::from_str(&read(&root().join("schemas/config.schema.json"))).expect("the schema is JSON");
    let tls: BTreeSet<String> = schema["$defs"]["tls"]["properties"].as_object().expect("$defs.tls").keys().cloned().collect();
    let mut out = Vec::new();
    for (section, v) in schema["properties"].as_object().expect("top-level properties") {
        let props = v.get("properties").or_else(|| v.get("items").and_then(|i| i.get("properties")));
        let Some(props) = props.and_then(|p| p.as_object()) else { continue };
        out.push((section.clone(), props.keys().cloned().collect()));
        for (key, sub) in props {
            if sub.get("$ref").and_then(|r| r.as_str()) == Some("#/$defs/tls") {
                out.push((format!("{section}.{key}"), tls.clone()));
            } else if let Some(nested) = sub.get("properties").or_else(|| sub.get("items").and_then(|i| i.get("properties"))) {
                out.push((format!("{section}.{key}"), nested.as_object().expect("properties").keys().cloned().collect()));
            }
        }
    }
    out
}

/// The key columns of the tables of docs/configuration.md, per heading: the heading's text
/// (`` ## `[source]` ``, `` ### `[kafka.sasl]` ``) -> the `` | `key` | `` rows under it.
fn config_doc_tables() -> Vec<(String, BTreeSet<String>)> {
    let doc = read(&root().join("docs/configuration.md"));
    let mut out: Vec<(String, BTreeSet<String>)> = Vec::new();
    for line in doc.lines() {
        if line.starts_with("## ") || line.starts_with("### ") {
            out.push((line.to_string(), BTreeSet::new()));
        } else if let (Some(name), Some((_, keys))) = (line.strip_prefix("| `").and_then(|r| r.split('`').next()), out.last_mut()) {
            keys.insert(name.to_string());
        }
    }
    out
}

#[test]
fn the_configuration_reference_names_every_key_of_the_schema() {
    let tables = config_doc_tables();
    let tls_heading = tables.iter().find(|(h, _)| h.starts_with("## TLS")).map(|(_, k)| k.clone()).expect("a TLS section");
    let mut checked = 0;
    for (section, keys) in schema_sections() {
        let documented = if section.ends_with(".tls") {
            tls_heading.clone()
        } else {
            let heading =
                [format!("## `[{section}]`"), format!("## `[[{section}]]`"), format!("### `[{section}]`"), format!("### `[[{section}]]`")];
            match tables.iter().find(|(h, _)| heading.contains(h)) {
                Some((_, k)) => k.clone(),
                // A nested table without a heading of its own (`kafka.sasl`, `adaptive.pin`):
                // its keys are described in its parent's section.
                None => continue,
            }
        };
        assert_same(&format!("keys of `{section}` in the schema against docs/configuration.md"), &keys, &documented);
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} sections compared");
}

#[test]
fn the_schema_holds_every_key_of_the_example_config() {
    let sections: std::collections::BTreeMap<String, BTreeSet<String>> = schema_sections().into_iter().collect();
    let example = read(&root().join("config/binval.example.toml"));
    let mut section = String::new();
    let mut unknown = Vec::new();
    for line in example.lines() {
        // Commented-out settings (`# key = value`, one space after the `#`) are keys too;
        // indented comment text is prose.
        let line = line.trim();
        let line = line.strip_prefix("# ").or_else(|| line.strip_prefix('#')).unwrap_or(line);
        if let Some(name) = line.strip_prefix('[').and_then(|r| r.split(']').next()) {
            section = name.trim_matches(['[', ']']).to_string();
            continue;
        }
        let Some((key, _)) = line.split_once(" = ") else { continue };
        if !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') || section == "kafka.properties" {
            continue;
        }
        if !sections.get(&section).is_some_and(|keys| keys.contains(key)) {
            unknown.push(format!("[{section}] {key}"));
        }
    }
    assert!(unknown.is_empty(), "config/binval.example.toml has keys schemas/config.schema.json lacks: {unknown:?}");
}
