//! What benchmarks print: percentiles, milliseconds, sizes from the environment.

use std::time::Duration;

/// A setting from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p` quantile (0 to 1) of sorted durations (zero when empty).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Sets the CPUs every thread of process `pid` may run on (`taskset -a -p -c`), so a server
/// and its load generator each have a core of their own; false when that failed (no
/// `taskset`, say).
pub fn pin(pid: u32, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A duration as milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The resident set size of process `pid`, KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// Of that resident set: the anonymous pages (heap, stacks) and the file-backed ones (the
/// binary's code and read-only data, shared libraries), KiB.
pub fn rss_split_kib(pid: u32) -> (u64, u64) {
    (status_kib(pid, "RssAnon"), status_kib(pid, "RssFile"))
}

/// A `kB` field of `/proc/<pid>/status` (0 when it cannot be read).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `p50 … p99 … max …` of `durations` (sorted here), as the benches print a latency.
pub fn latency_summary(durations: &mut [Duration]) -> String {
    durations.sort();
    format!(
        "p50 {}  p99 {}  max {}",
        ms(percentile(durations, 0.5)),
        ms(percentile(durations, 0.99)),
        ms(durations.last().copied().unwrap_or_default())
    )
}

/// Where a benchmark's server keeps its catalog: a fresh data dir on this machine's disk,
/// every acknowledged write fsynced (what users run), unless `DEV=1` asks for memory
/// (`-dev`). The directory lives as long as this value.
#[derive(Debug)]
pub struct BenchStore {
    dir: Option<tempfile::TempDir>,
}

impl BenchStore {
    /// From the environment: `DEV=1` for `-dev`, else a fresh data dir.
    pub fn from_env() -> Self {
        let dev = std::env::var_os("DEV").is_some_and(|v| v == "1");
        Self {
            dir: (!dev).then(|| tempfile::tempdir().expect("a temporary data dir")),
        }
    }

    /// The server's arguments for this store: `-data-dir <dir>` or `-dev`.
    pub fn args(&self) -> Vec<String> {
        match &self.dir {
            Some(dir) => vec!["-data-dir".into(), dir.path().join("server").display().to_string()],
            None => vec!["-dev".into()],
        }
    }

    /// What the store is, for the bench's header line.
    pub fn describe(&self) -> &'static str {
        match self.dir {
            Some(_) => "server on a fresh data dir (durable; DEV=1 for -dev)",
            None => "server in memory (-dev, DEV=1)",
        }
    }
}
