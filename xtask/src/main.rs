//! meshd's developer tasks. `cargo xtask <task>`:
//!
//! - `test`: every test of the workspace (the README's test command).
//! - `demo`: the main job on an embedded default (no external services).
//! - `bench [NAME]`: benchmarks that print figures (`proxycfg`; all when no name is given).
#![allow(clippy::print_stdout)]

use anyhow::{Context, Result, bail};
use std::{
    path::{Path, PathBuf},
    process::Command,
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

fn test(extra: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--locked"]).args(extra);
    run(cmd)
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
