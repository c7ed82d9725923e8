"""The HTTPS API with real clients: certificates made by `meshd tls`, py-consul over HTTPS
verified with the CA (and with a client certificate when the server asks for one), plaintext
refused on the HTTPS port, and bad TLS settings refused at start."""

import os
import subprocess

import consul
import pytest
import requests

from conftest import _meshd_binary


def _tls(directory, *args):
    subprocess.run([_meshd_binary(), "tls", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA with a server and a client certificate, and a second, unrelated CA."""
    _tls(tmp_path, "ca", "create")
    _tls(tmp_path, "cert", "create", "-server")
    _tls(tmp_path, "cert", "create", "-client")
    other = tmp_path / "other"
    other.mkdir()
    _tls(other, "ca", "create")
    return {
        "ca": str(tmp_path / "meshd-agent-ca.pem"),
        "cert": str(tmp_path / "dc1-server-meshd-0.pem"),
        "key": str(tmp_path / "dc1-server-meshd-0-key.pem"),
        "client_cert": str(tmp_path / "dc1-client-meshd-0.pem"),
        "client_key": str(tmp_path / "dc1-client-meshd-0-key.pem"),
        "other_ca": str(other / "meshd-agent-ca.pem"),
    }


def _start(pki, *extra):
    """`meshd server -dev` with HTTPS; returns (process, https host, https port)."""
    proc = subprocess.Popen(
        [_meshd_binary(), "server", "-dev", "-log-level", "warn",
         "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0",
         "-tls-cert-file", pki["cert"], "-tls-key-file", pki["key"], *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    prefix = "meshd server listening on https://"
    for line in proc.stdout:
        if line.startswith(prefix):
            host, port = line[len(prefix):].strip().rsplit(":", 1)
            return proc, host, int(port)
    proc.kill()
    raise RuntimeError(f"meshd exited with {proc.wait()} before its HTTPS line")


def _stop(proc):
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "meshd server did not shut down cleanly"


@pytest.fixture
def https_server(pki, monkeypatch):
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    proc, host, port = _start(pki)
    yield host, port
    _stop(proc)


def test_py_consul_over_https_verified_with_the_ca(https_server, pki):
    host, port = https_server
    c = consul.Consul(host=host, port=port, scheme="https", verify=pki["ca"])
    assert c.catalog.register("node-1", "127.0.0.1", service={"Service": "web", "ID": "web-1", "Port": 8080})
    _, nodes = c.catalog.service("web")
    assert [n["ServiceID"] for n in nodes] == ["web-1"]
    assert c.status.leader()


def test_plain_http_on_the_https_port_gets_a_400(https_server):
    host, port = https_server
    resp = requests.get(f"http://{host}:{port}/v1/status/leader", timeout=10)
    assert resp.status_code == 400
    assert resp.text == "Client sent an HTTP request to an HTTPS server.\n"


def test_a_server_of_another_ca_is_not_trusted(https_server, pki):
    host, port = https_server
    c = consul.Consul(host=host, port=port, scheme="https", verify=pki["other_ca"])
    with pytest.raises(requests.exceptions.SSLError):
        c.status.leader()


def test_verify_incoming_wants_a_client_certificate_from_the_ca(pki, monkeypatch):
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    proc, host, port = _start(pki, "-tls-ca-file", pki["ca"], "-tls-verify-incoming")
    try:
        with_cert = consul.Consul(host=host, port=port, scheme="https", verify=pki["ca"],
                                  cert=(pki["client_cert"], pki["client_key"]))
        assert with_cert.status.leader()
        without = consul.Consul(host=host, port=port, scheme="https", verify=pki["ca"])
        with pytest.raises(requests.exceptions.RequestException):
            without.status.leader()
    finally:
        _stop(proc)


def test_a_missing_key_file_stops_the_start_with_one_line_naming_the_flag(pki, tmp_path):
    missing = str(tmp_path / "missing-key.pem")
    done = subprocess.run(
        [_meshd_binary(), "server", "-dev", "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0",
         "-https-addr", "127.0.0.1:0", "-tls-cert-file", pki["cert"], "-tls-key-file", missing],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "-tls-key-file" in lines[0] and missing in lines[0], lines[0]
    # The key files `meshd tls` wrote are private.
    assert os.stat(pki["key"]).st_mode & 0o777 == 0o600
