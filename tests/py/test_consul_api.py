"""py-consul 1.8.0 against a real `meshd server`: the calls Consul users make."""

import subprocess
import threading

import pytest
import requests
from consul.callback import CB
from consul.exceptions import BadRequest, ClientError

from conftest import _meshd_binary, _start_server, _stop_server

SIDECAR = {
    "Kind": "connect-proxy",
    "ID": "api-sidecar-proxy",
    "Service": "api-sidecar-proxy",
    "Port": 21000,
    "Proxy": {
        "DestinationServiceName": "api",
        "DestinationServiceID": "api",
        "LocalServicePort": 8080,
        "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9191, "Config": {"connect_timeout_ms": 500}}],
    },
}


def register_api(client, node="node-1", address="10.0.0.1"):
    assert client.catalog.register(
        node,
        address,
        service={"Service": "api", "ID": "api", "Port": 8080, "Tags": ["v1"]},
        check={"CheckID": "api-alive", "Name": "api alive", "ServiceID": "api", "Status": "passing"},
    ) is True
    assert client.catalog.register(node, address, service=SIDECAR) is True


def test_register_with_sidecar_and_read_back(client):
    register_api(client)

    index, services = client.catalog.services()
    assert int(index) >= 1
    # With the servers' own `consul` service, as in Consul.
    assert services == {"api": ["v1"], "api-sidecar-proxy": [], "consul": []}

    _, nodes = client.catalog.service("api")
    assert [(n["Node"], n["ServiceID"], n["ServicePort"]) for n in nodes] == [("node-1", "api", 8080)]
    _, tagged = client.catalog.service("api", tag="v1")
    assert len(tagged) == 1

    _, healthy = client.health.service("api", passing=True)
    assert healthy[0]["Service"]["ID"] == "api"
    assert healthy[0]["Checks"][0]["Status"] == "passing"

    _, connect = client.health.connect("api")
    assert [c["Service"]["ID"] for c in connect] == ["api-sidecar-proxy"]
    proxy = connect[0]["Service"]["Proxy"]
    assert proxy["DestinationServiceName"] == "api"
    assert proxy["Upstreams"][0]["DestinationName"] == "db"
    assert proxy["Upstreams"][0]["Config"] == {"connect_timeout_ms": 500}

    _, catalog_connect = client.catalog.connect("api")
    assert catalog_connect[0]["ServiceKind"] == "connect-proxy"

    _, checks = client.health.checks("api")
    assert [c["CheckID"] for c in checks] == ["api-alive"]
    _, node = client.catalog.node("node-1")
    assert set(node["Services"]) == {"api", "api-sidecar-proxy"}
    _, missing = client.catalog.node("nowhere")
    assert missing is None
    assert client.catalog.datacenters() == ["dc1"]


def test_blocking_query_wakes_on_a_change(client):
    register_api(client)
    index, before = client.health.service("api")
    assert len(before) == 1
    result = {}

    def block():
        result["reply"] = client.health.service("api", index=int(index), wait="60s")

    waiter = threading.Thread(target=block)
    waiter.start()
    register_api(client, node="node-2", address="10.0.0.2")
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "the blocking query did not wake"
    new_index, after = result["reply"]
    assert int(new_index) > int(index)
    assert sorted(n["Node"]["Node"] for n in after) == ["node-1", "node-2"]


def test_blocking_query_times_out_with_the_same_index(client):
    register_api(client)
    index, _ = client.health.service("api")
    again, _ = client.health.service("api", index=int(index), wait="100ms")
    assert again == index


def test_config_entries_set_get_list_delete_with_cas(client):
    assert client.config.set("service-defaults", "api", {"Protocol": "http"}) is True
    assert client.config.set("service-defaults", "api", {"Protocol": "grpc"}, cas=0) is False
    entry = client.config.get("service-defaults", "api")
    assert entry["Kind"] == "service-defaults"
    assert entry["Protocol"] == "http"
    modify = entry["ModifyIndex"]
    assert client.config.set("service-defaults", "api", {"protocol": "grpc"}, cas=modify) is True
    assert [e["Protocol"] for e in client.config.list("service-defaults")] == ["grpc"]
    assert client.config.delete("service-defaults", "api", cas=modify) is False
    current = client.config.get("service-defaults", "api")["ModifyIndex"]
    assert client.config.delete("service-defaults", "api", cas=current) is True
    assert client.config.get("service-defaults", "api") is None
    assert client.config.set("proxy-defaults", "global", {"Config": {"Team_Setting": "5s"}}) is True
    assert client.config.get("proxy-defaults", "global")["Config"] == {"Team_Setting": "5s"}
    assert client.config.delete("proxy-defaults", "global") is True
    # Consul's envoy_ keys are honoured or refused, never kept and ignored (any casing).
    with pytest.raises(BadRequest) as refused:
        client.config.set("proxy-defaults", "global", {"Config": {"Envoy_Stats_Flush": "5s"}})
    assert "Config.Envoy_Stats_Flush" in str(refused.value)
    # A JWT provider (mesh:write), read back as written.
    provider = {"Issuer": "https://issuer.example",
                "JSONWebKeySet": {"Remote": {"URI": "https://issuer.example/keys", "FetchAsynchronously": True}},
                "Locations": [{"Header": {"Name": "Authorization", "ValuePrefix": "Bearer "}}]}
    assert client.config.set("jwt-provider", "okta", provider) is True
    got = client.config.get("jwt-provider", "okta")
    assert got["Kind"] == "jwt-provider" and got["Issuer"] == "https://issuer.example"
    assert got["JSONWebKeySet"]["Remote"]["FetchAsynchronously"] is True
    with pytest.raises(BadRequest) as refused:
        client.config.set("jwt-provider", "bad", {"JSONWebKeySet": {}})
    assert "JSONWebKeySet" in str(refused.value)
    assert client.config.delete("jwt-provider", "okta") is True


def test_ca_roots_configuration_and_leaf(client):
    roots = client.connect.ca.roots()
    assert len(roots["Roots"]) == 1
    root = roots["Roots"][0]
    assert root["Active"] is True
    assert root["ID"] == roots["ActiveRootID"]
    assert "BEGIN CERTIFICATE" in root["RootCert"]
    trust_domain = roots["TrustDomain"]
    assert trust_domain.endswith(".consul")

    leaf = client.agent.connect.ca.leaf("web")
    assert leaf["Service"] == "web"
    assert leaf["ServiceURI"] == f"spiffe://{trust_domain}/ns/default/dc/dc1/svc/web"
    assert "BEGIN CERTIFICATE" in leaf["CertPEM"]
    assert "PRIVATE KEY" in leaf["PrivateKeyPEM"]

    config = client.connect.ca.configuration()
    assert config["Provider"] == "consul"
    assert config["Config"]["LeafCertTTL"] == "72h0m0s"


def test_intentions_allow_deny_and_match(client):
    assert client.connect.intentions.upsert("web", "api", action="allow") is True
    assert client.connect.intentions.upsert("*", "api", action="deny") is True
    assert client.connect.intentions.check("web", "api") is True
    assert client.connect.intentions.check("billing", "api") is False

    matched = client.connect.intentions.match("destination", "api")
    assert [(i["SourceName"], i["Action"]) for i in matched["api"]] == [("web", "allow"), ("*", "deny")]
    assert client.connect.intentions.read("web", "api")["Precedence"] == 9

    assert client.connect.intentions.delete("web", "api") is True
    assert client.connect.intentions.read("web", "api") is None
    assert client.connect.intentions.check("web", "api") is False


def test_deregister(client):
    register_api(client)
    assert client.catalog.deregister("node-1", service_id="api-sidecar-proxy") is True
    _, connect = client.health.connect("api")
    assert connect == []
    assert client.catalog.deregister("node-1") is True
    # What is left is the servers' own registrations: their nodes and the `consul` service.
    _, servers = client.catalog.service("consul")
    _, nodes = client.catalog.nodes()
    assert sorted(n["Node"] for n in nodes) == sorted(s["Node"] for s in servers)
    _, services = client.catalog.services()
    assert services == {"consul": []}


def test_bad_input_is_a_400_naming_the_field(client):
    with pytest.raises(BadRequest, match="Address: required"):
        client.catalog.register("node-1", "")
    with pytest.raises(BadRequest, match="Protocol: unsupported protocol"):
        client.config.set("service-defaults", "api", {"Protocol": "udp"})
    with pytest.raises(ClientError, match="405"):
        client.http.post(CB.boolean(), "/v1/catalog/register")


def test_discovery_chain_compiled_with_overrides(client):
    assert client.config.set("service-defaults", "web", {"Protocol": "http"}) is True
    assert client.config.set(
        "service-resolver",
        "web",
        {
            "DefaultSubset": "v1",
            "ConnectTimeout": "3s",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}},
            "Failover": {"v1": {"ServiceSubset": "v2"}},
        },
    ) is True
    assert client.config.set(
        "service-splitter", "web", {"Splits": [{"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]}
    ) is True
    assert client.config.set(
        "service-router",
        "web",
        {"Routes": [{"Match": {"HTTP": {"PathPrefix": "/v2"}}, "Destination": {"ServiceSubset": "v2"}}]},
    ) is True

    chain = client.discovery_chain.get("web")["Chain"]
    assert chain["ServiceName"] == "web"
    assert chain["Protocol"] == "http"
    assert chain["StartNode"] == "router:web.default.default"
    router = chain["Nodes"]["router:web.default.default"]
    assert [r["NextNode"] for r in router["Routes"]] == ["resolver:v2.web.default.default.dc1", "splitter:web.default.default"]
    splits = chain["Nodes"]["splitter:web.default.default"]["Splits"]
    assert [(s["Weight"], s["NextNode"]) for s in splits] == [
        (90, "resolver:v1.web.default.default.dc1"),
        (10, "resolver:v2.web.default.default.dc1"),
    ]
    v1 = chain["Nodes"]["resolver:v1.web.default.default.dc1"]["Resolver"]
    assert v1["ConnectTimeout"] == "3s"
    assert v1["Failover"]["Targets"] == ["v2.web.default.default.dc1"]
    assert chain["Targets"]["v1.web.default.default.dc1"]["Subset"]["Filter"] == "Service.Meta.version == v1"

    # Overrides go in a POST body.
    chain = client.discovery_chain.get("web", override_protocol="grpc", override_connect_timeout="7s")["Chain"]
    assert chain["Protocol"] == "grpc"
    assert chain["Nodes"]["resolver:v1.web.default.default.dc1"]["Resolver"]["ConnectTimeout"] == "7s"
    # A service without entries has the default chain.
    chain = client.discovery_chain.get("db")["Chain"]
    assert chain["Default"] is True
    assert chain["StartNode"] == "resolver:db.default.default.dc1"


def test_config_entries_that_break_a_chain_are_refused_naming_entry_and_field(client):
    # A router on a tcp service.
    with pytest.raises(BadRequest, match='service-router "db" Name: a service-router needs the service to speak http'):
        client.config.set("service-router", "db", {"Routes": [{"Match": {"HTTP": {"PathPrefix": "/"}}}]})
    # Splits must add up to 100.
    assert client.config.set("service-defaults", "api", {"Protocol": "http"}) is True
    with pytest.raises(BadRequest, match="Splits: weights must add up to 100, they add up to 90"):
        client.config.set("service-splitter", "api", {"Splits": [{"Weight": 50}, {"Weight": 40}]})
    # An unknown subset.
    with pytest.raises(BadRequest, match=r'Routes\[0\].Destination.ServiceSubset: subset "v3" of "api" is not defined'):
        client.config.set(
            "service-router", "api", {"Routes": [{"Match": {"HTTP": {"PathPrefix": "/"}}, "Destination": {"ServiceSubset": "v3"}}]}
        )
    # A loop of redirects.
    assert client.config.set("service-resolver", "a", {"Redirect": {"Service": "b"}}) is True
    with pytest.raises(BadRequest, match=r"service-resolver \"b\" Redirect.Service: redirects form a loop: a -> b -> a"):
        client.config.set("service-resolver", "b", {"Redirect": {"Service": "a"}})
    # A bad subset filter.
    with pytest.raises(BadRequest, match=r'Subsets\["v1"\].Filter: unknown selector'):
        client.config.set("service-resolver", "api", {"Subsets": {"v1": {"Filter": "Service.Version == v1"}}})
    # L7 intentions on a tcp service.
    with pytest.raises(BadRequest, match=r"Sources\[0\].Permissions: L7 permissions need service \"db\""):
        client.config.set(
            "service-intentions",
            "db",
            {"Sources": [{"Name": "web", "Permissions": [{"Action": "deny", "HTTP": {"PathPrefix": "/admin"}}]}]},
        )
    # Turning a routed service to tcp breaks its router: refused, and the router is named.
    assert client.config.set(
        "service-router", "api", {"Routes": [{"Match": {"HTTP": {"PathPrefix": "/x"}}}]}
    ) is True
    with pytest.raises(BadRequest, match='service-router "api" Name'):
        client.config.set("service-defaults", "api", {"Protocol": "tcp"})
    # Nothing was half-applied.
    assert client.config.get("service-defaults", "api")["Protocol"] == "http"
    assert client.config.get("service-resolver", "b") is None


def test_consul_settings_meshd_honours_only_at_their_default(client):
    """Consul 1.22's fields on the kinds meshd implements: kept and accepted at the value
    meshd's behaviour is, refused with a 400 naming the field otherwise, never ignored."""
    assert client.config.set("proxy-defaults", "global", {"MutualTLSMode": "strict", "PrioritizeByLocality": {"Mode": "none"}})
    entry = client.config.get("proxy-defaults", "global")
    assert entry["MutualTLSMode"] == "strict", entry
    resolver = {"Failover": {"*": {"Targets": [{"Service": "api-dr", "Partition": "default"}], "Policy": {"Mode": "default"}}}}
    assert client.config.set("service-resolver", "api", resolver)
    refused = [
        ("proxy-defaults", "global", {"MutualTLSMode": "permissive"}, "MutualTLSMode"),
        ("service-defaults", "api", {"MutualTLSMode": "permissive"}, "MutualTLSMode"),
        ("proxy-defaults", "global", {"FailoverPolicy": {"Mode": "order-by-locality"}}, "FailoverPolicy"),
        ("service-resolver", "api", {"PrioritizeByLocality": {"Mode": "failover"}}, "PrioritizeByLocality"),
        ("service-resolver", "api", {"Failover": {"*": {"Targets": [{"Service": "a", "Partition": "p1"}]}}}, "Targets[0].Partition"),
        ("service-resolver", "api", {"Failover": {"*": {"SamenessGroup": "g1"}}}, "SamenessGroup"),
        ("mesh", "mesh", {"ValidateClusters": True}, "ValidateClusters"),
    ]
    for kind, name, body, field in refused:
        with pytest.raises(BadRequest) as e:
            client.config.set(kind, name, body)
        assert field in str(e.value) and "not supported" in str(e.value), (kind, body, str(e.value))


def test_locality_and_named_ports_are_kept(client):
    """Consul's `Locality` and 1.22's multi-port `Ports` are stored and read back, never
    dropped; ports with a repeated name are refused naming the field."""
    service = {
        "Service": "multi", "ID": "multi-1", "Port": 8080,
        "Locality": {"Region": "us-east-1", "Zone": "us-east-1a"},
        "Ports": [{"Name": "http", "Port": 8080, "Default": True}, {"Name": "admin", "Port": 9000}],
    }
    assert client.catalog.register("loc-node", "10.0.0.7", service=service)
    _, nodes = client.health.service("multi")
    got = nodes[0]["Service"]
    assert got["Locality"] == {"Region": "us-east-1", "Zone": "us-east-1a"}
    assert got["Ports"] == [{"Name": "http", "Port": 8080, "Default": True}, {"Name": "admin", "Port": 9000}]
    service["Ports"].append({"Name": "http", "Port": 8081})
    with pytest.raises(BadRequest) as e:
        client.catalog.register("loc-node", "10.0.0.7", service=service)
    assert "Ports[2].Name" in str(e.value), str(e.value)


def test_the_trust_domain_can_be_chosen_and_never_changes_under_issued_certificates(tmp_path):
    """`-ca-cluster-id` names the CA's cluster id when the server creates the CA: the trust
    domain is `<id>.consul`. A data dir whose CA has another id refuses to start, saying so."""
    cluster_id = "7e3c0d5a-1b2c-4d3e-8f4a-5b6c7d8e9f00"
    data = tmp_path / "data"
    proc, (host, port) = _start_server("-data-dir", str(data), "-ca-cluster-id", cluster_id)
    try:
        roots = requests.get(f"http://{host}:{port}/v1/agent/connect/ca/roots", timeout=10).json()
        assert roots["TrustDomain"] == f"{cluster_id}.consul"
    finally:
        _stop_server(proc)
    other = "00000000-1111-4222-8333-444444444444"
    out = subprocess.run(
        [_meshd_binary(), "server", "-data-dir", str(data), "-ca-cluster-id", other, "-http-addr", "127.0.0.1:0",
         "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert f"the CA's cluster id is {cluster_id}" in out.stderr, out.stderr
