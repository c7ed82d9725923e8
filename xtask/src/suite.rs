//! The whole test suite, run once: every Rust test of the workspace, then the Python client
//! suites against the real binary, with their results counted.

use anyhow::{Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::command::{cargo, workspace_root};
use crate::tools;

/// Totals of the `test result:` lines of a cargo test run.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
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

impl Totals {
    /// Adds pytest's closing line (`===== 3 failed, 12 passed, 1 skipped in 4.2s =====`).
    fn add_pytest_line(&mut self, line: &str) {
        let line = line.trim().trim_matches('=').trim();
        if !line.contains(" in ") || !(line.contains("passed") || line.contains("failed") || line.contains("error")) {
            return;
        }
        let counts = line.rsplit_once(" in ").map_or(line, |(c, _)| c);
        for part in counts.split(',') {
            let mut words = part.split_whitespace();
            if let (Some(n), Some(what)) = (words.next(), words.next())
                && let Ok(n) = n.parse::<u64>()
            {
                match what {
                    "passed" => self.passed += n,
                    "failed" | "error" | "errors" => self.failed += n,
                    "skipped" => self.ignored += n,
                    _ => {}
                }
            }
        }
    }
}

/// Runs `cmd` and feeds each line of its stdout to `parse`; the lines are echoed, or only
/// written to `log` when one is given (the stress runs keep each run's output in a file).
fn run_and_parse(
    mut cmd: Command,
    mut log: Option<&mut std::fs::File>,
    mut parse: impl FnMut(&str),
) -> Result<std::process::ExitStatus> {
    use std::io::Write as _;
    cmd.stdout(Stdio::piped());
    match log.as_deref_mut() {
        Some(file) => {
            writeln!(file, "xtask: running {cmd:?}")?;
            cmd.stderr(file.try_clone()?);
        }
        None => println!("xtask: running {cmd:?}"),
    }
    let mut child = cmd.spawn().with_context(|| format!("could not start {cmd:?}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("reading test output")?;
            match log.as_deref_mut() {
                Some(file) => writeln!(file, "{line}")?,
                None => println!("{line}"),
            }
            parse(&line);
        }
    }
    child.wait().context("waiting for the tests")
}

/// What one run of the whole suite counted, and which parts failed.
#[derive(Debug, Default)]
pub(crate) struct SuiteRun {
    pub(crate) totals: Totals,
    pub(crate) failures: Vec<&'static str>,
    /// How long each stage took, in order.
    pub(crate) stages: Vec<(&'static str, std::time::Duration)>,
}

/// Runs the whole suite once: every Rust test of the workspace (with `extra` cargo
/// arguments), then the Python client suites against the real binary. Output is echoed, or
/// written to `log`; `on_line` sees every line of both runners' stdout.
pub(crate) fn run_suite(
    python: &Path,
    peers: &tools::Peers,
    extra: &[String],
    mut log: Option<&mut std::fs::File>,
    mut on_line: impl FnMut(&str),
) -> Result<SuiteRun> {
    let root = workspace_root();
    let mut run = SuiteRun::default();
    let binary = root.join("target").join("debug").join("meshd");
    let mut started = std::time::Instant::now();
    let mut stage = |run: &mut SuiteRun, name: &'static str| {
        run.stages.push((name, started.elapsed()));
        started = std::time::Instant::now();
    };
    // A whole-workspace run builds every test target (and the binary) first, then runs the
    // Python suites beside the Rust tests: cargo runs test binaries one after another, which
    // leaves the machine half idle. A filtered run keeps them one after the other.
    let beside = if extra.is_empty() {
        let mut build = cargo();
        build.args(["test", "--workspace", "--locked", "--no-run"]);
        crate::command::run(build)?;
        stage(&mut run, "build every test target");
        Some(spawn_pytest(python, peers, &binary)?)
    } else {
        None
    };
    let mut cmd = cargo();
    // Every test binary runs even when one fails: the summary counts them all.
    cmd.args(["test", "--workspace", "--locked", "--no-fail-fast"])
        .args(extra);
    peers.export(&mut cmd);
    let totals = &mut run.totals;
    if !run_and_parse(cmd, log.as_deref_mut(), |l| {
        totals.add_line(l);
        on_line(l);
    })?
    .success()
    {
        run.failures.push("cargo test");
    }
    stage(&mut run, "Rust tests");

    // The Python client suites run against the real binary.
    let before = run.totals.passed + run.totals.failed;
    let totals = &mut run.totals;
    let passed = match beside {
        Some(beside) => beside.finish(log, |l| {
            totals.add_pytest_line(l);
            on_line(l);
        })?,
        None => {
            // A filtered run may not have built the binary.
            if !binary.exists() {
                let mut build = cargo();
                build.args(["build", "--locked", "-p", "meshd"]);
                crate::command::run(build)?;
            }
            run_and_parse(pytest(python, peers, &binary), log, |l| {
                totals.add_pytest_line(l);
                on_line(l);
            })?
            .success()
        }
    };
    stage(&mut run, "Python suites (after the Rust tests, when beside them)");
    if !passed {
        run.failures.push("pytest");
    }
    if run.totals.passed + run.totals.failed == before {
        run.failures.push("pytest (no result line)");
    }
    Ok(run)
}

/// The Python client suites against `binary`.
fn pytest(python: &Path, peers: &tools::Peers, binary: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.current_dir(workspace_root())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/py"])
        .env("MESHD_BIN", binary);
    peers.export(&mut cmd);
    cmd
}

/// The Python suites running beside the Rust tests, their output kept in a file until the
/// Rust tests' is printed.
struct Beside {
    child: std::process::Child,
    output: std::path::PathBuf,
}

fn spawn_pytest(python: &Path, peers: &tools::Peers, binary: &Path) -> Result<Beside> {
    let output = workspace_root().join("target").join("xtask-pytest-output.txt");
    let file = std::fs::File::create(&output).with_context(|| format!("creating {}", output.display()))?;
    let mut cmd = pytest(python, peers, binary);
    cmd.stdout(file.try_clone()?).stderr(file);
    println!("xtask: running {cmd:?} beside the Rust tests");
    let child = cmd.spawn().with_context(|| format!("could not start {cmd:?}"))?;
    Ok(Beside { child, output })
}

impl Beside {
    /// Waits for the suites, then prints (or logs) their output, each line through `parse`;
    /// whether they passed.
    fn finish(mut self, mut log: Option<&mut std::fs::File>, mut parse: impl FnMut(&str)) -> Result<bool> {
        use std::io::Write as _;
        let status = self.child.wait().context("waiting for the Python suites")?;
        let text = std::fs::read_to_string(&self.output).context("reading the Python suites' output")?;
        for line in text.lines() {
            match log.as_deref_mut() {
                Some(file) => writeln!(file, "{line}")?,
                None => println!("{line}"),
            }
            parse(line);
        }
        Ok(status.success())
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
