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
