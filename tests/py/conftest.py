"""Fixtures: a real `meshd server` process and a py-consul client pointed at it.

Tests that take the `server` fixture run four times: against `meshd server -dev`, and
against each of three `meshd server -store etcd` processes sharing one catalog in a real
3-member etcd cluster (a fresh key prefix per test), so the suite passes against every
server of an HA cluster, not only the one that happened to write. (`test_acl.py` has its own
servers, with ACLs on, over the same etcd.)
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import consul
import pytest


def _meshd_binary():
    path = os.environ.get("MESHD_BIN")
    if not path or not os.path.exists(path):
        raise RuntimeError(
            "MESHD_BIN must name a built meshd binary; run these tests through `cargo xtask test`"
        )
    return path


# Reservations held for the whole session (see `_free_port`).
_RESERVED = []


def _free_port():
    """A loopback port held for a process started later (etcd's members): a socket bound with
    SO_REUSEADDR that never listens, kept open for the session. The kernel hands the port to
    no other bind asking for a free port (the Rust tests running beside reserve theirs the
    same way), while the process it is meant for, binding it with SO_REUSEADDR as Go's and
    Rust's listeners do, gets it. A port found free and closed at once could be handed to
    someone else before that process binds it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _RESERVED.append(s)
    return s.getsockname()[1]


@pytest.fixture(scope="session")
def etcd():
    """A real 3-member etcd cluster (the pinned binary in MESHD_ETCD) for the whole session;
    yields its client URLs, comma-separated."""
    binary = os.environ.get("MESHD_ETCD")
    if not binary or not os.path.exists(binary):
        raise RuntimeError("MESHD_ETCD must name the pinned etcd binary; run these tests through `cargo xtask test`")
    data = tempfile.mkdtemp(prefix="meshd-py-etcd-")
    members = [(f"py{i}", f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}") for i in range(3)]
    cluster = ",".join(f"{name}={peer}" for name, _, peer in members)
    procs, logs = [], []
    for name, client, peer in members:
        log = open(os.path.join(data, f"{name}.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [binary, "--name", name, "--data-dir", os.path.join(data, name),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", cluster, "--initial-cluster-token", f"py-{os.getpid()}",
             "--log-level", "error"],
            stdout=log, stderr=subprocess.STDOUT,
        ))
    deadline = time.monotonic() + 30
    for (name, client, _), proc, log in zip(members, procs, logs):
        while True:
            try:
                if b'"health":"true"' in urllib.request.urlopen(f"{client}/health", timeout=1).read():
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"etcd member {name} did not become healthy; its log: {open(log.name).read()[-2000:]}")
            time.sleep(0.1)
    yield ",".join(client for _, client, _ in members)
    for proc in procs:
        proc.kill()
        proc.wait()
    for log in logs:
        log.close()
    shutil.rmtree(data, ignore_errors=True)


def _start_server(*args):
    proc = subprocess.Popen(
        [_meshd_binary(), "server", "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0",
         "-grpc-tls-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    prefix = "meshd server listening on http://"
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"meshd did not start: {line!r}")
    host, port = line[len(prefix):].rsplit(":", 1)
    return proc, (host, int(port))


def _stop_server(proc):
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "meshd server did not shut down cleanly"


@pytest.fixture(params=["dev", "etcd-server-0", "etcd-server-1", "etcd-server-2"])
def server(request):
    """A meshd server on an ephemeral port: `-dev`, or one of three sharing an etcd
    catalog (under a prefix of this test's own); all stopped (SIGTERM) afterwards."""
    if request.param == "dev":
        started = [_start_server("-dev")]
        target = started[0][1]
    else:
        endpoints = request.getfixturevalue("etcd")
        prefix = f"/py-{uuid.uuid4().hex}/"
        started = [
            _start_server("-store", "etcd", "-etcd-endpoints", endpoints, "-etcd-prefix", prefix, "-node", f"server-{i}")
            for i in range(3)
        ]
        target = started[int(request.param[-1])][1]
    yield target
    for proc, _ in started:
        _stop_server(proc)


@pytest.fixture
def client(server, monkeypatch):
    """A py-consul client for the server (environment overrides removed)."""
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)
    host, port = server
    return consul.Consul(host=host, port=port)
