//! `[checkpoint]`: where the position binval resumes from is saved, and how often.

use std::path::PathBuf;

use serde::Deserialize;

use super::defaults::*;

/// Where the checkpoint lives.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointStore {
    /// Key `binval:{<source name>}:checkpoint` in the configured Redis (default).
    #[default]
    Redis,
    /// A JSON file at `checkpoint.path`, replaced atomically (write + rename).
    File,
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// `redis` (default) or `file`.
    #[serde(default)]
    pub store: CheckpointStore,
    /// File path for `store = "file"`.
    pub path: Option<PathBuf>,
    /// Save at most this often while events flow, ms. Default 1000.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Redis Cluster: on how many masters the checkpoint is kept (the key
    /// `binval:{<source name>}:checkpoint` beside the lease, plus copies under keys whose hash
    /// tags put them on other masters), so the loss of one master's data loses no checkpoint
    /// (`crate::ha::checkpoint`). 1 = no copies. Default 3 (at most the number of masters).
    /// Ignored on standalone Redis and for `store = "file"`.
    #[serde(default = "default_copies")]
    pub copies: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { store: CheckpointStore::Redis, path: None, interval_ms: default_interval_ms(), copies: default_copies() }
    }
}

pub(super) fn default_copies() -> usize {
    3
}
