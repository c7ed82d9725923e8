//! meshd's developer tasks. `cargo xtask <task>`:
//!
//! - `test`: every test of the workspace (the README's test command): the pinned real peers
//!   (Python clients, Envoy, etcd) are installed into `.tools/` first, then the Rust tests run, then
//!   the Python client suites against the real binary.
//! - `stress [N]`: the whole suite N times (default 5) while burner threads keep every core
//!   busy; prints each test that failed at least once, with its failure, and the load
//!   average during the runs (`docs/reliability.md`).
//! - `tools`: installs the pinned real peers into `.tools/` and prints `export` lines naming
//!   their binaries (`MESHD_ENVOY`, `MESHD_ETCD`, `MESHD_CHROMIUM`, `MESHD_NODE` with
//!   `MESHD_NODE_MODULES` for the npm clients, `MESHD_PYTHON` with the pinned Python clients,
//!   `MESHD_GO`, `MESHD_GOPATH` and `MESHD_GOCACHE` for `tests/go`),
//!   for running single tests by hand:
//!   `eval "$(cargo xtask tools)"`.
//! - `demo`: the main job on an embedded default, in agent mode: a server, two agents, two
//!   services registered with them, a real Envoy per agent, traffic, and an intention that
//!   denies and re-allows it. `demo multi-dc`: the second act, two datacenters (a server and
//!   an agent each, a mesh gateway each) and failover from dc1 to dc2 and back.
//! - `bench [NAME]`: benchmarks that print figures (`proxycfg`, `server`, `xds`, `supervisor`, `agent`, `acl`, `nack`, `storm`, `memory`, `gateway`, `ha`, `federation`; all
//!   when no name is given).
//! - `soak`: register/deregister churn against a real server with streams watching; prints
//!   the slopes of its tasks, file descriptors and RSS (`CYCLES`, default 10,000).
//! - `chaos`: real Envoys under 200 requests/s while the server is killed (SIGKILL) and
//!   restarted every 20 s for 3 minutes; prints failed requests and lost writes.
//! - `screenshots`: regenerates the dashboard screenshot the docs show (`docs/ui-proxies.png`,
//!   which the README shows) with the UI test's own tooling: the dashboard test in headless
//!   Chromium against the real binary, writing the image as it checks the page.
//! - `fuzz [CASES]`: the property tests of decoders, protocol state machines and recovery
//!   (`tests/fuzz_*.rs` and the JSON and filter properties) with many more cases than the
//!   test run's (`CASES`, default 20000), optimized.
//! - `cycles`: file-level import cycles within each crate (file A uses an item of file B and
//!   B, directly or through others, one of A); prints each and fails when there is one.
//! - `fn-lengths [--max N]`: the non-test functions over N lines (default 100); fails when
//!   there is one.
//! - `deny`: `cargo deny check` of the dependency policy in `deny.toml` (licenses, bans,
//!   sources) with the pinned cargo-deny, installed into `.tools/` first. Not advisories:
//!   their database is cloned from GitHub, which the build machines cannot reach.
//! - `link-order`: rewrites `crates/meshd/link/order.txt`, the layout of a release binary's
//!   functions, from callgrind profiles of the demo's processes (needs valgrind and nm).
#![allow(clippy::print_stdout)]

mod command;
mod cycles;
mod doc_tests;
mod fn_lengths;
mod link_order;
mod scan;
mod stress;
mod suite;
mod tools;

use anyhow::{Result, bail};
use std::process::Command;

use command::{cargo, run, workspace_root};
use suite::{SuiteRun, run_suite};

/// The benchmarks, by name: (package, bench target).
const BENCHES: &[(&str, &str, &str)] = &[
    ("proxycfg", "proxycfg", "propagation"),
    ("proxycfg", "xds", "l7_rebuild"),
    ("server", "meshd", "server"),
    ("kv", "meshd", "kv"),
    ("agent", "meshd", "agent"),
    ("agent", "meshd", "agent_cache"),
    ("xds", "meshd", "xds"),
    ("xds", "xds", "l7_rebuild"),
    ("supervisor", "supervisor", "hot_restart"),
    ("supervisor", "meshd", "managed"),
    ("acl", "http-api", "acl"),
    ("nack", "meshd", "nack"),
    ("storm", "meshd", "storm"),
    ("memory", "meshd", "memory"),
    ("gateway", "xds", "gateway"),
    ("gateway", "meshd", "api_gateway"),
    ("ha", "meshd", "ha"),
    ("dns", "meshd", "dns"),
    ("federation", "meshd", "federation"),
    ("peering", "meshd", "peering"),
];

fn test(extra: &[String]) -> Result<()> {
    // Real peers first: the pinned Python clients, Envoy and etcd.
    let started = std::time::Instant::now();
    let (python, peers) = tools::Peers::install(&workspace_root())?;
    let tools_time = started.elapsed();
    let SuiteRun {
        totals,
        failures,
        stages,
    } = run_suite(&python, &peers, extra, None, |_| {})?;
    println!("xtask test: stage times");
    println!("  {:5.0}s  install the pinned peers", tools_time.as_secs_f64());
    for (name, took) in &stages {
        println!("  {:5.0}s  {name}", took.as_secs_f64());
    }

    // One closing line for the whole run, in the plain form CI reads.
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if !failures.is_empty() {
        bail!("failed: {}", failures.join(", "));
    }
    if totals.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// Runs the dashboard's test with `MESHD_UPDATE_DOCS_SCREENSHOTS=1`: the screenshots the
/// docs show are written under `docs/` as well as `target/ui-screenshots/`.
fn screenshots() -> Result<()> {
    let root = workspace_root();
    let (python, peers) = tools::Peers::install(&root)?;
    let mut build = cargo();
    build.args(["build", "--locked", "-p", "meshd", "--bin", "meshd"]);
    run(build)?;
    let mut pytest = Command::new(python);
    pytest
        .current_dir(&root)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/py/test_ui.py",
            "-k",
            "dashboard_shows",
        ])
        .env("MESHD_BIN", root.join("target").join("debug").join("meshd"))
        .env("MESHD_UPDATE_DOCS_SCREENSHOTS", "1");
    peers.export(&mut pytest);
    run(pytest)?;
    println!("xtask: wrote docs/ui-proxies.png and docs/ui-troubleshoot.png");
    Ok(())
}

fn demo(act: Option<&str>) -> Result<()> {
    if let Some(act) = act.filter(|a| *a != "multi-dc") {
        bail!("unknown demo act {act:?}: expected none (the main job) or multi-dc (two datacenters)");
    }
    let root = workspace_root();
    let (_, peers) = tools::Peers::install(&root)?;
    // Cargo's own progress shows: a first build takes minutes, and silence looks like a hang.
    println!("xtask demo: building meshd and the demo (the first build takes a few minutes)");
    let mut build = cargo();
    build.args([
        "build",
        "--locked",
        "-p",
        "meshd",
        "--bin",
        "meshd",
        "--example",
        "demo",
    ]);
    run(build)?;
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--locked", "-p", "meshd", "--example", "demo", "--"])
        .args(act)
        .env("MESHD_BIN", root.join("target").join("debug").join("meshd"));
    peers.export(&mut cmd);
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
    // Several run real peers (Envoy, etcd): install the pinned ones first, and name them
    // to every benchmark.
    let (_, peers) = tools::Peers::install(&workspace_root())?;
    for (_, package, target) in selected {
        let mut cmd = cargo();
        cmd.args(["bench", "--locked", "-p", package, "--bench", target]);
        peers.export(&mut cmd);
        run(cmd)?;
    }
    Ok(())
}

/// The fuzzing property tests: (package, test target or `--lib` filter).
const FUZZ: &[(&str, &[&str])] = &[
    ("http-api", &["--test", "integration", "fuzz_api::"]),
    ("agent", &["--test", "integration", "fuzz_agent::"]),
    ("xds", &["--test", "integration", "fuzz_protocol::"]),
    ("catalog", &["--test", "fuzz_recovery"]),
    ("structs", &["--lib"]),
];

fn fuzz(cases: Option<&str>) -> Result<()> {
    let cases = cases.unwrap_or("20000");
    if cases.parse::<u32>().is_err() {
        bail!("fuzz: {cases:?} is not a number of cases");
    }
    for (package, target) in FUZZ {
        let mut cmd = cargo();
        cmd.args(["test", "--locked", "--release", "-p", package])
            .args(*target)
            .env("PROPTEST_CASES", cases);
        run(cmd)?;
    }
    Ok(())
}

/// Checks the dependency policy (`deny.toml`) with the pinned cargo-deny.
fn deny() -> Result<()> {
    let root = workspace_root();
    let binary = tools::ensure_cargo_deny(&root)?;
    let mut cmd = Command::new(binary);
    // Advisories are left out: cargo-deny clones their database from GitHub, which the build
    // machines cannot reach (only the package registries), and a check that cannot fetch
    // fails. `--locked`: the graph checked is Cargo.lock's, not a re-resolved one.
    cmd.current_dir(&root).args([
        "--locked",
        "check",
        "--hide-inclusion-graph",
        "licenses",
        "bans",
        "sources",
    ]);
    run(cmd)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("tools") => {
            let (_, peers) = tools::Peers::install(&workspace_root())?;
            println!("export MESHD_ENVOY={}", peers.envoy.display());
            println!("export MESHD_ETCD={}", peers.etcd.display());
            println!("export MESHD_CHROMIUM={}", peers.chromium.display());
            println!("export MESHD_NODE={}", peers.node.display());
            println!("export MESHD_NODE_MODULES={}", peers.node_modules.display());
            println!("export MESHD_PYTHON={}", peers.python.display());
            println!("export MESHD_GO={}", peers.go.go.display());
            println!("export MESHD_GOPATH={}", peers.go.gopath.display());
            println!("export MESHD_GOCACHE={}", peers.go.cache.display());
            Ok(())
        }
        Some("demo") => demo(args.get(1).map(String::as_str)),
        Some("stress") => stress::stress(args.get(1).map(String::as_str)),
        Some("screenshots") => screenshots(),
        Some("bench") => bench(args.get(1).map(String::as_str)),
        Some("fuzz") => fuzz(args.get(1).map(String::as_str)),
        Some("cycles") => cycles::cycles(&workspace_root()),
        Some("fn-lengths") => fn_lengths::fn_lengths(&workspace_root(), &args[1..]),
        Some("deny") => deny(),
        Some("link-order") => link_order::link_order(),
        Some("chaos") => {
            let (_, peers) = tools::Peers::install(&workspace_root())?;
            let mut cmd = cargo();
            cmd.args(["bench", "--locked", "-p", "meshd", "--bench", "chaos"]);
            peers.export(&mut cmd);
            run(cmd)
        }
        Some("soak") => {
            let mut cmd = cargo();
            cmd.args(["bench", "--locked", "-p", "meshd", "--bench", "soak"]);
            run(cmd)
        }
        Some(other) => {
            bail!(
                "unknown task {other:?}: expected test, stress, tools, demo, screenshots, bench, soak, chaos, fuzz, cycles, fn-lengths, deny or link-order"
            )
        }
        None => {
            bail!(
                "usage: cargo xtask <test | stress [N] | tools | demo [multi-dc] | screenshots | bench [NAME] | soak | chaos | fuzz [CASES] | cycles | fn-lengths [--max N] | deny | link-order>"
            )
        }
    }
}
