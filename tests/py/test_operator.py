"""py-consul 1.8.0's operator and coordinate reads against a real `meshd server` (`-dev`,
and each of three sharing etcd)."""

import pytest
from consul.exceptions import ConsulException

from test_agent import eventually


def test_raft_configuration_lists_the_servers_and_one_leader(client, request):
    expected = 1 if "dev" in request.node.name else 3

    def settled():
        # Servers started together register (and elect) within moments of each other.
        servers = client.operator.raft_config()["Servers"]
        leaders = sum(1 for s in servers if s["Leader"])
        return servers if len(servers) == expected and leaders == 1 else None

    servers = eventually(settled, timeout=30, what=f"{expected} servers and one leader")
    assert all(s["Voter"] and s["Address"] for s in servers)


def test_usage_counts_the_catalog(client):
    client.catalog.register("n1", "10.0.0.1", service={"Service": "web", "ID": "web1", "Port": 80})
    client.catalog.register("n1", "10.0.0.1", service={
        "Kind": "connect-proxy", "Service": "web-sidecar-proxy", "ID": "web1-sidecar", "Port": 21000,
        "Proxy": {"DestinationServiceName": "web"}})
    usage = client.http.get(lambda r: __import__("json").loads(r.body), "/v1/operator/usage")
    dc = next(iter(usage["Usage"].values()))
    # Each server is in the catalog too, as a node with the `consul` service (not billable).
    _, servers = client.catalog.service("consul")
    assert servers
    assert dc["Nodes"] == 1 + len(servers) and dc["ServiceInstances"] == 2 + len(servers) and dc["Services"] == 3
    assert dc["ConnectServiceInstances"]["connect-proxy"] == 1
    assert dc["BillableServiceInstances"] == 1


def test_coordinates_answer_empty_and_an_update_is_refused(client):
    dcs = client.coordinate.datacenters()
    assert dcs[0]["Coordinates"] == []
    _, nodes = client.coordinate.nodes()
    assert nodes == []
    with pytest.raises(ConsulException) as refused:
        client.coordinate.update("n1", {"Vec": [0.0] * 8, "Error": 1.5, "Adjustment": 0.0, "Height": 1e-5})
    assert "no gossip" in str(refused.value)


def test_prepared_queries_through_py_consul(client):
    for node, tags, status in [("n1", ["v1"], "passing"), ("n2", ["v2"], "passing"), ("n3", ["v2"], "critical")]:
        client.catalog.register(node, "10.0.0.1", service={"Service": "api", "ID": f"api-{node}", "Tags": tags},
                                check={"CheckID": f"{node}-alive", "Name": "alive", "ServiceID": f"api-{node}",
                                       "Status": status})
    created = client.query.create("api", name="api-v2", tags=["v2"])
    query_id = created["ID"]
    result = client.query.execute("api-v2")
    assert [n["Node"]["Node"] for n in result["Nodes"]] == ["n2"], "critical instances are never answered"
    assert client.query.execute(query_id)["Service"] == "api"
    assert client.query.get(query_id)[0]["Name"] == "api-v2"
    assert [q["ID"] for q in client.query.list()] == [query_id]
    assert client.query.update(query_id, "api", name="api-v2", tags=["v1"]) is True
    assert [n["Node"]["Node"] for n in client.query.execute("api-v2")["Nodes"]] == ["n1"]
    assert client.query.explain("api-v2")["Query"]["Service"]["Tags"] == ["v1"]
    assert client.query.delete(query_id) is True
    assert client.query.list() == []


def test_autopilot_state_names_the_leader_and_its_configuration_cannot_be_changed(client, request):
    expected = 1 if "dev" in request.node.name else 3

    def settled():
        state = client.http.get(lambda r: __import__("json").loads(r.body), "/v1/operator/autopilot/state")
        return state if len(state["Servers"]) == expected and state["Leader"] else None

    state = eventually(settled, timeout=30, what=f"{expected} servers in the autopilot state")
    assert state["Servers"][state["Leader"]]["Status"] == "leader"
    assert sorted(state["Voters"]) == sorted(state["Servers"])
    assert state["FailureTolerance"] == expected - 1
    config = client.operator.autopilot_configuration()
    assert config["CleanupDeadServers"] is True
    with pytest.raises(ConsulException) as refused:
        client.operator.update_autopilot_configuration(cleanup_dead_servers=False)
    assert "autopilot settings do not apply" in str(refused.value)


def test_a_servers_members_list_the_servers_and_the_agents_nodes(client, request):
    expected = 1 if "dev" in request.node.name else 3

    def servers():
        members = client.agent.members()
        found = [m for m in members if m["Tags"]["role"] == "consul"]
        return members if len(found) == expected else None

    members = eventually(servers, timeout=30, what=f"{expected} servers among the members")
    assert all(m["Status"] == 1 and m["Tags"]["dc"] == "dc1" for m in members)
    # A node kept alive by an agent's heartbeat is a member too; it fails when they stop.
    client.http.put(lambda r: r, "/v1/internal/node/heartbeat", data='{"Node": "host-9", "Address": "10.0.0.9"}')
    nodes = eventually(lambda: [m for m in client.agent.members() if m["Name"] == "host-9"], what="host-9 listed")
    assert nodes[0]["Tags"]["role"] == "node" and nodes[0]["Status"] == 1 and nodes[0]["Addr"] == "10.0.0.9"
    assert all(m["Tags"]["role"] == "consul" for m in client.agent.members(wan=True))


def test_a_server_is_the_agent_of_its_own_node(client):
    """py-consul's agent calls against a server (each of three sharing etcd, followers
    included): the registration lands on the node of the server asked, its TTL check is
    reported there, and it goes when deregistered; the server's own service stays."""
    import consul

    me = client.agent.self()["Config"]["NodeName"]
    assert client.agent.service.register(
        "py-on-server", service_id="py-on-server-1", port=7100, check=consul.Check.ttl("30s")
    )
    try:
        assert "py-on-server-1" in client.agent.services()
        assert "consul" not in client.agent.services()
        nodes = eventually(lambda: client.catalog.service("py-on-server")[1], what="the registration in the catalog")
        assert [n["Node"] for n in nodes] == [me]
        client.agent.check.ttl_pass("service:py-on-server-1", notes="fine")

        def passing():
            checks = client.health.checks("py-on-server")[1]
            return checks if checks and checks[0]["Status"] == "passing" else None

        checks = eventually(passing, what="the TTL check passing at the catalog")
        assert checks[0]["Node"] == me and checks[0]["Output"] == "fine"
    finally:
        client.agent.service.deregister("py-on-server-1")
    eventually(lambda: not client.catalog.service("py-on-server")[1] or None, what="the deregistration")
    assert any(n["Node"] == me for n in client.catalog.service("consul")[1])
