//! `cargo xtask link-order`: rewrites `crates/meshd/link/order.txt`, the order in which a
//! release build lays out the binary's functions (`crates/meshd/build.rs`).
//!
//! The kernel maps a binary's code in runs of 64 KiB around each page a process touches, so
//! a process that runs a few megabytes of code scattered over the 18 MB of text ends up with
//! most of it resident. This task runs the demo (a server, two agents, two `connect envoy`,
//! real Envoys and traffic) with every meshd process under valgrind's callgrind, takes the
//! functions each kind of process ran, and writes them grouped so each kind's code is one
//! contiguous run: `connect envoy` only, `connect envoy` and agent, agent only, agent and
//! server, server only, and the rest of `connect envoy`'s shared with the server.
//!
//! Needs `valgrind` and `nm` (binutils); takes a few minutes (the processes run about fifty
//! times slower under callgrind).

use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::command::{cargo, run, workspace_root};
use crate::tools;

pub(crate) fn link_order() -> Result<()> {
    for tool in ["valgrind", "nm"] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            bail!("link-order: `{tool}` is not installed (apt install valgrind binutils)");
        }
    }
    let root = workspace_root();
    let (_, peers) = tools::Peers::install(&root)?;
    let mut build = cargo();
    build.args(["build", "--locked", "--release", "-p", "meshd", "--bin", "meshd"]);
    run(build)?;
    let mut demo = cargo();
    demo.args(["build", "--locked", "-p", "meshd", "--example", "demo"]);
    run(demo)?;

    let dir = root.join("target").join("link-order");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let binary = dir.join("meshd.real");
    std::fs::copy(root.join("target/release/meshd"), &binary)?;
    // `exec`: the demo's SIGTERM reaches the process, which exits cleanly and so writes its
    // profile. The file is named after the command (`server`, `agent`, `connect`).
    let wrapper = dir.join("meshd");
    let script = format!(
        "#!/bin/sh\nexec valgrind -q --tool=callgrind --demangle=no --dump-instr=no \
         --callgrind-out-file={dir}/cg.$1.%p {binary} \"$@\"\n",
        dir = dir.display(),
        binary = binary.display()
    );
    std::fs::write(&wrapper, script)?;
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--locked", "-p", "meshd", "--example", "demo"])
        .env("MESHD_BIN", &wrapper);
    peers.export(&mut cmd);
    run(cmd)?;

    let sizes = text_symbols(&binary)?;
    let ran = functions_by_command(&dir, &sizes)?;
    let none = BTreeSet::new();
    let [agent, server, connect] = ["agent", "server", "connect"].map(|c| ran.get(c).unwrap_or(&none));
    if agent.is_empty() || server.is_empty() || connect.is_empty() {
        bail!(
            "link-order: a profile is missing (agent {}, server {}, connect {} functions)",
            agent.len(),
            server.len(),
            connect.len()
        );
    }
    let order = layout(agent, server, connect);
    let out = root.join("crates/meshd/link/order.txt");
    let mut text = order.join("\n");
    text.push('\n');
    std::fs::write(&out, text)?;
    let total = |set: &BTreeSet<String>| set.iter().map(|n| sizes[n]).sum::<u64>() as f64 / 1e6;
    println!(
        "link-order: wrote {} ({} functions; agent {:.2} MB, server {:.2} MB, connect envoy {:.2} MB of {:.2} MB of text)",
        out.display(),
        order.len(),
        total(agent),
        total(server),
        total(connect),
        sizes.values().sum::<u64>() as f64 / 1e6
    );
    Ok(())
}

/// The regions in order; each command's functions are one run but for `connect envoy`'s
/// shared with the server alone (small), which come last.
fn layout(agent: &BTreeSet<String>, server: &BTreeSet<String>, connect: &BTreeSet<String>) -> Vec<String> {
    let only = |n: &String, a: bool, s: bool, c: bool| {
        agent.contains(n) == a && server.contains(n) == s && connect.contains(n) == c
    };
    let all: BTreeSet<&String> = agent.iter().chain(server).chain(connect).collect();
    let regions = [
        (false, false, true),
        (true, false, true),
        (true, false, false),
        (true, true, true),
        (true, true, false),
        (false, true, false),
        (false, true, true),
    ];
    regions
        .iter()
        .flat_map(|&(a, s, c)| all.iter().filter(move |n| only(n, a, s, c)).map(|n| (*n).clone()))
        .collect()
}

/// The binary's functions and their sizes, from its symbol table.
fn text_symbols(binary: &Path) -> Result<BTreeMap<String, u64>> {
    let out = Command::new("nm")
        .arg("-S")
        .arg(binary)
        .output()
        .context("running nm")?;
    if !out.status.success() {
        bail!("nm -S {} failed", binary.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, size, kind, name) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            matches!(kind, "t" | "T" | "w" | "W")
                .then(|| Some((name.to_owned(), u64::from_str_radix(size, 16).ok()?)))?
        })
        .collect())
}

/// The functions of the binary each command ran, from the callgrind profiles in `dir`
/// (`cg.<command>.<pid>[.<n>]`). Callgrind names a function in full the first time and by a
/// number after: `fn=(12) name`, then `fn=(12)`; `cfn=` lines name callees the same way.
fn functions_by_command(dir: &Path, sizes: &BTreeMap<String, u64>) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut ran: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(command) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("cg."))
            .and_then(|n| n.split('.').next())
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
        let set = ran.entry(command.to_owned()).or_default();
        for line in text.lines() {
            let Some(value) = line.strip_prefix("fn=").or_else(|| line.strip_prefix("cfn=")) else {
                continue;
            };
            let name = match value.strip_prefix('(') {
                Some(rest) => rest.split_once(") ").map_or("", |(_, name)| name),
                None => value,
            };
            if sizes.contains_key(name) {
                set.insert(name.to_owned());
            }
        }
    }
    Ok(ran)
}
