"""HashiCorp's official Go client (github.com/hashicorp/consul/api, as Debian's consul 1.8.7
packages it) driving meshd: tests/go/consulapi, built with the pinned Go toolchain, one
pytest case per Go test (each starts its own meshd server, agent and ACL server).

Needs MESHD_GO, MESHD_GOPATH and MESHD_GOCACHE (`cargo xtask test`, or `eval "$(cargo xtask
tools)"`): missing, the tests fail, never skip."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import _meshd_binary

GO_DIR = Path(__file__).resolve().parent.parent / "go"
SOURCES = sorted((GO_DIR / "consulapi").glob("*_test.go"))
NAMES = sorted(
    name for src in SOURCES for name in re.findall(r"^func (Test\w+)\(t \*testing\.T\)", src.read_text(), re.M)
)


def _go_env():
    missing = [v for v in ("MESHD_GO", "MESHD_GOPATH", "MESHD_GOCACHE") if not os.environ.get(v)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not set: run `cargo xtask test` (it installs the Go toolchain)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GO", "CONSUL_"))}
    env.update(
        GOPATH=os.environ["MESHD_GOPATH"],
        GOCACHE=os.environ["MESHD_GOCACHE"],
        GO111MODULE="off",
        GOFLAGS="",
        GOTOOLCHAIN="local",
        GOPROXY="off",
        GOSUMDB="off",
        GOENV="off",
        CGO_ENABLED="0",
        MESHD_BIN=str(_meshd_binary()),
    )
    return env


@pytest.fixture(scope="module")
def go_tests(tmp_path_factory):
    """The Go tests' binary (a link when `cargo xtask tools` built them already)."""
    env = _go_env()
    binary = tmp_path_factory.mktemp("go") / "consulapi.test"
    build = subprocess.run(
        # The flags `cargo xtask tools` built with (unoptimized), so Go's cache has it all.
        [os.environ["MESHD_GO"], "test", "-vet=off", "-gcflags=all=-N -l", "-c", "-o", str(binary), "./consulapi"],
        cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return binary, env


def test_the_go_tests_were_found():
    assert len(NAMES) >= 10, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_go_client(go_tests, name):
    binary, env = go_tests
    run = subprocess.run(
        [str(binary), "-test.run", f"^{name}$", "-test.v", "-test.count=1"],
        cwd=GO_DIR / "consulapi", env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"--- PASS: {name}" in run.stdout, run.stdout
