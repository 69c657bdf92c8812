//! Collapsing the key changes of one apply group to one change per key (the last one wins, with
//! the right op when a key was deleted and inserted again).

use super::*;
use std::collections::HashMap;

use binval_protocol::Op;

/// Two passes over the rows of one statement: first the deletes of keys rows moved away from,
/// then everything else.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    MovedAway,
    Rest,
}

/// Keep only the last change of each key within one transaction (all of a transaction's
/// changes share its fence position, and only the state after the commit is ever visible to
/// readers). The kept change has the last op, except that a key inserted and then updated in
/// the same transaction stays an `insert`. Kept changes stay in the order of their last appearance.
pub fn collapse_per_key(changes: &mut Vec<KeyChange>) {
    collapse_per_key_with(changes, &mut Vec::<()>::new());
}

/// [`collapse_per_key`] over the changes of several transactions in commit order (a group,
/// see `write::apply`), keeping `tags[i]` (e.g. the change's transaction) with `changes[i]`
/// when `tags` is as long as `changes` (an empty `tags` is left alone). The newest change of
/// each key wins: writes are fenced and consumers evict by version, so the older ones need not
/// be written.
pub fn collapse_per_key_with<T>(changes: &mut Vec<KeyChange>, tags: &mut Vec<T>) {
    if changes.len() < 2 {
        return;
    }
    let (keep, first_insert): (Vec<bool>, Vec<bool>) = {
        let mut last: HashMap<&str, (usize, bool)> = HashMap::with_capacity(changes.len());
        for (i, c) in changes.iter().enumerate() {
            last.entry(c.key.as_str()).and_modify(|e| e.0 = i).or_insert((i, c.op == Op::Insert));
        }
        if last.len() == changes.len() {
            return;
        }
        let mut keep = vec![false; changes.len()];
        let mut first_insert = vec![false; changes.len()];
        for (i, ins) in last.into_values() {
            keep[i] = true;
            first_insert[i] = ins;
        }
        (keep, first_insert)
    };
    for (i, c) in changes.iter_mut().enumerate() {
        if keep[i] && first_insert[i] && c.op == Op::Update {
            c.op = Op::Insert;
        }
    }
    let mut i = 0;
    changes.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    if tags.len() == keep.len() {
        let mut i = 0;
        tags.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }
}
