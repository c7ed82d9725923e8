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


def _self_signed(host):
    """A certificate for `host` and its key, as PEM (cryptography, pinned for the JWT test)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return pem, key_pem


def test_api_gateway_entries_round_trip(client):
    """Every entry kind of the API gateway, written and read back unchanged by py-consul; the
    routes and the gateway come back with a status derived by the server."""
    cert, key = _self_signed("api.example.com")
    entries = [
        ("inline-certificate", "cert", {"Certificate": cert, "PrivateKey": key, "Meta": {"team": "edge"}}),
        ("file-system-certificate", "files", {"Certificate": "/etc/gw/cert.pem", "PrivateKey": "/etc/gw/key.pem"}),
        ("api-gateway", "gw", {"Listeners": [
            {"Name": "web", "Port": 8080, "Protocol": "http", "Hostname": "*.example.com",
             "TLS": {"Certificates": [{"Kind": "inline-certificate", "Name": "cert"}], "MinVersion": "TLSv1_2"}},
            {"Name": "db", "Port": 9000, "Protocol": "tcp"}]}),
        ("http-route", "api", {
            "Parents": [{"Kind": "api-gateway", "Name": "gw", "SectionName": "web"}],
            "Hostnames": ["api.example.com"],
            "Rules": [{
                "Matches": [{"Path": {"Match": "prefix", "Value": "/v1"},
                             "Headers": [{"Match": "exact", "Name": "x-team", "Value": "a"}],
                             "Query": [{"Match": "present", "Name": "debug"}], "Method": "GET"}],
                "Filters": {"Headers": [{"Add": {"x-from": "gw"}, "Remove": ["x-debug"]}],
                            "URLRewrite": {"Path": "/"},
                            "RetryFilter": {"NumRetries": 2, "RetryOn": ["5xx"], "RetryOnConnectFailure": True},
                            "TimeoutFilter": {"RequestTimeout": "5s"}},
                "Services": [{"Name": "api", "Weight": 80}, {"Name": "api-canary", "Weight": 20}]}]}),
        ("tcp-route", "db", {"Parents": [{"Kind": "api-gateway", "Name": "gw", "SectionName": "db"}],
                             "Services": [{"Name": "db"}]}),
    ]
    for kind, name, body in entries:
        assert client.config.set(kind, name, body) is True, kind

    def subset(written, read):
        if isinstance(written, dict):
            return all(k in read and subset(v, read[k]) for k, v in written.items())
        if isinstance(written, list):
            return len(written) == len(read) and all(subset(w, r) for w, r in zip(written, read))
        return written == read

    for kind, name, body in entries:
        read = client.config.get(kind, name)
        assert read["Kind"] == kind and read["Name"] == name
        assert subset(body, read), (kind, body, read)
    listed = client.config.list("http-route")
    assert [e["Name"] for e in listed] == ["api"]
    conditions = {c["Type"]: c for c in client.config.get("tcp-route", "db")["Status"]["Conditions"]}
    assert conditions["Bound"]["Status"] == "True", conditions
    assert conditions["ResolvedRefs"]["Reason"] == "BackendNotFound", conditions
    gateway = client.config.get("api-gateway", "gw")["Status"]["Conditions"]
    assert any(c["Type"] == "ResolvedRefs" and c["Status"] == "True" for c in gateway), gateway
    # A key that is not the certificate's is refused, and the entry is left as it was.
    _, other_key = _self_signed("api.example.com")
    import consul

    try:
        client.config.set("inline-certificate", "cert", {"Certificate": cert, "PrivateKey": other_key})
        raise AssertionError("a mismatched key was accepted")
    except consul.base.ConsulException as e:
        assert "PrivateKey" in str(e), e
    assert client.config.get("inline-certificate", "cert")["PrivateKey"] == key
