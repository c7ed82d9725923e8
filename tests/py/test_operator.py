"""py-consul 1.8.0's operator and coordinate reads against a real `meshd server` (`-dev`,
and each of three sharing etcd)."""

import pytest
from consul.exceptions import ConsulException


def test_raft_configuration_lists_the_servers_and_one_leader(client, request):
    config = client.operator.raft_config()
    servers = config["Servers"]
    expected = 1 if "dev" in request.node.name else 3
    assert len(servers) == expected, servers
    assert sum(1 for s in servers if s["Leader"]) == 1
    assert all(s["Voter"] and s["Address"] for s in servers)


def test_usage_counts_the_catalog(client):
    client.catalog.register("n1", "10.0.0.1", service={"Service": "web", "ID": "web1", "Port": 80})
    client.catalog.register("n1", "10.0.0.1", service={
        "Kind": "connect-proxy", "Service": "web-sidecar-proxy", "ID": "web1-sidecar", "Port": 21000,
        "Proxy": {"DestinationServiceName": "web"}})
    usage = client.http.get(lambda r: __import__("json").loads(r.body), "/v1/operator/usage")
    dc = next(iter(usage["Usage"].values()))
    assert dc["Nodes"] == 1 and dc["ServiceInstances"] == 2 and dc["Services"] == 2
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
