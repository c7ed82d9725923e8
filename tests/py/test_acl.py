"""ACLs through py-consul 1.8.0, bootstrapped, with policies, roles and tokens made through
the client; reads filtered, writes with the wrong token refused, the right token accepted.

Each test runs twice: against `meshd server -dev -acl-enabled -acl-default-policy deny`, and
against three such servers sharing one catalog in a real etcd cluster (started at once, so
their ACL setup races). There the bootstrap goes through server 0, the tests work through
server 1, and a second bootstrap is tried through server 2: ACL state written through one
server holds on the others."""

import subprocess
import uuid

import consul
import pytest
import requests

from conftest import _meshd_binary

ACL_FLAGS = ["-acl-enabled", "-acl-default-policy", "deny"]


def _spawn(*args):
    return subprocess.Popen(
        [_meshd_binary(), "server", "-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0",
         "-log-level", "warn", *ACL_FLAGS, *args],
        stdout=subprocess.PIPE,
        text=True,
    )


def _address(proc):
    line = proc.stdout.readline().strip()
    prefix = "meshd server listening on http://"
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"meshd did not start: {line!r}")
    host, port = line[len(prefix):].rsplit(":", 1)
    return host, int(port)


@pytest.fixture(params=["dev", "etcd"])
def acl_servers(request):
    """Every server's (host, port): one `-dev` server, or three over etcd (a fresh prefix)."""
    if request.param == "dev":
        procs = [_spawn("-dev")]
    else:
        endpoints = request.getfixturevalue("etcd")
        prefix = f"/py-acl-{uuid.uuid4().hex}/"
        # All three at once: their ACL setup races.
        procs = [
            _spawn("-store", "etcd", "-etcd-endpoints", endpoints, "-etcd-prefix", prefix, "-node", f"acl-{i}")
            for i in range(3)
        ]
    try:
        addresses = [_address(p) for p in procs]
        yield addresses
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            assert proc.wait(timeout=30) == 0, "meshd server did not shut down cleanly"


@pytest.fixture
def mesh(acl_servers, monkeypatch):
    """(host, port, management secret, a client with the management token), on the server
    the tests work through; bootstrapped through the first server."""
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)
    boot_host, boot_port = acl_servers[0]
    boot = consul.Consul(host=boot_host, port=boot_port).acl.bootstrap()
    secret = boot["SecretID"]
    assert boot["Policies"][0]["Name"] == "global-management"
    host, port = acl_servers[1 % len(acl_servers)]
    return host, port, secret, consul.Consul(host=host, port=port, token=secret)


def register(c, node, service, port):
    assert c.catalog.register(node, "10.0.0.1", service={"Service": service, "ID": service, "Port": port})


def test_bootstrap_happens_once(mesh, acl_servers):
    # Through another server than the first bootstrap, when there are several.
    host, port = acl_servers[-1]
    with pytest.raises(consul.ACLPermissionDenied) as e:
        consul.Consul(host=host, port=port).acl.bootstrap()
    assert "ACL bootstrap no longer allowed" in str(e.value)


def test_tokens_written_through_one_server_work_on_every_server(mesh, acl_servers):
    _, _, _, admin = mesh
    admin.acl.policy.create(name="web-writer", rules={"service": {"web": {"policy": "write"}}, "node_prefix": {"": {"policy": "write"}}})
    token = admin.acl.token.create(policies_name=["web-writer"])
    for i, (host, port) in enumerate(acl_servers):
        # Used at once, on each server: one that has not applied the token yet catches up
        # with etcd before calling it unknown.
        web = consul.Consul(host=host, port=port, token=token["SecretID"])
        register(web, f"n{i}", "web", 80 + i)
        with pytest.raises(consul.ACLPermissionDenied):
            register(web, f"n{i}", "db", 5432)
    _, instances = admin.catalog.service("web")
    assert len(instances) >= 1


def test_policy_and_token_filter_reads_and_guard_writes(mesh):
    host, port, _, admin = mesh
    register(admin, "n1", "web", 80)
    register(admin, "n1", "db", 5432)
    # Rules as py-consul's documentation passes them: a dict (sent as JSON rules).
    policy = admin.acl.policy.create(
        name="web-owner",
        description="web and the node it runs on",
        rules={"service": {"web": {"policy": "write"}}, "node_prefix": {"": {"policy": "read"}}},
    )
    assert policy["ID"] and '"web"' in policy["Rules"]
    token = admin.acl.token.create(policies_name=["web-owner"], description="web's token")
    assert token["Policies"] == [{"ID": policy["ID"], "Name": "web-owner"}]
    web = consul.Consul(host=host, port=port, token=token["SecretID"])

    # Reads are filtered to what the token may read, and say so.
    _, services = web.catalog.services()
    assert set(services) == {"web"}
    _, nodes = web.health.service("db")
    assert nodes == []
    resp = requests.get(
        f"http://{host}:{port}/v1/catalog/services",
        headers={"X-Consul-Token": token["SecretID"]},
        timeout=10,
    )
    assert resp.headers.get("X-Consul-Results-Filtered-By-ACLs") == "true"
    _, everything = admin.catalog.services()
    assert {"web", "db"} <= set(everything)

    # A write the token may not do is refused and changes nothing.
    with pytest.raises(consul.ACLPermissionDenied) as e:
        register(web, "n1", "db", 9999)
    assert "Permission denied" in str(e.value)
    _, db = admin.catalog.service("db")
    assert [s["ServicePort"] for s in db] == [5432]


def test_anonymous_reads_are_filtered_not_refused(mesh):
    host, port, _, admin = mesh
    register(admin, "n1", "web", 80)
    _, services = consul.Consul(host=host, port=port).catalog.services()
    assert services == {}


def test_the_right_token_is_accepted(mesh):
    host, port, _, admin = mesh
    token = admin.acl.token.create(service_identities=[{"ServiceName": "web"}])
    web = consul.Consul(host=host, port=port, token=token["SecretID"])
    # A new node needs node:write, which a service identity does not hold.
    with pytest.raises(consul.ACLPermissionDenied) as e:
        register(web, "n1", "web", 80)
    assert "'node:write' on \"n1\"" in str(e.value)
    assert admin.catalog.register("n1", "10.0.0.1")
    register(web, "n1", "web", 80)
    _, instances = admin.catalog.service("web")
    assert [s["ServiceID"] for s in instances] == ["web"]
    # The service identity covers the sidecar too, and reads of every service.
    register(web, "n1", "web-sidecar-proxy", 21000)
    _, services = web.catalog.services()
    assert "web-sidecar-proxy" in services


def test_unknown_token_and_acl_management(mesh):
    host, port, secret, admin = mesh
    with pytest.raises(consul.ACLPermissionDenied) as e:
        consul.Consul(host=host, port=port, token="00000000-aaaa-bbbb-cccc-000000000000").catalog.services()
    assert "ACL not found" in str(e.value)

    me = admin.acl.token.read_self()
    assert me["SecretID"] == secret
    # Rules as HCL text (py-consul quotes it; the server reads the text inside).
    reader_policy = admin.acl.policy.create(name="acl-reader", rules='acl = "read"')
    assert reader_policy["Rules"] == 'acl = "read"'
    role = admin.acl.role.create(name="auditors", policies_id=[reader_policy["ID"]])
    assert role["Policies"] == [{"ID": reader_policy["ID"], "Name": "acl-reader"}]
    auditor = admin.acl.token.create(roles_name=["auditors"])
    audit = consul.Consul(host=host, port=port, token=auditor["SecretID"])
    listed = audit.acl.token.list()
    assert listed and all(t["SecretID"] == "<hidden>" for t in listed)
    with pytest.raises(consul.ACLPermissionDenied):
        audit.acl.policy.create(name="sneaky", rules='acl = "write"')

    clone = admin.acl.token.clone(auditor["AccessorID"], description="copy")
    assert clone["AccessorID"] != auditor["AccessorID"] and clone["Roles"] == auditor["Roles"]
    updated = admin.acl.token.update(auditor["AccessorID"], description="renamed", roles_name=["auditors"])
    assert updated["Description"] == "renamed"
    assert admin.acl.token.delete(auditor["AccessorID"])
    with pytest.raises(consul.ACLPermissionDenied):
        audit.acl.token.list()
    assert admin.acl.role.delete(role["ID"])
    assert admin.acl.policy.delete(reader_policy["ID"])


def test_malformed_rules_name_line_and_column(mesh):
    _, _, _, admin = mesh
    with pytest.raises(consul.ConsulException) as e:
        admin.acl.policy.create(name="broken", rules='service "web" {\n  policy = "wirte"\n}\n')
    assert "400" in str(e.value) and "line 2, column 12" in str(e.value)
    names = [p["Name"] for p in admin.acl.policy.list()]
    assert "broken" not in names and "global-management" in names


def test_the_sync_status_and_csds_need_operator_read():
    """With ACLs on, /v1/internal/xds-status and CSDS (a grpcio call on the xDS port, its
    token in `x-consul-token`) refuse the anonymous token and a token without
    `operator:read`, and answer one that holds it."""
    import grpc

    from conftest import _start_server, _stop_server

    proc, (host, port) = _start_server("-dev", "-acl-enabled", "-acl-default-policy", "deny")
    grpc_addr = proc.stdout.readline().strip().split("on ", 1)[1]
    http = f"http://{host}:{port}"
    channel = None
    try:
        secret = requests.put(f"{http}/v1/acl/bootstrap").json()["SecretID"]

        def token(rules):
            auth = {"X-Consul-Token": secret}
            policy = requests.put(f"{http}/v1/acl/policy", json={"Name": f"p{abs(hash(rules))}", "Rules": rules},
                                  headers=auth)
            assert policy.ok, policy.text
            made = requests.put(f"{http}/v1/acl/token", json={"Policies": [{"ID": policy.json()["ID"]}]}, headers=auth)
            assert made.ok, made.text
            return made.json()["SecretID"]

        reader = token('operator = "read"')
        writer = token('service_prefix "" { policy = "write" }\nnode_prefix "" { policy = "write" }')

        for who, secret_id, want in (("anonymous", None, 403), ("no operator:read", writer, 403),
                                     ("operator:read", reader, 200)):
            headers = {"X-Consul-Token": secret_id} if secret_id else {}
            r = requests.get(f"{http}/v1/internal/xds-status", headers=headers)
            assert r.status_code == want, f"{who}: {r.status_code} {r.text}"
            if want == 403:
                assert "operator:read" in r.text, r.text
        assert requests.get(f"{http}/v1/internal/xds-status", headers={"X-Consul-Token": reader}).json() == []

        channel = grpc.insecure_channel(grpc_addr)
        # An empty ClientStatusRequest (no node matchers: every proxy) is zero bytes.
        fetch = channel.unary_unary("/envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus")
        for who, secret_id in (("anonymous", None), ("no operator:read", writer)):
            metadata = (("x-consul-token", secret_id),) if secret_id else ()
            with pytest.raises(grpc.RpcError) as refused:
                fetch(b"", metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, f"{who}: {refused.value}"
            assert "operator:read" in refused.value.details(), refused.value.details()
        # Allowed: a ClientStatusResponse with no proxy connected (empty).
        assert fetch(b"", metadata=(("x-consul-token", reader),), timeout=10) == b""
    finally:
        if channel is not None:
            channel.close()
        _stop_server(proc)


def _rsa_key():
    """(private key, public PEM) of a fresh RSA key, for JWTs signed as an identity provider would."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return key, public


def _jwt(key, **claims):
    import time

    import jwt

    now = int(time.time())
    body = {"iss": "https://idp.example", "aud": "meshd", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, key, algorithm="RS256")


def test_a_jwt_login_gets_the_identity_its_binding_rule_sets(mesh):
    """A JWT signed by PyJWT logs in through a jwt auth method (py-consul's auth-method,
    binding-rule and login calls); the token's identity is the one the rule computed from
    the claims, and it can do what that identity may and nothing else."""
    host, port, _, admin = mesh
    key, public = _rsa_key()
    method = admin.acl.auth_method.create(
        name="idp",
        method_type="jwt",
        max_token_ttl="10m",
        config={
            "JWTValidationPubKeys": [public],
            "BoundIssuer": "https://idp.example",
            "BoundAudiences": ["meshd"],
            "ClaimMappings": {"service": "service"},
            "ListClaimMappings": {"groups": "groups"},
        },
    )
    assert method["Name"] == "idp" and method["Type"] == "jwt"
    rule = admin.acl.binding_rule.create(
        auth_method="idp",
        bind_type="service",
        bind_name="${value.service}",
        selector='"deployers" in list.groups',
    )
    assert rule["ID"] and rule["AuthMethod"] == "idp"
    assert [r["ID"] for r in admin.acl.binding_rule.list(auth_method="idp")] == [rule["ID"]]
    assert [m["Name"] for m in admin.acl.auth_method.list()] == ["idp"]

    anonymous = consul.Consul(host=host, port=port)
    login = anonymous.acl.login("idp", _jwt(key, service="web", groups=["deployers"]), meta={"pod": "web-1"})
    assert login["AuthMethod"] == "idp"
    assert login["ServiceIdentities"] == [{"ServiceName": "web"}]
    assert login["Local"] is True and login["ExpirationTime"]
    assert "token created via login" in login["Description"] and "web-1" in login["Description"]
    web = consul.Consul(host=host, port=port, token=login["SecretID"])
    assert admin.catalog.register("n1", "10.0.0.1")
    register(web, "n1", "web", 80)
    with pytest.raises(consul.ACLPermissionDenied):
        register(web, "n1", "db", 5432)
    listed = admin.acl.token.list()
    assert login["AccessorID"] in [t["AccessorID"] for t in listed]
    by_method = requests.get(
        f"http://{host}:{port}/v1/acl/tokens?authmethod=idp", headers={"X-Consul-Token": mesh[2]}, timeout=10
    ).json()
    assert [t["AccessorID"] for t in by_method] == [login["AccessorID"]]

    # Refusals: no rule applies; another signer; a token for another audience.
    other_key, _ = _rsa_key()
    for bearer, reason in [
        (_jwt(key, service="web", groups=["readers"]), "no binding rule"),
        (_jwt(other_key, service="web", groups=["deployers"]), "no key of the method verifies it"),
        (_jwt(key, service="web", groups=["deployers"], aud="elsewhere"), "audience"),
    ]:
        resp = requests.post(
            f"http://{host}:{port}/v1/acl/login", json={"AuthMethod": "idp", "BearerToken": bearer}, timeout=10
        )
        assert resp.status_code == 403 and reason in resp.text, (resp.status_code, resp.text)

    # Only a login's token logs out, and only itself.
    with pytest.raises(consul.ACLPermissionDenied):
        anonymous.acl.logout(mesh[2])
    assert anonymous.acl.logout(login["SecretID"]) is True
    with pytest.raises(consul.ACLPermissionDenied):
        web.catalog.services()

    # Deleting the method takes its rules and its logins' tokens with it.
    second = anonymous.acl.login("idp", _jwt(key, service="api", groups=["deployers"]))
    assert admin.acl.auth_method.delete("idp")
    assert admin.acl.binding_rule.list() == []
    assert second["AccessorID"] not in [t["AccessorID"] for t in admin.acl.token.list()]


def test_auth_methods_that_cannot_work_are_refused_and_credentials_stay_hidden(mesh):
    host, port, secret, admin = mesh
    url = f"http://{host}:{port}/v1/acl/auth-method"
    hdr = {"X-Consul-Token": secret}
    for body, field in [
        ({"Name": "m", "Type": "oidc", "Config": {}}, "Type"),
        ({"Name": "m", "Type": "jwt", "Config": {"JWKSURL": "https://idp.example/keys", "BoundAudience": ["x"]}}, "Config.BoundAudience"),
        ({"Name": "m", "Type": "jwt", "Config": {"JWTValidationPubKeys": ["nope"]}}, "Config.JWTValidationPubKeys[0]"),
        ({"Name": "m", "Type": "jwt", "MaxTokenTTL": "48h", "Config": {"JWKSURL": "https://idp.example/keys"}}, "MaxTokenTTL"),
        ({"Name": "m", "Type": "kubernetes", "Config": {"Host": "https://k8s.example"}}, "Config.ServiceAccountJWT"),
    ]:
        resp = requests.put(url, json=body, headers=hdr, timeout=10)
        assert resp.status_code == 400 and field in resp.text, (body, resp.status_code, resp.text)
    k8s = {"Name": "k8s", "Type": "kubernetes", "Config": {"Host": "https://k8s.example", "ServiceAccountJWT": "reviewer-secret"}}
    assert requests.put(url, json=k8s, headers=hdr, timeout=10).status_code == 200
    rules = f"http://{host}:{port}/v1/acl/binding-rule"
    for body, field in [
        ({"AuthMethod": "k8s", "BindType": "service", "BindName": "${value.service}"}, "BindName"),
        ({"AuthMethod": "k8s", "BindType": "service", "BindName": "x", "Selector": "value.a == b"}, "Selector"),
        ({"AuthMethod": "k8s", "BindType": "templated-policy", "BindName": "x"}, "BindType"),
        ({"AuthMethod": "nope", "BindType": "service", "BindName": "x"}, "AuthMethod"),
    ]:
        resp = requests.put(rules, json=body, headers=hdr, timeout=10)
        assert resp.status_code == 400 and field in resp.text, (body, resp.status_code, resp.text)

    # A reader of the ACL system sees the method, not its reviewer token; it cannot write.
    reader_policy = admin.acl.policy.create(name="acl-reader-2", rules='acl = "read"')
    reader = admin.acl.token.create(policies_id=[reader_policy["ID"]])
    seen = requests.get(f"{url}/k8s", headers={"X-Consul-Token": reader["SecretID"]}, timeout=10).json()
    assert seen["Config"]["ServiceAccountJWT"] == "<hidden>"
    resp = requests.put(f"{url}/k8s", json=k8s, headers={"X-Consul-Token": reader["SecretID"]}, timeout=10)
    assert resp.status_code == 403
    assert "reviewer-secret" not in requests.get(f"{url}s", headers={"X-Consul-Token": reader["SecretID"]}, timeout=10).text
