use super::*;
use serde_json::json;

fn def(v: serde_json::Value) -> ServiceDefinition {
    structs::json::from_value(v).unwrap()
}

const PORTS: RangeInclusive<u16> = 21000..=21255;

#[test]
fn sidecar_is_expanded_as_consul_does() {
    let d = def(json!({
        "Name": "web", "ID": "web-1", "Port": 8080, "Tags": ["v1"], "Meta": {"team": "a"},
        "Connect": {"SidecarService": {"Proxy": {"Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191}]}}}
    }));
    let e = expand(&d, &BTreeMap::new(), &PORTS).unwrap();
    let (proxy, checks) = e.sidecar.unwrap();
    assert_eq!(proxy.kind, ServiceKind::ConnectProxy);
    assert_eq!(proxy.id, "web-1-sidecar-proxy");
    assert_eq!(proxy.service, "web-sidecar-proxy");
    assert_eq!(proxy.port, 21000);
    assert_eq!(proxy.tags, ["v1"]);
    assert_eq!(proxy.meta.get("team").map(String::as_str), Some("a"));
    assert_eq!(proxy.proxy.destination_service_name, "web");
    assert_eq!(proxy.proxy.destination_service_id, "web-1");
    assert_eq!(proxy.proxy.local_service_address, "127.0.0.1");
    assert_eq!(proxy.proxy.local_service_port, 8080);
    assert_eq!(proxy.proxy.upstreams[0].destination_name, "api");
    let ids: Vec<_> = checks
        .iter()
        .map(|c| (c.check.check_id.as_str(), c.kind.type_name()))
        .collect();
    assert_eq!(
        ids,
        [
            ("service:web-1-sidecar-proxy:1", "tcp"),
            ("service:web-1-sidecar-proxy:2", "alias")
        ]
    );
    assert_eq!(checks[0].check.definition.tcp, "127.0.0.1:21000");
    assert_eq!(checks[1].check.name, "Connect Sidecar Aliasing web-1");
    assert!(e.service.connect.sidecar_service.is_none());
}

#[test]
fn ports_are_allocated_kept_and_conflicts_refused() {
    let mut existing = BTreeMap::new();
    let web = def(json!({"Name": "web", "Port": 8080, "Connect": {"SidecarService": {}}}));
    let e = expand(&web, &existing, &PORTS).unwrap();
    let (proxy, _) = e.sidecar.unwrap();
    existing.insert(proxy.id.clone(), proxy.port);
    // A second service's sidecar takes the next port.
    let api = def(json!({"Name": "api", "Port": 9090, "Connect": {"SidecarService": {}}}));
    let (p2, _) = expand(&api, &existing, &PORTS).unwrap().sidecar.unwrap();
    assert_eq!(p2.port, 21001);
    // Registering web again keeps its port.
    let (again, _) = expand(&web, &existing, &PORTS).unwrap().sidecar.unwrap();
    assert_eq!(again.port, 21000);
    // A given port someone else has is refused, naming the field.
    let clash = def(json!({"Name": "api", "Port": 9090, "Connect": {"SidecarService": {"Port": 21000}}}));
    assert_eq!(
        expand(&clash, &existing, &PORTS).unwrap_err().to_string(),
        "Connect.SidecarService.Port: 21000 is already used by another service on this node"
    );
    // A full range is refused.
    let full = def(json!({"Name": "api", "Port": 9090, "Connect": {"SidecarService": {}}}));
    assert_eq!(
        expand(&full, &existing, &(21000..=21000)).unwrap_err().to_string(),
        "Connect.SidecarService.Port: no free sidecar port left in 21000-21000: give one"
    );
}

#[test]
fn given_sidecar_checks_replace_the_defaults_and_ids_follow_consul() {
    let d = def(json!({
        "Name": "web", "Port": 80,
        "Checks": [{"TTL": "10s"}, {"TCP": "127.0.0.1:80", "Interval": "5s", "Name": "tcp"}],
        "Connect": {"SidecarService": {"Port": 21500, "Check": {"TTL": "30s", "CheckID": "mine"}}}
    }));
    let e = expand(&d, &BTreeMap::new(), &PORTS).unwrap();
    let ids: Vec<_> = e
        .checks
        .iter()
        .map(|c| (c.check.check_id.as_str(), c.check.name.as_str()))
        .collect();
    assert_eq!(
        ids,
        [("service:web:1", "Service 'web' check"), ("service:web:2", "tcp")]
    );
    assert_eq!(e.checks[0].check.status, HealthStatus::Critical);
    assert_eq!(e.checks[0].check.service_name, "web");
    let (proxy, checks) = e.sidecar.unwrap();
    assert_eq!(proxy.port, 21500);
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].check.check_id, "mine");
    let single = def(json!({"Name": "db", "Check": {"TTL": "1s", "Status": "passing"}}));
    let e = expand(&single, &BTreeMap::new(), &PORTS).unwrap();
    assert_eq!(e.checks[0].check.check_id, "service:db");
    assert_eq!(e.checks[0].check.status, HealthStatus::Passing);
}
