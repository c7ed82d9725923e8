"""The DNS interface against a real DNS client (dnspython): each name form, SRV answers and
their additional records, tag filtering, health, truncation then TCP, NXDOMAIN with the SOA,
the recursors, the alternative domain, an agent answering from its servers, and ACLs.
"""

import json
import os
import socket
import subprocess
import threading
import urllib.request

import consul
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest


def _meshd_binary():
    path = os.environ.get("MESHD_BIN")
    if not path or not os.path.exists(path):
        raise RuntimeError("MESHD_BIN must name a built meshd binary; run these tests through `cargo xtask test`")
    return path


class Node:
    """A meshd server or agent; its HTTP and DNS addresses read off its ready lines."""

    def __init__(self, args, mode):
        self.proc = subprocess.Popen([_meshd_binary(), *args], stdout=subprocess.PIPE, text=True)
        self.http = self.dns = None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith(f"meshd {mode} listening on http://"):
                self.http = line.rsplit("http://", 1)[1]
            elif line.startswith(f"meshd {mode} dns listening on "):
                host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
                self.dns = (host, int(port))
                break
        if not (self.http and self.dns):
            self.proc.kill()
            raise RuntimeError(f"meshd {mode} did not print its ready lines")

    def client(self, token=None):
        host, port = self.http.rsplit(":", 1)
        return consul.Consul(host=host, port=int(port), token=token)

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=30) == 0


def start_server(*extra):
    return Node(["server", "-dev", "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0",
                 "-dns-addr", "127.0.0.1:0", "-log-level", "warn", *extra], "server")


def ask(node, name, rdtype="A", tcp=False, payload=None):
    q = dns.message.make_query(name, rdtype, use_edns=payload is not None, payload=payload or 512)
    send = dns.query.tcp if tcp else dns.query.udp
    return send(q, node.dns[0], port=node.dns[1], timeout=5)


def addresses(answer):
    return sorted(r.address for rrset in answer.answer for r in rrset if hasattr(r, "address"))


class Recursor:
    """A DNS server for names outside the mesh: `example.test` is 192.0.2.1."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.addr = self.sock.getsockname()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            q = dns.message.from_wire(data)
            r = dns.message.make_response(q)
            name = q.question[0].name.to_text()
            if name == "example.test.":
                r.answer.append(dns.rrset.from_text(name, 60, "IN", "A", "192.0.2.1"))
            else:
                r.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(r.to_wire(), peer)


def register(c, node, address, service=None, check_status=None):
    check = None
    if service and check_status:
        check = {"CheckID": f"{service['ID']}-check", "Name": "probe", "Status": check_status,
                 "ServiceID": service["ID"]}
    assert c.catalog.register(node, address, service=service, check=check)


@pytest.fixture(scope="module")
def mesh():
    recursor = Recursor()
    server = start_server("-recursor", f"{recursor.addr[0]}:{recursor.addr[1]}", "-alt-domain", "mesh.test",
                          "-dns-service-ttl", "5s", "-dns-node-ttl", "7s")
    c = server.client()
    register(c, "n1", "10.0.0.1", {"ID": "web-1", "Service": "web", "Port": 8080, "Tags": ["v1"]}, "passing")
    register(c, "n2", "10.0.0.2", {"ID": "web-2", "Service": "web", "Port": 8081, "Tags": ["v2"],
                                   "Address": "10.0.0.22"}, "warning")
    register(c, "n3", "10.0.0.3", {"ID": "web-3", "Service": "web", "Port": 8082, "Tags": ["v1"]}, "critical")
    register(c, "n1", "10.0.0.1", {"ID": "web-sidecar-proxy", "Service": "web-sidecar-proxy",
                                   "Kind": "connect-proxy", "Port": 21000,
                                   "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web-1"}})
    for i in range(12):
        register(c, f"big-{i}", f"10.1.0.{i + 1}", {"ID": f"big-{i}", "Service": "big", "Port": 9000})
    yield server
    server.stop()


def test_service_names_answer_healthy_instances(mesh):
    a = ask(mesh, "web.service.consul.")
    assert a.rcode() == dns.rcode.NOERROR
    assert a.flags & dns.flags.AA
    # web-3 is critical: left out; web-2 warns: kept, at its own address.
    assert addresses(a) == ["10.0.0.1", "10.0.0.22"]
    assert all(rrset.ttl == 5 for rrset in a.answer)
    assert addresses(ask(mesh, "web.service.dc1.consul.")) == ["10.0.0.1", "10.0.0.22"]
    assert addresses(ask(mesh, "WEB.Service.Consul.")) == ["10.0.0.1", "10.0.0.22"]
    assert addresses(ask(mesh, "web.service.mesh.test.")) == ["10.0.0.1", "10.0.0.22"]


def test_tags_filter_in_both_forms(mesh):
    assert addresses(ask(mesh, "v1.web.service.consul.")) == ["10.0.0.1"]
    assert addresses(ask(mesh, "v2.web.service.consul.")) == ["10.0.0.22"]
    srv = ask(mesh, "_web._v2.service.consul.", "SRV")
    [rrset] = srv.answer
    [record] = list(rrset)
    assert (record.port, record.target.to_text()) == (8081, "0a000016.addr.dc1.consul.")
    assert addresses(srv) == []
    assert [r.address for rrset in srv.additional for r in rrset] == ["10.0.0.22"]
    # `_tcp` is no tag: every healthy instance.
    assert len(list(ask(mesh, "_web._tcp.service.consul.", "SRV").answer[0])) == 2
    assert ask(mesh, "v9.web.service.consul.").rcode() == dns.rcode.NXDOMAIN


def test_srv_targets_nodes_with_their_addresses_as_additional_records(mesh):
    a = ask(mesh, "web.service.consul.", "SRV")
    records = {r.target.to_text(): r.port for rrset in a.answer for r in rrset}
    assert records == {"n1.node.dc1.consul.": 8080, "0a000016.addr.dc1.consul.": 8081}
    additional = {rrset.name.to_text(): [r.address for r in rrset] for rrset in a.additional
                  if rrset.rdtype == dns.rdatatype.A}
    assert additional == {"n1.node.dc1.consul.": ["10.0.0.1"], "0a000016.addr.dc1.consul.": ["10.0.0.22"]}
    # The targets resolve too.
    assert addresses(ask(mesh, "0a000016.addr.dc1.consul.")) == ["10.0.0.22"]


def test_node_names(mesh):
    a = ask(mesh, "n2.node.consul.")
    assert addresses(a) == ["10.0.0.2"]
    assert a.answer[0].ttl == 7
    assert addresses(ask(mesh, "n2.node.dc1.mesh.test.")) == ["10.0.0.2"]
    missing = ask(mesh, "nobody.node.consul.")
    assert missing.rcode() == dns.rcode.NXDOMAIN
    # A name that exists, asked for a type it has none of: NOERROR, no answer, the SOA.
    empty = ask(mesh, "n2.node.consul.", "AAAA")
    assert (empty.rcode(), empty.answer) == (dns.rcode.NOERROR, [])
    assert empty.authority[0].rdtype == dns.rdatatype.SOA


def test_connect_names_answer_the_sidecars(mesh):
    a = ask(mesh, "web.connect.consul.", "SRV")
    assert [(r.port, r.target.to_text()) for rrset in a.answer for r in rrset] == [(21000, "n1.node.dc1.consul.")]
    assert ask(mesh, "big.connect.consul.").rcode() == dns.rcode.NXDOMAIN


def test_virtual_names_answer_the_services_virtual_ip(mesh):
    # web has a sidecar: the catalog gave it the first virtual IP, which its connect
    # instances show as their `consul-virtual` tagged address.
    assert addresses(ask(mesh, "web.virtual.consul.")) == ["240.0.0.1"]
    [sidecar] = mesh.client().health.connect("web")[1]
    assert sidecar["Service"]["TaggedAddresses"]["consul-virtual"] == {"Address": "240.0.0.1", "Port": 21000}
    # The catalog's own listings show it too (py-consul's catalog.service and catalog.connect).
    for listed in (mesh.client().catalog.service(sidecar["Service"]["Service"])[1], mesh.client().catalog.connect("web")[1]):
        assert [n["ServiceTaggedAddresses"]["consul-virtual"] for n in listed] == [{"Address": "240.0.0.1", "Port": 21000}]
    assert ask(mesh, "big.virtual.consul.").rcode() == dns.rcode.NXDOMAIN


def test_unknown_names_are_nxdomain_with_the_soa(mesh):
    for name in ["nope.service.consul.", "web.service.dc2.consul.", "what.consul.", "web.virtualish.consul."]:
        a = ask(mesh, name)
        assert a.rcode() == dns.rcode.NXDOMAIN, name
        [soa] = a.authority
        assert soa.rdtype == dns.rdatatype.SOA and soa.name.to_text() == "consul.", name
        assert soa[0].mname.to_text() == "ns.consul.", name


def test_udp_answers_are_cut_with_the_tc_bit_and_tcp_answers_whole(mesh):
    udp = ask(mesh, "big.service.consul.")
    assert udp.flags & dns.flags.TC
    assert len(addresses(udp)) == 3
    tcp = ask(mesh, "big.service.consul.", tcp=True)
    assert not tcp.flags & dns.flags.TC
    assert addresses(tcp) == sorted(f"10.1.0.{i + 1}" for i in range(12))
    # What a resolver does with TC: asks again over TCP.
    q = dns.message.make_query("big.service.consul.", "A")
    answer, over_tcp = dns.query.udp_with_fallback(q, mesh.dns[0], port=mesh.dns[1], timeout=5)
    assert over_tcp and len(addresses(answer)) == 12
    # Shuffled: the first address is not always the same.
    firsts = {addresses_in_order(ask(mesh, "big.service.consul.", tcp=True))[0] for _ in range(30)}
    assert len(firsts) > 1


def addresses_in_order(answer):
    return [r.address for rrset in answer.answer for r in rrset]


def test_a_critical_instance_leaves_the_answer_at_once(mesh):
    c = mesh.client()
    register(c, "n4", "10.0.0.4", {"ID": "flip-1", "Service": "flip", "Port": 1}, "passing")
    register(c, "n5", "10.0.0.5", {"ID": "flip-2", "Service": "flip", "Port": 1}, "passing")
    assert addresses(ask(mesh, "flip.service.consul.")) == ["10.0.0.4", "10.0.0.5"]
    register(c, "n5", "10.0.0.5", {"ID": "flip-2", "Service": "flip", "Port": 1}, "critical")
    assert addresses(ask(mesh, "flip.service.consul.")) == ["10.0.0.4"]
    register(c, "n4", "10.0.0.4", {"ID": "flip-1", "Service": "flip", "Port": 1}, "critical")
    assert ask(mesh, "flip.service.consul.").rcode() == dns.rcode.NXDOMAIN


def test_prepared_queries(mesh):
    body = json.dumps({"Name": "webq", "Service": {"Service": "web", "OnlyPassing": True}}).encode()
    req = urllib.request.Request(f"http://{mesh.http}/v1/query", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).read()
    assert addresses(ask(mesh, "webq.query.consul.")) == ["10.0.0.1"]
    assert ask(mesh, "nosuch.query.consul.").rcode() == dns.rcode.NXDOMAIN


def test_other_names_go_to_the_recursor(mesh):
    a = ask(mesh, "example.test.")
    assert addresses(a) == ["192.0.2.1"]
    assert ask(mesh, "other.test.").rcode() == dns.rcode.NXDOMAIN
    assert addresses(ask(mesh, "example.test.", tcp=False, payload=1232)) == ["192.0.2.1"]


def test_the_apex_has_an_soa_and_ns(mesh):
    soa = ask(mesh, "consul.", "SOA")
    assert soa.answer[0].rdtype == dns.rdatatype.SOA
    ns = ask(mesh, "consul.", "NS")
    assert [r.target.to_text() for r in ns.answer[0]] == ["ns.consul."]


def test_an_agent_answers_from_its_servers_and_refuses_other_names_without_recursors(mesh):
    agent = Node(["agent", "-node", "dns-agent", "-dev", "-retry-join", mesh.http, "-http-addr", "127.0.0.1:0",
                  "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-advertise", "127.0.0.1",
                  "-log-level", "warn"], "agent")
    try:
        assert addresses(ask(agent, "web.service.consul.")) == ["10.0.0.1", "10.0.0.22"]
        assert addresses(ask(agent, "n1.node.consul.")) == ["10.0.0.1"]
        assert ask(agent, "nope.service.consul.").rcode() == dns.rcode.NXDOMAIN
        assert ask(agent, "example.test.").rcode() == dns.rcode.REFUSED
    finally:
        agent.stop()


def test_names_resolve_only_what_the_anonymous_token_may_read(tmp_path):
    token_file = tmp_path / "management"
    token_file.write_text("c0ffee00-0000-4000-8000-000000000001")
    token_file.chmod(0o600)
    server = start_server("-acl-enabled", "-acl-default-policy", "deny",
                          "-acl-initial-management-token-file", str(token_file))
    try:
        c = server.client(token="c0ffee00-0000-4000-8000-000000000001")
        register(c, "n1", "10.0.0.1", {"ID": "web-1", "Service": "web", "Port": 8080})
        register(c, "n1", "10.0.0.1", {"ID": "db-1", "Service": "db", "Port": 5432})
        assert ask(server, "web.service.consul.").rcode() == dns.rcode.NXDOMAIN
        assert ask(server, "n1.node.consul.").rcode() == dns.rcode.NXDOMAIN
        # Anonymous may read web and every node: web resolves, db does not.
        policy = c.acl.policy.create("dns-read", rules='service "web" { policy = "read" }\nnode_prefix "" { policy = "read" }')
        anonymous = "00000000-0000-0000-0000-000000000002"
        c.acl.token.update(anonymous, policies_id=[policy["ID"]])
        assert addresses(ask(server, "web.service.consul.")) == ["10.0.0.1"]
        assert addresses(ask(server, "n1.node.consul.")) == ["10.0.0.1"]
        assert ask(server, "db.service.consul.").rcode() == dns.rcode.NXDOMAIN
    finally:
        server.stop()
