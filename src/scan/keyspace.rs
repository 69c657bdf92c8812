//! The other direction of a table scan: from keys in Redis back to the mapping, template and
//! column values they were rendered from, and every logical key of a template found by `SCAN`.
//!
//! A key is the key of a template when it splits by the template's literal text
//! ([`KeyTemplate::split_key`]). Templates of different mappings may overlap (`item:{id}` also
//! matches `item:7:extra`): a key belongs to the matching template with the most literal text.
//!
//! `SCAN` per template: `MATCH <glob>:*` on every master (one pass per template, not one per
//! suffix); keys ending in `:ver` or `:r<digits>` give their logical key. `SCAN` visits the
//! whole keyspace of each master (Redis docs: `MATCH` filters after the keys are read), so a
//! reverse check costs a pass over every key in Redis per template.

use binval_protocol::KeyTemplate;

use crate::config::MappingConfig;
use crate::error::Error;
use crate::redis::RedisConn;

/// Which mapping and template a key belongs to, with the column texts it was rendered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner<'k> {
    /// Index into the resolver's mappings.
    pub mapping: usize,
    /// Index into that mapping's key templates.
    pub template: usize,
    /// `(column, text)` per placeholder.
    pub values: Vec<(String, &'k str)>,
}

/// The key templates of a set of mappings, for finding a key's owner.
pub struct KeyResolver {
    /// The mappings, as given.
    pub mappings: Vec<MappingConfig>,
    /// Parsed templates per mapping.
    pub templates: Vec<Vec<KeyTemplate>>,
}

impl KeyResolver {
    /// Templates of `mappings` (validated with the config, so they parse).
    pub fn new(mappings: &[MappingConfig]) -> Self {
        let templates = mappings.iter().map(|m| m.keys.iter().filter_map(|k| KeyTemplate::parse(k).ok()).collect()).collect();
        KeyResolver { mappings: mappings.to_vec(), templates }
    }

    /// The template `key` belongs to (module docs), if any.
    pub fn owner<'k>(&self, key: &'k str) -> Option<KeyOwner<'k>> {
        let mut best: Option<(usize, KeyOwner<'k>)> = None;
        for (m, ts) in self.templates.iter().enumerate() {
            for (t, tpl) in ts.iter().enumerate() {
                let Some(values) = tpl.split_key(key) else { continue };
                let specificity = tpl.literal_len();
                if best.as_ref().is_none_or(|(s, _)| specificity > *s) {
                    let values = values.into_iter().map(|(c, v)| (c.to_string(), v)).collect();
                    best = Some((specificity, KeyOwner { mapping: m, template: t, values }));
                }
            }
        }
        best.map(|(_, o)| o)
    }

    /// Hand every logical key of template `t` of mapping `m` found in Redis to `f`, a batch at
    /// a time (module docs; keys repeat: once per replica and token).
    pub async fn scan_template(&self, redis: &RedisConn, m: usize, t: usize, f: &mut (dyn FnMut(Vec<String>) + Send)) -> Result<(), Error> {
        let pattern = format!("{}:*", self.templates[m][t].glob());
        redis
            .scan_each(&pattern, &mut |batch| {
                let keys: Vec<String> = batch.into_iter().filter_map(|k| logical_key(&k).map(String::from)).collect();
                if !keys.is_empty() {
                    f(keys);
                }
            })
            .await
    }
}

/// The logical key of a version token (`K:ver`) or suffix replica (`K:r<digits>`).
pub fn logical_key(redis_key: &str) -> Option<&str> {
    if let Some(k) = redis_key.strip_suffix(":ver") {
        return Some(k);
    }
    let (k, suffix) = redis_key.rsplit_once(binval_protocol::REPLICA_SEPARATOR)?;
    (!suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit())).then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(table: &str, keys: &[&str]) -> MappingConfig {
        serde_json::from_value(serde_json::json!({"table": table, "keys": keys})).unwrap()
    }

    #[test]
    fn a_key_belongs_to_the_most_specific_template() {
        let r = KeyResolver::new(&[mapping("s.items", &["item:{id}"]), mapping("s.extra", &["item:{id}:extra", "x:{a}:{b}"])]);
        let o = r.owner("item:7").unwrap();
        assert_eq!((o.mapping, o.template, o.values), (0, 0, vec![("id".to_string(), "7")]));
        let o = r.owner("item:7:extra").unwrap();
        assert_eq!((o.mapping, o.template), (1, 0));
        assert_eq!(r.owner("x:1:2").unwrap().values, vec![("a".to_string(), "1"), ("b".to_string(), "2")]);
        assert_eq!(r.owner("other:1"), None);
    }

    #[test]
    fn logical_keys_of_tokens_and_replicas() {
        assert_eq!(logical_key("item:7:ver"), Some("item:7"));
        assert_eq!(logical_key("item:7:r12"), Some("item:7"));
        assert_eq!(logical_key("item:7:rx"), None);
        assert_eq!(logical_key("item:7:r"), None);
        assert_eq!(logical_key("item:7"), None);
    }
}
