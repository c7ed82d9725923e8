use super::*;
use crate::json::from_value;
use serde_json::json;

fn def(v: serde_json::Value) -> Result<ServiceDefinition, String> {
    let d: ServiceDefinition = from_value(v).map_err(|e| e.to_string())?;
    d.validate().map_err(|e| e.to_string())?;
    Ok(d)
}

#[test]
fn decodes_any_casing_with_sidecar_and_checks() {
    let d = def(json!({
        "name": "web", "ID": "web-1", "port": 8080, "tags": ["a"], "meta": {"Owner_Key": "x"},
        "check": {"http": "http://127.0.0.1:8080/health", "interval": "10s"},
        "checks": [{"ttl": "15s", "check_id": "t"}],
        "connect": {"sidecar_service": {"proxy": {"upstreams": [{"destination_name": "api", "local_bind_port": 9191}]}}}
    }))
    .unwrap();
    assert_eq!(d.instance_id(), "web-1");
    assert_eq!(d.meta.keys().collect::<Vec<_>>(), vec!["Owner_Key"]);
    let checks: Vec<_> = d
        .all_checks()
        .map(|(at, c)| (at, c.kind().unwrap().type_name()))
        .collect();
    assert_eq!(checks, vec![("Check".into(), "http"), ("Checks[0]".into(), "ttl")]);
    let sidecar = d.connect.sidecar_service.as_ref().unwrap();
    assert_eq!(sidecar.proxy.upstreams[0].destination_name, "api");
    // The sidecar survives a round trip (it is persisted by the agent).
    let back: ServiceDefinition = from_value(serde_json::to_value(&d).unwrap()).unwrap();
    assert_eq!(back, d);
    // The catalog instance carries no sidecar.
    assert!(d.node_service().connect.sidecar_service.is_none());
}

#[test]
fn bad_definitions_name_the_field() {
    let err = |v| def(v).unwrap_err();
    assert_eq!(err(json!({"Port": 1})), "Name: required");
    assert_eq!(
        err(json!({"Name": "web", "Check": {"Interval": "10s"}})),
        "Check.TTL: required (or HTTP, TCP or AliasService): the check has no type"
    );
    assert_eq!(
        err(json!({"Name": "web", "Checks": [{"TTL": "1s"}, {"HTTP": "http://x/", "TTL": "1s"}]})),
        "Checks[1].HTTP: not allowed together with another check type: a check has one type"
    );
    assert_eq!(
        err(json!({"Name": "web", "Checks": [{"TCP": "localhost:80"}]})),
        "Checks[0].Interval: required for HTTP and TCP checks"
    );
    assert_eq!(
        err(json!({"Name": "web", "Check": {"TCP": "nohost", "Interval": "1s"}})),
        "Check.TCP: \"nohost\" is not host:port"
    );
    assert_eq!(
        err(json!({"Name": "web", "Check": {"HTTP": "ftp://x", "Interval": "1s"}})),
        "Check.HTTP: \"ftp://x\" is not an http:// or https:// URL with a host"
    );
    assert!(
        err(json!({"Name": "web", "Check": {"ScriptArgs": ["true"], "Interval": "1s"}}))
            .starts_with("Check.ScriptArgs: not allowed (this check type is not supported")
    );
    assert_eq!(
        err(json!({"Name": "web", "Connect": {"Native": true, "SidecarService": {}}})),
        "Connect.SidecarService: not allowed together with Connect.Native"
    );
    assert_eq!(
        err(json!({"Name": "web", "Connect": {"SidecarService": {"Connect": {"SidecarService": {}}}}})),
        "Connect.SidecarService.Connect.SidecarService: not allowed inside a sidecar"
    );
    assert_eq!(
        err(
            json!({"Name": "web", "Connect": {"SidecarService": {"Proxy": {"Upstreams": [{"DestinationName": "api"}]}}}})
        ),
        "Connect.SidecarService.Proxy.Upstreams[0].LocalBindPort: required unless LocalBindSocketPath is set"
    );
    assert_eq!(
        err(json!({"Name": "web", "Connect": {"SidecarService": {"Check": {"TTL": "x"}}}})),
        "Connect.SidecarService.Check.TTL: invalid duration \"x\": expected a number: use a duration like 10s, \
         1m30s or 250ms"
    );
    assert_eq!(
        err(json!({"Name": "web", "Port": 70000})).split(':').next().unwrap(),
        "Port"
    );
    // Consul's config-file spelling of script arguments is recognised, and refused.
    assert!(
        err(json!({"Name": "web", "Check": {"args": ["true"], "Interval": "1s"}})).starts_with("Check.ScriptArgs:")
    );
    assert_eq!(
        err(json!({"Name": "web", "Namespace": "team-a"})),
        "Namespace: \"team-a\": only \"default\" exists in meshd"
    );
    def(json!({"Name": "web", "Namespace": "default", "Partition": ""})).unwrap();
    // Settings meshd would not honour are refused rather than ignored.
    def(json!({"Name": "web", "Check": {"HTTP": "https://h/", "Interval": "1s", "TLSServerName": "x"}})).unwrap();
    assert!(
        err(json!({"Name": "web", "Check": {"HTTP": "http://h/", "Interval": "1s", "TLSServerName": "x"}}))
            .starts_with("Check.TLSServerName: not allowed without an https:// HTTP URL")
    );
    assert!(
        err(json!({"Name": "web", "Check": {"TTL": "1s", "OutputMaxSize": 100_000}}))
            .starts_with("Check.OutputMaxSize: must be between 0 and 4096")
    );
    def(json!({"Name": "web", "Check": {"TTL": "1s", "OutputMaxSize": 4096}})).unwrap();
}

#[test]
fn bad_durations_name_the_field_and_show_a_duration() {
    for field in ["Interval", "Timeout", "TTL", "DeregisterCriticalServiceAfter"] {
        let e = def(json!({"Name": "web", "Check": {"TCP": "h:1", "Interval": "10s", field: "nope"}})).unwrap_err();
        assert!(
            e.starts_with(&format!("Check.{field}: invalid duration \"nope\"")),
            "{e}"
        );
        assert!(e.contains("a duration like 10s"), "{e}");
        let e = def(json!({"Name": "web", "Check": {field: true}})).unwrap_err();
        assert!(e.starts_with(&format!("Check.{field}: ")), "{e}");
        assert!(e.contains("a duration like 10s"), "{e}");
    }
}

#[test]
fn header_values_with_cr_or_lf_and_bad_names_are_refused_naming_the_header() {
    let check = |header| json!({"Name": "web", "Check": {"HTTP": "http://h/", "Interval": "1s", "Header": header}});
    for value in ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\u{0}b"] {
        let e = def(check(json!({"X-Auth": ["ok", value]}))).unwrap_err();
        assert!(
            e.starts_with("Check.Header[\"X-Auth\"]: the value contains a CR, LF or NUL"),
            "{e}"
        );
    }
    for name in ["X Auth", "X-Auth\r\n", ""] {
        let e = def(check(json!({name: ["v"]}))).unwrap_err();
        assert!(e.ends_with("is not a valid header name"), "{name:?}: {e}");
    }
    def(check(json!({"X-Auth": ["Bearer abc", "x=1; y=2"]}))).unwrap();
}

#[test]
fn check_kinds_apply_defaults() {
    let c: CheckType = from_value(json!({"HTTP": "https://h/x", "Interval": "100ms", "method": "post"})).unwrap();
    let CheckKind::Http {
        method,
        interval,
        timeout,
        ..
    } = c.kind().unwrap()
    else {
        panic!("not http")
    };
    assert_eq!(
        (method.as_str(), interval, timeout),
        ("POST", MIN_CHECK_INTERVAL, DEFAULT_CHECK_TIMEOUT)
    );
    let c: CheckType = from_value(json!({"ID": "a", "AliasService": "web"})).unwrap();
    assert_eq!(c.given_id(), "a");
    assert_eq!(
        c.kind().unwrap(),
        CheckKind::Alias {
            node: String::new(),
            service: "web".into()
        }
    );
}
