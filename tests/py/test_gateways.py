"""py-consul 1.8.0 against a real `meshd server`: ingress and terminating gateways."""


def test_gateway_services_and_ingress_health(client):
    assert client.config.set("service-defaults", "web", {"Protocol": "http"}) is True
    assert client.config.set(
        "ingress-gateway",
        "ing",
        {"Listeners": [{"Port": 8080, "Protocol": "http", "Services": [{"Name": "web", "Hosts": ["web.example"]}]}]},
    ) is True
    assert client.config.set(
        "terminating-gateway",
        "tgw",
        {"Services": [{"Name": "billing", "CAFile": "/etc/ca.pem", "SNI": "billing.example"}]},
    ) is True
    assert client.catalog.register(
        "node-1",
        "10.0.0.1",
        service={"Kind": "ingress-gateway", "Service": "ing", "ID": "ing", "Port": 8080},
        check={"CheckID": "ing-alive", "Name": "alive", "ServiceID": "ing", "Status": "passing"},
    ) is True

    # py-consul hands back the body alone for this call (no index).
    services = client.catalog.gateway_services("ing")
    assert [(s["Gateway"]["Name"], s["Service"]["Name"], s["GatewayKind"], s["Port"], s["Protocol"], s["Hosts"])
            for s in services] == [("ing", "web", "ingress-gateway", 8080, "http", ["web.example"])]

    services = client.catalog.gateway_services("tgw")
    assert [(s["Service"]["Name"], s["CAFile"], s["SNI"], s["GatewayKind"]) for s in services] == [
        ("billing", "/etc/ca.pem", "billing.example", "terminating-gateway")
    ]

    index, nodes = client.health.ingress("web", passing=True)
    assert int(index) >= 1
    assert [(n["Node"]["Node"], n["Service"]["ID"], n["Service"]["Kind"]) for n in nodes] == [
        ("node-1", "ing", "ingress-gateway")
    ]
    _, nodes = client.health.ingress("db")
    assert nodes == []
