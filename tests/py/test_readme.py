"""The README's command blocks, run as written (`readme_runner.py` says how), so the README
cannot drift from what meshd does: the server, HA, agent and Secure setup sections.

Each section runs in a network and mount namespace of its own (`unshare`; as root, or
through a user namespace otherwise), where every example address is free.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(ROOT, "tests", "py", "readme_runner.py")


@pytest.mark.parametrize(
    "section",
    ["meshd server", "High availability: several servers over etcd", "meshd agent", "Secure setup"],
)
def test_readme_section_works_as_written(section):
    for var in ("MESHD_BIN", "MESHD_ENVOY", "MESHD_ETCD"):
        assert os.environ.get(var), f"{var} must be set (cargo xtask test sets it)"
    unshare = ["unshare", "--net", "--mount"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    done = subprocess.run(
        unshare + ["--", sys.executable, RUNNER, os.path.join(ROOT, "README.md"), section],
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(done.stdout)
    print(done.stderr)
    assert done.returncode == 0, f"{section}: {done.stdout[-4000:]}\n{done.stderr[-4000:]}"
