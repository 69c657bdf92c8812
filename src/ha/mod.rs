//! High availability and resumption: one active instance per source, and the position it
//! resumes from.
//!
//! | module | what |
//! |---|---|
//! | [`lease`] | the source's lease and the fencing token of each tenure |
//! | [`checkpoint`] | the resume position, saved only after both sinks acknowledged |
//! | [`checkpoint_task`] | the task that awaits each transaction's deliveries and saves the checkpoint |
//! | [`traces`] | what an earlier run left, looked for when no checkpoint is found |
//! | [`topic_marks`] | where an earlier run stopped, read back from the invalidation topic |

pub mod checkpoint;
pub mod checkpoint_task;
pub mod lease;
pub mod topic_marks;
pub mod traces;
