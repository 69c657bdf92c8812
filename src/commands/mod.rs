//! The subcommands of the `binval` binary, one module each (the CLI in `main.rs` only parses
//! arguments and dispatches here).
//!
//! | module | command |
//! |---|---|
//! | [`run`] | `binval run`: the pipeline under a signal handler |
//! | [`check`] | `binval check`: read-only preflight |
//! | [`placement`] | the placement report of `binval check`: how sampled keys' replicas spread over the masters |
//! | [`decode`] | `binval decode`: a binlog file as JSON lines |
//! | [`replay`] | `binval replay`: re-apply a binlog range through the fenced writes |
//! | [`republish`] | `binval republish`: publish a past range of invalidation events again |
//! | [`status`] | `binval status`: leader, positions, lag, checkpoint and lease holder of a source |

pub mod check;
pub mod decode;
pub mod placement;
pub mod replay;
pub mod republish;
pub mod run;
pub mod status;
