use super::*;
use crate::Validate;
use serde_json::{Value, json};

fn ingress(listeners: Value) -> ConfigEntry {
    ConfigEntry::from_json(json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": listeners})).unwrap()
}

fn terminating(services: Value) -> ConfigEntry {
    ConfigEntry::from_json(json!({"Kind": "terminating-gateway", "Name": "term", "Services": services})).unwrap()
}

fn error(e: ConfigEntry) -> String {
    e.validate()
        .map(|()| "valid".to_owned())
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn a_sound_ingress_entry_passes() {
    let e = ingress(json!([
        {"Port": 8080, "Protocol": "http", "TLS": {"Enabled": true, "TLSMinVersion": "TLSv1_2"},
         "Services": [{"Name": "web", "Hosts": ["web.example.com", "*.web.example.com"],
                       "RequestHeaders": {"Add": {"x-gw": "1"}}},
                      {"Name": "api", "Namespace": "default"}, {"Name": "*"}]},
        {"Port": 9090, "Services": [{"Name": "db"}]},
    ]));
    assert_eq!(error(e), "valid");
}

#[test]
fn ingress_listeners() {
    let cases = [
        (
            json!([{"Port": 0, "Services": [{"Name": "a"}]}]),
            "Listeners[0].Port: required",
        ),
        (
            json!([{"Port": 1, "Services": [{"Name": "a"}]}, {"Port": 1, "Services": [{"Name": "b"}]}]),
            "Listeners[1].Port: duplicate listener port 1",
        ),
        (
            json!([{"Port": 1, "Protocol": "udp", "Services": [{"Name": "a"}]}]),
            "Listeners[0].Protocol: unsupported protocol \"udp\": expected tcp, http, http2 or grpc",
        ),
        (
            json!([{"Port": 1, "Protocol": "http", "Services": []}]),
            "Listeners[0].Services: required (at least one service per listener)",
        ),
        (
            json!([{"Port": 1, "Services": [{"Name": "a"}, {"Name": "b"}]}]),
            "Listeners[0].Services: a tcp listener takes exactly one service; several need an http, http2 or grpc listener",
        ),
    ];
    for (listeners, expect) in cases {
        assert_eq!(error(ingress(listeners)), expect);
    }
}

#[test]
fn ingress_services_and_hosts() {
    let http = |services: Value| ingress(json!([{"Port": 80, "Protocol": "http", "Services": services}]));
    let tcp = |services: Value| ingress(json!([{"Port": 80, "Services": services}]));
    let cases = [
        (
            tcp(json!([{"Name": "*"}])),
            "Listeners[0].Services[0].Name: not allowed on a tcp listener: \"*\" needs an http, http2 or grpc listener",
        ),
        (
            tcp(json!([{"Name": "a", "Hosts": ["a.com"]}])),
            "Listeners[0].Services[0].Hosts: not allowed on a tcp listener: hosts route HTTP requests",
        ),
        (
            http(json!([{"Name": "*", "Hosts": ["a.com"]}])),
            "Listeners[0].Services[0].Hosts: not allowed with service \"*\": each service gets its default host",
        ),
        (
            http(json!([{"Name": "a"}, {"Name": "b", "Hosts": ["ok.com", "bad_host.com"]}])),
            "Listeners[0].Services[1].Hosts[1]: host \"bad_host.com\" is not a valid DNS name",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["a.*.com"]}])),
            "Listeners[0].Services[0].Hosts[0]: host \"a.*.com\": a wildcard is only allowed as the whole first label (\"*.example.com\")",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["x.com"]}, {"Name": "b", "Hosts": ["x.com"]}])),
            "Listeners[0].Services[1].Hosts[0]: duplicate host \"x.com\" on listener port 80",
        ),
        (
            http(json!([{"Name": "a"}, {"Name": "b", "Hosts": ["a.ingress.*"]}])),
            "Listeners[0].Services[1].Hosts[0]: host \"a.ingress.*\": a wildcard is only allowed as the whole first label (\"*.example.com\")",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["x.com:0"]}])),
            "Listeners[0].Services[0].Hosts[0]: host \"x.com:0\": the port must be 1 to 65535",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["x.com:99999"]}])),
            "Listeners[0].Services[0].Hosts[0]: host \"x.com:99999\": the port must be 1 to 65535",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["*:80"]}])),
            "Listeners[0].Services[0].Hosts[0]: host \"*\" cannot name a port: it matches every host and port",
        ),
        (
            http(json!([{"Name": "a", "Hosts": ["bad_host:80"]}])),
            "Listeners[0].Services[0].Hosts[0]: host \"bad_host:80\" is not a valid DNS name",
        ),
        (
            // `x.com` also matches `x.com:80` on port 80.
            http(json!([{"Name": "a", "Hosts": ["x.com"]}, {"Name": "b", "Hosts": ["x.com:80"]}])),
            "Listeners[0].Services[1].Hosts[0]: duplicate host \"x.com:80\" on listener port 80",
        ),
        (
            http(json!([{"Name": "a"}, {"Name": "a", "Hosts": ["b.com"]}])),
            "Listeners[0].Services[1].Name: duplicate service \"a\" on listener port 80",
        ),
        (
            http(json!([{"Name": "a", "Namespace": "team"}])),
            "Listeners[0].Services[0].Namespace: only \"default\" is supported, got \"team\"",
        ),
        (
            http(json!([{"Name": "a", "Partition": "p"}])),
            "Listeners[0].Services[0].Partition: only \"default\" is supported, got \"p\"",
        ),
        (
            http(json!([{"Name": "a", "RequestHeaders": {"Set": {"bad header": "x"}}}])),
            "Listeners[0].Services[0].RequestHeaders.Set: \"bad header\" is not a valid header name",
        ),
        (
            http(json!([{"Name": "a", "ResponseHeaders": {"Remove": [""]}}])),
            "Listeners[0].Services[0].ResponseHeaders.Remove: \"\" is not a valid header name",
        ),
        (
            http(json!([{"Name": "a", "TLS": {"SDS": {"ClusterName": "sds"}}}])),
            "Listeners[0].Services[0].TLS.SDS.CertResource: required with SDS",
        ),
        (
            http(json!([{"Name": "a", "TLS": {"SDS": {"ClusterName": "sds", "CertResource": "c"}}}])),
            "Listeners[0].Services[0].Hosts: required (a service with its own TLS.SDS certificate is selected by SNI on its hosts)",
        ),
    ];
    for (e, expect) in cases {
        assert_eq!(error(e), expect);
    }
    // A host with a port (what gRPC clients send as `:authority`), another port than the
    // listener's beside the same name without one.
    assert_eq!(
        error(http(
            json!([{"Name": "a", "Hosts": ["localhost:9999"]}, {"Name": "b", "Hosts": ["localhost:81", "localhost"]}])
        )),
        "valid"
    );
    assert_eq!(host_domains("localhost:9999", 80), ["localhost:9999"]);
    assert_eq!(
        host_domains("api.example.com", 80),
        ["api.example.com:80", "api.example.com"]
    );
    assert_eq!(host_name("localhost:9999"), "localhost");
    // `*` alone routes every host, but never with TLS (it cannot be a DNS SAN).
    assert_eq!(error(http(json!([{"Name": "a", "Hosts": ["*"]}]))), "valid");
    let e = ConfigEntry::from_json(
        json!({"Kind": "ingress-gateway", "Name": "ing", "TLS": {"Enabled": true},
        "Listeners": [{"Port": 80, "Protocol": "http", "Services": [{"Name": "a", "Hosts": ["*"]}]}]}),
    )
    .unwrap();
    assert!(error(e).starts_with("Listeners[0].Services[0].Hosts[0]: host \"*\" is not allowed with TLS"));
}

#[test]
fn hosts_are_unique_per_listener_not_per_gateway() {
    let e = ingress(json!([{"Port": 80, "Protocol": "http", "Services": [
        {"Name": "a", "Hosts": ["*"]}, {"Name": "b", "Hosts": ["*"]}]}]));
    assert_eq!(
        error(e),
        "Listeners[0].Services[1].Hosts[0]: duplicate host \"*\" on listener port 80"
    );
    let e = ingress(json!([
        {"Port": 80, "Protocol": "http", "Services": [{"Name": "a", "Hosts": ["x.com"]}]},
        {"Port": 81, "Protocol": "http", "Services": [{"Name": "b", "Hosts": ["x.com"]}, {"Name": "a"}]},
    ]));
    assert_eq!(error(e), "valid");
}

#[test]
fn ingress_tls() {
    let with_tls = |tls: Value| {
        ConfigEntry::from_json(json!({"Kind": "ingress-gateway", "Name": "ing", "TLS": tls,
            "Listeners": [{"Port": 80, "Services": [{"Name": "a"}]}]}))
        .unwrap()
    };
    let listener_tls = |tls: Value| ingress(json!([{"Port": 80, "TLS": tls, "Services": [{"Name": "a"}]}]));
    let cases = [
        (
            with_tls(json!({"SDS": {"CertResource": "c"}})),
            "TLS.SDS.ClusterName: required with SDS",
        ),
        (
            with_tls(json!({"TLSMinVersion": "TLSv9"})),
            "TLS.TLSMinVersion: unknown TLS version \"TLSv9\": expected one of TLS_AUTO, TLSv1_0, TLSv1_1, TLSv1_2, TLSv1_3",
        ),
        (
            listener_tls(json!({"TLSMinVersion": "TLSv1_3", "TLSMaxVersion": "TLSv1_2"})),
            "Listeners[0].TLS.TLSMinVersion: TLSv1_3 is above TLSMaxVersion TLSv1_2",
        ),
        (
            listener_tls(json!({"CipherSuites": ["NOPE"]})),
            "Listeners[0].TLS.CipherSuites[0]: unknown or unsupported cipher suite \"NOPE\"",
        ),
        (
            listener_tls(json!({"TLSMinVersion": "TLSv1_3", "CipherSuites": ["AES128-GCM-SHA256"]})),
            "Listeners[0].TLS.CipherSuites: not allowed with TLSMinVersion TLSv1_3: TLS 1.3 cipher suites are not configurable",
        ),
    ];
    for (e, expect) in cases {
        assert_eq!(error(e), expect);
    }
}

#[test]
fn a_sound_terminating_entry_passes() {
    let e = terminating(json!([
        {"Name": "billing", "CAFile": "/etc/ca.pem", "CertFile": "/etc/c.pem", "KeyFile": "/etc/k.pem", "SNI": "b.example"},
        {"Name": "plain"}, {"Name": "*", "CAFile": "/etc/ca.pem"},
    ]));
    assert_eq!(error(e), "valid");
}

#[test]
fn terminating_rules() {
    let cases = [
        (
            json!([{"Name": "a"}, {"Name": "a"}]),
            "Services[1].Name: duplicate service \"a\"",
        ),
        (
            json!([{"Name": "a", "CAFile": "/ca", "CertFile": "/c"}]),
            "Services[0].KeyFile: required with CertFile",
        ),
        (
            json!([{"Name": "a", "CAFile": "/ca", "KeyFile": "/k"}]),
            "Services[0].CertFile: required with KeyFile",
        ),
        (
            json!([{"Name": "a", "CertFile": "/c", "KeyFile": "/k"}]),
            "Services[0].CAFile: required with CertFile and KeyFile (TLS origination verifies the service)",
        ),
        (
            json!([{"Name": "a", "SNI": "a.example"}]),
            "Services[0].CAFile: required with SNI (SNI is sent only when the gateway originates TLS)",
        ),
        (
            json!([{"Name": "a", "CAFile": "ca\n.pem"}]),
            "Services[0].CAFile: \"ca\\n.pem\" is not a file name",
        ),
        (
            json!([{"Name": "a", "Namespace": "ns"}]),
            "Services[0].Namespace: only \"default\" is supported, got \"ns\"",
        ),
        (
            json!([{"Name": "a b"}]),
            "Services[0].Name: invalid character ' ': use letters, digits, '-', '_' or '.'",
        ),
    ];
    for (services, expect) in cases {
        assert_eq!(error(terminating(services)), expect);
    }
}
