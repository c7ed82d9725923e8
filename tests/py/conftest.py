"""Fixtures: a real `meshd server` process and a py-consul client pointed at it."""

import os
import subprocess

import consul
import pytest


def _meshd_binary():
    path = os.environ.get("MESHD_BIN")
    if not path or not os.path.exists(path):
        raise RuntimeError(
            "MESHD_BIN must name a built meshd binary; run these tests through `cargo xtask test`"
        )
    return path


@pytest.fixture
def server():
    """Starts `meshd server -dev` on an ephemeral port; stops it (SIGTERM) afterwards."""
    proc = subprocess.Popen(
        [_meshd_binary(), "server", "-dev", "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-log-level", "warn"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    prefix = "meshd server listening on http://"
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"meshd did not start: {line!r}")
    host, port = line[len(prefix):].rsplit(":", 1)
    yield host, int(port)
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "meshd server did not shut down cleanly"


@pytest.fixture
def client(server, monkeypatch):
    """A py-consul client for the server (environment overrides removed)."""
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)
    host, port = server
    return consul.Consul(host=host, port=port)
