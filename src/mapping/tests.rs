use super::*;
use crate::binlog::decode::{Row, RowChange, RowKind};
use serde_json::json;

fn mapper(extra: &str) -> Mapper {
    let cfg = crate::config::Config::from_toml(&format!(
        r#"
[source]
url = "mysql://u:p@h:1"
server_id = 1
[redis]
mode = "standalone"
urls = ["redis://h:1"]
[kafka]
brokers = "h:1"
[[mappings]]
table = "shop.items"
keys = ["item:detail:{{id}}", "item:sku:{{sku}}"]
replicas = 4
{extra}
"#
    ))
    .unwrap();
    Mapper::new(&cfg.mappings).unwrap()
}

fn row(v: serde_json::Value) -> Row {
    v.as_object().unwrap().clone()
}

#[test]
fn a_non_unique_mapping_invalidates_instead_of_deleting() {
    let m = mapper("mode = \"invalidate\"\nallow_non_unique_keys = true");
    assert_eq!(m.key_rule("shop.items").map(|(i, t, a)| (i, t.len(), a)), Some((0, 2, true)));
    let (a, b) = (row(json!({"id": 1, "sku": "A"})), row(json!({"id": 1, "sku": "B"})));
    let change = |kind, before: Option<&Row>, after: Option<&Row>| RowChange {
        table: "shop.items".into(),
        kind,
        before: before.cloned(),
        after: after.cloned(),
        event: 0,
        json_columns: None,
    };
    let mut out = vec![];
    m.map_row(&change(RowKind::Delete, Some(&a), None), &mut out);
    m.map_row(&change(RowKind::Update, Some(&a), Some(&b)), &mut out);
    let got: Vec<(&str, Op, Option<&str>)> = out.iter().map(|c| (c.key.as_str(), c.op, c.payload.as_deref())).collect();
    // Another row may still render item:sku:A: a stale marker (update, no payload), not a
    // tombstone.
    assert_eq!(
        got,
        vec![
            ("item:detail:1", Op::Update, None),
            ("item:sku:A", Op::Update, None),
            ("item:sku:A", Op::Update, None),
            ("item:detail:1", Op::Update, None),
            ("item:sku:B", Op::Insert, None)
        ]
    );
    assert_eq!(mapper("").key_rule("shop.items").map(|(_, _, a)| a), Some(false));
}

#[test]
fn insert_update_delete() {
    let m = mapper("");
    assert!(m.is_mapped("shop", "items"));
    assert!(!m.is_mapped("shop", "other"));
    let mut out = vec![];
    let after = row(json!({"id": 1, "sku": "A", "price": "1.50"}));
    m.map_row(
        &RowChange {
            table: "shop.items".into(),
            kind: RowKind::Insert,
            before: None,
            after: Some(after.clone()),
            event: 0,
            json_columns: None,
        },
        &mut out,
    );
    assert_eq!(out.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), vec!["item:detail:1", "item:sku:A"]);
    assert!(out.iter().all(|c| c.op == Op::Insert && c.replicas == 4 && c.count == 4));
    assert_eq!(out[0].payload.as_deref(), Some(r#"{"id":1,"price":"1.50","sku":"A"}"#));

    out.clear();
    let after2 = row(json!({"id": 1, "sku": "B", "price": "2.00"}));
    m.map_row(
        &RowChange {
            table: "shop.items".into(),
            kind: RowKind::Update,
            before: Some(after.clone()),
            after: Some(after2),
            event: 0,
            json_columns: None,
        },
        &mut out,
    );
    let got: Vec<(String, Op)> = out.iter().map(|c| (c.key.clone(), c.op)).collect();
    assert_eq!(got, vec![("item:sku:A".into(), Op::Delete), ("item:detail:1".into(), Op::Update), ("item:sku:B".into(), Op::Insert)]);
    assert_eq!(out[0].payload, None);

    out.clear();
    m.map_row(
        &RowChange { table: "shop.items".into(), kind: RowKind::Delete, before: Some(after), after: None, event: 0, json_columns: None },
        &mut out,
    );
    assert!(out.iter().all(|c| c.op == Op::Delete && c.payload.is_none()));
}

#[test]
fn swapping_key_values_in_one_statement_keeps_both_keys() {
    let m = mapper("");
    let r = |id: i64, sku: &str| row(json!({"id": id, "sku": sku}));
    let rows = vec![
        RowChange {
            table: "shop.items".into(),
            kind: RowKind::Update,
            before: Some(r(1, "A")),
            after: Some(r(1, "B")),
            event: 0,
            json_columns: None,
        },
        RowChange {
            table: "shop.items".into(),
            kind: RowKind::Update,
            before: Some(r(2, "B")),
            after: Some(r(2, "A")),
            event: 0,
            json_columns: None,
        },
    ];
    let mut out = vec![];
    m.map_rows(&rows, &mut out);
    let sku: Vec<(String, Op)> = out.iter().filter(|c| c.key.starts_with("item:sku")).map(|c| (c.key.clone(), c.op)).collect();
    assert_eq!(
        sku,
        vec![
            ("item:sku:A".into(), Op::Delete),
            ("item:sku:B".into(), Op::Delete),
            ("item:sku:B".into(), Op::Insert),
            ("item:sku:A".into(), Op::Insert)
        ],
        "deletes first: both keys end up present"
    );
    // Across statements, order is kept as committed.
    let mut rows = rows;
    rows[1].event = 1;
    out.clear();
    m.map_rows(&rows, &mut out);
    let last_a = out.iter().rposition(|c| c.key == "item:sku:A").unwrap();
    assert_eq!(out[last_a].op, Op::Insert);
}

#[test]
fn payload_columns_and_invalidate_mode() {
    let m = mapper("payload = [\"price\"]");
    let mut out = vec![];
    m.map_row(
        &RowChange {
            table: "shop.items".into(),
            kind: RowKind::Insert,
            before: None,
            after: Some(row(json!({"id": 1, "sku": null, "price": "1.50"}))),
            event: 0,
            json_columns: None,
        },
        &mut out,
    );
    assert_eq!(out.len(), 1, "NULL sku renders no key");
    assert_eq!(out[0].payload.as_deref(), Some(r#"{"price":"1.50"}"#));
    let m = mapper("mode = \"invalidate\"");
    out.clear();
    m.map_row(
        &RowChange {
            table: "shop.items".into(),
            kind: RowKind::Insert,
            before: None,
            after: Some(row(json!({"id": 1, "sku": "A"}))),
            event: 0,
            json_columns: None,
        },
        &mut out,
    );
    assert!(out.iter().all(|c| c.payload.is_none()));
}

fn two_mappings() -> Mapper {
    let mut m = mapper("");
    let extra = Mapper::new(
        &crate::config::Config::from_toml(
            "[source]\nurl = \"mysql://u:p@h:1\"\nserver_id = 1\n[redis]\nmode = \"standalone\"\nurls = [\"redis://h:1\"]\n[kafka]\nbrokers = \"h:1\"\n[[mappings]]\ntable = \"shop.items_new\"\nkeys = [\"n:{id}\"]\n",
        )
        .unwrap()
        .mappings,
    )
    .unwrap();
    m.rules.extend(extra.rules);
    m
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn renames_follow_the_table_unless_the_name_gets_another() {
    let m = two_mappings();
    let mut n = TableNames::default();
    // A plain rename: followed, and back again.
    let o = n.rename_statement(&m, &pairs(&[("shop.items", "shop.goods")])).unwrap();
    assert_eq!(o.followed, vec![("shop.items".into(), "shop.items".into(), "shop.goods".into())]);
    assert_eq!(n.resolve(&m, "shop.goods").as_deref(), Some("shop.items"));
    assert_eq!(n.resolve(&m, "shop.items"), None);
    n.rename_statement(&m, &pairs(&[("shop.goods", "shop.items")])).unwrap();
    assert_eq!(n, TableNames::default(), "back to the configured names");
    // A swap through a temporary name: both stay with their names, both stale.
    let o = n
        .rename_statement(&m, &pairs(&[("shop.items", "shop.tmp"), ("shop.items_new", "shop.items"), ("shop.tmp", "shop.items_new")]))
        .unwrap();
    assert_eq!((o.followed.len(), o.stale), (0, vec!["shop.items".to_string(), "shop.items_new".to_string()]));
    assert_eq!(n, TableNames::default());
    // A table renamed away and back in one statement: nothing changes.
    let o = n.rename_statement(&m, &pairs(&[("shop.items", "shop.t"), ("shop.t", "shop.items")])).unwrap();
    assert_eq!(o, RenameOutcome::default());
    // The cut-over onto another mapping's name: refused, nothing changed.
    let e = n.rename_statement(&m, &pairs(&[("shop.items", "shop.items_old"), ("shop.items_new", "shop.items")])).unwrap_err();
    assert_eq!(
        e,
        RenameConflict {
            mapping: "shop.items_new".into(),
            table: "shop.items_new".into(),
            onto: "shop.items".into(),
            other: "shop.items".into()
        }
    );
    assert_eq!(n, TableNames::default());
    // With only one of them mapped, the cut-over keeps the mapping with the name.
    let m1 = mapper("");
    let o = n.rename_statement(&m1, &pairs(&[("shop.items", "shop.items_old"), ("shop.items_new", "shop.items")])).unwrap();
    assert_eq!((o.followed.len(), o.stale), (0, vec!["shop.items".to_string()]));
    assert_eq!(n.resolve(&m1, "shop.items_old"), None);
}

fn ch(key: &str, op: Op, payload: Option<&str>) -> KeyChange {
    KeyChange {
        key: key.into(),
        op,
        table: std::sync::Arc::from("db.t"),
        payload: payload.map(String::from),
        replicas: 1,
        count: 1,
        ttl_secs: 0,
    }
}

#[test]
fn one_change_per_key_per_transaction_the_state_after_commit() {
    let mut v = vec![
        ch("a", Op::Insert, Some("1")),
        ch("b", Op::Update, Some("x")),
        ch("a", Op::Update, Some("2")),
        ch("c", Op::Update, Some("y")),
        ch("c", Op::Delete, None),
        ch("a", Op::Update, Some("3")),
    ];
    collapse_per_key(&mut v);
    let got: Vec<(&str, Op, Option<&str>)> = v.iter().map(|c| (c.key.as_str(), c.op, c.payload.as_deref())).collect();
    assert_eq!(got, vec![("b", Op::Update, Some("x")), ("c", Op::Delete, None), ("a", Op::Insert, Some("3"))]);
}
