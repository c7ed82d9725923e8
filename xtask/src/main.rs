//! meshd's developer tasks. `cargo xtask <task>`:
//!
//! - `test`: every test of the workspace (the README's test command).
//! - `demo`: the main job on an embedded default (no external services).
//! - `bench [NAME]`: benchmarks that print figures (`proxycfg`; all when no name is given).
#![allow(clippy::print_stdout)]

use anyhow::{Context, Result, bail};
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn run(mut cmd: Command) -> Result<()> {
    println!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// The benchmarks, by name: (package, bench target).
const BENCHES: &[(&str, &str, &str)] = &[("proxycfg", "proxycfg", "propagation")];

/// Totals of the `test result:` lines of a cargo test run.
#[derive(Debug, Default, PartialEq, Eq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds one `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(['.', ';']) {
            let mut words = part.split_whitespace();
            if let (Some(n), Some(what)) = (words.next(), words.next())
                && let Ok(n) = n.parse::<u64>()
            {
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        }
    }
}

fn test(extra: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--locked"])
        .args(extra)
        .stdout(Stdio::piped());
    println!("xtask: running {cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("could not start {cmd:?}"))?;
    let mut totals = Totals::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("reading cargo test output")?;
            println!("{line}");
            totals.add_line(&line);
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    // One closing line for the whole workspace, in the plain form CI reads.
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if !status.success() {
        bail!("cargo test failed with {status}");
    }
    if totals.passed == 0 {
        bail!("cargo test ran no test");
    }
    Ok(())
}

fn demo() -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--locked",
        "-p",
        "proxycfg",
        "--example",
        "walkthrough",
    ]);
    run(cmd)
}

fn bench(name: Option<&str>) -> Result<()> {
    let selected: Vec<_> = BENCHES
        .iter()
        .filter(|(n, _, _)| name.is_none_or(|want| want == *n))
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = BENCHES.iter().map(|(n, _, _)| *n).collect();
        bail!(
            "unknown benchmark {:?}: expected one of {}",
            name.unwrap_or_default(),
            names.join(", ")
        );
    }
    for (_, package, target) in selected {
        let mut cmd = cargo();
        cmd.args(["bench", "--locked", "-p", package, "--bench", target]);
        run(cmd)?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("demo") => demo(),
        Some("bench") => bench(args.get(1).map(String::as_str)),
        Some(other) => bail!("unknown task {other:?}: expected test, demo or bench"),
        None => bail!("usage: cargo xtask <test | demo | bench [NAME]>"),
    }
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_test_result_lines() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 19 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.68s");
        t.add_line("test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        t.add_line("running 4 tests");
        assert_eq!(
            t,
            Totals {
                passed: 22,
                failed: 1,
                ignored: 2
            }
        );
    }
}
