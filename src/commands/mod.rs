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
//! | [`bootstrap`] | `binval bootstrap`: replicas and version tokens of existing rows, from a table scan |
//! | [`verify`] | `binval verify`: the database against the replicas and version tokens, measured in nines |
//! | [`inspect`] | `binval inspect`: one key in full: replicas, slots, masters, positions, the row it should hold |

pub mod bootstrap;
pub mod check;
pub mod decode;
pub mod inspect;
pub mod placement;
pub mod replay;
pub mod republish;
pub mod run;
pub mod status;
pub mod verify;

/// A flag that turns true at the first SIGINT or SIGTERM (logging `what`); a second signal
/// exits at once with code 130. For commands that stop after the unit of work in flight.
pub fn shutdown_signal(what: &'static str) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else { return };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::warn!("interrupted: {what}; signal again to exit at once");
        let _ = tx.send(true);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        std::process::exit(130);
    });
    rx
}
