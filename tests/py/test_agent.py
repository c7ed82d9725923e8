"""py-consul 1.8.0 against a real `meshd agent` joined to a real `meshd server`.

Applications talk to their local agent only; every change must reach the server's catalog
within the sync window, and reads the agent does not answer itself are forwarded.
"""

import http.server
import json
import urllib.request
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time

import consul
import pytest
from consul import Check
from consul.exceptions import ConsulException

from conftest import _meshd_binary

# How long a change may take to reach the server: generous, for a loaded machine (the
# sync itself takes milliseconds; a probe returns as soon as it holds).
SYNC_WINDOW = 30.0


def eventually(probe, timeout=SYNC_WINDOW, what="condition"):
    """Polls `probe` until it returns a truthy value; fails naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")


class Proc:
    """A meshd process started by a test; stopped (by pid) when the test ends."""

    def __init__(self, args, ready_prefix):
        self.proc = subprocess.Popen([_meshd_binary(), *args], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith(ready_prefix):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"meshd did not start: {line!r}")
        self.addr = line[len(ready_prefix):]
        host, port = self.addr.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def client(self):
        return consul.Consul(host=self.host, port=self.port)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


def start_server(data_dir=None, http_addr="127.0.0.1:0", liveness="10s"):
    store = ["-data-dir", str(data_dir)] if data_dir else ["-dev"]
    return Proc(
        ["server", *store, "-http-addr", http_addr, "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn",
         "-node-liveness-timeout", liveness],
        "meshd server listening on http://",
    )


def start_agent(servers, node="node-a", data_dir=None, extra=()):
    store = ["-data-dir", str(data_dir)] if data_dir else ["-dev"]
    joins = [arg for s in servers for arg in ("-retry-join", s)]
    return Proc(
        ["agent", "-node", node, *store, *joins, "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0",
         "-advertise", "127.0.0.1", "-log-level", "warn", *extra],
        "meshd agent listening on http://",
    )


@pytest.fixture(autouse=True)
def no_consul_environment(monkeypatch):
    """py-consul reads these; the tests talk to the processes they start, nothing else."""
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cluster():
    """One server and one agent (both in memory); yields (server, agent) processes."""
    # The default liveness window: a heartbeat late on a loaded machine must not turn the
    # node critical under tests that expect it passing.
    server = start_server(liveness="10s")
    agent = start_agent([server.addr])
    yield server, agent
    assert agent.stop() == 0, "meshd agent did not shut down cleanly"
    assert server.stop() == 0, "meshd server did not shut down cleanly"


def server_health(server, name, passing=False):
    return server.client().health.service(name, passing=passing)[1]


def statuses(entry):
    return {c["CheckID"]: c["Status"] for c in entry["Checks"]}


def test_register_with_checks_and_a_sidecar_reaches_the_server(cluster):
    server, agent = cluster
    c = agent.client()
    assert c.agent.service.register(
        "web", service_id="web-1", port=8080, tags=["v1"], check=Check.ttl("30s"),
        connect={"sidecar_service": {"proxy": {"upstreams": [{"destination_name": "api", "local_bind_port": 9191}]}}},
    ) is True

    services = c.agent.services()
    assert set(services) == {"web-1", "web-1-sidecar-proxy"}
    proxy = services["web-1-sidecar-proxy"]
    assert proxy["Kind"] == "connect-proxy"
    assert proxy["Service"] == "web-sidecar-proxy"
    assert 21000 <= proxy["Port"] <= 21255
    assert proxy["Proxy"]["DestinationServiceName"] == "web"
    assert proxy["Proxy"]["DestinationServiceID"] == "web-1"
    assert proxy["Proxy"]["LocalServicePort"] == 8080
    assert proxy["Proxy"]["Upstreams"][0]["DestinationName"] == "api"

    checks = c.agent.checks()
    assert checks["service:web-1"]["Status"] == "critical"
    assert checks["service:web-1"]["Type"] == "ttl"
    assert {checks[k]["Type"] for k in checks if k.startswith("service:web-1-sidecar-proxy")} == {"tcp", "alias"}

    entry = eventually(lambda: server_health(server, "web"), what="web on the server")[0]
    assert entry["Node"]["Node"] == "node-a"
    assert entry["Service"]["Tags"] == ["v1"]
    assert statuses(entry)["service:web-1"] == "critical"
    connect = eventually(lambda: server.client().health.connect("web")[1], what="the sidecar on the server")
    assert connect[0]["Service"]["ID"] == "web-1-sidecar-proxy"
    assert connect[0]["Service"]["Proxy"]["Upstreams"][0]["LocalBindPort"] == 9191

    # TTL pass and fail, each visible on the server.
    assert c.agent.check.ttl_pass("service:web-1", "all good") is True
    assert c.agent.checks()["service:web-1"]["Output"] == "all good"
    eventually(lambda: server_health(server, "web", passing=True), what="web passing on the server")
    assert c.agent.check.ttl_fail("service:web-1", "broken") is True
    eventually(lambda: not server_health(server, "web", passing=True), what="web critical on the server")

    # Maintenance mode, on and off.
    c.agent.check.ttl_pass("service:web-1")
    eventually(lambda: server_health(server, "web", passing=True), what="web passing again")
    assert c.agent.service.maintenance("web-1", True, "upgrading") is True
    entry = eventually(
        lambda: [e for e in server_health(server, "web") if "_service_maintenance:web-1" in statuses(e)],
        what="the maintenance check on the server",
    )[0]
    assert statuses(entry)["_service_maintenance:web-1"] == "critical"
    assert not server_health(server, "web", passing=True)
    assert c.agent.service.maintenance("web-1", False) is True
    eventually(lambda: server_health(server, "web", passing=True), what="web out of maintenance")

    # Deregistering the service takes its sidecar along, locally and on the server.
    assert c.agent.service.deregister("web-1") is True
    assert c.agent.services() == {}
    eventually(lambda: not server_health(server, "web"), what="web gone from the server")
    eventually(lambda: not server.client().health.connect("web")[1], what="the sidecar gone from the server")


def test_bad_definitions_are_refused_naming_the_field_and_change_nothing(cluster):
    _, agent = cluster
    c = agent.client()
    with pytest.raises(ConsulException, match="Checks\\[0\\].TTL: required"):
        c.agent.service.register("web", check={"interval": "10s"})
    with pytest.raises(ConsulException, match="ScriptArgs"):
        c.agent.service.register("web", check={"args": ["true"], "ScriptArgs": ["true"], "interval": "10s"})
    assert c.agent.service.register("api", port=9000, connect={"sidecar_service": {"port": 21010}}) is True
    with pytest.raises(ConsulException, match="Connect.SidecarService.Port: 21010 is already used"):
        c.agent.service.register("web", port=8080, connect={"sidecar_service": {"port": 21010}})
    assert set(c.agent.services()) == {"api", "api-sidecar-proxy"}
    with pytest.raises(ConsulException, match="ServiceID"):
        c.agent.check.register("orphan", Check.ttl("10s"), service_id="nope")
    assert set(c.agent.checks()) == {"service:api-sidecar-proxy:1", "service:api-sidecar-proxy:2"}


def test_forwarded_blocking_query_wakes_on_a_change(cluster):
    _, agent = cluster
    c = agent.client()
    c.agent.service.register("db", service_id="db-1", port=5432, check=Check.ttl("30s"))
    index, entries = eventually(lambda: (lambda r: r if r[1] else None)(c.health.service("db")), what="db via the agent")
    assert int(index) >= 1
    result = {}

    def block():
        result["reply"] = c.health.service("db", index=int(index), wait="30s", passing=True)

    waiter = threading.Thread(target=block)
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    assert "reply" not in result, "the forwarded query did not block"
    c.agent.check.ttl_pass("service:db-1")
    waiter.join(timeout=20)
    assert "reply" in result, "the forwarded blocking query did not wake"
    new_index, passing = result["reply"]
    assert int(new_index) > int(index)
    assert [e["Service"]["ID"] for e in passing] == ["db-1"]
    assert time.monotonic() - started < 10


class Backend(http.server.BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self):  # noqa: N802 (http.server's naming)
        code = 200 if Backend.healthy else 500
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"failing")

    def log_message(self, *args):
        pass


def test_http_check_turns_critical_and_leaves_passing_results(cluster):
    server, agent = cluster
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    thread = threading.Thread(target=backend.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{backend.server_address[1]}/health"
        c = agent.client()
        c.agent.service.register("shop", port=backend.server_address[1], check=Check.http(url, "1s", timeout="1s"))
        eventually(lambda: server_health(server, "shop", passing=True), timeout=8, what="shop passing")
        Backend.healthy = False
        eventually(lambda: not server_health(server, "shop", passing=True), timeout=8, what="shop out of ?passing")
        out = c.agent.checks()["service:shop"]["Output"]
        assert "500" in out and "failing" in out
        Backend.healthy = True
        eventually(lambda: server_health(server, "shop", passing=True), timeout=8, what="shop passing again")
    finally:
        Backend.healthy = True
        backend.shutdown()


def test_anti_entropy_removes_foreign_entries_of_its_node():
    server = start_server()
    agent = start_agent([server.addr], extra=["-sync-interval", "1s", "-node-meta", "rack:r1"])
    try:
        c = agent.client()
        c.agent.service.register("web", port=80)
        eventually(lambda: server_health(server, "web"), what="web on the server")
        assert server.client().catalog.node("node-a")[1]["Node"]["Meta"]["rack"] == "r1"
        # Someone writes an entry for the agent's node straight to the server.
        assert server.client().catalog.register("node-a", "127.0.0.1", service={"Service": "rogue", "Port": 1}) is True
        assert server_health(server, "rogue")
        eventually(lambda: not server_health(server, "rogue"), what="the rogue entry removed")
        assert server_health(server, "web"), "the agent's own service stays"
    finally:
        assert agent.stop() == 0
        assert server.stop() == 0


def test_server_restarted_from_its_data_dir_converges(tmp_path):
    data = tmp_path / "server"
    server = start_server(data_dir=data)
    # A dead first server: the agent fails over to the live one.
    agent = start_agent(["127.0.0.1:1", server.addr], extra=["-sync-interval", "2s"])
    try:
        c = agent.client()
        c.agent.service.register("web", port=80)
        eventually(lambda: server_health(server, "web"), what="web on the server")
        addr = server.addr
        assert server.stop() == 0
        # With no server the agent keeps answering locally; forwarded reads fail with a reason.
        c.agent.service.register("api", port=81)
        c.agent.service.deregister("web")
        assert set(c.agent.services()) == {"api"}
        with pytest.raises(ConsulException, match="cannot forward to a server"):
            c.catalog.services()
        server = start_server(data_dir=data, http_addr=addr)
        eventually(lambda: server_health(server, "api"), timeout=20, what="api after the server's restart")
        eventually(lambda: not server_health(server, "web"), timeout=20, what="web removed after the restart")
    finally:
        assert agent.stop() == 0
        assert server.stop() == 0


def test_agent_restarted_from_its_data_dir_keeps_its_services(tmp_path):
    server = start_server()
    agent = start_agent([server.addr], data_dir=tmp_path / "agent")
    try:
        c = agent.client()
        c.agent.service.register("web", service_id="web-1", port=80, check=Check.ttl("60s"),
                                 connect={"sidecar_service": {}})
        c.agent.check.ttl_pass("service:web-1")
        port = c.agent.services()["web-1-sidecar-proxy"]["Port"]
        assert agent.stop() == 0
        # A corrupt file is skipped; the rest load.
        (tmp_path / "agent" / "services" / "junk.json").write_text("{not json")
        agent = start_agent([server.addr], data_dir=tmp_path / "agent")
        c = agent.client()
        services = c.agent.services()
        assert set(services) == {"web-1", "web-1-sidecar-proxy"}
        assert services["web-1-sidecar-proxy"]["Port"] == port
        assert "service:web-1" in c.agent.checks()
        eventually(lambda: server_health(server, "web"), what="web back on the server after the restart")
    finally:
        assert agent.stop() == 0
        assert server.stop() == 0


def test_killed_agent_turns_critical_within_the_liveness_timeout():
    server = start_server(liveness="2s")
    agent = start_agent([server.addr], node="doomed")
    try:
        c = agent.client()
        c.agent.service.register("web", port=80, check=Check.ttl("60s"))
        c.agent.check.ttl_pass("service:web")
        eventually(lambda: server_health(server, "web", passing=True), what="web passing")
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)
        killed = time.monotonic()
        eventually(lambda: not server_health(server, "web", passing=True), timeout=30,
                   what="web critical after the kill")
        # How soon after the liveness timeout (2 s) is the benchmarks' to measure.
        print(f"web critical {time.monotonic() - killed:.1f}s after the kill")
        entry = server_health(server, "web")[0]
        assert statuses(entry)["serfHealth"] == "critical"
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        assert server.stop() == 0


def test_terminate_leaves_the_catalog():
    server = start_server()
    agent = start_agent([server.addr], node="leaver")
    try:
        agent.client().agent.service.register("web", port=80)
        index, _ = eventually(lambda: (lambda r: r if r[1] else None)(agent.client().health.service("web")),
                              what="web via the agent")
        # A forwarded blocking query in flight does not hold the agent's exit.
        result = {}

        def block():
            try:
                result["reply"] = agent.client().health.service("web", index=int(index), wait="60s")
            except Exception as e:  # noqa: BLE001 (any failure is the expected outcome)
                result["error"] = e

        waiter = threading.Thread(target=block)
        waiter.start()
        time.sleep(0.3)
        stopping = time.monotonic()
    finally:
        assert agent.stop() == 0
    assert time.monotonic() - stopping < 5, "the agent waited for the blocking query"
    waiter.join(timeout=10)
    assert "reply" not in result or result["reply"][1], "the blocked query got no answer"
    try:
        nodes = [n["Node"] for n in server.client().catalog.nodes()[1]]
        assert "leaver" not in nodes
    finally:
        assert server.stop() == 0


def test_leave_force_leave_and_host_through_py_consul():
    """`agent.leave()` shuts an agent down and its node leaves the catalog; `force_leave`
    (through an agent, forwarded) removes a node that stopped without leaving; `/host`
    describes the machine."""
    server = start_server()
    leaver = start_agent([server.addr], node="leaver")
    gone = start_agent([server.addr], node="gone")
    try:
        catalog_nodes = lambda: {n["Node"] for n in server.client().catalog.nodes()[1]}
        eventually(lambda: {"leaver", "gone"} <= catalog_nodes(), what="both nodes registered")
        host = json.load(urllib.request.urlopen(f"http://{leaver.addr}/v1/agent/host"))
        assert host["Errors"] == [] and host["Memory"]["total"] > 0 and host["Host"]["os"] == "linux", host
        # A graceful leave: the answer, then the process ends cleanly and the node is gone.
        assert leaver.client().agent.leave() is True
        assert leaver.proc.wait(timeout=30) == 0
        eventually(lambda: "leaver" not in catalog_nodes(), what="the node that left removed")
        # A node whose agent died without leaving stays until forced out.
        gone.stop(signal.SIGKILL)
        assert "gone" in catalog_nodes()
        assert server.client().agent.force_leave("gone", prune=True) is True
        assert "gone" not in catalog_nodes()
        # An unknown node is a 404 naming it (py-consul reads it as False).
        assert server.client().agent.force_leave("never-was") is False
        req = urllib.request.Request(f"http://{server.addr}/v1/agent/force-leave/never-was", method="PUT")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 404 and b'No node found with name "never-was"' in err.value.read()
    finally:
        for proc in (leaver, gone):
            if proc.proc.poll() is None:
                proc.stop(signal.SIGKILL)
        assert server.stop() == 0


def test_the_agent_node_has_a_kept_id_tagged_addresses_and_meta(tmp_path):
    """As a Consul agent's: a UUID kept in the data dir across restarts, `lan`/`wan` tagged
    addresses, and `consul-version`/`consul-network-segment` meta."""
    import uuid
    server = start_server()
    agent = start_agent([server.addr], node="ided", data_dir=tmp_path / "agent")
    try:
        # The first heartbeat may make the node before the first sync names its id.
        node = eventually(lambda: (lambda n: n if n and n["Node"]["ID"] else None)(
            server.client().catalog.node("ided")[1]), what="the node with its id")["Node"]
        node_id = node["ID"]
        assert str(uuid.UUID(node_id)) == node_id
        assert node["TaggedAddresses"] == {"lan": "127.0.0.1", "lan_ipv4": "127.0.0.1",
                                           "wan": "127.0.0.1", "wan_ipv4": "127.0.0.1"}
        assert node["Meta"]["consul-network-segment"] == "" and node["Meta"]["consul-version"], node
        assert agent.client().agent.self()["Config"]["NodeID"] == node_id
        assert agent.stop() == 0
        agent = start_agent([server.addr], node="ided", data_dir=tmp_path / "agent")
        assert agent.client().agent.self()["Config"]["NodeID"] == node_id
        assert oct(os.stat(tmp_path / "agent" / "node-id").st_mode & 0o777) == "0o600"
    finally:
        assert agent.stop() == 0
        assert server.stop() == 0


def test_connect_authorize_through_the_agent(cluster):
    """py-consul's `agent.connect.authorize` through an agent (forwarded to a server):
    intentions decide for the certificate's service."""
    server, agent = cluster
    td = server.client().connect.ca.roots()["TrustDomain"]
    uri = f"spiffe://{td}/ns/default/dc/dc1/svc/web"
    c = agent.client()
    assert c.agent.connect.authorize("db", uri, "01")["Authorized"] is True
    assert server.client().connect.intentions.upsert("web", "db", action="deny") is not None
    answer = c.agent.connect.authorize("db", uri, "01")
    assert answer["Authorized"] is False and answer["Reason"].startswith("Matched L4 intention web => db"), answer


def test_agent_self_has_the_debug_config_clients_read(cluster):
    """`DebugConfig` of `/v1/agent/self` on both modes: the node, its mode and its ports."""
    server, agent = cluster
    for proc, server_mode in ((server, True), (agent, False)):
        me = proc.client().agent.self()
        debug = me["DebugConfig"]
        assert debug["ServerMode"] is server_mode, debug
        assert debug["HTTPPort"] == proc.port and debug["GRPCPort"] > 0, debug
        assert debug["HTTPSPort"] == -1 and debug["GRPCTLSPort"] == -1 and debug["DNSPort"] > 0, debug
        assert debug["Datacenter"] == debug["PrimaryDatacenter"] == "dc1", debug
        assert debug["NodeName"] == me["Config"]["NodeName"] and debug["NodeID"] == me["Config"]["NodeID"], me
        assert debug["ConnectEnabled"] is True and debug["ACLsEnabled"] is False, debug


def test_config_file_services_and_sighup_reload(tmp_path):
    server = start_server()
    cfg = tmp_path / "agent.json"
    cfg.write_text('{"services": [{"name": "from-file", "port": 7000}]}')
    agent = start_agent([server.addr], extra=["-config-file", str(cfg)])
    try:
        c = agent.client()
        assert set(c.agent.services()) == {"from-file"}
        eventually(lambda: server_health(server, "from-file"), what="the file's service on the server")
        cfg.write_text('{"services": [{"name": "renamed", "port": 7001}]}')
        os.kill(agent.proc.pid, signal.SIGHUP)
        eventually(lambda: set(c.agent.services()) == {"renamed"}, what="the reload")
        eventually(lambda: not server_health(server, "from-file"), what="the old service gone from the server")
        # A bad file changes nothing.
        cfg.write_text('{"services": [{"port": 1}]}')
        os.kill(agent.proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        assert set(c.agent.services()) == {"renamed"}
    finally:
        assert agent.stop() == 0
        assert server.stop() == 0


def test_alias_of_a_service_on_another_node_follows_it():
    server = start_server()
    a = start_agent([server.addr], node="node-a")
    b = start_agent([server.addr], node="node-b")
    try:
        a.client().agent.service.register("db", port=5432, check=Check.ttl("60s"))
        a.client().agent.check.ttl_pass("service:db")
        eventually(lambda: server_health(server, "db", passing=True), what="db passing")
        cb = b.client()
        cb.agent.service.register("app", port=8080, check={"alias_node": "node-a", "alias_service": "db"})
        eventually(lambda: cb.agent.checks()["service:app"]["Status"] == "passing", what="the alias passing")
        a.client().agent.check.ttl_fail("service:db", "down")
        eventually(lambda: cb.agent.checks()["service:app"]["Status"] == "critical", what="the alias critical")
        eventually(lambda: not server_health(server, "app", passing=True), what="app out of ?passing")
    finally:
        assert b.stop() == 0
        assert a.stop() == 0
        assert server.stop() == 0


def test_https_check_verifies_unless_told_to_skip(cluster, tmp_path):
    _, agent = cluster
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the test's self-signed certificate"
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server_names = set()
    ctx.sni_callback = lambda sock, name, context: server_names.add(name)
    backend.socket = ctx.wrap_socket(backend.socket, server_side=True)
    thread = threading.Thread(target=backend.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{backend.server_address[1]}/health"
        c = agent.client()
        # Each service's check targets the service's own port (checks registered through the
        # API may target nothing else).
        port = backend.server_address[1]
        c.agent.service.register("secure", port=port, check={"http": url, "interval": "1s", "tls_skip_verify": True})
        c.agent.service.register("strict", port=port, check={"http": url, "interval": "1s"})
        c.agent.service.register("named", port=port, check={"http": url, "interval": "1s", "tls_skip_verify": True,
                                                            "tls_server_name": "svc.example"})
        checks = eventually(
            lambda: (lambda cs: cs if cs["service:secure"]["Status"] == "passing"
                     and cs["service:named"]["Status"] == "passing"
                     and cs["service:strict"]["Output"] else None)(c.agent.checks()),
            timeout=8, what="the https checks run",
        )
        assert checks["service:strict"]["Status"] == "critical"
        assert "certificate" in checks["service:strict"]["Output"].lower()
        assert "svc.example" in server_names, f"TLSServerName not sent as SNI: {server_names}"
    finally:
        backend.shutdown()


def test_the_agent_serves_the_dashboard_over_its_own_proxies(cluster):
    """/ui on an agent: the page and its assets, its catalog pages read through the agent's
    forwarding, its proxies page from the agent's own xDS streams."""
    _, agent = cluster
    base = f"http://{agent.addr}"
    for path, kind in [("/ui", "text/html"), ("/ui/app.js", "javascript"), ("/ui/style.css", "text/css")]:
        r = urllib.request.urlopen(base + path, timeout=5)
        assert r.status == 200 and kind in r.headers["Content-Type"], (path, r.headers["Content-Type"])
    services = json.loads(urllib.request.urlopen(base + "/v1/internal/ui/services", timeout=5).read())
    assert isinstance(services, list)
    streams = json.loads(urllib.request.urlopen(base + "/v1/internal/xds-status", timeout=5).read())
    assert isinstance(streams, list)


def test_dc_parameter_reads_and_writes_another_datacenter_through_an_agent():
    """py-consul's `dc=` through a dc1 agent: dc2's server (joined to dc1, the primary, with
    -retry-join-wan) answers, reads, blocking reads and writes alike; an unknown one fails."""
    dc1 = start_server()
    dc2 = Proc(
        ["server", "-dev", "-datacenter", "dc2", "-primary-datacenter", "dc1", "-retry-join-wan", dc1.addr, "-node", "server-dc2",
         "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn"],
        "meshd server listening on http://",
    )
    agent = start_agent([dc1.addr])
    try:
        c = agent.client()
        eventually(lambda: c.catalog.datacenters() == ["dc1", "dc2"], what="both datacenters listed through the agent")
        dc2.client().catalog.register("n2", "10.2.0.1", service={"service": "api", "port": 80})
        index, nodes = c.health.service("api", dc="dc2")
        assert [n["Node"]["Node"] for n in nodes] == ["n2"]
        assert c.health.service("api")[1] == [], "dc1 has no api"
        assert c.kv.put("where", "dc2", dc="dc2") is True
        assert c.kv.get("where", dc="dc2")[1]["Value"] == b"dc2"
        assert c.kv.get("where")[1] is None, "written in dc2 only"

        woken = {}
        waiter = threading.Thread(target=lambda: woken.update(r=c.health.service("api", dc="dc2", index=index, wait="30s")))
        waiter.start()
        time.sleep(0.3)
        dc2.client().catalog.register("n3", "10.2.0.2", service={"service": "api", "port": 80})
        waiter.join(timeout=15)
        assert not waiter.is_alive(), "the blocking query through the agent woke on dc2's change"
        assert int(woken["r"][0]) > int(index)
        assert len(woken["r"][1]) == 2

        with pytest.raises(ConsulException, match='No path to datacenter "dc9"'):
            c.catalog.nodes(dc="dc9")
    finally:
        assert agent.stop() == 0
        assert dc2.stop() == 0
        assert dc1.stop() == 0
