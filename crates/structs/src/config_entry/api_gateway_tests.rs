use super::api_gateway_binding::{bind, hosts_intersect, statuses};
use super::*;
use crate::Validate;
use serde_json::{Value, json};
use std::sync::Arc;

fn entry(v: Value) -> ConfigEntry {
    ConfigEntry::from_json(v).unwrap()
}

fn error(v: Value) -> String {
    entry(v)
        .validate()
        .map(|()| "valid".to_owned())
        .unwrap_or_else(|e| e.to_string())
}

fn gateway(listeners: Value) -> Value {
    json!({"Kind": "api-gateway", "Name": "gw", "Listeners": listeners})
}

fn http_route(name: &str, parents: Value, hostnames: Value, rules: Value) -> Value {
    json!({"Kind": "http-route", "Name": name, "Parents": parents, "Hostnames": hostnames, "Rules": rules})
}

#[test]
fn gateway_listeners_are_checked_field_by_field() {
    let ok = json!({"Name": "web", "Port": 80, "Protocol": "http", "Hostname": "*.example.com"});
    assert_eq!(error(gateway(json!([ok]))), "valid");
    let cases = [
        (json!([]), "Listeners: required (at least one listener)"),
        (json!([{"Port": 80, "Protocol": "http"}]), "Listeners[0].Name: required"),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http"}, {"Name": "a", "Port": 81, "Protocol": "http"}]),
            "Listeners[1].Name: duplicate listener name \"a\"",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http"}, {"Name": "b", "Port": 80, "Protocol": "tcp"}]),
            "Listeners[1].Port: duplicate listener port 80",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "grpc"}]),
            "Listeners[0].Protocol: unsupported protocol \"grpc\": expected http or tcp",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "tcp", "Hostname": "a.example.com"}]),
            "Listeners[0].Hostname: not allowed on a tcp listener (a connection names no host)",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http", "TLS": {"Certificates": [{"Kind": "http-route", "Name": "x"}]}}]),
            "Listeners[0].TLS.Certificates[0].Kind: \"http-route\" cannot be referenced here: expected inline-certificate or file-system-certificate",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http", "TLS": {"MinVersion": "TLSv1_2"}}]),
            "Listeners[0].TLS.Certificates: required when TLS versions or cipher suites are set",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http", "TLS": {"Certificates": [{"Name": "c"}], "MinVersion": "TLSv9"}}]),
            "Listeners[0].TLS.MinVersion: unknown TLS version",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http", "TLS": {"Certificates": [{"Name": "c"}], "MinVersion": "TLSv1_3", "MaxVersion": "TLSv1_2"}}]),
            "Listeners[0].TLS.MinVersion: TLSv1_3 is above MaxVersion TLSv1_2",
        ),
        (
            json!([{"Name": "a", "Port": 80, "Protocol": "http", "TLS": {"Certificates": [{"Name": "c"}], "MinVersion": "TLSv1_3", "CipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]}}]),
            "Listeners[0].TLS.CipherSuites: not allowed with MinVersion TLSv1_3",
        ),
    ];
    for (listeners, want) in cases {
        let got = error(gateway(listeners.clone()));
        assert!(got.starts_with(want), "{listeners}: {got}");
    }
}

#[test]
fn routes_are_checked_field_by_field() {
    let parents = json!([{"Name": "gw"}]);
    let rule = json!([{"Services": [{"Name": "api"}]}]);
    assert_eq!(
        error(http_route("r", parents.clone(), json!([]), rule.clone())),
        "valid"
    );
    let cases = [
        (http_route("r", json!([]), json!([]), rule.clone()), "Parents: required"),
        (
            http_route(
                "r",
                json!([{"Kind": "ingress-gateway", "Name": "gw"}]),
                json!([]),
                rule.clone(),
            ),
            "Parents[0].Kind: \"ingress-gateway\" cannot be referenced here: expected api-gateway",
        ),
        (
            http_route("r", parents.clone(), json!(["a.example.com:80"]), rule.clone()),
            "Hostnames[0]: a route's hostname names no port",
        ),
        (
            http_route("r", parents.clone(), json!([]), json!([])),
            "Rules: required",
        ),
        (
            http_route("r", parents.clone(), json!([]), json!([{"Services": []}])),
            "Rules[0].Services: required",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Matches": [{"Path": {"Match": "prefix", "Value": "v1"}}], "Services": [{"Name": "a"}]}]),
            ),
            "Rules[0].Matches[0].Path.Value: \"v1\" must start with '/'",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Matches": [{"Path": {"Match": "regex", "Value": "(("}}], "Services": [{"Name": "a"}]}]),
            ),
            "Rules[0].Matches[0].Path.Value: invalid regex",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Matches": [{"Method": "FETCH"}], "Services": [{"Name": "a"}]}]),
            ),
            "Rules[0].Matches[0].Method: unknown method \"FETCH\"",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Filters": {"RetryFilter": {"RetryOn": ["sometimes"]}}, "Services": [{"Name": "a"}]}]),
            ),
            "Rules[0].Filters.RetryFilter.RetryOn[0]: \"sometimes\" is not one of",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Services": [{"Name": "a", "Filters": {"URLRewrite": {"Path": "/"}}}]}]),
            ),
            "Rules[0].Services[0].Filters: not allowed to rewrite, retry or time out per service",
        ),
        (
            http_route(
                "r",
                parents.clone(),
                json!([]),
                json!([{"Services": [{"Name": "a"}, {"Name": "a"}]}]),
            ),
            "Rules[0].Services[1].Name: duplicate service \"a\"",
        ),
        (
            json!({"Kind": "tcp-route", "Name": "t", "Parents": [{"Name": "gw"}], "Services": [{"Name": "a"}, {"Name": "b"}]}),
            "Services: a tcp-route sends to exactly one service, not 2",
        ),
        (
            json!({"Kind": "inline-certificate", "Name": "c", "Certificate": "nope", "PrivateKey": "x"}),
            "Certificate: not a PEM CERTIFICATE",
        ),
        (
            json!({"Kind": "file-system-certificate", "Name": "c", "Certificate": "cert.pem", "PrivateKey": "/k.pem"}),
            "Certificate: \"cert.pem\" must be an absolute path",
        ),
    ];
    for (v, want) in cases {
        let got = error(v.clone());
        assert!(got.starts_with(want), "{v}: {got}");
    }
}

#[test]
fn a_status_written_by_a_client_is_read_and_an_inline_key_is_never_debug_printed() {
    let e = entry(
        json!({"Kind": "tcp-route", "Name": "t", "Parents": [{"Name": "gw"}], "Services": [{"Name": "a"}],
                         "Status": {"Conditions": [{"Type": "Bound", "Status": "True", "Reason": "Bound", "Message": ""}]}}),
    );
    assert!(e.status().unwrap().is_some());
    let cert = entry(
        json!({"Kind": "inline-certificate", "Name": "c", "Certificate": "-----BEGIN CERTIFICATE-----",
                            "PrivateKey": "-----BEGIN PRIVATE KEY-----secret"}),
    );
    assert!(!format!("{cert:?}").contains("secret"));
}

#[test]
fn hostnames_intersect_by_wildcard() {
    assert!(hosts_intersect("*.example.com", "a.example.com"));
    assert!(hosts_intersect("a.example.com", "*.example.com"));
    assert!(hosts_intersect("*.example.com", "*.a.example.com"));
    assert!(!hosts_intersect("*.example.com", "example.com"));
    assert!(!hosts_intersect("a.example.com", "b.example.com"));
}

fn arc(v: Value) -> Arc<ConfigEntry> {
    Arc::new(entry(v))
}

fn bound_to(conds: &[Condition]) -> Vec<(String, String, String)> {
    conds
        .iter()
        .filter(|c| c.type_ == "Bound")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .collect()
}

#[test]
fn routes_bind_to_the_listeners_they_fit_and_say_why_not() {
    let ConfigEntry::ApiGateway(gw) = entry(gateway(json!([
        {"Name": "web", "Port": 80, "Protocol": "http", "Hostname": "*.example.com"},
        {"Name": "raw", "Port": 9000, "Protocol": "tcp"},
        {"Name": "tls", "Port": 443, "Protocol": "http", "TLS": {"Certificates": [{"Name": "present"}, {"Name": "absent"}]}},
    ]))) else {
        unreachable!()
    };
    let rule = json!([{"Services": [{"Name": "api"}]}]);
    let routes = vec![
        arc(http_route(
            "fits",
            json!([{"Name": "gw", "SectionName": "web"}]),
            json!(["api.example.com"]),
            rule.clone(),
        )),
        arc(http_route(
            "elsewhere",
            json!([{"Name": "gw", "SectionName": "web"}]),
            json!(["api.other.org"]),
            rule.clone(),
        )),
        arc(http_route(
            "no-section",
            json!([{"Name": "gw", "SectionName": "nope"}]),
            json!([]),
            rule.clone(),
        )),
        arc(http_route(
            "on-tcp",
            json!([{"Name": "gw", "SectionName": "raw"}]),
            json!([]),
            rule.clone(),
        )),
        arc(http_route(
            "everywhere",
            json!([{"Name": "gw"}]),
            json!([]),
            rule.clone(),
        )),
        arc(json!({"Kind": "tcp-route", "Name": "db-1", "Parents": [{"Name": "gw"}], "Services": [{"Name": "db"}]})),
        arc(
            json!({"Kind": "tcp-route", "Name": "db-2", "Parents": [{"Name": "gw", "SectionName": "raw"}], "Services": [{"Name": "db"}]}),
        ),
        arc(http_route(
            "other-gateway",
            json!([{"Name": "gw2"}]),
            json!([]),
            rule.clone(),
        )),
    ];
    let b = bind(&gw, &routes, |_, name| name == "present");
    let names = |l: usize| -> Vec<String> {
        b.listeners[l]
            .routes
            .iter()
            .map(|r| match r {
                api_gateway_binding::BoundRoute::Http(e, hosts) => format!("{} {}", e.name(), hosts.join(",")),
                api_gateway_binding::BoundRoute::Tcp(e) => e.name().to_owned(),
            })
            .collect()
    };
    assert_eq!(names(0), ["everywhere *.example.com", "fits api.example.com"]);
    assert_eq!(names(1), ["db-1"]);
    assert_eq!(names(2), ["everywhere *"]);
    let key = |k: ConfigEntryKind, n: &str| (k, n.to_owned());
    let http = ConfigEntryKind::HttpRoute;
    assert_eq!(bound_to(&b.routes[&key(http, "fits")])[0].0, "True");
    let why = |n: &str| bound_to(&b.routes[&key(http, n)]).remove(0);
    assert_eq!(why("elsewhere").1, "NoMatchingListenerHostname");
    assert!(why("elsewhere").2.contains("api.other.org"), "{:?}", why("elsewhere"));
    assert_eq!(why("no-section").1, "NoMatchingParent");
    assert_eq!(why("on-tcp").1, "NotAllowedByListeners");
    let second = bound_to(&b.routes[&key(ConfigEntryKind::TcpRoute, "db-2")]).remove(0);
    assert_eq!((second.0.as_str(), second.1.as_str()), ("False", "RouteConflict"));
    assert!(!b.routes.contains_key(&key(http, "other-gateway")));
    // The gateway: one certificate missing, one listener conflicted.
    let gw_conds: Vec<(String, String, String)> = b
        .gateway
        .iter()
        .filter(|c| c.status != if c.type_ == "Conflicted" { "False" } else { "True" })
        .map(|c| (c.type_.clone(), c.reason.clone(), c.message.clone()))
        .collect();
    assert_eq!(gw_conds.len(), 2, "{gw_conds:?}");
    assert_eq!(gw_conds[0].1, "InvalidCertificateRef");
    assert!(gw_conds[0].2.contains("inline-certificate/absent"), "{gw_conds:?}");
    assert_eq!(gw_conds[1].1, "RouteConflict");
    assert_eq!(b.listeners[2].certificates.len(), 1);

    // Statuses: a missing service and a missing gateway are named.
    let gateways = vec![arc(gateway(json!([{"Name": "web", "Port": 80, "Protocol": "http"}])))];
    let all = statuses(
        &gateways,
        &routes,
        |s| s == "api",
        |k, n| k == ConfigEntryKind::ApiGateway && n == "gw",
    );
    let tcp = &all[&key(ConfigEntryKind::TcpRoute, "db-1")].conditions;
    assert!(
        tcp.iter().any(|c| c.type_ == "ResolvedRefs"
            && c.status == "False"
            && c.reason == "BackendNotFound"
            && c.message.contains("db")),
        "{tcp:?}"
    );
    let orphan = &all[&key(http, "other-gateway")].conditions;
    assert!(
        orphan
            .iter()
            .any(|c| c.type_ == "Bound" && c.reason == "GatewayNotFound" && c.message.contains("gw2")),
        "{orphan:?}"
    );
    assert!(all.contains_key(&key(ConfigEntryKind::ApiGateway, "gw")));
}
