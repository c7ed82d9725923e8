//! ACL enforcement over every route: no token, a wrong token and the right token.
//!
//! The table has one row per method and route. A route the router serves that has no row
//! fails `every_route_has_a_row`, so a new route cannot ship without its permission.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::acl::{AclSettings, Resolver};
use catalog::{Op, Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    filtered: bool,
    index: Option<u64>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// A body given as `{RAW: [bytes]}` is sent as those bytes (a snapshot archive).
const RAW: &str = "$raw";

async fn call(app: &Router, method: &str, uri: &str, token: Option<&str>, body: Value) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("X-Consul-Token", t);
    }
    let body = if body.is_null() {
        Body::empty()
    } else if let Some(raw) = body.get(RAW) {
        Body::from(serde_json::from_value::<Vec<u8>>(raw.clone()).unwrap())
    } else {
        Body::from(body.to_string())
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let filtered = resp.headers().get(http_api::FILTERED_HEADER).is_some();
    let index = resp
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        filtered,
        index,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

struct Mesh {
    app: Router,
    paths: Vec<&'static str>,
    store: Store,
    management: String,
    metrics: Arc<http_api::HttpMetrics>,
}

/// A server with ACLs on (default deny), bootstrapped, with node `n1` running `web` and its
/// sidecar, a service-defaults for `web` and an intention `api` → `web`.
async fn mesh() -> Mesh {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let resolver = Arc::new(Resolver::new(AclSettings {
        enabled: true,
        default_allow: false,
        datacenter: "dc1".into(),
    }));
    let liveness = Arc::new(catalog::liveness::Liveness::new(store.clone(), Default::default()));
    let metrics = Arc::new(http_api::HttpMetrics::default());
    let peerings = peering::Peerings::new(
        peering::Context {
            store: store.clone(),
            datacenter: "dc1".into(),
            tracker: peering::Tracker::new(),
            addresses: Arc::new(|| vec!["127.0.0.1:8502".to_owned()]),
            addresses_changed: None,
        },
        tokio_util::sync::CancellationToken::new(),
    );
    let (app, paths) = http_api::router_and_paths(
        store.clone(),
        http_api::ApiConfig {
            acl: resolver,
            liveness: Some(liveness),
            metrics: Arc::clone(&metrics),
            peering: Some(peerings),
            ..Default::default()
        },
    );
    store
        .write(Op::Peering(catalog::PeeringOp::GenerateToken {
            name: "cluster-b".into(),
            meta: Default::default(),
            id: "6a6a3a1e-0000-4000-8000-000000000001".into(),
            secret: "s".into(),
        }))
        .await
        .unwrap();
    store.federation().put(structs::federation::FederationState {
        datacenter: "dc2".into(),
        servers: vec!["10.0.2.1:8500".into()],
        // A gateway whose service only `web` readers see.
        mesh_gateways: vec![
            serde_json::from_value(json!({
                "Node": {"Node": "gw2", "Address": "10.0.2.2"},
                "Service": {"Kind": "mesh-gateway", "ID": "web", "Service": "web", "Port": 8443},
                "Checks": []
            }))
            .unwrap(),
        ],
        ..Default::default()
    });
    store.write(Op::AclInit).await.unwrap();
    let boot = call(&app, "PUT", "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(boot.status, StatusCode::OK, "{}", boot.body);
    let management = boot.json()["SecretID"].as_str().unwrap().to_owned();
    let m = Some(management.as_str());
    let reg = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {"ID": "web1", "Service": "web", "Port": 8080},
        "Checks": [{"CheckID": "web-alive", "Name": "alive", "ServiceID": "web1", "Status": "passing"}],
    });
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", m, reg).await.status,
        StatusCode::OK
    );
    let sidecar = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {"ID": "web1-sidecar-proxy", "Service": "web-sidecar-proxy", "Kind": "connect-proxy", "Port": 21000,
                    "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web1"}},
    });
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", m, sidecar).await.status,
        StatusCode::OK
    );
    let fired = call(&app, "PUT", "/v1/event/fire/deploy", m, json!("v")).await;
    assert_eq!(fired.status, StatusCode::OK, "{}", fired.body);
    for key in ["app/config", "app/secret/db"] {
        let put = call(&app, "PUT", &format!("/v1/kv/{key}"), m, json!("v")).await;
        assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    }
    let defaults = json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"});
    assert_eq!(
        call(&app, "PUT", "/v1/config", m, defaults).await.status,
        StatusCode::OK
    );
    let ingress = json!({"Kind": "ingress-gateway", "Name": "ing",
        "Listeners": [{"Port": 8080, "Protocol": "tcp", "Services": [{"Name": "db"}]}]});
    let put = call(&app, "PUT", "/v1/config", m, ingress).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let gateway = json!({
        "Node": "n1", "Address": "10.0.0.1",
        "Service": {"ID": "ing", "Service": "ing", "Kind": "ingress-gateway", "Port": 8080},
    });
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", m, gateway).await.status,
        StatusCode::OK
    );
    let ixn = call(
        &app,
        "PUT",
        "/v1/connect/intentions/exact?source=api&destination=web",
        m,
        json!({"Action": "allow"}),
    )
    .await;
    assert_eq!(ixn.status, StatusCode::OK, "{}", ixn.body);
    Mesh {
        app,
        paths,
        store,
        management,
        metrics,
    }
}

impl Mesh {
    /// A new token holding exactly `rules`.
    async fn token(&self, rules: &str) -> String {
        let m = Some(self.management.as_str());
        let name = format!("p{}", fastrand_name());
        let p = call(
            &self.app,
            "PUT",
            "/v1/acl/policy",
            m,
            json!({"Name": name, "Rules": rules}),
        )
        .await;
        assert_eq!(p.status, StatusCode::OK, "policy {rules:?}: {}", p.body);
        let t = call(
            &self.app,
            "PUT",
            "/v1/acl/token",
            m,
            json!({"Policies": [{"Name": name}]}),
        )
        .await;
        assert_eq!(t.status, StatusCode::OK, "{}", t.body);
        t.json()["SecretID"].as_str().unwrap().to_owned()
    }
}

fn fastrand_name() -> String {
    catalog::ca::new_uuid().unwrap().replace('-', "")
}

/// What a token without the permission gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Without {
    /// 403 Permission denied (or ACL not found), nothing changed.
    Denied,
    /// 200 with what it may not read left out, and the filtered header.
    Filtered,
    /// Needs no permission.
    Open,
}

struct Row {
    method: &'static str,
    route: &'static str,
    uri: String,
    body: Value,
    rules: &'static str,
    without: Without,
}

fn row(
    method: &'static str,
    route: &'static str,
    uri: &str,
    body: Value,
    rules: &'static str,
    without: Without,
) -> Row {
    Row {
        method,
        route,
        uri: uri.to_owned(),
        body,
        rules,
        without,
    }
}

const WEB_READ: &str = "service \"web\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }";
const WEB_WRITE: &str = "service \"web\" { policy = \"write\" }";
const KV_READ: &str = "key_prefix \"app/\" { policy = \"read\" }";
const KV_WRITE: &str = "key_prefix \"app/\" { policy = \"write\" }";
const SESSION_READ: &str = "session \"n1\" { policy = \"read\" }";
const SESSION_WRITE: &str = "session \"n1\" { policy = \"write\" }";
const EVENT_READ: &str = "event \"deploy\" { policy = \"read\" }";
const EVENT_WRITE: &str = "event_prefix \"dep\" { policy = \"write\" }";
const QUERY_READ: &str = "query_prefix \"web-\" { policy = \"read\" }";
const QUERY_WRITE: &str = "query_prefix \"web-\" { policy = \"write\" }";
const KV_ALL: &str = "key_prefix \"\" { policy = \"write\" }";
const GATEWAY_READ: &str =
    "service \"ing\" { policy = \"read\" }\nservice \"db\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }";
const NODE_READ: &str = "node \"n1\" { policy = \"read\" }";
const NODES_READ: &str = "node_prefix \"\" { policy = \"read\" }";
const NODE_WRITE: &str = "node \"n1\" { policy = \"write\" }";
const IXN_READ: &str = "service \"web\" {\n policy = \"read\"\n intentions = \"read\"\n}";
const IXN_WRITE: &str = "service \"web\" {\n policy = \"read\"\n intentions = \"write\"\n}";
const OPERATOR_READ: &str = "operator = \"read\"";
const OPERATOR_WRITE: &str = "operator = \"write\"";
const MESH_WRITE: &str = "mesh = \"write\"";
const AGENT_READ: &str = "agent \"meshd-server\" { policy = \"read\" }";
const ACL_READ: &str = "acl = \"read\"";
const ACL_WRITE: &str = "acl = \"write\"";
const PEERING_READ: &str = "peering = \"read\"";
const PEERING_WRITE: &str = "peering = \"write\"";

fn csr_for(uri: &str) -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(uri.to_owned().try_into().unwrap())];
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// Every route's row. Ids of ACL objects are filled from the mesh.
/// The ids a row may name: a policy, a role, a token and an intention of the mesh.
struct Spares {
    policy: String,
    role: String,
    token: String,
    intention: String,
    session: String,
    query: String,
    binding_rule: String,
    /// A snapshot archive taken once the spares exist.
    archive: Vec<u8>,
}

fn table(trust_domain: &str, spares: &Spares) -> Vec<Row> {
    let (policy_id, role_id, token_id) = (&spares.policy, &spares.role, &spares.token);
    let ixn = format!("/v1/connect/intentions/{}", spares.intention);
    use Without::*;
    let n = Value::Null;
    let (intermediate_csr, _) = catalog::ca::intermediate_csr(trust_domain, &Default::default()).unwrap();
    let web_reg =
        json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"ID": "web2", "Service": "web", "Port": 8081}});
    let p = format!("/v1/acl/policy/{policy_id}");
    let r = format!("/v1/acl/role/{role_id}");
    let t = format!("/v1/acl/token/{token_id}");
    let b = format!("/v1/acl/binding-rule/{}", spares.binding_rule);
    vec![
        row(
            "PUT",
            "/v1/catalog/register",
            "/v1/catalog/register",
            web_reg,
            WEB_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/catalog/deregister",
            "/v1/catalog/deregister",
            json!({"Node": "n1", "ServiceID": "web1"}),
            WEB_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/catalog/datacenters",
            "/v1/catalog/datacenters",
            n.clone(),
            "",
            Open,
        ),
        row(
            "GET",
            "/v1/catalog/nodes",
            "/v1/catalog/nodes",
            n.clone(),
            NODE_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/node/{node}",
            "/v1/catalog/node/n1",
            n.clone(),
            NODE_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/node-services/{node}",
            "/v1/catalog/node-services/n1",
            n.clone(),
            NODE_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/services",
            "/v1/catalog/services",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/service/{name}",
            "/v1/catalog/service/web",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/connect/{name}",
            "/v1/catalog/connect/web",
            n.clone(),
            "service \"web\" { policy = \"read\" }\nservice \"web-sidecar-proxy\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }",
            Filtered,
        ),
        row(
            "GET",
            "/v1/catalog/gateway-services/{gateway}",
            "/v1/catalog/gateway-services/ing",
            n.clone(),
            GATEWAY_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/health/ingress/{name}",
            "/v1/health/ingress/db",
            n.clone(),
            GATEWAY_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/health/service/{name}",
            "/v1/health/service/web",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/health/connect/{name}",
            "/v1/health/connect/web",
            n.clone(),
            "service_prefix \"web\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }",
            Filtered,
        ),
        row(
            "GET",
            "/v1/health/checks/{name}",
            "/v1/health/checks/web",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/health/state/{state}",
            "/v1/health/state/any",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/health/node/{node}",
            "/v1/health/node/n1",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "PUT",
            "/v1/config",
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": "web", "Protocol": "grpc"}),
            WEB_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/config/{kind}",
            "/v1/config/service-defaults",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/config/{kind}/{name}",
            "/v1/config/service-defaults/web",
            n.clone(),
            WEB_READ,
            Denied,
        ),
        row(
            "DELETE",
            "/v1/config/{kind}/{name}",
            "/v1/config/service-defaults/web",
            n.clone(),
            WEB_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/session/create",
            "/v1/session/create",
            json!({"Node": "n1", "Checks": []}),
            SESSION_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/session/destroy/{id}",
            &format!("/v1/session/destroy/{}", spares.session),
            n.clone(),
            SESSION_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/session/renew/{id}",
            &format!("/v1/session/renew/{}", spares.session),
            n.clone(),
            SESSION_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/session/info/{id}",
            &format!("/v1/session/info/{}", spares.session),
            n.clone(),
            SESSION_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/session/node/{node}",
            "/v1/session/node/n1",
            n.clone(),
            SESSION_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/session/list",
            "/v1/session/list",
            n.clone(),
            SESSION_READ,
            Filtered,
        ),
        row(
            "PUT",
            "/v1/txn",
            "/v1/txn",
            json!([{"KV": {"Verb": "set", "Key": "app/t", "Value": "dg=="}}]),
            KV_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/event/fire/{name}",
            "/v1/event/fire/deploy",
            json!("p"),
            EVENT_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/event/list",
            "/v1/event/list",
            n.clone(),
            EVENT_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/operator/raft/configuration",
            "/v1/operator/raft/configuration",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/operator/autopilot/health",
            "/v1/operator/autopilot/health",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/operator/usage",
            "/v1/operator/usage",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "POST",
            "/v1/peering/token",
            "/v1/peering/token",
            json!({"PeerName": "cluster-c"}),
            PEERING_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/peering/{name}",
            "/v1/peering/cluster-b",
            n.clone(),
            PEERING_READ,
            Denied,
        ),
        row("GET", "/v1/peerings", "/v1/peerings", n.clone(), PEERING_READ, Denied),
        row(
            "GET",
            "/v1/internal/peering/upstream/{peer}/{service}",
            "/v1/internal/peering/upstream/cluster-b/web",
            n.clone(),
            WEB_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/peering/trust-bundles/{service}",
            "/v1/internal/peering/trust-bundles/web",
            n.clone(),
            WEB_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/peering/servers",
            "/v1/internal/peering/servers",
            n.clone(),
            "service \"consul\" { policy = \"read\" }",
            Denied,
        ),
        row(
            "DELETE",
            "/v1/peering/{name}",
            "/v1/peering/gone",
            n.clone(),
            PEERING_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/agent/members",
            "/v1/agent/members",
            n.clone(),
            NODES_READ,
            Filtered,
        ),
        row("GET", "/v1/acl/replication", "/v1/acl/replication", n.clone(), "", Open),
        row(
            "GET",
            "/v1/operator/autopilot/state",
            "/v1/operator/autopilot/state",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/operator/autopilot/configuration",
            "/v1/operator/autopilot/configuration",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/coordinate/datacenters",
            "/v1/coordinate/datacenters",
            n.clone(),
            "",
            Open,
        ),
        row(
            "GET",
            "/v1/coordinate/nodes",
            "/v1/coordinate/nodes",
            n.clone(),
            "",
            Open,
        ),
        row(
            "POST",
            "/v1/query",
            "/v1/query",
            json!({"Name": "web-q2", "Service": {"Service": "web"}}),
            QUERY_WRITE,
            Denied,
        ),
        row("GET", "/v1/query", "/v1/query", n.clone(), QUERY_READ, Filtered),
        row(
            "GET",
            "/v1/query/{id}",
            &format!("/v1/query/{}", spares.query),
            n.clone(),
            QUERY_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/query/{id}",
            &format!("/v1/query/{}", spares.query),
            json!({"Name": "web-q", "Service": {"Service": "web", "OnlyPassing": true}}),
            QUERY_WRITE,
            Denied,
        ),
        row(
            "DELETE",
            "/v1/query/{id}",
            &format!("/v1/query/{}", spares.query),
            n.clone(),
            QUERY_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/query/{id}/execute",
            &format!("/v1/query/{}/execute", spares.query),
            n.clone(),
            // Anyone may run a query; its instances are filtered (an object, not a list:
            // `prepared_query_results_are_filtered_by_the_callers_rights` checks them).
            "",
            Open,
        ),
        row(
            "GET",
            "/v1/query/{id}/explain",
            &format!("/v1/query/{}/explain", spares.query),
            n.clone(),
            QUERY_READ,
            Denied,
        ),
        row("GET", "/v1/kv/", "/v1/kv/?keys", n.clone(), KV_READ, Filtered),
        row("GET", "/v1/kv/{*key}", "/v1/kv/app/config", n.clone(), KV_READ, Denied),
        row("PUT", "/v1/kv/{*key}", "/v1/kv/app/new", json!("v"), KV_WRITE, Denied),
        row(
            "DELETE",
            "/v1/kv/{*key}",
            "/v1/kv/app/config",
            n.clone(),
            KV_WRITE,
            Denied,
        ),
        row("DELETE", "/v1/kv/", "/v1/kv/?recurse", n.clone(), KV_ALL, Denied),
        row(
            "GET",
            "/v1/discovery-chain/{service}",
            "/v1/discovery-chain/web",
            n.clone(),
            WEB_READ,
            Denied,
        ),
        row(
            "POST",
            "/v1/discovery-chain/{service}",
            "/v1/discovery-chain/web",
            json!({}),
            WEB_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/connect/ca/roots",
            "/v1/connect/ca/roots",
            n.clone(),
            "",
            Open,
        ),
        row(
            "GET",
            "/v1/agent/connect/ca/roots",
            "/v1/agent/connect/ca/roots",
            n.clone(),
            "",
            Open,
        ),
        row(
            "GET",
            "/v1/connect/ca/configuration",
            "/v1/connect/ca/configuration",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/connect/ca/configuration",
            "/v1/connect/ca/configuration",
            json!({"Provider": "consul", "Config": {"LeafCertTTL": "48h"}}),
            OPERATOR_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/agent/connect/ca/leaf/{service}",
            "/v1/agent/connect/ca/leaf/web",
            n.clone(),
            WEB_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/internal/connect/ca/sign",
            "/v1/internal/connect/ca/sign",
            json!({"CSR": csr_for(&format!("spiffe://{trust_domain}/ns/default/dc/dc1/svc/web"))}),
            WEB_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/connect/intentions",
            "/v1/connect/intentions",
            n.clone(),
            IXN_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/connect/intentions/exact",
            "/v1/connect/intentions/exact?source=api&destination=web",
            n.clone(),
            IXN_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/connect/intentions/exact",
            "/v1/connect/intentions/exact?source=api&destination=web",
            json!({"Action": "deny"}),
            IXN_WRITE,
            Denied,
        ),
        row(
            "DELETE",
            "/v1/connect/intentions/exact",
            "/v1/connect/intentions/exact?source=api&destination=web",
            n.clone(),
            IXN_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/connect/intentions/match",
            "/v1/connect/intentions/match?by=destination&name=web",
            n.clone(),
            IXN_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/connect/intentions/check",
            "/v1/connect/intentions/check?source=api&destination=web",
            n.clone(),
            IXN_READ,
            Denied,
        ),
        row("GET", "/v1/status/leader", "/v1/status/leader", n.clone(), "", Open),
        row("GET", "/v1/status/peers", "/v1/status/peers", n.clone(), "", Open),
        row("GET", "/v1/agent/self", "/v1/agent/self", n.clone(), AGENT_READ, Denied),
        row(
            "POST",
            "/v1/agent/connect/authorize",
            "/v1/agent/connect/authorize",
            json!({"Target": "web", "ClientCertURI": format!("spiffe://{trust_domain}/ns/default/dc/dc1/svc/api")}),
            WEB_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/agent/connect/authorize",
            "/v1/agent/connect/authorize",
            json!({"Target": "web", "ClientCertURI": format!("spiffe://{trust_domain}/ns/default/dc/dc1/svc/api")}),
            WEB_WRITE,
            Denied,
        ),
        row(
            "POST",
            "/v1/connect/intentions",
            "/v1/connect/intentions",
            json!({"SourceName": "db", "DestinationName": "web", "Action": "allow"}),
            IXN_WRITE,
            Denied,
        ),
        row("GET", "/v1/connect/intentions/{id}", &ixn, n.clone(), IXN_READ, Denied),
        row(
            "PUT",
            "/v1/connect/intentions/{id}",
            &ixn,
            json!({"Action": "deny"}),
            IXN_WRITE,
            Denied,
        ),
        row(
            "DELETE",
            "/v1/connect/intentions/{id}",
            &ixn,
            n.clone(),
            IXN_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/agent/force-leave/{node}",
            "/v1/agent/force-leave/n1?prune",
            n.clone(),
            OPERATOR_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/ui/services",
            "/v1/internal/ui/services",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/internal/federation-states",
            "/v1/internal/federation-states",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/federation-states/mesh-gateways",
            "/v1/internal/federation-states/mesh-gateways",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/internal/federation-state/{dc}",
            "/v1/internal/federation-state/dc2",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/internal/federation-state",
            "/v1/internal/federation-state",
            json!({"Datacenter": "dc3", "Servers": ["10.0.3.1:8500"]}),
            OPERATOR_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/replication/config-entries",
            "/v1/internal/replication/config-entries",
            n.clone(),
            "operator = \"read\"\nmesh = \"read\"\nservice_prefix \"\" {\n policy = \"read\"\n intentions = \"read\"\n}",
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/replication/acl",
            "/v1/internal/replication/acl",
            n.clone(),
            ACL_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/operator/replication",
            "/v1/operator/replication",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/internal/ca/intermediate",
            "/v1/internal/ca/intermediate",
            json!({"CSR": intermediate_csr}),
            OPERATOR_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/service-virtual-ip",
            "/v1/internal/service-virtual-ip",
            n.clone(),
            WEB_READ,
            Filtered,
        ),
        row(
            "GET",
            "/v1/internal/service-virtual-ip/{service}",
            "/v1/internal/service-virtual-ip/web",
            n.clone(),
            WEB_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/internal/audit",
            "/v1/internal/audit",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/internal/node/heartbeat",
            "/v1/internal/node/heartbeat",
            json!({"Node": "n1", "Address": "10.0.0.1"}),
            NODE_WRITE,
            Denied,
        ),
        row(
            "PUT",
            "/v1/acl/token",
            "/v1/acl/token",
            json!({"Description": "new"}),
            ACL_WRITE,
            Denied,
        ),
        row("GET", "/v1/acl/token/{id}", &t, n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/token/{id}",
            &t,
            json!({"Description": "changed"}),
            ACL_WRITE,
            Denied,
        ),
        row("DELETE", "/v1/acl/token/{id}", &t, n.clone(), ACL_WRITE, Denied),
        row(
            "PUT",
            "/v1/acl/token/{id}/clone",
            &format!("{t}/clone"),
            json!({}),
            ACL_WRITE,
            Denied,
        ),
        row("GET", "/v1/acl/tokens", "/v1/acl/tokens", n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/policy",
            "/v1/acl/policy",
            json!({"Name": "fresh", "Rules": ""}),
            ACL_WRITE,
            Denied,
        ),
        row("GET", "/v1/acl/policy/{id}", &p, n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/policy/{id}",
            &p,
            json!({"Name": "renamed", "Rules": ""}),
            ACL_WRITE,
            Denied,
        ),
        row("DELETE", "/v1/acl/policy/{id}", &p, n.clone(), ACL_WRITE, Denied),
        row(
            "GET",
            "/v1/acl/policy/name/{name}",
            "/v1/acl/policy/name/spare",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row(
            "GET",
            "/v1/acl/policies",
            "/v1/acl/policies",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/acl/role",
            "/v1/acl/role",
            json!({"Name": "fresh-role"}),
            ACL_WRITE,
            Denied,
        ),
        row("GET", "/v1/acl/role/{id}", &r, n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/role/{id}",
            &r,
            json!({"Name": "renamed-role"}),
            ACL_WRITE,
            Denied,
        ),
        row("DELETE", "/v1/acl/role/{id}", &r, n.clone(), ACL_WRITE, Denied),
        row(
            "GET",
            "/v1/acl/role/name/{name}",
            "/v1/acl/role/name/spare-role",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row("GET", "/v1/acl/roles", "/v1/acl/roles", n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/auth-method",
            "/v1/acl/auth-method",
            json!({"Name": "fresh-method", "Type": "jwt", "Config": {"JWKSURL": "https://idp.example/keys"}}),
            ACL_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/acl/auth-method/{name}",
            "/v1/acl/auth-method/spare-method",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/acl/auth-method/{name}",
            "/v1/acl/auth-method/spare-method",
            json!({"Type": "jwt", "Description": "d", "Config": {"JWKSURL": "https://idp.example/keys"}}),
            ACL_WRITE,
            Denied,
        ),
        row(
            "DELETE",
            "/v1/acl/auth-method/{name}",
            "/v1/acl/auth-method/spare-method",
            n.clone(),
            ACL_WRITE,
            Denied,
        ),
        row(
            "GET",
            "/v1/acl/auth-methods",
            "/v1/acl/auth-methods",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/acl/binding-rule",
            "/v1/acl/binding-rule",
            json!({"AuthMethod": "spare-method", "BindType": "service", "BindName": "web"}),
            ACL_WRITE,
            Denied,
        ),
        row("GET", "/v1/acl/binding-rule/{id}", &b, n.clone(), ACL_READ, Denied),
        row(
            "PUT",
            "/v1/acl/binding-rule/{id}",
            &b,
            json!({"AuthMethod": "spare-method", "BindType": "service", "BindName": "api"}),
            ACL_WRITE,
            Denied,
        ),
        row("DELETE", "/v1/acl/binding-rule/{id}", &b, n.clone(), ACL_WRITE, Denied),
        row(
            "GET",
            "/v1/acl/binding-rules",
            "/v1/acl/binding-rules",
            n.clone(),
            ACL_READ,
            Denied,
        ),
        row(
            "PUT",
            "/v1/config",
            "/v1/config#proxy-defaults",
            json!({"Kind": "proxy-defaults", "Name": "global"}),
            MESH_WRITE,
            Denied,
        ),
        // Last: a restore sets the catalog back to when the spares were made.
        row("GET", "/v1/snapshot", "/v1/snapshot", n.clone(), ACL_WRITE, Denied),
        row(
            "PUT",
            "/v1/snapshot",
            "/v1/snapshot",
            json!({ RAW: spares.archive }),
            ACL_WRITE,
            Denied,
        ),
    ]
}

/// Routes whose answer is about the caller's own token or the ACL system itself: checked by
/// their own tests below, not by the table.
const OWN_TOKEN_ROUTES: [(&str, &str); 8] = [
    ("PUT", "/v1/acl/bootstrap"),
    // A login needs no token, a logout deletes the caller's own (tests/py/test_acl.py logs
    // in with signed JWTs).
    ("POST", "/v1/acl/login"),
    ("PUT", "/v1/acl/login"),
    ("POST", "/v1/acl/logout"),
    ("PUT", "/v1/acl/logout"),
    ("GET", "/v1/acl/token/self"),
    ("GET", "/v1/internal/acl/authorizer"),
    // Needs a peer to succeed: `establish_needs_peering_write` below.
    ("POST", "/v1/peering/establish"),
];

/// Routes that refuse every request alike (what they would do meshd does not do), whatever
/// the token: checked to answer 400.
const ALWAYS_REFUSED: [(&str, &str); 7] = [
    ("PUT", "/v1/coordinate/update"),
    ("PUT", "/v1/agent/join/{address}"),
    ("PUT", "/v1/operator/autopilot/configuration"),
    ("GET", "/v1/operator/keyring"),
    ("POST", "/v1/operator/keyring"),
    ("PUT", "/v1/operator/keyring"),
    ("DELETE", "/v1/operator/keyring"),
];

/// The objects the ACL rows act on: a spare policy, role and token.
async fn spares(mesh: &Mesh) -> Spares {
    let m = Some(mesh.management.as_str());
    let p = call(
        &mesh.app,
        "PUT",
        "/v1/acl/policy",
        m,
        json!({"Name": "spare", "Rules": ""}),
    )
    .await;
    let r = call(&mesh.app, "PUT", "/v1/acl/role", m, json!({"Name": "spare-role"})).await;
    let t = call(&mesh.app, "PUT", "/v1/acl/token", m, json!({"Description": "spare"})).await;
    let method = json!({"Name": "spare-method", "Type": "jwt", "Config": {"JWKSURL": "https://idp.example/keys"}});
    let created = call(&mesh.app, "PUT", "/v1/acl/auth-method", m, method).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let rule = json!({"AuthMethod": "spare-method", "BindType": "service", "BindName": "web"});
    let rule = call(&mesh.app, "PUT", "/v1/acl/binding-rule", m, rule).await;
    assert_eq!(rule.status, StatusCode::OK, "{}", rule.body);
    let i = call(
        &mesh.app,
        "GET",
        "/v1/connect/intentions/exact?source=api&destination=web",
        m,
        Value::Null,
    )
    .await;
    let session = call(
        &mesh.app,
        "PUT",
        "/v1/session/create",
        m,
        json!({"Node": "n1", "Checks": []}),
    )
    .await;
    assert_eq!(session.status, StatusCode::OK, "{}", session.body);
    let query = call(
        &mesh.app,
        "POST",
        "/v1/query",
        m,
        json!({"Name": "web-q", "Service": {"Service": "web"}}),
    )
    .await;
    assert_eq!(query.status, StatusCode::OK, "{}", query.body);
    Spares {
        query: query.json()["ID"].as_str().unwrap().to_owned(),
        binding_rule: rule.json()["ID"].as_str().unwrap().to_owned(),
        session: session.json()["ID"].as_str().unwrap().to_owned(),
        policy: p.json()["ID"].as_str().unwrap().to_owned(),
        role: r.json()["ID"].as_str().unwrap().to_owned(),
        token: t.json()["AccessorID"].as_str().unwrap().to_owned(),
        intention: i.json()["ID"].as_str().unwrap().to_owned(),
        archive: mesh.store.save_snapshot().await.unwrap().1,
    }
}

fn trust_domain(store: &Store) -> String {
    let state = store.read();
    let roots = state.ca_roots();
    serde_json::to_value(&roots).unwrap()["TrustDomain"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn every_route_no_token_wrong_token_right_token() {
    // One mesh per row: the right token's write must not disturb the next row.
    let probe = mesh().await;
    let rows = table(&trust_domain(&probe.store), &spares(&probe).await);
    for i in 0..rows.len() {
        let mesh = mesh().await;
        let spare = spares(&mesh).await;
        let td = trust_domain(&mesh.store);
        // Ids differ per mesh: take this mesh's row.
        let row = &table(&td, &spare)[i];
        let uri = row.uri.split('#').next().unwrap();
        let wrong = mesh
            .token("service \"other\" { policy = \"write\" }\nnode \"other\" { policy = \"write\" }\nagent \"other\" { policy = \"write\" }")
            .await;
        let right = if row.rules.is_empty() {
            wrong.clone()
        } else {
            mesh.token(row.rules).await
        };
        let what = format!("{} {}", row.method, row.uri);
        for (who, token) in [("no token", None), ("a wrong token", Some(wrong.as_str()))] {
            let reply = call(&mesh.app, row.method, uri, token, row.body.clone()).await;
            match row.without {
                Without::Denied => {
                    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{what} with {who}: {}", reply.body);
                    assert!(
                        reply.body.starts_with("Permission denied"),
                        "{what} with {who}: {}",
                        reply.body
                    );
                }
                Without::Filtered => {
                    assert_eq!(reply.status, StatusCode::OK, "{what} with {who}: {}", reply.body);
                    assert!(reply.filtered, "{what} with {who}: not marked filtered");
                    let v = reply.json();
                    let empty = match &v {
                        Value::Null => true,
                        Value::Array(a) => a.is_empty(),
                        Value::Object(o) => o
                            .values()
                            .all(|x| x.is_null() || x.as_array().is_some_and(|a| a.is_empty())),
                        _ => false,
                    };
                    assert!(empty, "{what} with {who} leaked: {}", reply.body);
                }
                Without::Open => assert!(reply.status.is_success(), "{what} with {who}: {}", reply.body),
            }
        }
        let reply = call(&mesh.app, row.method, uri, Some(&right), row.body.clone()).await;
        assert!(
            reply.status.is_success(),
            "{what} with the right token: {} {}",
            reply.status,
            reply.body
        );
        if row.without == Without::Filtered {
            let v = reply.json();
            assert!(
                !v.is_null() && v != json!([]) && v != json!({}),
                "{what}: the right token read nothing: {}",
                reply.body
            );
        }
        // An unknown token is refused wherever a permission is needed.
        if row.without != Without::Open {
            let reply = call(
                &mesh.app,
                row.method,
                uri,
                Some("00000000-1111-2222-3333-444444444444"),
                row.body.clone(),
            )
            .await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{what} with an unknown token");
            assert_eq!(reply.body.trim(), "ACL not found", "{what}");
        }
    }
    // Every row names a served route.
    for row in &rows {
        assert!(probe.paths.contains(&row.route), "row for unknown route {}", row.route);
    }
}

#[tokio::test]
async fn every_route_has_a_row() {
    let mesh = mesh().await;
    let rows = table(&trust_domain(&mesh.store), &spares(&mesh).await);
    let mut covered: BTreeMap<(&str, &str), ()> = BTreeMap::new();
    for row in &rows {
        covered.insert((row.method, row.route), ());
    }
    for (m, route) in OWN_TOKEN_ROUTES {
        covered.insert((m, route), ());
    }
    for (m, route) in ALWAYS_REFUSED {
        covered.insert((m, route), ());
        let reply = call(&mesh.app, m, route, Some(mesh.management.as_str()), Value::Null).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{m} {route}: {}", reply.body);
    }
    for route in &mesh.paths {
        // A concrete path for the route: from a row if one exists, else the template itself
        // (its placeholders match any segment).
        let uri = rows.iter().find(|r| r.route == *route).map_or_else(
            || route.replace(['{', '}'], ""),
            |r| r.uri.split('#').next().unwrap().to_owned(),
        );
        for method in ["GET", "PUT", "POST", "DELETE"] {
            let reply = call(&mesh.app, method, &uri, Some("no-such-token"), Value::Null).await;
            if reply.status != StatusCode::METHOD_NOT_ALLOWED {
                assert!(
                    covered.contains_key(&(method, *route)),
                    "{method} {route} is served but has no ACL row in this test's table"
                );
            }
        }
    }
}

/// Establishing needs `peering:write` before anything else is looked at; with it, a bad
/// token is a 400 naming the field.
#[tokio::test]
async fn establish_needs_peering_write() {
    let mesh = mesh().await;
    let body = json!({"PeerName": "cluster-c", "PeeringToken": "not a token"});
    let wrong = mesh.token("operator = \"read\"").await;
    for token in [None, Some(wrong.as_str())] {
        let reply = call(&mesh.app, "POST", "/v1/peering/establish", token, body.clone()).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
        assert!(reply.body.contains("peering:write"), "{}", reply.body);
    }
    let right = mesh.token(PEERING_WRITE).await;
    let reply = call(&mesh.app, "POST", "/v1/peering/establish", Some(&right), body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert!(reply.body.starts_with("PeeringToken: not base64"), "{}", reply.body);
}

#[tokio::test]
async fn bootstrap_once_then_403() {
    let mesh = mesh().await;
    let again = call(&mesh.app, "PUT", "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN);
    assert!(again.body.contains("ACL bootstrap no longer allowed"), "{}", again.body);
}

#[tokio::test]
async fn a_secret_need_not_be_a_uuid_but_must_fit_a_header() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let made = call(
        &mesh.app,
        "PUT",
        "/v1/acl/token",
        m,
        serde_json::json!({"SecretID": "my-own-secret_1", "Policies": [{"Name": "global-management"}]}),
    )
    .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    let me = call(
        &mesh.app,
        "GET",
        "/v1/acl/token/self",
        Some("my-own-secret_1"),
        Value::Null,
    )
    .await;
    assert_eq!(me.status, StatusCode::OK, "{}", me.body);
    for bad in ["has space", ""] {
        let body = if bad.is_empty() {
            serde_json::json!({"SecretID": "é"})
        } else {
            serde_json::json!({"SecretID": bad})
        };
        let refused = call(&mesh.app, "PUT", "/v1/acl/token", m, body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
        assert!(refused.body.contains("SecretID"), "{}", refused.body);
    }
}

#[tokio::test]
async fn own_token_routes_answer_the_token_itself() {
    let mesh = mesh().await;
    let token = mesh.token(WEB_WRITE).await;
    let me = call(&mesh.app, "GET", "/v1/acl/token/self", Some(&token), Value::Null).await;
    assert_eq!(me.status, StatusCode::OK);
    assert_eq!(me.json()["SecretID"], token.as_str());
    let unknown = call(&mesh.app, "GET", "/v1/acl/token/self", Some("nope"), Value::Null).await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN);
    let rules = call(
        &mesh.app,
        "GET",
        "/v1/internal/acl/authorizer",
        Some(&token),
        Value::Null,
    )
    .await;
    assert_eq!(rules.status, StatusCode::OK, "{}", rules.body);
    let parsed: acl::TokenRules = serde_json::from_str(&rules.body).unwrap();
    let a = parsed.authorizer();
    assert!(a.service_write("web") && !a.service_write("db") && !a.default_allow());
    let unknown = call(
        &mesh.app,
        "GET",
        "/v1/internal/acl/authorizer",
        Some("nope"),
        Value::Null,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_token_change_or_deletion_takes_effect_at_once() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let token = mesh.token(WEB_WRITE).await;
    let leaf = "/v1/agent/connect/ca/leaf/web";
    assert_eq!(
        call(&mesh.app, "GET", leaf, Some(&token), Value::Null).await.status,
        StatusCode::OK
    );
    let me = call(&mesh.app, "GET", "/v1/acl/token/self", Some(&token), Value::Null)
        .await
        .json();
    let accessor = me["AccessorID"].as_str().unwrap().to_owned();
    let policy_id = me["Policies"][0]["ID"].as_str().unwrap().to_owned();
    // The policy changes to read only: refused on the next request.
    let upd = call(
        &mesh.app,
        "PUT",
        &format!("/v1/acl/policy/{policy_id}"),
        m,
        json!({"Name": me["Policies"][0]["Name"], "Rules": "service \"web\" { policy = \"read\" }"}),
    )
    .await;
    assert_eq!(upd.status, StatusCode::OK, "{}", upd.body);
    assert_eq!(
        call(&mesh.app, "GET", leaf, Some(&token), Value::Null).await.status,
        StatusCode::FORBIDDEN
    );
    // Deleted: unknown.
    let del = call(
        &mesh.app,
        "DELETE",
        &format!("/v1/acl/token/{accessor}"),
        m,
        Value::Null,
    )
    .await;
    assert_eq!(del.status, StatusCode::OK);
    let gone = call(&mesh.app, "GET", leaf, Some(&token), Value::Null).await;
    assert_eq!(
        (gone.status, gone.body.trim()),
        (StatusCode::FORBIDDEN, "ACL not found")
    );
}

#[tokio::test]
async fn malformed_rules_name_line_and_column_and_change_nothing() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let bad = call(
        &mesh.app,
        "PUT",
        "/v1/acl/policy",
        m,
        json!({"Name": "bad", "Rules": "service \"web\" {\n  policy = \"wirte\"\n}"}),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("Rules: line 2, column 12"), "{}", bad.body);
    let list = call(&mesh.app, "GET", "/v1/acl/policies", m, Value::Null).await.json();
    assert!(list.as_array().unwrap().iter().all(|p| p["Name"] != "bad"));
}

#[tokio::test]
async fn expired_tokens_are_refused_and_ttl_is_bounded() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let short = call(&mesh.app, "PUT", "/v1/acl/token", m, json!({"ExpirationTTL": "10s"})).await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert!(short.body.contains("ExpirationTTL"), "{}", short.body);
    // A token stored with an expiration in the past (as after a restart past its TTL).
    let t = call(
        &mesh.app,
        "PUT",
        "/v1/acl/token",
        m,
        json!({"ExpirationTTL": "1m", "Policies": [{"Name": "global-management"}]}),
    )
    .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.body);
    let secret = t.json()["SecretID"].as_str().unwrap().to_owned();
    assert_eq!(
        call(&mesh.app, "GET", "/v1/acl/tokens", Some(&secret), Value::Null)
            .await
            .status,
        StatusCode::OK
    );
    let accessor = t.json()["AccessorID"].as_str().unwrap().to_owned();
    let mut stored = (*mesh.store.read().acl_token(&accessor).unwrap()).clone();
    stored.expiration_time = Some(structs::Timestamp(
        std::time::SystemTime::now() - std::time::Duration::from_secs(1),
    ));
    // The past expiration goes around the API's checks, as time passing would.
    let expired = acl_token_expired(&mesh, stored).await;
    assert_eq!(
        (expired.status, expired.body.trim()),
        (StatusCode::FORBIDDEN, "ACL not found")
    );
}

/// Replaces a stored token with `token` through a fresh store on the same state (the API
/// refuses past expirations) and asks with its secret.
async fn acl_token_expired(mesh: &Mesh, token: structs::acl::AclToken) -> Reply {
    let resolver = Resolver::new(AclSettings {
        enabled: true,
        default_allow: false,
        datacenter: "dc1".into(),
    });
    let mut state = (*mesh.store.read()).clone();
    let next = state.index.next();
    let secret = token.secret_id.clone();
    state.apply(next, &[catalog::Change::PutAclToken(token)]);
    let resolved = resolver.resolve(&state, structs::Token::new(&secret).as_ref());
    Reply {
        status: if resolved.is_err() {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::OK
        },
        filtered: false,
        index: None,
        body: resolved.err().map(|e| e.to_string()).unwrap_or_default(),
    }
}

#[tokio::test]
async fn default_allow_grants_all_but_acl_management_and_intentions_follow_it() {
    for (default_allow, allowed) in [(true, true), (false, false)] {
        let store = Store::open(StoreConfig::default()).await.unwrap();
        let app = http_api::router(
            store.clone(),
            http_api::ApiConfig {
                acl: Arc::new(Resolver::new(AclSettings {
                    enabled: true,
                    default_allow,
                    datacenter: "dc1".into(),
                })),
                ..Default::default()
            },
        );
        store.write(Op::AclInit).await.unwrap();
        let boot = call(&app, "PUT", "/v1/acl/bootstrap", None, Value::Null).await;
        let m = boot.json()["SecretID"].as_str().unwrap().to_owned();
        let check = call(
            &app,
            "GET",
            "/v1/connect/intentions/check?source=a&destination=b",
            Some(&m),
            Value::Null,
        )
        .await;
        assert_eq!(check.json()["Allowed"], allowed, "default {default_allow}");
        let anon = call(&app, "GET", "/v1/agent/connect/ca/leaf/web", None, Value::Null).await;
        assert_eq!(anon.status.is_success(), default_allow);
        let acl = call(&app, "GET", "/v1/acl/tokens", None, Value::Null).await;
        assert_eq!(acl.status, StatusCode::FORBIDDEN);
    }
}

#[tokio::test]
async fn secrets_are_hidden_without_acl_write() {
    let mesh = mesh().await;
    let reader = mesh.token(ACL_READ).await;
    let list = call(&mesh.app, "GET", "/v1/acl/tokens", Some(&reader), Value::Null).await;
    assert_eq!(list.status, StatusCode::OK);
    for t in list.json().as_array().unwrap() {
        assert_eq!(t["SecretID"], "<hidden>", "{t}");
    }
    let writer = mesh.token(ACL_WRITE).await;
    let list = call(&mesh.app, "GET", "/v1/acl/tokens", Some(&writer), Value::Null)
        .await
        .json();
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|t| t["SecretID"] == writer.as_str())
    );
}

/// A check's header values (credentials, often) are shown only to tokens that may write
/// its service, on every health route that lists checks; readers see `<hidden>`.
#[tokio::test]
async fn check_header_values_are_hidden_from_tokens_that_cannot_write_the_service() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let reg = json!({
        "Node": "n1", "Address": "10.0.0.1", "SkipNodeUpdate": true,
        "Checks": [{"CheckID": "web-http", "Name": "http", "ServiceID": "web1", "Status": "passing",
                    "Definition": {"HTTP": "http://127.0.0.1:8080/health", "Interval": "10s",
                                   "Header": {"Authorization": ["Bearer s3cret"]}}}],
    });
    let put = call(&mesh.app, "PUT", "/v1/catalog/register", m, reg).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let reader = mesh
        .token("service_prefix \"\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }")
        .await;
    let writer = mesh
        .token("service \"web\" { policy = \"write\" }\nnode_prefix \"\" { policy = \"read\" }")
        .await;
    for path in [
        "/v1/health/checks/web",
        "/v1/health/state/any",
        "/v1/health/node/n1",
        "/v1/health/service/web",
    ] {
        let seen = call(&mesh.app, "GET", path, Some(&reader), Value::Null).await;
        assert_eq!(seen.status, StatusCode::OK, "{path}: {}", seen.body);
        assert!(!seen.body.contains("s3cret"), "{path}: {}", seen.body);
        assert!(seen.body.contains("<hidden>"), "{path}: {}", seen.body);
        let own = call(&mesh.app, "GET", path, Some(&writer), Value::Null).await;
        assert!(own.body.contains("Bearer s3cret"), "{path}: {}", own.body);
    }
}

#[tokio::test]
async fn acl_endpoints_say_acls_are_off() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store, http_api::ApiConfig::default());
    let r = call(&app, "PUT", "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(
        (r.status, r.body.trim()),
        (StatusCode::UNAUTHORIZED, "ACL support disabled")
    );
    // Everything else is open.
    let r = call(&app, "GET", "/v1/agent/connect/ca/leaf/web", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn gateway_routes_filter_what_the_token_may_not_read() {
    let mesh = mesh().await;
    // Read on the gateway but not on the service it fronts: an empty, filtered list.
    let gateway_only = mesh.token("service \"ing\" { policy = \"read\" }").await;
    let r = call(
        &mesh.app,
        "GET",
        "/v1/catalog/gateway-services/ing",
        Some(&gateway_only),
        Value::Null,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.filtered);
    assert_eq!(r.json(), json!([]));
    // Read on the service but not on the gateway instance (or its node): filtered too.
    let service_only = mesh.token("service \"db\" { policy = \"read\" }").await;
    let r = call(
        &mesh.app,
        "GET",
        "/v1/health/ingress/db",
        Some(&service_only),
        Value::Null,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.filtered);
    assert_eq!(r.json(), json!([]));
    let r = call(
        &mesh.app,
        "GET",
        "/v1/health/ingress/db",
        Some(&gateway_only),
        Value::Null,
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "service:read on db is needed: {}",
        r.body
    );
}

#[tokio::test]
async fn the_builtin_read_only_policy_reads_everything_writes_nothing_and_stays_as_it_is() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let id = "00000000-0000-0000-0000-000000000002";
    // Read by name, as Consul's Go client asks for it (the '/' escaped).
    let p = call(
        &mesh.app,
        "GET",
        "/v1/acl/policy/name/builtin%2Fglobal-read-only",
        m,
        Value::Null,
    )
    .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert_eq!(p.json()["ID"], id);
    let t = call(
        &mesh.app,
        "PUT",
        "/v1/acl/token",
        m,
        json!({"Policies": [{"Name": "builtin/global-read-only"}]}),
    )
    .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.body);
    let reader = t.json()["SecretID"].as_str().unwrap().to_owned();
    let r = Some(reader.as_str());
    for uri in [
        "/v1/catalog/services",
        "/v1/health/service/web",
        "/v1/acl/policies",
        "/v1/connect/intentions",
    ] {
        let reply = call(&mesh.app, "GET", uri, r, Value::Null).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", reply.body);
        assert!(!reply.filtered, "{uri} filtered for a global reader");
    }
    let reg = json!({"Node": "n9", "Address": "10.0.0.9"});
    let w = call(&mesh.app, "PUT", "/v1/catalog/register", r, reg).await;
    assert_eq!(w.status, StatusCode::FORBIDDEN, "{}", w.body);
    // The policy keeps its name and rules and cannot be deleted.
    let uri = format!("/v1/acl/policy/{id}");
    for (body, want) in [
        (
            json!({"Name": "builtin/global-read-only", "Rules": "acl = \"write\""}),
            "Rules: the rules of the built-in builtin/global-read-only policy cannot be changed",
        ),
        (
            json!({"Name": "reader", "Rules": acl::GLOBAL_READ_ONLY_RULES}),
            "Name: the built-in builtin/global-read-only policy cannot be renamed",
        ),
    ] {
        let reply = call(&mesh.app, "PUT", &uri, m, body).await;
        assert_eq!((reply.status, reply.body.trim()), (StatusCode::BAD_REQUEST, want));
    }
    let d = call(&mesh.app, "DELETE", &uri, m, Value::Null).await;
    assert_eq!(d.status, StatusCode::BAD_REQUEST);
    assert!(d.body.contains("cannot be deleted"), "{}", d.body);
    // Its description may change, as Consul allows.
    let ok = call(
        &mesh.app,
        "PUT",
        &uri,
        m,
        json!({"Name": "builtin/global-read-only", "Description": "ours", "Rules": acl::GLOBAL_READ_ONLY_RULES}),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
}

/// Many requests parked on one service, woken by one write: the answer is rendered once per
/// (request, token) and shared, yet each request gets exactly what a fresh request with its
/// own token and parameters gets: no token sees another's answer, no filter or parameter
/// another's.
#[tokio::test]
async fn shared_blocking_answers_follow_each_requests_token_and_parameters() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let everything = mesh
        .token("service_prefix \"\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }")
        .await;
    let only_n1 = mesh
        .token("service \"web\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }")
        .await;
    let nothing = mesh.token("service \"other\" { policy = \"read\" }").await;
    let second = json!({"Node": "n2", "Address": "10.0.0.2",
        "Service": {"ID": "web2", "Service": "web", "Port": 8080, "Tags": ["v2"]},
        "Checks": [{"CheckID": "web2-alive", "Name": "alive", "ServiceID": "web2", "Status": "critical"}]});
    assert_eq!(
        call(&mesh.app, "PUT", "/v1/catalog/register", m, second).await.status,
        StatusCode::OK
    );
    let index = call(&mesh.app, "GET", "/v1/health/service/web", m, Value::Null)
        .await
        .index
        .unwrap();
    let asks: Vec<(&str, &str)> = vec![
        (&everything, ""),
        (&only_n1, ""),
        (&nothing, ""),
        (&everything, "&tag=v2"),
        (&everything, "&filter=Node.Node%20%3D%3D%20%22n1%22"),
        (&everything, "&passing=true"),
        (&everything, "&pretty"),
        (&only_n1, "&tag=v2"),
    ];
    let mut parked = Vec::new();
    for (token, extra) in &asks {
        let (app, token) = (mesh.app.clone(), token.to_string());
        let uri = format!("/v1/health/service/web?index={index}&wait=30s{extra}");
        parked.push(tokio::spawn(async move {
            call(&app, "GET", &uri, Some(&token), Value::Null).await
        }));
    }
    while mesh.metrics.blocking_now() < asks.len() as i64 {
        tokio::task::yield_now().await;
    }
    // One write wakes them all: a third instance, on n1.
    let third = json!({"Node": "n1", "Address": "10.0.0.1",
        "Service": {"ID": "web3", "Service": "web", "Port": 8081, "Tags": ["v2"]}});
    assert_eq!(
        call(&mesh.app, "PUT", "/v1/catalog/register", m, third).await.status,
        StatusCode::OK
    );
    for ((token, extra), woken) in asks.iter().zip(parked) {
        let woken = woken.await.unwrap();
        let fresh = call(
            &mesh.app,
            "GET",
            &format!("/v1/health/service/web?{}", &extra.trim_start_matches('&')),
            Some(token),
            Value::Null,
        )
        .await;
        assert_eq!(woken.status, StatusCode::OK, "{extra}: {}", woken.body);
        assert!(woken.index.unwrap() > index, "{extra}: woken at the new index");
        assert_eq!(woken.index, fresh.index, "{extra}");
        assert_eq!(woken.body, fresh.body, "{extra}: the woken answer is the fresh one");
        assert_eq!(woken.filtered, fresh.filtered, "{extra}");
    }
    // And the answers differ where the tokens and parameters do.
    let ids = |token: &str, extra: &'static str| {
        let (app, token) = (mesh.app.clone(), token.to_owned());
        async move {
            let r = call(
                &app,
                "GET",
                &format!("/v1/health/service/web?{extra}"),
                Some(&token),
                Value::Null,
            )
            .await;
            let mut ids: Vec<String> = r
                .json()
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["Service"]["ID"].as_str().unwrap().to_owned())
                .collect();
            ids.sort();
            (ids, r.filtered)
        }
    };
    assert_eq!(
        ids(&everything, "").await,
        (vec!["web1".into(), "web2".into(), "web3".into()], false)
    );
    assert_eq!(ids(&only_n1, "").await, (vec!["web1".into(), "web3".into()], true));
    assert_eq!(ids(&nothing, "").await, (vec![], true));
    assert_eq!(
        ids(&everything, "tag=v2").await,
        (vec!["web2".into(), "web3".into()], false)
    );
    assert_eq!(
        ids(&everything, "passing=true").await,
        (vec!["web1".into(), "web3".into()], false)
    );
    assert_eq!(ids(&only_n1, "tag=v2").await, (vec!["web3".into()], true));
}

/// A request whose token was resolved before its policy changed must not share its answer
/// with a request resolved after the change: the shared answer is keyed by the ACL state
/// the rights came from, not the state after the wait.
#[tokio::test]
async fn a_policy_change_during_a_wait_does_not_leak_the_old_rights_answer() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let name = "narrowing";
    let p = call(
        &mesh.app,
        "PUT",
        "/v1/acl/policy",
        m,
        json!({"Name": name, "Rules": "service \"web\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }"}),
    )
    .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    let policy_id = p.json()["ID"].as_str().unwrap().to_owned();
    let t = call(
        &mesh.app,
        "PUT",
        "/v1/acl/token",
        m,
        json!({"Policies": [{"Name": name}]}),
    )
    .await;
    let token = t.json()["SecretID"].as_str().unwrap().to_owned();
    let index = call(&mesh.app, "GET", "/v1/health/service/web", Some(&token), Value::Null)
        .await
        .index
        .unwrap();
    // Parked with the old rights (web readable).
    let (app, tok) = (mesh.app.clone(), token.clone());
    let parked = tokio::spawn(async move {
        call(
            &app,
            "GET",
            &format!("/v1/health/service/web?index={index}&wait=30s"),
            Some(&tok),
            Value::Null,
        )
        .await
    });
    while mesh.metrics.blocking_now() < 1 {
        tokio::task::yield_now().await;
    }
    // The policy loses web; then web changes, which wakes the parked request.
    let narrowed = call(
        &mesh.app,
        "PUT",
        &format!("/v1/acl/policy/{policy_id}"),
        m,
        json!({"Name": name, "Rules": "service \"other\" { policy = \"read\" }"}),
    )
    .await;
    assert_eq!(narrowed.status, StatusCode::OK, "{}", narrowed.body);
    let more = json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"ID": "web9", "Service": "web", "Port": 8089}});
    assert_eq!(
        call(&mesh.app, "PUT", "/v1/catalog/register", m, more).await.status,
        StatusCode::OK
    );
    let old_rights = parked.await.unwrap();
    assert_eq!(old_rights.status, StatusCode::OK);
    // A request made now, at the same index, has the new rights: nothing of web.
    let now = call(
        &mesh.app,
        "GET",
        &format!("/v1/health/service/web?index={index}"),
        Some(&token),
        Value::Null,
    )
    .await;
    assert_eq!(now.index, old_rights.index, "the same index of the service");
    assert_eq!(now.json(), json!([]), "the narrowed token reads no web instance");
    assert!(now.filtered);
}

#[tokio::test]
async fn prepared_query_results_are_filtered_by_the_callers_rights() {
    let mesh = mesh().await;
    let id = spares(&mesh).await.query;
    let uri = format!("/v1/query/{id}/execute");
    let nobody = call(&mesh.app, "GET", &uri, None, Value::Null).await;
    assert_eq!(nobody.status, StatusCode::OK);
    assert!(nobody.filtered, "not marked filtered");
    assert_eq!(nobody.json()["Nodes"], json!([]));
    let reader = mesh.token(WEB_READ).await;
    let read = call(&mesh.app, "GET", &uri, Some(reader.as_str()), Value::Null).await;
    assert_eq!(read.json()["Nodes"].as_array().unwrap().len(), 1, "{}", read.body);
}

#[tokio::test]
async fn a_prepared_querys_stored_token_is_hidden_and_runs_the_query() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let reader_secret = mesh.token(WEB_READ).await;
    let created = call(
        &mesh.app,
        "POST",
        "/v1/query",
        m,
        json!({"Name": "web-stored", "Token": reader_secret, "Service": {"Service": "web"}}),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let id = created.json()["ID"].as_str().unwrap().to_owned();
    // A reader of queries sees that there is a token, never the token.
    let query_reader = mesh.token(QUERY_READ).await;
    for uri in [format!("/v1/query/{id}"), "/v1/query".to_owned()] {
        let r = call(&mesh.app, "GET", &uri, Some(query_reader.as_str()), Value::Null).await;
        assert_eq!(r.json()[0]["Token"], "<hidden>", "{uri}: {}", r.body);
        assert!(!r.body.contains(&reader_secret), "{uri} leaked the stored token");
    }
    let r = call(
        &mesh.app,
        "GET",
        "/v1/query/web-stored/explain",
        Some(query_reader.as_str()),
        Value::Null,
    )
    .await;
    assert_eq!(r.json()["Query"]["Token"], "<hidden>");
    let r = call(&mesh.app, "GET", &format!("/v1/query/{id}"), m, Value::Null).await;
    assert_eq!(r.json()[0]["Token"], reader_secret, "ACL managers see it");
    // Anyone running it gets what the stored token may read.
    let r = call(&mesh.app, "GET", "/v1/query/web-stored/execute", None, Value::Null).await;
    assert_eq!(r.json()["Nodes"].as_array().unwrap().len(), 1, "{}", r.body);
}

/// The config entries a secondary copies are read all or nothing: `operator:read` alone
/// does not read an entry its token could not read through `/v1/config`.
#[tokio::test]
async fn replication_of_config_entries_needs_the_read_of_every_entry() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let entry = json!({"Kind": "service-defaults", "Name": "billing", "Protocol": "http"});
    assert_eq!(
        call(&mesh.app, "PUT", "/v1/config", m, entry).await.status,
        StatusCode::OK
    );
    let uri = "/v1/internal/replication/config-entries";
    let operator = mesh.token(OPERATOR_READ).await;
    let reply = call(&mesh.app, "GET", uri, Some(operator.as_str()), Value::Null).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert!(reply.body.contains("service-defaults/billing"), "{}", reply.body);
    let reader = mesh
        .token("operator = \"read\"\nmesh = \"read\"\nservice_prefix \"\" {\n policy = \"read\"\n intentions = \"read\"\n}")
        .await;
    let reply = call(&mesh.app, "GET", uri, Some(reader.as_str()), Value::Null).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("billing"), "{}", reply.body);
    // An inline certificate carries its private key: copied only with mesh:write.
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["gw.example.com".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let entry = json!({"Kind": "inline-certificate", "Name": "edge", "Certificate": cert.pem(), "PrivateKey": key.serialize_pem()});
    assert_eq!(
        call(&mesh.app, "PUT", "/v1/config", m, entry).await.status,
        StatusCode::OK
    );
    let reply = call(&mesh.app, "GET", uri, Some(reader.as_str()), Value::Null).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert!(
        reply.body.contains("inline-certificate/edge") && reply.body.contains("mesh:write"),
        "{}",
        reply.body
    );
    let writer = mesh
        .token("operator = \"read\"\nmesh = \"write\"\nservice_prefix \"\" {\n policy = \"read\"\n intentions = \"read\"\n}")
        .await;
    let reply = call(&mesh.app, "GET", uri, Some(writer.as_str()), Value::Null).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("PRIVATE KEY"), "{}", reply.body);
}

/// A dry run lists only the proxies the caller may read: a fake server-side with three
/// proxies the change reaches, filtered by the token's rights; the others only counted.
#[tokio::test]
async fn a_dry_run_lists_only_the_proxies_the_token_may_read() {
    use http_api::dry_run::{DryRun, DryRunPage, DryRunProxies, MayRead};
    struct Three;
    #[async_trait::async_trait]
    impl DryRun for Three {
        async fn proxies(
            &self,
            _: Arc<catalog::State>,
            _: Arc<catalog::State>,
            _: DryRunPage,
            may_read: MayRead,
        ) -> DryRunProxies {
            let mut out = DryRunProxies::default();
            for (service, node) in [("web", "n1"), ("db", "n1"), ("web", "n2")] {
                if may_read(service, node) {
                    out.total += 1;
                    out.items.push(json!({"Service": service, "Node": node}));
                } else {
                    out.hidden_by_acls += 1;
                }
            }
            out
        }
    }
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(
        store.clone(),
        http_api::ApiConfig {
            acl: Arc::new(Resolver::new(AclSettings {
                enabled: true,
                default_allow: false,
                datacenter: "dc1".into(),
            })),
            dry_run: Some(Arc::new(Three)),
            ..Default::default()
        },
    );
    store.write(Op::AclInit).await.unwrap();
    let boot = call(&app, "PUT", "/v1/acl/bootstrap", None, Value::Null).await;
    let m = boot.json()["SecretID"].as_str().unwrap().to_owned();
    let rules = "service \"api\" { policy = \"write\" }\nservice \"web\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }";
    let policy = call(
        &app,
        "PUT",
        "/v1/acl/policy",
        Some(&m),
        json!({"Name": "p", "Rules": rules}),
    )
    .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.body);
    let token = call(
        &app,
        "PUT",
        "/v1/acl/token",
        Some(&m),
        json!({"Policies": [{"Name": "p"}]}),
    )
    .await;
    let secret = token.json()["SecretID"].as_str().unwrap().to_owned();
    let entry = json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"});
    let reply = call(&app, "PUT", "/v1/config?dry-run", Some(&secret), entry.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.filtered, "marked filtered");
    let proxies = &reply.json()["Proxies"];
    assert_eq!(
        proxies["Items"],
        json!([{"Service": "web", "Node": "n1"}]),
        "{}",
        reply.body
    );
    assert_eq!(proxies["HiddenByAcls"], 2);
    // The write's own permission first: a dry run of another service's entry is refused.
    let other = json!({"Kind": "service-defaults", "Name": "db", "Protocol": "http"});
    let reply = call(&app, "PUT", "/v1/config?dry-run", Some(&secret), other).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    // Nothing was written.
    assert!(
        store
            .read()
            .config_entry(structs::ConfigEntryKind::ServiceDefaults, "api")
            .is_none()
    );
}

/// An inline certificate's private key goes only to a caller who could write it
/// (`mesh:write`) or to the identity of a gateway whose listener serves it; the gateway
/// family's entries are written with `mesh:write` alone.
#[tokio::test]
async fn an_inline_certificates_key_goes_only_to_who_may_have_it() {
    let mesh = mesh().await;
    let m = Some(mesh.management.as_str());
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["gw.example.com".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let entry = json!({"Kind": "inline-certificate", "Name": "gw-cert",
                       "Certificate": cert.pem(), "PrivateKey": key.serialize_pem()});
    let put = call(&mesh.app, "PUT", "/v1/config", m, entry).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let gateway = json!({"Kind": "api-gateway", "Name": "gw", "Listeners": [
        {"Name": "https", "Port": 443, "Protocol": "http", "TLS": {"Certificates": [{"Name": "gw-cert"}]}}]});
    let put = call(&mesh.app, "PUT", "/v1/config", m, gateway.clone()).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let read_key = |token: String| {
        let app = mesh.app.clone();
        async move {
            let r = call(
                &app,
                "GET",
                "/v1/config/inline-certificate/gw-cert",
                Some(&token),
                Value::Null,
            )
            .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            let listed = call(&app, "GET", "/v1/config/inline-certificate", Some(&token), Value::Null).await;
            assert_eq!(
                listed.json()[0]["PrivateKey"],
                r.json()["PrivateKey"],
                "the list says the same"
            );
            r.json()["PrivateKey"].as_str().unwrap().to_owned()
        }
    };
    assert!(read_key(mesh.management.clone()).await.contains("PRIVATE KEY"));
    assert_eq!(read_key(mesh.token(r#"mesh = "read""#).await).await, "");
    assert_eq!(
        read_key(mesh.token(r#"service "other" { policy = "write" }"#).await).await,
        ""
    );
    let gateway_identity = mesh.token(r#"service "gw" { policy = "write" }"#).await;
    assert!(read_key(gateway_identity.clone()).await.contains("PRIVATE KEY"));
    // The agent of a node the gateway runs on hands the key to its Envoy: its token reads
    // it once the gateway is registered there, not before, and no other node's does.
    let agent = mesh
        .token("node \"gw-node\" { policy = \"write\" }\nmesh = \"read\"")
        .await;
    assert_eq!(read_key(agent.clone()).await, "");
    let register = json!({"Node": "gw-node", "Address": "10.0.0.9",
                          "Service": {"ID": "gw", "Service": "gw", "Kind": "api-gateway", "Port": 443}});
    let r = call(&mesh.app, "PUT", "/v1/catalog/register", m, register).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(read_key(agent).await.contains("PRIVATE KEY"));
    let other_agent = mesh
        .token("node \"other-node\" { policy = \"write\" }\nmesh = \"read\"")
        .await;
    assert_eq!(read_key(other_agent).await, "");
    // Nor can that identity write the gateway family (mesh:write), or read without a rule.
    let denied = call(&mesh.app, "PUT", "/v1/config", Some(&gateway_identity), gateway).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{}", denied.body);
    assert!(denied.body.contains("mesh:write"), "{}", denied.body);
    let nobody = mesh.token(r#"node "n1" { policy = "read" }"#).await;
    let r = call(
        &mesh.app,
        "GET",
        "/v1/config/inline-certificate/gw-cert",
        Some(&nobody),
        Value::Null,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    // A key that is not the certificate's is refused at write time, naming the field.
    let other = rcgen::KeyPair::generate().unwrap();
    let wrong = json!({"Kind": "inline-certificate", "Name": "bad", "Certificate": cert.pem(), "PrivateKey": other.serialize_pem()});
    let r = call(&mesh.app, "PUT", "/v1/config", m, wrong).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.body.contains("PrivateKey") && r.body.contains("not the key"),
        "{}",
        r.body
    );
}
