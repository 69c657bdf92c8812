//! The human table of `binval inspect`.
//!
//! ```text
//! key            item:detail:6666 (shop.items, template item:detail:{id}, write-through, 4 replicas)
//! version token  item:detail:6666:ver = 5531  slot 1017  master 10.0.0.1:7000 (10.0.0.4:7003)  ttl none
//! replica               slot  master (replicas)              position  fencing token  payload   ttl  state
//! item:detail:6666:r0   9213  10.0.0.2:7001 (10.0.0.5:7004)      5531  1733050215093    231 B  none  ok
//! ...
//! agreement      yes: every replica holds position 5531 and the row's payload; the token is 5531
//! row            {"id":6666,"price":"9.90",...} (read at mysql-bin.000042:91234)
//! ```

use std::fmt::Write as _;

use super::{Inspection, KeyReport, NodeReport};

/// The whole inspection as text.
pub fn table(ins: &Inspection) -> String {
    let mut out = String::new();
    for k in &ins.keys {
        key(&mut out, k);
        out.push('\n');
    }
    match &ins.row {
        Some(r) => {
            let _ = writeln!(out, "row            {} (read at {})", r, ins.row_source);
        }
        None => {
            let _ = writeln!(
                out,
                "row            none ({})",
                if ins.row_source.starts_with("not read") {
                    ins.row_source.clone()
                } else {
                    format!("no row maps to the key at {}", ins.row_source)
                }
            );
        }
    }
    out
}

fn key(out: &mut String, k: &KeyReport) {
    let _ = writeln!(out, "key            {} ({}, template {}, {}, {} replicas)", k.key, k.table, k.template, k.mode, k.replica_count);
    if k.replica_setting.contains("..") {
        let why = k.replica_count_why.as_deref().unwrap_or("at the mapping's min: no fleet read rate above the budget");
        let _ = writeln!(out, "replica count  {} of {} (adaptive): {why}", k.replica_count, k.replica_setting);
    }
    let v = &k.version;
    let _ = writeln!(
        out,
        "version token  {} = {}  slot {}  master {}  ttl {}",
        v.name,
        v.position.map(|p| p.to_string()).unwrap_or_else(|| "(none)".into()),
        v.slot,
        node(v),
        ttl(v)
    );
    let _ = writeln!(
        out,
        "{:<w$}  {:>5}  {:<32}  {:>20}  {:>15}  {:>9}  {:>9}  state",
        "replica",
        "slot",
        "master (replicas)",
        "position",
        "fencing token",
        "payload",
        "ttl",
        w = name_width(k)
    );
    for r in &k.replicas {
        let state = if !r.exists {
            "missing"
        } else if r.tombstone {
            "tombstone"
        } else if r.payload_bytes.is_none() {
            "no payload"
        } else {
            "ok"
        };
        let _ = writeln!(
            out,
            "{:<w$}  {:>5}  {:<32}  {:>20}  {:>15}  {:>9}  {:>9}  {state}",
            r.name,
            r.slot,
            node(r),
            r.position.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            r.fencing_token.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            r.payload_bytes.map(|b| format!("{b} B")).unwrap_or_else(|| "-".into()),
            ttl(r),
            w = name_width(k)
        );
    }
    if k.agree {
        let positions: Vec<u64> = k.replicas.iter().filter_map(|r| r.position).collect();
        let one = positions.first().filter(|p| positions.iter().all(|x| x == *p));
        let _ = writeln!(
            out,
            "agreement      yes{}",
            match one {
                Some(p) => format!(
                    ": the replicas present hold position {p}; the token is {}",
                    k.version.position.map(|v| v.to_string()).unwrap_or_else(|| "(none)".into())
                ),
                None => String::new(),
            }
        );
    } else {
        let _ = writeln!(out, "agreement      NO");
        for f in &k.findings {
            let at = f.replica.map(|r| format!("r{r}")).unwrap_or_else(|| "ver".into());
            let fields = if f.fields.is_empty() { String::new() } else { format!(" (fields {})", f.fields.join(", ")) };
            let _ = writeln!(out, "  {:<7} {at}: {}{fields}", f.kind.as_str(), f.detail);
        }
    }
}

fn name_width(k: &KeyReport) -> usize {
    k.replicas.iter().map(|r| r.name.len()).max().unwrap_or(7).max(7)
}

/// The master serving a key's slot, with its Redis replicas in parentheses.
fn node(n: &NodeReport) -> String {
    match &n.node {
        Some(o) if o.replicas.is_empty() => o.master.clone(),
        Some(o) => format!("{} ({})", o.master, o.replicas.join(", ")),
        None => "(no master serves the slot)".into(),
    }
}

fn ttl(n: &NodeReport) -> String {
    match (n.exists, n.ttl_ms) {
        (false, _) => "-".into(),
        (true, None) => "none".into(),
        (true, Some(ms)) => format!("{:.1} s", ms as f64 / 1000.0),
    }
}
