//! How the tasks run cargo and other programs: from the workspace root, echoing the command.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root directory (xtask's parent).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    without_package_vars(&mut cmd);
    cmd
}

/// Clears from `cmd`'s environment the package variables cargo set for xtask itself.
pub(crate) fn without_package_vars(cmd: &mut Command) {
    // `cargo xtask` runs this program with xtask's own package variables set
    // (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`...). Build scripts that rerun when those change
    // (ring's, through the cc crate) would see other values than under a cargo started from
    // a shell, and every crate above them would be rebuilt, each time the two alternate (CI
    // builds from its script first, then through xtask).
    for (var, _) in std::env::vars_os() {
        let Some(name) = var.to_str() else { continue };
        if name.starts_with("CARGO_PKG_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "OUT_DIR"
            )
        {
            cmd.env_remove(name);
        }
    }
}

pub(crate) fn run(mut cmd: Command) -> Result<()> {
    println!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
