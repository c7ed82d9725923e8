//! The whole test suite, run once: every Rust test of the workspace, then the Python client
//! suites against the real binary, with their results counted.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
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

/// One line to `log` when one is given, else to stdout.
fn echo(log: Option<&mut std::fs::File>, line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    match log {
        Some(file) => writeln!(file, "{line}"),
        None => {
            println!("{line}");
            Ok(())
        }
    }
}

/// Each line of `text` echoed ([`echo`]), then handed to `each`.
fn echo_lines(mut log: Option<&mut std::fs::File>, text: &str, mut each: impl FnMut(&str)) -> std::io::Result<()> {
    for line in text.lines() {
        echo(log.as_deref_mut(), line)?;
        each(line);
    }
    Ok(())
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
            echo(log.as_deref_mut(), &line)?;
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
///
/// A whole-workspace run builds every test target (and the binary) first, then runs the
/// Python suites beside the Rust tests: cargo runs test binaries one after another, which
/// leaves the machine half idle. The test binaries are run here rather than by `cargo test`,
/// which would hold the build directory's lock until the last one ended: a job named by
/// `XTASK_TEST_BESIDE` (CI's builds of each mode alone) builds beside them, at the lowest
/// priority. A filtered run keeps everything one after the other, through cargo.
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
    let beside = if extra.is_empty() {
        let binaries = build_test_binaries()?;
        stage(&mut run, "build every test target");
        let pytest = spawn_pytest(python, peers, &binary)?;
        let job = std::env::var("XTASK_TEST_BESIDE").ok().filter(|j| !j.trim().is_empty());
        let job = job.map(|j| spawn_beside_job(&j)).transpose()?;
        run_test_binaries(&binaries, peers, &mut run, log.as_deref_mut(), &mut on_line)?;
        stage(&mut run, "Rust tests");
        if let Some(job) = job {
            if !job.finish(log.as_deref_mut(), |_| {})? {
                run.failures.push("XTASK_TEST_BESIDE");
            }
            stage(&mut run, "the job beside the tests (after them)");
        }
        // The doc tests, last as under `cargo test`: the lock is free again. Only of the
        // packages that have any: rustdoc over every library finds none in ten seconds.
        let documented = crate::doc_tests::packages_with_doc_tests(&crate::scan::packages(&root)?)?;
        if documented.is_empty() {
            echo(
                log.as_deref_mut(),
                "xtask: no doc tests (no doc comment holds a Rust code block)",
            )?;
        } else {
            let mut docs = cargo();
            docs.args(["test", "--locked", "--doc"]);
            for name in &documented {
                docs.args(["-p", name]);
            }
            run_counted(docs, "cargo test --doc", &mut run, log.as_deref_mut(), &mut on_line)?;
        }
        stage(&mut run, "doc tests");
        Some(pytest)
    } else {
        let mut cmd = cargo();
        // Every test binary runs even when one fails: the summary counts them all.
        cmd.args(["test", "--workspace", "--locked", "--no-fail-fast"])
            .args(extra);
        peers.export(&mut cmd);
        run_counted(cmd, "cargo test", &mut run, log.as_deref_mut(), &mut on_line)?;
        stage(&mut run, "Rust tests");
        None
    };

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

/// Runs `cmd`, its `test result:` lines counted; a failure is recorded as `what`.
fn run_counted(
    cmd: Command,
    what: &'static str,
    run: &mut SuiteRun,
    log: Option<&mut std::fs::File>,
    on_line: &mut impl FnMut(&str),
) -> Result<()> {
    let totals = &mut run.totals;
    let status = run_and_parse(cmd, log, |l| {
        totals.add_line(l);
        on_line(l);
    })?;
    if !status.success() && !run.failures.contains(&what) {
        run.failures.push(what);
    }
    Ok(())
}

/// One test executable of the workspace, as the build reported it.
struct TestBinary {
    path: PathBuf,
    /// Its package's directory: the working directory cargo would give it.
    dir: PathBuf,
    /// `package (target kind target name)`, for the log.
    label: String,
}

/// Builds every test target of the workspace (`cargo test --no-run`) and returns their
/// executables, by package (as cargo runs them).
fn build_test_binaries() -> Result<Vec<TestBinary>> {
    let mut build = cargo();
    build
        .args([
            "test",
            "--workspace",
            "--locked",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped());
    println!("xtask: running {build:?}");
    let out = build.output().with_context(|| format!("could not start {build:?}"))?;
    if !out.status.success() {
        bail!("{build:?} failed with {}", out.status);
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(path), Some(manifest)) = (msg["executable"].as_str(), msg["manifest_path"].as_str()) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let dir = Path::new(manifest)
            .parent()
            .context("a manifest path without a directory")?;
        let package = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
        let name = msg["target"]["name"].as_str().unwrap_or("?");
        binaries.push(TestBinary {
            path: path.into(),
            dir: dir.to_path_buf(),
            label: format!("{package} ({kind} {name})"),
        });
    }
    if binaries.is_empty() {
        bail!("{build:?} reported no test executable");
    }
    binaries.sort_by(|a, b| a.dir.cmp(&b.dir).then_with(|| a.label.cmp(&b.label)));
    Ok(binaries)
}

/// How many test binaries run at once, and how many tests each runs at once: most of the
/// end-to-end tests wait on real peers (Envoy, etcd, child processes) and sockets, not the
/// CPU, and one binary at a time with the test harness's default (one thread per core) left
/// this two-core machine idle half the time. `RUST_TEST_THREADS` set by the caller wins.
const BINARIES_AT_ONCE: usize = 2;
const TEST_THREADS: &str = "6";

/// Runs each test binary in its package's directory, as `cargo test --no-fail-fast` would
/// (every one, whatever fails), counting their results. They run `BINARIES_AT_ONCE` at a
/// time, the largest executables (the end-to-end binaries, the longest) first; each one's
/// output is printed (or logged) whole when it ends.
fn run_test_binaries(
    binaries: &[TestBinary],
    peers: &tools::Peers,
    run: &mut SuiteRun,
    mut log: Option<&mut std::fs::File>,
    on_line: &mut impl FnMut(&str),
) -> Result<()> {
    use std::io::Write as _;
    let mut order: Vec<&TestBinary> = binaries.iter().collect();
    order.sort_by_key(|b| std::cmp::Reverse(std::fs::metadata(&b.path).map_or(0, |m| m.len())));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|scope| -> Result<()> {
        for _ in 0..BINARIES_AT_ONCE {
            let (done, next, order) = (done.clone(), &next, &order);
            scope.spawn(move || {
                while let Some(test) = order.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    if done.send((*test, run_captured(test, peers))).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done);
        for (test, output) in finished {
            echo(log.as_deref_mut(), &format!("xtask: tests of {}", test.label))?;
            let output = output?;
            echo_lines(log.as_deref_mut(), &String::from_utf8_lossy(&output.stdout), |line| {
                run.totals.add_line(line);
                on_line(line);
            })?;
            match log.as_deref_mut() {
                Some(file) => file.write_all(&output.stderr)?,
                None => std::io::stderr().write_all(&output.stderr)?,
            }
            if !output.status.success() && !run.failures.contains(&"cargo test") {
                run.failures.push("cargo test");
            }
        }
        Ok(())
    })
}

/// Runs one test binary to its end, its stdout and stderr kept.
fn run_captured(test: &TestBinary, peers: &tools::Peers) -> Result<std::process::Output> {
    let mut cmd = Command::new(&test.path);
    crate::command::without_package_vars(&mut cmd);
    cmd.current_dir(&test.dir).env("CARGO_MANIFEST_DIR", &test.dir);
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        cmd.env("RUST_TEST_THREADS", TEST_THREADS);
    }
    peers.export(&mut cmd);
    cmd.output()
        .with_context(|| format!("could not run {}", test.path.display()))
}

/// Starts `job` (a shell command) at the lowest priority, its output kept in a file until it
/// is awaited.
fn spawn_beside_job(job: &str) -> Result<Beside> {
    let output = workspace_root().join("target").join("xtask-beside-output.txt");
    let file = std::fs::File::create(&output).with_context(|| format!("creating {}", output.display()))?;
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "19", "sh", "-c", job])
        .current_dir(workspace_root())
        .stdout(file.try_clone()?)
        .stderr(file);
    // Its cargo commands must build as the others do.
    crate::command::without_package_vars(&mut cmd);
    println!("xtask: running {cmd:?} beside the Rust tests");
    let child = cmd.spawn().with_context(|| format!("could not start {cmd:?}"))?;
    Ok(Beside { child, output })
}

/// How many pytest-xdist workers run the Python suites.
const PYTEST_WORKERS: &str = "3";

/// The Python client suites against `binary`.
fn pytest(python: &Path, peers: &tools::Peers, binary: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.current_dir(workspace_root())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/py"])
        // Several workers (pytest-xdist): most tests wait on processes and sockets. A module
        // whose tests share one setup in order is kept on one worker (`xdist_group`).
        .args(["-n", PYTEST_WORKERS, "--dist", "loadgroup"])
        .env("MESHD_BIN", binary);
    peers.export(&mut cmd);
    cmd
}

/// A job running beside the Rust tests (the Python suites, `XTASK_TEST_BESIDE`), its output
/// kept in a file until the Rust tests' is printed.
struct Beside {
    child: std::process::Child,
    output: PathBuf,
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
    /// Waits for the job, then prints (or logs) its output, each line through `parse`;
    /// whether it succeeded.
    fn finish(mut self, log: Option<&mut std::fs::File>, parse: impl FnMut(&str)) -> Result<bool> {
        let status = self.child.wait().context("waiting for a job beside the tests")?;
        let text =
            std::fs::read_to_string(&self.output).with_context(|| format!("reading {}", self.output.display()))?;
        echo_lines(log, &text, parse)?;
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
