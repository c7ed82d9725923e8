"""Cluster peering's lifecycle with Consul's JSON, against real servers: cluster A (`-dev`,
and each of three sharing etcd, whose token names every server) generates a token, a
separate `-dev` cluster B establishes with it; both read and list the peering, B imports
what A exports (py-consul for the config entries and the catalog, plain HTTP where
py-consul has no call), and a delete in A terminates the peering in B.
py-consul 1.8.0 has no peering API: the lifecycle calls are made with requests."""

import base64
import json

import consul
import requests

from conftest import _start_server, _stop_server
from test_agent import eventually


def _url(addr, path):
    host, port = addr
    return f"http://{host}:{port}{path}"


def test_peering_lifecycle_with_consuls_json(client, server, request):
    b_proc, b_addr = _start_server("-dev", "-node", "cluster-b-server")
    try:
        b = consul.Consul(host=b_addr[0], port=b_addr[1])
        # py-consul writes A's exports and a service to export.
        assert client.catalog.register("n1", "10.0.0.1", service={"Service": "api", "ID": "api1", "Port": 8080})
        assert client.config.set("exported-services", "default", {
            "Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]})
        # A bad entry is a 400 naming the field.
        bad = requests.put(_url(server, "/v1/config"), json={
            "Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "api", "Consumers": [{"Peer": "Cluster B"}]}]}, timeout=10)
        assert bad.status_code == 400 and "Services[0].Consumers[0].Peer" in bad.text, bad.text

        generated = requests.post(_url(server, "/v1/peering/token"),
                                  json={"PeerName": "cluster-b", "Meta": {"env": "test"}}, timeout=10)
        assert generated.status_code == 200, generated.text
        token = generated.json()["PeeringToken"]
        decoded = json.loads(base64.b64decode(token))
        assert set(decoded) >= {"CA", "ServerAddresses", "ServerName", "PeerID", "EstablishmentSecret", "Remote"}
        servers = 1 if "dev" in request.node.name else 3
        assert len(decoded["ServerAddresses"]) == servers, decoded["ServerAddresses"]
        pending = requests.get(_url(server, "/v1/peering/cluster-b"), timeout=10).json()
        assert pending["State"] == "PENDING" and pending["Meta"] == {"env": "test"}
        assert "EstablishmentSecret" not in json.dumps(pending)

        bad = requests.post(_url(b_addr, "/v1/peering/establish"),
                            json={"PeerName": "cluster-a", "PeeringToken": "not-a-token"}, timeout=10)
        assert bad.status_code == 400 and bad.text.startswith("PeeringToken:"), bad.text
        established = requests.post(_url(b_addr, "/v1/peering/establish"),
                                    json={"PeerName": "cluster-a", "PeeringToken": token}, timeout=30)
        assert established.status_code == 200 and established.json() == {}, established.text

        def active(addr, name):
            p = requests.get(_url(addr, f"/v1/peering/{name}"), timeout=10).json()
            return p if p["State"] == "ACTIVE" else None

        b_side = eventually(lambda: active(b_addr, "cluster-a"), timeout=30, what="B's peering active")
        assert b_side["PeerID"] == decoded["PeerID"] and b_side["PeerServerAddresses"]
        a_side = eventually(lambda: active(server, "cluster-b"), timeout=30, what="A's peering active")
        assert a_side["StreamStatus"]["ExportedServices"] == ["api"]
        assert a_side["Remote"]["Datacenter"] == "dc1"
        listed = requests.get(_url(b_addr, "/v1/peerings"), timeout=10).json()
        assert [p["Name"] for p in listed] == ["cluster-a"]

        def imported():
            rows = requests.get(_url(b_addr, "/v1/health/service/api?peer=cluster-a"), timeout=10).json()
            return rows or None

        rows = eventually(imported, timeout=30, what="api imported in B")
        assert rows[0]["Service"]["PeerName"] == "cluster-a" and rows[0]["Node"]["Address"] == "10.0.0.1"
        assert requests.get(_url(b_addr, "/v1/catalog/services?peer=cluster-a"), timeout=10).json() == {"api": []}
        # B's own catalog is untouched.
        assert b.health.service("api")[1] == []

        # A deletes: B's side is terminated, its imports gone; A's goes once B is told.
        assert requests.delete(_url(server, "/v1/peering/cluster-b"), timeout=10).status_code == 200
        eventually(lambda: requests.get(_url(b_addr, "/v1/peering/cluster-a"), timeout=10).json()["State"] == "TERMINATED",
                   timeout=30, what="B's peering terminated")
        assert requests.get(_url(b_addr, "/v1/health/service/api?peer=cluster-a"), timeout=10).json() == []
        eventually(lambda: requests.get(_url(server, "/v1/peering/cluster-b"), timeout=10).status_code == 404,
                   timeout=30, what="A's peering removed")
        missing = requests.get(_url(server, "/v1/peering/cluster-b"), timeout=10)
        assert missing.text.strip() == 'Peering not found for "cluster-b"'
        assert requests.delete(_url(b_addr, "/v1/peering/cluster-a"), timeout=10).status_code == 200
    finally:
        _stop_server(b_proc)
