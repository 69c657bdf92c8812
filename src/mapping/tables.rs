//! [`TableNames`]: the tables a mapping names, as the source calls them now (after renames), and
//! what following a rename found.

use super::*;
use std::collections::HashMap;

/// Renamed mapped tables, followed as the binlog goes: current `schema.table` -> the
/// configured name whose rule applies (`Some`), or `None` for a configured name that was renamed
/// away (no longer mapped under that name). Saved in the checkpoint, so a restart after a
/// RENAME keeps following it; a restart before it replays the RENAME and follows it again.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct TableNames(pub std::collections::BTreeMap<String, Option<String>>);

impl TableNames {
    /// The configured table whose rule applies to live table `name`, if any.
    pub fn resolve(&self, mapper: &Mapper, name: &str) -> Option<String> {
        match self.0.get(name) {
            Some(v) => v.clone(),
            None => mapper.rules.contains_key(name).then(|| name.to_string()),
        }
    }

    /// The live name of the table configured as `configured`: the table a RENAME moved its
    /// rule to, else `configured` itself unless it was renamed away (`None`).
    ///
    /// ```
    /// use binval::mapping::TableNames;
    /// let mut n = TableNames::default();
    /// n.0.insert("shop.goods".into(), Some("shop.items".into()));
    /// n.0.insert("shop.items".into(), None);
    /// assert_eq!(n.live_name("shop.items").as_deref(), Some("shop.goods"));
    /// assert_eq!(n.live_name("shop.tags").as_deref(), Some("shop.tags"));
    /// ```
    pub fn live_name(&self, configured: &str) -> Option<String> {
        let moved = self.0.iter().find(|(_, v)| v.as_deref() == Some(configured)).map(|(k, _)| k.clone());
        moved.or_else(|| (!self.0.contains_key(configured)).then(|| configured.to_string()))
    }

    /// Where each mapping's rule applies now: configured name -> live name (`None`: no table
    /// is mapped by it, e.g. after an older version left it so).
    fn locations(&self, mapper: &Mapper) -> HashMap<String, Option<String>> {
        let mut at: HashMap<String, Option<String>> = HashMap::new();
        for cfg in mapper.rules.keys() {
            at.insert(cfg.clone(), self.live_name(cfg));
        }
        at
    }

    /// The state for the locations `at` (configured name -> live name), in its canonical form:
    /// an entry for each rule applying under another name, and `None` for each configured name
    /// its own rule does not apply to (and no other does).
    fn from_locations(at: &HashMap<String, Option<String>>) -> Self {
        let mut m = std::collections::BTreeMap::new();
        for (cfg, live) in at {
            if let Some(l) = live {
                if l != cfg {
                    m.insert(l.clone(), Some(cfg.clone()));
                }
            }
        }
        for (cfg, live) in at {
            if live.as_deref() != Some(cfg.as_str()) {
                m.entry(cfg.clone()).or_insert(None);
            }
        }
        TableNames(m)
    }

    /// The live `schema.table` names some mapping applies to now.
    pub fn live_names(&self, mapper: &Mapper) -> Vec<String> {
        let mut v: Vec<String> = self.locations(mapper).into_values().flatten().collect();
        v.sort();
        v
    }

    /// Follow one RENAME statement: `pairs` are its `(from, to)` renames, applied in order as
    /// MySQL/MariaDB do (atomically: the statement is judged as a whole). Per mapping whose
    /// table is named in the statement:
    ///
    /// * its name ends up holding a *different* table (an online schema change cut-over
    ///   `RENAME TABLE t TO t_old, t_new TO t`, or a swap of two tables): the mapping stays with
    ///   the name, and since the rows under it are others now, every key of it is stale
    ///   ([`RenameOutcome::stale`]);
    /// * its name is left empty: the mapping follows its table to the table's new name (rows and
    ///   keys are unchanged, [`RenameOutcome::followed`]);
    /// * its table comes back to its name: nothing changes.
    ///
    /// A mapping that would follow its table onto a name where another mapping applies is a
    /// [`RenameConflict`]: two mappings on one table would mix their keys, and which one the
    /// operator means is not in the binlog. Nothing is changed then.
    pub fn rename_statement(&mut self, mapper: &Mapper, pairs: &[(String, String)]) -> Result<RenameOutcome, RenameConflict> {
        // Which table (by its name before the statement) each name holds after it; a name not
        // in `holds` keeps its own table, `None` is a name left empty.
        let mut holds: HashMap<&str, Option<&str>> = HashMap::new();
        for (from, to) in pairs {
            let table = holds.get(from.as_str()).copied().unwrap_or(Some(from.as_str()));
            holds.insert(from.as_str(), None);
            holds.insert(to.as_str(), table);
        }
        let final_name = |table: &str| holds.iter().find(|(_, t)| **t == Some(table)).map(|(n, _)| n.to_string());
        let mut at = self.locations(mapper);
        let mut out = RenameOutcome::default();
        for (cfg, live) in at.iter_mut() {
            let Some(name) = live.clone() else { continue };
            let Some(held) = holds.get(name.as_str()) else { continue };
            match held {
                Some(t) if *t == name => {}
                Some(_) => out.stale.push(cfg.clone()),
                None => {
                    if let Some(to) = final_name(&name) {
                        out.followed.push((cfg.clone(), name.clone(), to.clone()));
                        *live = Some(to);
                    }
                }
            }
        }
        for (cfg, from, to) in &out.followed {
            if let Some((other, _)) = at.iter().find(|(c, l)| *c != cfg && l.as_deref() == Some(to.as_str())) {
                return Err(RenameConflict { mapping: cfg.clone(), table: from.clone(), onto: to.clone(), other: other.clone() });
            }
        }
        out.stale.sort();
        out.followed.sort();
        *self = Self::from_locations(&at);
        Ok(out)
    }
}

/// What one RENAME statement did to the mappings ([`TableNames::rename_statement`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RenameOutcome {
    /// `(configured name, from, to)`: mappings that follow their table to its new name.
    pub followed: Vec<(String, String, String)>,
    /// Configured names of mappings that stay with their name, which now holds another table:
    /// every key of them is stale.
    pub stale: Vec<String>,
}

/// A RENAME that would move the table of mapping `mapping` (live name `table`) onto `onto`,
/// where mapping `other` applies (see [`TableNames::rename_statement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameConflict {
    /// The configured name of the mapping whose table moves.
    pub mapping: String,
    /// That table's name before the statement.
    pub table: String,
    /// The name it moves to.
    pub onto: String,
    /// The configured name of the mapping that applies to `onto`.
    pub other: String,
}
