//! Process plumbing shared by the Envoy agent and the daemon manager: spawning a child whose
//! life is tied to its supervisor, identifying a process beyond its pid, waiting for a
//! process that is not our child, and stopping one politely then firmly.

use procfs::process::{ProcState, Process, Stat};
use rustix::process::{Pid, PidfdFlags, Signal};
use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::process::{Child, Command};

/// Spawns `cmd` so that the kernel kills the child (SIGKILL) when the supervisor dies, even
/// by `kill -9`: Envoy epochs never outlive the agent that owns them.
///
/// Linux delivers the parent-death signal when the *thread* that forked exits. Call this from
/// a runtime worker (any async context), never from `spawn_blocking`, whose idle threads exit.
pub fn spawn_tied(cmd: &mut Command) -> io::Result<Child> {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes two raw system
    // calls (prctl and getppid) through rustix: no allocation, no locks, async-signal-safe.
    // `pre_exec` has no safe equivalent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The supervisor may have died between fork and prctl: then no signal will come.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::other("supervisor exited during spawn"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A process identity that survives pid reuse: the pid plus the kernel's start time of the
/// process (clock ticks after boot, field 22 of `/proc/<pid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// Start time in clock ticks after boot.
    pub start_time: u64,
}

impl ProcessId {
    /// The identity of the live process `pid`, or `None` when no such process exists.
    pub fn of(pid: u32) -> Option<Self> {
        let stat = stat_of(pid)?;
        Some(Self {
            pid,
            start_time: stat.starttime,
        })
    }

    /// True when the process this identity names is still running (not a zombie, and not a
    /// different process that reused the pid).
    pub fn is_alive(&self) -> bool {
        stat_of(self.pid)
            .is_some_and(|stat| stat.starttime == self.start_time && !matches!(stat.state(), Ok(ProcState::Zombie)))
    }
}

/// `/proc/<pid>/stat`, or `None` when there is no such process (or it cannot be read).
fn stat_of(pid: u32) -> Option<Stat> {
    let pid = i32::try_from(pid).ok()?;
    Process::new(pid).ok()?.stat().ok()
}

/// Sends `signal` to `pid`. A process that is already gone is not an error.
pub fn signal(pid: u32, signal: Signal) -> io::Result<()> {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Err(io::Error::other(format!("invalid pid {pid}")));
    };
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Watches a process that is not our child (a re-adopted daemon) through a pidfd, which also
/// pins the identity: once opened, a reused pid cannot be confused with it.
pub struct Watched {
    fd: AsyncFd<OwnedFd>,
    id: ProcessId,
}

impl Watched {
    /// Opens a pidfd for `id`, checking after opening that the pid still is that process.
    pub fn open(id: ProcessId) -> io::Result<Self> {
        let pid = i32::try_from(id.pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::other(format!("invalid pid {}", id.pid)))?;
        let fd = rustix::process::pidfd_open(pid, PidfdFlags::NONBLOCK)?;
        if !id.is_alive() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "process is gone or pid was reused",
            ));
        }
        // SAFETY: `OwnedFd` owns the descriptor: it stays open, and names the same pidfd,
        // until the `AsyncFd` drops it, which is all `register` asks.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?;
        Ok(Self { fd, id })
    }

    /// The watched process.
    pub fn id(&self) -> ProcessId {
        self.id
    }

    /// Resolves when the process has exited.
    pub async fn exited(&self) {
        loop {
            match self.fd.readable().await {
                Ok(mut guard) => {
                    // A pidfd turns readable exactly when the process exits, and stays so.
                    guard.retain_ready();
                    return;
                }
                Err(_) => {
                    // Cannot poll the pidfd (should not happen): fall back to looking.
                    if !self.id.is_alive() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Stops our child: `first` (SIGINT or SIGTERM), up to `grace` for it to exit, then SIGKILL.
/// Returns once the child has been reaped.
pub async fn stop_child(child: &mut Child, first: Signal, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = signal(pid, first);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Stops a process we do not own: `first`, up to `grace`, then SIGKILL.
pub async fn stop_watched(w: &Watched, first: Signal, grace: Duration) {
    let _ = signal(w.id.pid, first);
    if tokio::time::timeout(grace, w.exited()).await.is_ok() {
        return;
    }
    if w.id.is_alive() {
        let _ = signal(w.id.pid, Signal::KILL);
    }
    w.exited().await;
}

/// Stops a child started with `std::process` from synchronous code (a `Drop`, a script):
/// SIGTERM, up to `grace` for it to exit, then SIGKILL; returns once it has been reaped.
pub fn terminate_blocking(child: &mut std::process::Child, grace: Duration) {
    let pid = child.id();
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = signal(pid, Signal::TERM);
    let (done, wait) = std::sync::mpsc::channel::<()>();
    // The watchdog owns the deadline; this thread blocks in wait().
    let span = tracing::info_span!("terminate_watchdog", pid);
    let watchdog = std::thread::spawn(move || {
        let _entered = span.enter();
        if wait.recv_timeout(grace).is_err() {
            let _ = signal(pid, Signal::KILL);
        }
    });
    let _ = child.wait();
    let _ = done.send(());
    let _ = watchdog.join();
}

/// Writes `bytes` to `path` atomically and durably (see the `atomic-file` crate).
pub use atomic_file::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = ProcessId::of(std::process::id()).unwrap();
        assert!(me.is_alive());
        let other = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.is_alive());
        assert!(ProcessId::of(u32::MAX / 2).is_none());
    }

    #[tokio::test]
    async fn an_exited_unreaped_child_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId::of(child.id()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while id.is_alive() {
            assert!(tokio::time::Instant::now() < deadline, "child never became a zombie");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Not reaped yet: the pid still names the same process, now a zombie.
        assert_eq!(ProcessId::of(child.id()), Some(id));
        child.wait().unwrap();
    }
}
