//! High availability and resumption: one active instance per source, and the position it
//! resumes from.
//!
//! | module | what |
//! |---|---|
//! | [`lease`] | the source's lease and the fencing token of each tenure |
//! | [`checkpoint`] | the resume position, saved only after both sinks acknowledged |
//! | [`checkpoint_task`] | the task that awaits each transaction's deliveries and saves the checkpoint |

pub mod checkpoint;
pub mod checkpoint_task;
pub mod lease;
