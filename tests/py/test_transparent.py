"""Transparent proxying end to end, across real network namespaces.

The test builds its own small network: a bridge in this namespace (where a meshd server
runs) and two namespaces plugged into it, `web` and `api`, each with its Envoy (run by
`meshd connect envoy`) and the redirection rules of `meshd connect redirect-traffic`. The
application side is plain: `curl` run as an unprivileged user in `web` (so its traffic is
redirected; Envoy runs as root, whose traffic is not), resolving names through the
namespace's resolv.conf (port 53, sent to meshd's DNS by the rules), and a Python HTTP
server in `api`. No upstream is declared anywhere.

Checked: `curl http://api.virtual.consul/` reaches api over mTLS through both Envoys once an
allow intention exists (a `* -> *` deny stands for default deny) and stops when it is
denied; the same for api's instance address dialed directly (`DialedDirectly`); an address
outside the mesh passes through, and is refused with the mesh's `MeshDestinationsOnly`.
Then a destination outside the mesh (service-defaults `Destination`: the server's HTTP API
on the bridge) is reached, under `MeshDestinationsOnly`, through a terminating gateway (its
Envoy in this namespace, registered in the server's catalog) once an intention allows it,
as TCP and then as HTTP, and not when denied; and the same address registered as a
catalog service linked to the gateway is reached by its virtual IP's name.

It needs root (network namespaces, nftables) and fails, naming why, without it.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import consul
import pytest

APP_USER = "65534"  # nobody: the application's traffic is redirected, Envoy's (root) is not.
# One mesh (namespaces, agents, sidecars) shared by the module's tests, in order: under
# pytest-xdist they all run on one worker.
pytestmark = pytest.mark.xdist_group("transparent")



def _meshd_binary():
    path = os.environ.get("MESHD_BIN")
    if not path or not os.path.exists(path):
        raise RuntimeError("MESHD_BIN must name a built meshd binary; run these tests through `cargo xtask test`")
    return path


def _envoy_binary():
    path = os.environ.get("MESHD_ENVOY")
    if not path or not os.path.exists(path):
        raise RuntimeError("MESHD_ENVOY must name the pinned Envoy; run these tests through `cargo xtask test`")
    return path


def sh(*args):
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def free_port(host):
    """A port free on `host` now (the process given it binds it right after)."""
    import socket
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Network:
    """A bridge here and one namespace per host on it; removed by `close`."""

    def __init__(self):
        if os.geteuid() != 0:
            raise RuntimeError("transparent proxying is tested in network namespaces with nftables rules: run as root")
        pid = os.getpid()
        self.tag = f"{pid % 100000}"
        self.prefix = f"10.{100 + pid % 100}.{(pid // 100) % 250}"
        self.bridge = f"mbr{self.tag}"
        self.hosts = {}
        self.cleanup = [lambda: sh("ip", "link", "del", self.bridge)]
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    @property
    def gateway(self):
        return f"{self.prefix}.1"

    def add(self, name, last_octet):
        ns = f"meshd-tp-{name}-{self.tag}"
        host_end, ns_end = f"vh{name[:3]}{self.tag}", f"vn{name[:3]}{self.tag}"
        sh("ip", "netns", "add", ns)
        self.cleanup.append(lambda: sh("ip", "netns", "del", ns))
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        sh("ip", "link", "set", ns_end, "netns", ns)
        sh("ip", "link", "set", host_end, "master", self.bridge, "up")
        address = f"{self.prefix}.{last_octet}"
        sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", ns_end)
        sh("ip", "-n", ns, "link", "set", ns_end, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", self.gateway)
        # `ip netns exec` puts this file over /etc/resolv.conf: the applications ask port 53
        # on loopback, which the rules send to the agent's DNS.
        etc = f"/etc/netns/{ns}"
        os.makedirs(etc, exist_ok=True)
        self.cleanup.append(lambda: shutil.rmtree(etc, ignore_errors=True))
        with open(f"{etc}/resolv.conf", "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:2 attempts:2\n")
        self.hosts[name] = (ns, address)
        return ns, address

    def close(self):
        for undo in reversed(self.cleanup):
            try:
                undo()
            except Exception:
                pass


class Mesh:
    """A server on the bridge; in each host namespace a meshd agent (joined to it), the
    sidecar's Envoy, and the redirection rules."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.net = Network()
        self.web_ns, self.web_ip = self.net.add("web", 2)
        self.api_ns, self.api_ip = self.net.add("api", 3)
        gw = self.net.gateway
        self.server = self._start(
            [], "server", [_meshd_binary(), "server", "-dev", "-http-addr", f"{gw}:0", "-grpc-addr", f"{gw}:0",
                           "-dns-addr", f"{gw}:0", "-log-level", "warn"])
        self.client = consul.Consul(host=gw, port=self.server["http"])
        self.agents = {}

    def _start(self, prefix, mode, args):
        """Starts a meshd node (in a namespace when `prefix` says so); its ports from its
        ready lines."""
        proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        ports = {}
        for line in proc.stdout:
            line = line.strip()
            if line.startswith(f"meshd {mode} listening on http://"):
                ports["http"] = int(line.rsplit(":", 1)[1])
            elif line.startswith(f"meshd {'xds' if mode == 'server' else 'agent xds'} listening on "):
                ports["grpc"] = line.rsplit(" ", 1)[1]
            elif line.startswith(f"meshd {mode} dns listening on "):
                ports["dns"] = int(line.rsplit(":", 1)[1])
                break
        if len(ports) != 3:
            raise RuntimeError(f"meshd {mode} did not print its ready lines")
        return ports

    def agent(self, name, ns, address):
        """`meshd agent` in `ns`: its API on the host's address (the test reaches it over
        the bridge), xDS and DNS on the namespace's loopback."""
        ports = self._start(
            ["ip", "netns", "exec", ns], "agent",
            [_meshd_binary(), "agent", "-dev", "-node", f"{name}-node", "-advertise", address,
             "-retry-join", f"{self.net.gateway}:{self.server['http']}", "-http-addr", f"{address}:0",
             "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn"])
        self.agents[name] = (address, ports)
        return consul.Consul(host=address, port=ports["http"])

    def spawn(self, ns, *args, log):
        out = open(os.path.join(self.tmp, log), "w")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def register(self, name, port, dialed_directly=False):
        """Registers `name` and its transparent sidecar at its host's agent (py-consul)."""
        address, _ = self.agents[name]
        c = consul.Consul(host=address, port=self.agents[name][1]["http"])
        proxy = {"DestinationServiceName": name, "DestinationServiceID": name,
                 "LocalServicePort": port, "Mode": "transparent"}
        if dialed_directly:
            proxy["TransparentProxy"] = {"DialedDirectly": True}
        assert c.agent.service.register(name, port=port)
        assert c.agent.service.register(f"{name}-sidecar-proxy", port=21000, kind="connect-proxy", proxy=proxy)

    def sidecar(self, name, ns, base_id):
        """Envoy for `name`'s sidecar (through its agent), then the rules of
        `redirect-traffic` for it (the agent's API port left out of the inbound
        redirection: the test and the server reach it from outside)."""
        address, ports = self.agents[name]
        run_dir = os.path.join(self.tmp, name)
        self.spawn(ns, _meshd_binary(), "connect", "envoy", "-proxy-id", f"{name}-sidecar-proxy",
                   "-http-addr", f"{address}:{ports['http']}", "-grpc-addr", ports["grpc"],
                   "-admin-bind", "127.0.0.1:0", "-run-dir", run_dir,
                   "-base-id", str(base_id), "-drain-time", "1s", "-log-level", "warn",
                   "-envoy-binary", _envoy_binary(), "--", "-l", "error", log=f"envoy-{name}.log")
        out = sh(_meshd_binary(), "connect", "redirect-traffic", "-http-addr", f"{address}:{ports['http']}",
                 "-proxy-id", f"{name}-sidecar-proxy", "-proxy-uid", "0", "-netns", f"/var/run/netns/{ns}",
                 "-exclude-inbound-port", str(ports["http"]),
                 "-consul-dns-ip", "127.0.0.1", "-consul-dns-port", str(ports["dns"]))
        assert "Redirected network namespace" in out, out

    def terminating_gateway(self, name, base_id):
        """A terminating gateway in this namespace, on the bridge: (its port, Envoy's admin
        URL)."""
        port, admin = free_port(self.net.gateway), free_port("127.0.0.1")
        gw = self.net.gateway
        self.procs.append(subprocess.Popen(
            [_meshd_binary(), "connect", "envoy", "-gateway", "terminating", "-service", name, "-register",
             "-address", f"{gw}:{port}", "-node", f"{name}-node",
             "-http-addr", f"{gw}:{self.server['http']}", "-grpc-addr", self.server["grpc"],
             "-admin-bind", f"127.0.0.1:{admin}", "-run-dir", os.path.join(self.tmp, name),
             "-base-id", str(base_id), "-drain-time", "1s", "-log-level", "warn",
             "-envoy-binary", _envoy_binary(), "--", "-l", "error"],
            stdout=open(os.path.join(self.tmp, f"envoy-{name}.log"), "w"), stderr=subprocess.STDOUT))
        return port, f"http://127.0.0.1:{admin}"

    def curl(self, url):
        """`curl` as the application in `web`: (exit code, body)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.web_ns, "setpriv", f"--reuid={APP_USER}", f"--regid={APP_USER}",
             "--clear-groups", "curl", "-s", "-m", "5", url],
            capture_output=True, text=True)
        return out.returncode, out.stdout

    def eventually(self, what, url, ok, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            code, body = self.curl(url)
            if ok(code, body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: curl {url} still gives exit {code}, {body[:200]!r}; logs: {self.logs()}")
            time.sleep(0.5)

    def logs(self):
        text = ""
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmp, name)) as f:
                    text += f"\n--- {name}\n{f.read()[-1500:]}"
        return text

    def close(self):
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.net.close()


@pytest.fixture(scope="module")
def mesh():
    tmp = tempfile.mkdtemp(prefix="meshd-tp-")
    m = None
    try:
        m = Mesh(tmp)
        with open(os.path.join(tmp, "index.html"), "w") as f:
            f.write("hello from api\n")
        m.spawn(m.api_ns, "python3", "-m", "http.server", "8080", "--bind", "0.0.0.0", "--directory", tmp,
                log="api-app.log")
        c = m.client
        # Default deny: a wildcard deny intention.
        assert c.config.set("service-intentions", "*", {"Sources": [{"Name": "*", "Action": "deny"}]})
        m.agent("web", m.web_ns, m.web_ip)
        m.agent("api", m.api_ns, m.api_ip)
        m.register("web", 8080)
        m.register("api", 8080, dialed_directly=True)
        base = 30000 + os.getpid() % 1000 * 2
        m.sidecar("web", m.web_ns, base)
        m.sidecar("api", m.api_ns, base + 1)
        yield m
    finally:
        if m is not None:
            m.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _allow(mesh, action):
    assert mesh.client.config.set("service-intentions", "api", {"Sources": [{"Name": "web", "Action": action}]})


def _reached(code, body):
    return code == 0 and "hello from api" in body


def _cut(code, body):
    return code != 0 and "hello from api" not in body


def test_virtual_ip_direct_dial_and_passthrough(mesh):
    # The name resolves through meshd's DNS (port 53 redirected) to api's virtual IP.
    index, nodes = mesh.client.health.connect("api")
    while not nodes:
        index, nodes = mesh.client.health.connect("api", index=index, wait="10s")
    vip = nodes[0]["Service"]["TaggedAddresses"]["consul-virtual"]["Address"]
    assert vip.startswith("240."), vip
    # No allow intention yet: web has no upstream, nothing reaches api.
    mesh.eventually("web's outbound listener up", f"http://{mesh.net.gateway}:{mesh.server['http']}/v1/status/leader",
                    lambda code, body: code == 0 and body.startswith('"'))
    code, body = mesh.curl("http://api.virtual.consul/")
    assert _cut(code, body), (code, body)

    _allow(mesh, "allow")
    mesh.eventually("allowed by name", "http://api.virtual.consul/", _reached)
    mesh.eventually("allowed by virtual IP", f"http://{vip}/", _reached)
    mesh.eventually("allowed, instance dialed directly", f"http://{mesh.api_ip}:8080/", _reached)
    web_agent, ports = mesh.agents["web"]
    status = json.loads(urllib.request.urlopen(
        f"http://{web_agent}:{ports['http']}/v1/internal/proxy-status/web-sidecar-proxy").read())
    assert status["Mode"] == "transparent"
    assert {"ID": "api", "Implicit": True} in status["Upstreams"], status
    streams = json.loads(urllib.request.urlopen(f"http://{web_agent}:{ports['http']}/v1/internal/xds-status").read())
    web = [st for st in streams if st["Node"] == "web-sidecar-proxy"]
    assert web and web[0]["Transparent"] and web[0]["ImplicitUpstreams"] == ["api"], streams
    over_http = json.loads(urllib.request.urlopen(
        f"http://{mesh.net.gateway}:{mesh.server['http']}/v1/internal/service-virtual-ip/api").read())
    assert over_http == {"ServiceName": "api", "VirtualIP": vip}, over_http

    _allow(mesh, "deny")
    mesh.eventually("denied by name", "http://api.virtual.consul/", _cut)
    mesh.eventually("denied, instance dialed directly", f"http://{mesh.api_ip}:8080/", _cut)

    # Outside the mesh (the server's HTTP API on the bridge): passed through, until the mesh
    # keeps proxies to its own destinations.
    outside = f"http://{mesh.net.gateway}:{mesh.server['http']}/v1/status/leader"
    mesh.eventually("passthrough", outside, lambda code, body: code == 0 and body.startswith('"'))
    assert mesh.client.config.set("mesh", "mesh", {"TransparentProxy": {"MeshDestinationsOnly": True}})
    mesh.eventually("MeshDestinationsOnly", outside, lambda code, body: code != 0)


def _stat(admin, name):
    """One counter from Envoy's admin stats (0 while absent)."""
    text = urllib.request.urlopen(f"{admin}/stats").read().decode()
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def _web_problems(mesh):
    """The build problems of web's sidecar, from its agent's xds-status."""
    web_agent, ports = mesh.agents["web"]
    streams = json.loads(urllib.request.urlopen(f"http://{web_agent}:{ports['http']}/v1/internal/xds-status").read())
    web = [st for st in streams if st["Node"] == "web-sidecar-proxy"]
    assert web, streams
    return web[0].get("BuildProblems", {})


def test_destination_through_terminating_gateway(mesh):
    c = mesh.client
    assert c.config.set("mesh", "mesh", {"TransparentProxy": {"MeshDestinationsOnly": True}})
    gw, http_port = mesh.net.gateway, mesh.server["http"]
    outside = f"http://{gw}:{http_port}/v1/status/leader"
    leader = lambda code, body: code == 0 and body.startswith('"')  # noqa: E731
    mesh.eventually("outside refused", outside, lambda code, body: code != 0)

    base = 30000 + os.getpid() % 1000 * 2
    _, admin = mesh.terminating_gateway("tgw", base + 500)
    assert c.config.set("service-defaults", "outside-api", {
        "Protocol": "tcp", "Destination": {"Addresses": [gw], "Port": http_port}})
    assert c.config.set("service-intentions", "outside-api", {"Sources": [{"Name": "web", "Action": "allow"}]})
    # Allowed, but no gateway links it yet: web's proxy says so, and connections are closed.
    deadline = time.monotonic() + 60
    while "no terminating-gateway config entry links it" not in json.dumps(_web_problems(mesh)):
        assert time.monotonic() < deadline, f"web's status never named the unlinked destination: {_web_problems(mesh)}"
        time.sleep(0.5)
    code, body = mesh.curl(outside)
    assert not leader(code, body), (code, body)

    assert c.config.set("terminating-gateway", "tgw", {"Services": [{"Name": "outside-api"}]})
    mesh.eventually("destination over TCP", outside, leader)
    trust_domain = json.loads(urllib.request.urlopen(f"http://{gw}:{http_port}/v1/connect/ca/roots").read())["TrustDomain"]
    cluster = f"destination.{gw.replace('.', '-')}.outside-api.default.dc1.internal.{trust_domain}"
    through = _stat(admin, f"cluster.{cluster}.upstream_cx_total")
    assert through > 0, f"the terminating gateway did not carry it; logs: {mesh.logs()}"
    assert not any("destination" in k for k in _web_problems(mesh)), _web_problems(mesh)

    # As HTTP: routed by host on the sidecar, proxied by the gateway's HTTP chain.
    assert c.config.set("service-defaults", "outside-api", {
        "Protocol": "http", "Destination": {"Addresses": [gw], "Port": http_port}})
    deadline = time.monotonic() + 60
    while _stat(admin, f"cluster.{cluster}.upstream_rq_total") == 0:
        mesh.curl(outside)
        assert time.monotonic() < deadline, f"no HTTP request through the gateway; logs: {mesh.logs()}"
        time.sleep(0.5)
    mesh.eventually("destination over HTTP", outside, leader)

    assert c.config.set("service-intentions", "outside-api", {"Sources": [{"Name": "web", "Action": "deny"}]})
    mesh.eventually("destination denied", outside, lambda code, body: not leader(code, body))

    # A service registered in the catalog outside the mesh and linked to the gateway: it gets
    # a virtual IP, which web's application dials by name.
    assert c.catalog.register("outside-node", gw, service={"Service": "legacy", "Port": http_port})
    assert c.config.set("terminating-gateway", "tgw", {"Services": [{"Name": "outside-api"}, {"Name": "legacy"}]})
    assert c.config.set("service-intentions", "legacy", {"Sources": [{"Name": "web", "Action": "allow"}]})
    by_name = f"http://legacy.virtual.consul:{http_port}/v1/status/leader"
    mesh.eventually("linked service by its virtual IP", by_name, leader)
    legacy = f"legacy.default.dc1.internal.{trust_domain}"
    assert _stat(admin, f"cluster.{legacy}.upstream_cx_total") > 0, "not through the gateway"
    assert c.config.set("service-intentions", "legacy", {"Sources": [{"Name": "web", "Action": "deny"}]})
    mesh.eventually("linked service denied", by_name, lambda code, body: not leader(code, body))
