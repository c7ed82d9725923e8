//! `cargo xtask stress [N]`: the whole suite N times (default 5) on a loaded machine, to
//! shake out tests that only pass when the machine is fast.
//!
//! Burner threads (one per core, or `STRESS_BURNERS`) keep every core busy for the whole
//! run, so each test competes for CPU with something as greedy as a parallel build. Each
//! run's output goes to `target/stress/run-K.log`; at the end every test that failed at
//! least once is printed with how often and its first failure, with the load average
//! sampled during the runs and any process of ours (meshd, Envoy, etcd) a run left behind.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::command::{cargo, run, workspace_root};
use crate::suite::run_suite;
use crate::tools;

/// How many lines of a failure the report keeps.
const FAILURE_LINES: usize = 12;

/// Runs the suite `runs` times under load and reports every failing test.
pub(crate) fn stress(runs: Option<&str>) -> Result<()> {
    let runs: u32 = match runs {
        None => 5,
        Some(n) => n
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| format!("stress: {n:?} is not a positive number of runs"))?,
    };
    let root = workspace_root();
    let (python, peers) = tools::Peers::install(&root)?;
    // Built once before the load starts: the runs time tests, not compilation.
    let mut build = cargo();
    build.args(["test", "--workspace", "--locked", "--no-run"]);
    run(build)?;
    let mut build = cargo();
    build.args(["build", "--locked", "-p", "meshd"]);
    run(build)?;

    let logs = root.join("target").join("stress");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let load = Load::start(burners()?);
    let mut report = Report::default();
    for run in 1..=runs {
        let started = Instant::now();
        let path = logs.join(format!("run-{run}.log"));
        let mut log = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut failures = FailureParser::default();
        let suite = run_suite(&python, &peers, &[], Some(&mut log), |line| failures.line(line))?;
        let found = failures.finish();
        let leftovers = leftover_processes(&root, &peers);
        println!(
            "stress: run {run}/{runs}: {} passed, {} failed in {:.0?} (load {}); log {}",
            suite.totals.passed,
            suite.totals.failed,
            started.elapsed(),
            load.latest(),
            path.display()
        );
        for (name, text) in &found {
            println!("stress:   FAILED {name}");
            report.add(name, run, text);
        }
        if found.is_empty() && !suite.failures.is_empty() {
            // A runner failed without naming a test (a build error, a crashed binary).
            report.add(&format!("({})", suite.failures.join(", ")), run, "see the log");
        }
        for process in leftovers {
            println!("stress:   left running: {process}");
            report.leftovers.push(format!("run {run}: {process}"));
        }
    }
    let samples = load.stop();
    report.print(runs, &samples);
    if !report.failed.is_empty() || !report.leftovers.is_empty() {
        bail!("stress: {} test(s) failed at least once", report.failed.len());
    }
    Ok(())
}

/// How many burner threads: `STRESS_BURNERS`, or one per core.
fn burners() -> Result<usize> {
    match std::env::var("STRESS_BURNERS") {
        Ok(n) => n
            .parse()
            .with_context(|| format!("STRESS_BURNERS={n:?} is not a number")),
        Err(_) => Ok(std::thread::available_parallelism().map_or(2, usize::from)),
    }
}

/// The load: burner threads and a sampler of the 1-minute load average.
struct Load {
    stop: Arc<AtomicBool>,
    stop_sampler: std::sync::mpsc::Sender<()>,
    threads: Vec<JoinHandle<()>>,
    sampler: JoinHandle<Vec<f64>>,
    /// The latest sample, as `f64` bits.
    latest: Arc<AtomicU64>,
}

impl Load {
    fn start(burners: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..burners)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || burn(&stop))
            })
            .collect();
        println!("stress: {burners} burner thread(s) keep the cores busy");
        let latest = Arc::new(AtomicU64::new(0));
        let (stop_sampler, stopped) = std::sync::mpsc::channel::<()>();
        let sampler = {
            let latest = Arc::clone(&latest);
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                loop {
                    if let Some(one) = load_average() {
                        latest.store(one.to_bits(), Ordering::Relaxed);
                        samples.push(one);
                    }
                    // A sample every 5 s, until told to stop (or the sender is gone).
                    match stopped.recv_timeout(Duration::from_secs(5)) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return samples,
                    }
                }
            })
        };
        Self {
            stop,
            stop_sampler,
            threads,
            sampler,
            latest,
        }
    }

    fn latest(&self) -> String {
        format!("{:.2}", f64::from_bits(self.latest.load(Ordering::Relaxed)))
    }

    /// Stops the burners and the sampler; returns the load samples.
    fn stop(self) -> Vec<f64> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stop_sampler.send(());
        for t in self.threads {
            let _ = t.join();
        }
        self.sampler.join().unwrap_or_default()
    }
}

/// Keeps one core busy until `stop`.
fn burn(stop: &AtomicBool) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
    }
}

/// The 1-minute load average from `/proc/loadavg`.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Collects failing tests and their failure text from both runners' output.
#[derive(Default)]
struct FailureParser {
    /// Test names from `test NAME ... FAILED` lines, in order.
    failed: Vec<String>,
    /// Text of each `---- NAME stdout ----` block.
    blocks: BTreeMap<String, Vec<String>>,
    current: Option<String>,
}

impl FailureParser {
    fn line(&mut self, line: &str) {
        if let Some(name) = line.strip_prefix("test ").and_then(|l| l.strip_suffix(" ... FAILED")) {
            self.failed.push(name.to_owned());
            return;
        }
        if let Some(name) = line.strip_prefix("---- ").and_then(|l| l.strip_suffix(" stdout ----")) {
            self.current = Some(name.to_owned());
            return;
        }
        // The backtrace says where in the runtime the panic went through, not why.
        if line == "failures:" || line.starts_with("test result:") || line.starts_with("stack backtrace:") {
            self.current = None;
            return;
        }
        // pytest's short summary: `FAILED tests/py/x.py::test - reason` (or ERROR).
        for prefix in ["FAILED ", "ERROR "] {
            if let Some(rest) = line.strip_prefix(prefix)
                && rest.starts_with("tests/")
            {
                let (name, reason) = rest.split_once(" - ").unwrap_or((rest, ""));
                self.failed.push(name.to_owned());
                self.blocks.entry(name.to_owned()).or_default().push(reason.to_owned());
                return;
            }
        }
        if let Some(name) = &self.current {
            let block = self.blocks.entry(name.clone()).or_default();
            if block.len() < FAILURE_LINES && !line.trim().is_empty() {
                block.push(line.to_owned());
            }
        }
    }

    /// Each failed test with its failure text.
    fn finish(self) -> Vec<(String, String)> {
        let mut blocks = self.blocks;
        self.failed
            .into_iter()
            .map(|name| {
                let text = blocks.remove(&name).unwrap_or_default().join("\n");
                (name, text)
            })
            .collect()
    }
}

/// Every failure over the runs.
#[derive(Default)]
struct Report {
    /// Test name -> (runs it failed in, its first failure).
    failed: BTreeMap<String, (Vec<u32>, String)>,
    leftovers: Vec<String>,
}

impl Report {
    fn add(&mut self, name: &str, run: u32, text: &str) {
        let entry = self
            .failed
            .entry(name.to_owned())
            .or_insert_with(|| (Vec::new(), text.to_owned()));
        entry.0.push(run);
    }

    fn print(&self, runs: u32, samples: &[f64]) {
        println!();
        if samples.is_empty() {
            println!("stress: load average: no samples");
        } else {
            let max = samples.iter().copied().fold(f64::MIN, f64::max);
            let min = samples.iter().copied().fold(f64::MAX, f64::min);
            let mean = samples.iter().sum::<f64>() / samples.len() as f64;
            println!(
                "stress: 1-minute load average over {} samples: min {min:.2}, mean {mean:.2}, max {max:.2} ({} cores)",
                samples.len(),
                std::thread::available_parallelism().map_or(0, usize::from)
            );
        }
        if self.failed.is_empty() {
            println!("stress: {runs} run(s), no test failed");
        }
        for (name, (in_runs, text)) in &self.failed {
            println!("stress: {name} failed in run(s) {in_runs:?} of {runs}:");
            for line in text.lines() {
                println!("stress:     {line}");
            }
        }
        for leftover in &self.leftovers {
            println!("stress: left running after {leftover}");
        }
    }
}

/// Processes of ours still running after a run: the meshd binaries of this workspace, and
/// the pinned Envoy and etcd. A test that leaks one is as broken as one that fails.
fn leftover_processes(root: &Path, peers: &tools::Peers) -> Vec<String> {
    // Processes a test started get a moment to finish exiting after their owner's drop (no
    // runtime here: xtask is plain threads).
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(Duration::from_secs(2));
    // Canonical, as `/proc/PID/exe` reads (a `.tools` may be a link to another checkout's).
    let ours: Vec<PathBuf> = [
        root.join("target").join("debug"),
        peers.envoy.clone(),
        peers.etcd.clone(),
    ]
    .into_iter()
    .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
    .collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        if ours.iter().any(|p| exe.starts_with(p)) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("pid {pid}: {}", cmdline.trim()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_tests_are_named_with_their_panic() {
        let mut p = FailureParser::default();
        for line in [
            "test a::ok ... ok",
            "test tls::refuses ... FAILED",
            "failures:",
            "",
            "---- tls::refuses stdout ----",
            "thread 'tls::refuses' panicked at crates/meshd/tests/tls_e2e.rs:136:5:",
            "assertion `left == right` failed",
            "failures:",
            "    tls::refuses",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "FAILED tests/py/test_acl.py::test_bootstrap - AssertionError: 403",
        ] {
            p.line(line);
        }
        let found = p.finish();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "tls::refuses");
        assert!(found[0].1.contains("tls_e2e.rs:136"), "{}", found[0].1);
        assert!(!found[0].1.contains("    tls::refuses"), "{}", found[0].1);
        assert_eq!(
            found[1],
            (
                "tests/py/test_acl.py::test_bootstrap".to_owned(),
                "AssertionError: 403".to_owned()
            )
        );
    }
}
