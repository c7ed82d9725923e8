//! What a daemon's keeper tells: events for subscribers, reports for the manager's task.

use crate::process::ProcessId;

/// What happened to a daemon; sent to [`super::ManagerHandle::events`] subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonEvent {
    /// A process was started for the daemon (attempt counts from 1 since the last reset).
    Started {
        /// Proxy id.
        id: String,
        /// The new process.
        pid: u32,
        /// Attempt number.
        attempt: u32,
    },
    /// A running process from the snapshot was re-adopted without a restart.
    Adopted {
        /// Proxy id.
        id: String,
        /// The adopted process.
        pid: u32,
    },
    /// The daemon's process exited on its own (it will be restarted).
    Exited {
        /// Proxy id.
        id: String,
        /// The process that exited.
        pid: u32,
        /// How it ended (`exit status: 1`, `signal: 9 (SIGKILL)`), when known: an adopted
        /// process's exit status cannot be read.
        status: Option<String>,
    },
    /// The daemon could not be started (it will be retried with back-off).
    Failed {
        /// Proxy id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The daemon was stopped because it left the desired set or changed.
    Stopped {
        /// Proxy id.
        id: String,
    },
}

/// What a daemon's keeper tells the manager's task about the daemon's process.
pub(super) enum Report {
    Running { id: String, process: ProcessId },
    Gone { id: String },
}
