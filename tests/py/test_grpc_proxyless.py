"""grpcio 1.85.0, unchanged, as a proxyless xDS client of a real `meshd server`: `xds:///api`
resolves through meshd (listener, routes, clusters, endpoints), new instances receive calls,
a splitter's weights hold, and with xDS credentials the call is mTLS with the mesh's
certificates (written and kept current by `meshd connect grpc-bootstrap -watch`). The same
first call from grpc-js-xds (npm, unchanged; tests/node/xds_call.js)."""

import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import grpc
import pytest
import requests

from conftest import _meshd_binary, _start_server, _stop_server

# gRPC reads GRPC_XDS_BOOTSTRAP once per process: each scenario runs in a child Python
# process of its own, given its bootstrap.
CLIENT = r"""
import collections, json, sys, time, grpc
mode, target, calls, patience = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if mode == "mtls":
    creds = grpc.xds_channel_credentials(fallback_credentials=grpc.local_channel_credentials())
    channel = grpc.secure_channel(target, creds)
else:
    channel = grpc.insecure_channel(target)
call = channel.unary_unary("/test.Echo/Call")
seen = collections.Counter()
deadline = time.monotonic() + patience
while sum(seen.values()) < calls:
    try:
        seen[call(b"hi", timeout=10).decode()] += 1
    except grpc.RpcError as e:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
print(json.dumps(seen))
"""

# One channel kept open: calls until every name in argv[2] answered, printing "ready" after
# the first answer (the test changes the mesh then), then `extra` more calls; prints every
# answering name in order.
KEPT_OPEN = r"""
import json, sys, time, grpc
target, wanted, extra, patience = sys.argv[1], set(sys.argv[2].split(",")), int(sys.argv[3]), float(sys.argv[4])
call = grpc.insecure_channel(target).unary_unary("/test.Echo/Call")
seen = []
deadline = time.monotonic() + patience
while not wanted <= set(seen) or extra > 0:
    if time.monotonic() > deadline:
        sys.exit("timed out; answers so far: " + json.dumps(seen))
    try:
        seen.append(call(b"hi", timeout=10).decode().split("|")[0])
    except grpc.RpcError:
        time.sleep(0.1)
        continue
    if len(seen) == 1:
        print("ready", flush=True)
    if wanted <= set(seen):
        extra -= 1
    time.sleep(0.05)
print(json.dumps(seen), flush=True)
"""


def echo_server(name, tls=None):
    """A grpcio server answering /test.Echo/Call with its name and the caller's identity."""

    def call(request, context):
        peer = context.auth_context().get("x509_subject_alternative_name", [b""])
        return f"{name}|{b','.join(peer).decode()}".encode()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}),)
    )
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", tls)
    server.start()
    return server, port


class Mesh:
    def __init__(self, *args):
        self.token = ""
        self.proc, (host, port) = _start_server("-dev", *args)
        self.http = f"{host}:{port}"
        # The server prints its xDS address on the line after the HTTP one.
        self.grpc = self.proc.stdout.readline().strip().split("on ", 1)[1]

    def put(self, path, body):
        r = requests.put(f"http://{self.http}{path}", json=body, headers={"X-Consul-Token": self.token})
        assert r.ok, r.text
        return r.json()

    def register(self, body):
        r = requests.put(f"http://{self.http}/v1/catalog/register", json=body, headers={"X-Consul-Token": self.token})
        assert r.ok, r.text

    def native(self, service, instance, port, meta=None):
        self.register({"Node": f"node-{instance}", "Address": "127.0.0.1",
                       "Service": {"Service": service, "ID": instance, "Port": port, "Meta": meta or {},
                                   "Connect": {"Native": True}}})

    def config(self, entry):
        r = requests.put(f"http://{self.http}/v1/config", json=entry, headers={"X-Consul-Token": self.token})
        assert r.ok, r.text

    def bootstrap(self, tmp_path, service, *extra):
        cert_dir = tmp_path / f"certs-{service}"
        out = subprocess.run(
            [_meshd_binary(), "connect", "grpc-bootstrap", "-service", service, "-http-addr", self.http,
             "-grpc-addr", self.grpc, "-cert-dir", str(cert_dir), *extra],
            capture_output=True, text=True, timeout=30,
        )
        assert out.returncode == 0, out.stderr
        path = tmp_path / f"bootstrap-{service}.json"
        path.write_text(out.stdout)
        return path, cert_dir

    def run_client(self, bootstrap, n, mode="plain", target="xds:///api", patience=30):
        env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap))
        return subprocess.run([sys.executable, "-c", CLIENT, mode, target, str(n), str(patience)],
                              env=env, capture_output=True, text=True, timeout=120)

    def calls(self, bootstrap, n, mode="plain", target="xds:///api"):
        out = self.run_client(bootstrap, n, mode, target)
        assert out.returncode == 0, out.stderr[-3000:]
        return collections.Counter(json.loads(out.stdout))

    def kept_open(self, bootstrap, wanted, extra=5, patience=60):
        """Starts a client process with one channel to xds:///api; returns it once a call
        got through."""
        env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap))
        proc = subprocess.Popen([sys.executable, "-c", KEPT_OPEN, "xds:///api", ",".join(wanted), str(extra),
                                 str(patience)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            raise AssertionError(f"the client never got a call through: {line} {proc.stderr.read()[-3000:]}")
        return proc

    @staticmethod
    def answers(proc):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out)

    def stop(self):
        _stop_server(self.proc)


@pytest.fixture
def mesh():
    m = Mesh()
    yield m
    m.stop()


def names(counts):
    return collections.Counter({k.split("|")[0]: v for k, v in counts.items()})


def test_a_proxyless_client_calls_api_and_new_instances_get_calls(mesh, tmp_path):
    api1, port1 = echo_server("api-1")
    mesh.native("api", "api-1", port1)
    mesh.native("client", "client-1", 1)
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    node = json.loads(bootstrap.read_text())["node"]
    assert node["id"] == "client-1"
    assert names(mesh.calls(bootstrap, 5)) == {"api-1": 5}

    api2, port2 = echo_server("api-2")
    mesh.native("api", "api-2", port2)
    seen = names(mesh.calls(bootstrap, 40))
    assert set(seen) == {"api-1", "api-2"}, seen
    api1.stop(None)
    api2.stop(None)


def test_a_splitters_weights_hold_for_proxyless_calls(mesh, tmp_path):
    v1, p1 = echo_server("v1")
    v2, p2 = echo_server("v2")
    mesh.native("api", "api-v1", p1, {"version": "v1"})
    mesh.native("api", "api-v2", p2, {"version": "v2"})
    mesh.native("client", "client-1", 1)
    mesh.config({"Kind": "service-defaults", "Name": "api", "Protocol": "grpc"})
    mesh.config({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
                 "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"},
                             "v2": {"Filter": "Service.Meta.version == v2"}}})
    mesh.config({"Kind": "service-splitter", "Name": "api",
                 "Splits": [{"Weight": 50, "ServiceSubset": "v1"}, {"Weight": 50, "ServiceSubset": "v2"}]})
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    seen = names(mesh.calls(bootstrap, 400))
    assert sum(seen.values()) == 400
    for version in ("v1", "v2"):
        assert 160 <= seen[version] <= 240, f"50/50 within ±10 %: {seen}"
    v1.stop(None)
    v2.stop(None)


def test_with_xds_credentials_the_call_is_mtls_with_mesh_identities(mesh, tmp_path):
    mesh.native("client", "client-1", 1)
    # The server is connect-native too: the mesh's leaf for api, client certificates from
    # the mesh CA required.
    mesh.native("api", "api-1", 1)
    _, api_certs = mesh.bootstrap(tmp_path, "api")
    creds = grpc.ssl_server_credentials(
        [((api_certs / "key.pem").read_bytes(), (api_certs / "cert.pem").read_bytes())],
        root_certificates=(api_certs / "roots.pem").read_bytes(),
        require_client_auth=True,
    )
    server, port = echo_server("api-1", tls=creds)
    mesh.native("api", "api-1", port)
    bootstrap, certs = mesh.bootstrap(tmp_path, "client")
    assert oct((certs / "key.pem").stat().st_mode & 0o777) == "0o600"
    seen = mesh.calls(bootstrap, 3, mode="mtls")
    [(answer, count)] = seen.items()
    assert count == 3
    name, peer = answer.split("|")
    assert name == "api-1"
    assert peer.startswith("spiffe://") and peer.endswith("/svc/client"), f"the server saw the client's mesh identity: {peer}"
    server.stop(None)


def test_with_acls_the_clients_token_must_write_its_service(tmp_path):
    mesh = Mesh("-acl-enabled", "-acl-default-policy", "deny")
    try:
        mesh.token = requests.put(f"http://{mesh.http}/v1/acl/bootstrap").json()["SecretID"]
        api, port = echo_server("api-1")
        mesh.native("api", "api-1", port)
        mesh.native("client", "client-1", 1)
        mesh.native("other", "other-1", 1)

        def token_for(service):
            rules = f'service "{service}" {{ policy = "write" }}\nservice_prefix "" {{ policy = "read" }}\nnode_prefix "" {{ policy = "read" }}'
            policy = mesh.put("/v1/acl/policy", {"Name": f"{service}-identity", "Rules": rules})
            secret = mesh.put("/v1/acl/token", {"Policies": [{"ID": policy["ID"]}]})["SecretID"]
            path = tmp_path / f"{service}.token"
            path.write_text(secret)
            return path

        client_token, other_token = token_for("client"), token_for("other")
        bootstrap, _ = mesh.bootstrap(tmp_path, "client", "-token-file", str(client_token))
        assert names(mesh.calls(bootstrap, 3)) == {"api-1": 3}

        # A token of another service gets nothing for client-1 (its certificates are
        # refused too, so the bootstrap is made with the right token and then swapped).
        wrong = json.loads(bootstrap.read_text())
        wrong["node"]["metadata"]["x-consul-token"] = other_token.read_text()
        wrong_path = tmp_path / "wrong.json"
        wrong_path.write_text(json.dumps(wrong))
        out = mesh.run_client(wrong_path, 1, patience=3)
        assert out.returncode != 0
        assert "PERMISSION_DENIED" in out.stderr or "permission" in out.stderr.lower(), out.stderr[-2000:]
        api.stop(None)
    finally:
        mesh.stop()


def test_watch_rewrites_the_certificate_files_when_the_ca_rotates(mesh, tmp_path):
    import time

    mesh.native("client", "client-1", 1)
    cert_dir = tmp_path / "certs"
    proc = subprocess.Popen(
        [_meshd_binary(), "connect", "grpc-bootstrap", "-service", "client", "-http-addr", mesh.http,
         "-grpc-addr", mesh.grpc, "-cert-dir", str(cert_dir), "-output", str(tmp_path / "b.json"),
         "-watch", "-log-level", "warn"],
    )
    try:
        deadline = time.monotonic() + 20
        while not (cert_dir / "roots.pem").exists():
            assert time.monotonic() < deadline, "files written"
            time.sleep(0.1)
        before = ((cert_dir / "cert.pem").read_text(), (cert_dir / "roots.pem").read_text())
        assert before[1].count("BEGIN CERTIFICATE") == 1
        r = requests.put(f"http://{mesh.http}/v1/connect/ca/configuration",
                         json={"Provider": "consul", "Config": {"PrivateKeyType": "ec", "PrivateKeyBits": 384}})
        assert r.ok, r.text
        while True:
            now = ((cert_dir / "cert.pem").read_text(), (cert_dir / "roots.pem").read_text())
            if now[0] != before[0] and now[1].count("BEGIN CERTIFICATE") == 2:
                break
            assert time.monotonic() < deadline + 20, "the leaf and the roots were rewritten after the rotation"
            time.sleep(0.2)
        assert proc.poll() is None, "-watch keeps running"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_a_running_channel_reaches_a_newly_registered_instance(mesh, tmp_path):
    api1, port1 = echo_server("api-1")
    mesh.native("api", "api-1", port1)
    mesh.native("client", "client-1", 1)
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    client = mesh.kept_open(bootstrap, ["api-1", "api-2"])
    api2, port2 = echo_server("api-2")
    mesh.native("api", "api-2", port2)
    seen = mesh.answers(client)
    assert seen[0] == "api-1" and "api-2" in seen, seen
    api1.stop(None)
    api2.stop(None)


def test_failover_when_the_primarys_instances_go_critical(mesh, tmp_path):
    """A resolver with failover routes the client to an aggregate cluster (primary, then
    api-dr): while api's only instance is healthy it answers; once it is critical (its
    server still up), the same channel's calls go to api-dr."""
    primary, port1 = echo_server("api-1")
    dr, port2 = echo_server("api-dr-1")
    mesh.native("api", "api-1", port1)
    mesh.native("api-dr", "api-dr-1", port2)
    mesh.native("client", "client-1", 1)
    for service in ("api", "api-dr"):
        mesh.config({"Kind": "service-defaults", "Name": service, "Protocol": "grpc"})
    mesh.config({"Kind": "service-resolver", "Name": "api", "Failover": {"*": {"Service": "api-dr"}}})
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    assert names(mesh.calls(bootstrap, 5)) == {"api-1": 5}

    client = mesh.kept_open(bootstrap, ["api-1", "api-dr-1"])
    mesh.register({"Node": "node-api-1", "Address": "127.0.0.1",
                   "Service": {"Service": "api", "ID": "api-1", "Port": port1, "Connect": {"Native": True}},
                   "Check": {"CheckID": "api-1-alive", "Name": "alive", "ServiceID": "api-1",
                             "Status": "critical"}})
    seen = mesh.answers(client)
    first_dr = seen.index("api-dr-1")
    assert set(seen[:first_dr]) == {"api-1"}, seen
    assert set(seen[first_dr:]) == {"api-dr-1"}, f"after the switch only the failover target answers: {seen}"
    # A new client gets the failover target from its first call.
    assert names(mesh.calls(bootstrap, 5)) == {"api-dr-1": 5}
    primary.stop(None)
    dr.stop(None)


def test_csds_from_grpcio_lists_the_proxyless_client_synced_with_its_resources(mesh, tmp_path):
    """grpcio with the Envoy API's own Python protos (xds-protos) as the CSDS client: a
    running proxyless client is listed by its node id, every resource it asked for SYNCED
    (it ACKed them) with contents that decode as what their type URL says (secrets: none);
    without contents, the same rows carry none; StreamClientStatus answers each request."""
    from envoy.config.listener.v3 import listener_pb2
    from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

    api1, port1 = echo_server("api-1")
    mesh.native("api", "api-1", port1)
    mesh.native("client", "client-1", 1)
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    client = mesh.kept_open(bootstrap, ["api-1"], extra=2000, patience=300)
    channel = grpc.insecure_channel(mesh.grpc)
    stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
    mine = csds_pb2.ClientStatusRequest(
        node_matchers=[{"node_id": {"exact": "client-1"}}])
    # What the client asked for is SYNCED once it ACKed; what meshd holds for it but it never
    # asked for (its secrets: a proxyless client reads its certificates from files) stays
    # NOT_SENT.
    deadline = time.monotonic() + 30
    while True:
        answer = stub.FetchClientStatus(mine, timeout=10)
        rows = [g for c in answer.config for g in c.generic_xds_configs]
        status = {(g.type_url.rsplit(".", 1)[1], g.name): csds_pb2.ConfigStatus.Name(g.config_status) for g in rows}
        synced = {t for (t, _), s in status.items() if s == "SYNCED"}
        if {"Listener", "RouteConfiguration", "Cluster", "ClusterLoadAssignment"} <= synced and set(
                status.values()) <= {"SYNCED", "NOT_SENT"}:
            break
        assert time.monotonic() < deadline, f"never SYNCED: {status}"
        time.sleep(0.1)
    assert [c.node.id for c in answer.config] == ["client-1"]
    assert status[("Listener", "api")] == "SYNCED", status
    for g in rows:
        assert g.version_info, g
        if g.type_url.endswith(".Secret"):
            assert not g.HasField("xds_config"), "a secret's contents (a private key) are never listed"
        else:
            assert g.xds_config.type_url == g.type_url, g
        if g.config_status == csds_pb2.SYNCED:
            assert g.last_updated.seconds > 0, g
    listener = next(g for g in rows if g.type_url.endswith(".Listener") and g.name == "api")
    decoded = listener_pb2.Listener()
    assert listener.xds_config.Unpack(decoded)
    assert decoded.name == "api" and decoded.HasField("api_listener"), decoded

    bare = csds_pb2.ClientStatusRequest(node_matchers=mine.node_matchers, exclude_resource_contents=True)
    nobody = csds_pb2.ClientStatusRequest(node_matchers=[{"node_id": {"prefix": "no-such-"}}])
    answers = list(stub.StreamClientStatus(iter([bare, nobody]), timeout=10))
    assert len(answers) == 2
    bare_rows = [g for c in answers[0].config for g in c.generic_xds_configs]
    assert [(g.type_url, g.name) for g in bare_rows] == [(g.type_url, g.name) for g in rows]
    assert not any(g.HasField("xds_config") for g in bare_rows)
    assert len(answers[1].config) == 0
    channel.close()
    client.kill()
    client.wait()
    api1.stop(None)


def test_a_grpc_js_xds_client_calls_api(mesh, tmp_path):
    """grpc-js-xds (npm, pinned in tests/node, installed by the xtask) makes the same first
    call: xds:///api through meshd to the grpcio server registered as api."""
    modules = os.environ.get("MESHD_NODE_MODULES")
    if not modules or not os.path.isdir(os.path.join(modules, "@grpc", "grpc-js-xds")):
        raise RuntimeError("MESHD_NODE_MODULES must name the pinned npm clients; run these tests through `cargo xtask test`")
    node = os.environ.get("MESHD_NODE")
    if not node or not os.path.isfile(node):
        raise RuntimeError("MESHD_NODE must name the pinned Node.js; run these tests through `cargo xtask test`")
    api, port = echo_server("api-1")
    mesh.native("api", "api-1", port)
    mesh.native("client", "client-1", 1)
    bootstrap, _ = mesh.bootstrap(tmp_path, "client")
    script = os.path.join(os.path.dirname(__file__), "..", "node", "xds_call.js")
    env = dict(os.environ, GRPC_XDS_BOOTSTRAP=str(bootstrap), NODE_PATH=modules)
    out = subprocess.run([node, script, "xds:///api", "3", "30"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert names(collections.Counter(json.loads(out.stdout))) == {"api-1": 3}
    api.stop(None)
