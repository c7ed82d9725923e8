use super::*;
use crate::Validate;
use serde_json::json;

fn entry(v: serde_json::Value) -> ConfigEntry {
    ConfigEntry::from_json(v).unwrap()
}

#[test]
fn decodes_every_kind_with_any_casing() {
    let cases = [
        json!({"kind": "proxy-defaults", "name": "global", "config": {"Protocol_X": "http"}}),
        json!({"Kind": "service-defaults", "Name": "api", "protocol": "http",
               "upstream_config": {"overrides": [{"name": "db", "connect_timeout_ms": 100}]}}),
        json!({"Kind": "service-router", "Name": "api",
               "Routes": [{"match": {"http": {"path_prefix": "/admin"}}, "destination": {"service": "admin", "num_retries": 3}}]}),
        json!({"Kind": "service-splitter", "Name": "api", "splits": [{"weight": 90}, {"weight": 10, "service_subset": "v2"}]}),
        json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1", "connect_timeout": "3s",
               "Subsets": {"v1": {"filter": "Service.Meta.version == v1"}, "V2_beta": {"OnlyPassing": true}}}),
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Action": "allow"}, {"name": "*", "action": "deny"}]}),
        json!({"Kind": "mesh", "transparent_proxy": {"mesh_destinations_only": true}}),
        json!({"Kind": "ingress-gateway", "Name": "igw", "Listeners": [{"Port": 8080, "Protocol": "tcp",
               "Services": [{"Name": "api"}]}]}),
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "legacy"}]}),
        json!({"Kind": "jwt-provider", "Name": "okta", "Issuer": "https://okta.example",
               "JSONWebKeySet": {"Remote": {"URI": "https://okta.example/keys", "FetchAsynchronously": true}},
               "Locations": [{"Header": {"Name": "Authorization", "ValuePrefix": "Bearer "}}]}),
    ];
    for (case, kind) in cases.into_iter().zip(ConfigEntryKind::ALL) {
        let e = entry(case);
        assert_eq!(e.kind(), kind);
        e.validate().unwrap_or_else(|err| panic!("{kind}: {err}"));
        // Round trip through Consul's casing.
        let out = serde_json::to_value(&e).unwrap();
        assert_eq!(out["Kind"], kind.as_str());
        assert_eq!(ConfigEntry::from_json(out).unwrap(), e);
    }
}

#[test]
fn user_map_keys_are_untouched() {
    let ConfigEntry::ServiceResolver(r) = entry(
        json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "V2_beta",
        "Subsets": {"V2_beta": {}}, "Meta": {"Team_Name": "x"}}),
    ) else {
        panic!()
    };
    assert!(r.subsets.contains_key("V2_beta"));
    assert!(r.meta.contains_key("Team_Name"));
    let ConfigEntry::ProxyDefaults(p) =
        entry(json!({"Kind": "proxy-defaults", "Config": {"Envoy_Prometheus_Bind_Addr": "0.0.0.0:9102"}}))
    else {
        panic!()
    };
    assert!(p.config.contains_key("Envoy_Prometheus_Bind_Addr"));
}

#[test]
fn rejects_unknown_fields_and_kinds() {
    let err =
        ConfigEntry::from_json(json!({"Kind": "service-defaults", "Name": "api", "Protocl": "http"})).unwrap_err();
    assert!(err.message.contains("Protocl"), "{err}");
    let err = ConfigEntry::from_json(json!({"Kind": "service-thing", "Name": "api"})).unwrap_err();
    assert_eq!(err.path, "Kind");
    let err = ConfigEntry::from_json(json!({"Name": "api"})).unwrap_err();
    assert_eq!(err.to_string(), "Kind: required");
    let err = ConfigEntry::from_json(json!({"Kind": "mesh", "Namespace": "team-a"})).unwrap_err();
    assert_eq!(err.path, "Namespace");
    assert!(ConfigEntry::from_json(json!({"Kind": "mesh", "Namespace": "default"})).is_ok());
}

#[test]
fn validation_names_field_and_problem() {
    let check = |v: serde_json::Value, expect: &str| {
        let err = entry(v).validate().unwrap_err();
        assert_eq!(err.to_string(), expect);
    };
    check(
        json!({"Kind": "proxy-defaults", "Name": "mine"}),
        "Name: proxy-defaults entries must be named \"global\", not \"mine\"",
    );
    check(
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "udp"}),
        "Protocol: unsupported protocol \"udp\": expected tcp, http, http2 or grpc",
    );
    check(
        json!({"Kind": "service-splitter", "Name": "api", "Splits": [{"Weight": 50}, {"Weight": 40}]}),
        "Splits: weights must add up to 100, they add up to 90",
    );
    check(
        json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v9"}),
        "DefaultSubset: \"v9\" is not one of the Subsets",
    );
    check(
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web"}]}),
        "Sources[0].Action: required (or Permissions)",
    );
    check(
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Action": "allow"}, {"Name": "web", "Action": "deny"}]}),
        "Sources[1].Name: duplicate source \"web\"",
    );
    check(
        json!({"Kind": "service-router", "Name": "api", "Routes": [{"Match": {"HTTP": {"PathPrefix": "admin"}}}]}),
        "Routes[0].Match.HTTP.PathPrefix: \"admin\" must begin with '/'",
    );
    check(json!({"Kind": "service-defaults", "Name": ""}), "Name: required");
    let header = |h: serde_json::Value| {
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web",
            "Permissions": [{"Action": "allow", "HTTP": {"Header": [h]}}]}]})
    };
    check(
        header(json!({"Name": "x-user", "Contains": "adm", "Exact": "admin"})),
        "Sources[0].Permissions[0].HTTP.Header[0]: set at most one of Present, Exact, Prefix, Suffix, Contains and Regex",
    );
    check(
        header(json!({"Name": "x-user", "Regex": "a.*", "IgnoreCase": true})),
        "Sources[0].Permissions[0].HTTP.Header[0].IgnoreCase: applies only to Exact, Prefix, Suffix or Contains",
    );
    assert!(
        entry(header(json!({"Name": "x-user", "Contains": "adm", "IgnoreCase": true})))
            .validate()
            .is_ok()
    );
    check(
        json!({"Kind": "mesh", "TLS": {"Incoming": {"TLSMinVersion": "TLSv9"}}}),
        "TLS.Incoming.TLSMinVersion: unknown TLS version \"TLSv9\": expected one of TLS_AUTO, TLSv1_0, TLSv1_1, TLSv1_2, TLSv1_3",
    );
    let normalization =
        |rn: serde_json::Value| json!({"Kind": "mesh", "HTTP": {"Incoming": {"RequestNormalization": rn}}});
    check(
        normalization(json!({"PathWithEscapedSlashesAction": "UNESCAPE"})),
        "HTTP.Incoming.RequestNormalization.PathWithEscapedSlashesAction: unknown action \"UNESCAPE\": expected one of \
         IMPLEMENTATION_SPECIFIC_DEFAULT, KEEP_UNCHANGED, REJECT_REQUEST, UNESCAPE_AND_REDIRECT, UNESCAPE_AND_FORWARD",
    );
    check(
        normalization(json!({"HeadersWithUnderscoresAction": "drop_header"})),
        "HTTP.Incoming.RequestNormalization.HeadersWithUnderscoresAction: unknown action \"drop_header\": expected one of \
         ALLOW, REJECT_REQUEST, DROP_HEADER",
    );
}

/// `HTTP.Incoming.RequestNormalization` (Consul 1.20.1) with every field, in any casing.
#[test]
fn mesh_request_normalization_decodes_and_validates() {
    let e = entry(json!({"Kind": "mesh", "http": {"incoming": {"request_normalization": {
        "insecure_disable_path_normalization": true, "merge_slashes": true,
        "path_with_escaped_slashes_action": "UNESCAPE_AND_FORWARD",
        "headers_with_underscores_action": "DROP_HEADER"}}}}));
    e.validate().unwrap();
    let ConfigEntry::Mesh(mesh) = &e else { panic!() };
    let rn = mesh.request_normalization().unwrap();
    assert_eq!(
        rn,
        &RequestNormalization {
            insecure_disable_path_normalization: true,
            merge_slashes: true,
            path_with_escaped_slashes_action: "UNESCAPE_AND_FORWARD".into(),
            headers_with_underscores_action: "DROP_HEADER".into(),
        }
    );
    let out = serde_json::to_value(&e).unwrap();
    assert_eq!(out["HTTP"]["Incoming"]["RequestNormalization"]["MergeSlashes"], true);
    assert_eq!(ConfigEntry::from_json(out).unwrap(), e);
    // Empty values are the defaults; so are Envoy's names of them.
    for (path, headers) in [("", ""), ("IMPLEMENTATION_SPECIFIC_DEFAULT", "ALLOW")] {
        let e = entry(json!({"Kind": "mesh", "HTTP": {"Incoming": {"RequestNormalization": {
            "PathWithEscapedSlashesAction": path, "HeadersWithUnderscoresAction": headers}}}}));
        e.validate().unwrap();
    }
    let ConfigEntry::Mesh(mesh) = entry(json!({"Kind": "mesh", "HTTP": {"SanitizeXForwardedClientCert": true}})) else {
        panic!()
    };
    assert_eq!(mesh.request_normalization(), None);
}

#[test]
fn intentions_flatten_with_precedence() {
    let ConfigEntry::ServiceIntentions(e) = entry(json!({"Kind": "service-intentions", "Name": "api",
        "Sources": [{"Name": "*", "Action": "deny"}, {"Name": "web", "Action": "allow"}]}))
    else {
        panic!()
    };
    let mut flat = crate::intention::from_config_entry(&e);
    flat.sort_by(crate::Intention::evaluation_order);
    assert_eq!(flat[0].source_name, "web");
    assert_eq!(flat[0].precedence, 9);
    assert_eq!(flat[1].precedence, 8);
}

#[test]
fn jwt_providers_are_checked_naming_the_field() {
    use base64::Engine;
    let keys = base64::engine::general_purpose::STANDARD.encode(r#"{"keys": []}"#);
    let ok = entry(json!({"Kind": "jwt-provider", "Name": "local", "JSONWebKeySet": {"Local": {"JWKS": keys}}}));
    ok.validate().unwrap();
    for (bad, says) in [
        (json!({"JSONWebKeySet": {}}), "JSONWebKeySet"),
        (
            json!({"JSONWebKeySet": {"Local": {"JWKS": "not base64!"}}}),
            "JSONWebKeySet.Local.JWKS",
        ),
        (
            json!({"JSONWebKeySet": {"Local": {"JWKS": "e30=", "Filename": "/k"}}}),
            "JSONWebKeySet.Local",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "ftp://x"}}}),
            "JSONWebKeySet.Remote.URI",
        ),
        (
            json!({"JSONWebKeySet": {"Local": {"Filename": "/k"}}, "Locations": [{"Header": {"Name": "a"}, "Cookie": {"Name": "b"}}]}),
            "Locations[0]",
        ),
        (
            json!({"JSONWebKeySet": {"Local": {"Filename": "/k"}}, "Forwarding": {}}),
            "Forwarding.HeaderName",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://"}}}),
            "JSONWebKeySet.Remote.URI",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "JWKSCluster": {"DiscoveryType": "EDS"}}}}),
            "JSONWebKeySet.Remote.JWKSCluster.DiscoveryType",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "JWKSCluster": {"DiscoveryType": "STATIC"}}}}),
            "STATIC needs an IP address",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "JWKSCluster": {"TLSCertificates": {
                "CaCertificateProviderInstance": {"InstanceName": "x"}}}}}}),
            "TLSCertificates.CaCertificateProviderInstance",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "JWKSCluster": {"TLSCertificates": {
                "TrustedCA": {"Filename": "/ca.pem", "InlineString": "x"}}}}}}),
            "TLSCertificates.TrustedCA",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "RetryPolicy": {
                "NumRetries": 3, "RetryPolicyBackOff": {"MaxInterval": "10s"}}}}}),
            "RetryPolicyBackOff.BaseInterval",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "RetryPolicy": {
                "RetryPolicyBackOff": {"BaseInterval": "5s", "MaxInterval": "1s"}}}}}),
            "RetryPolicyBackOff.MaxInterval",
        ),
        (
            json!({"JSONWebKeySet": {"Remote": {"URI": "https://keys.example", "JWKSCluster": {"Bogus": 1}}}}),
            "Bogus",
        ),
    ] {
        let mut v = bad.clone();
        v["Kind"] = json!("jwt-provider");
        v["Name"] = json!("p");
        let e = problem(v);
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn remote_key_sets_parse_their_url_and_cluster() {
    let e = entry(
        json!({"Kind": "jwt-provider", "Name": "okta", "JSONWebKeySet": {"Remote": {
        "URI": "https://[::1]:8443/keys", "CacheDuration": "10m", "FetchAsynchronously": true,
        "JWKSCluster": {"DiscoveryType": "STATIC", "ConnectTimeout": "2s",
            "TLSCertificates": {"TrustedCA": {"InlineBytes": "LS0tLS0="}}},
        "RetryPolicy": {"NumRetries": 2, "RetryPolicyBackOff": {"BaseInterval": "1s", "MaxInterval": "4s"}}}}}),
    );
    e.validate().unwrap();
    let ConfigEntry::JwtProvider(p) = &e else { panic!() };
    let r = p.json_web_key_set.remote.as_ref().unwrap();
    assert_eq!(
        r.url(),
        Some(super::JwksUrl {
            tls: true,
            host: "::1".into(),
            port: 8443
        })
    );
    let plain = RemoteJwks {
        uri: "http://keys.example/jwks.json".into(),
        ..Default::default()
    };
    assert_eq!(
        plain.url().map(|u| (u.tls, u.host, u.port)),
        Some((false, "keys.example".into(), 80))
    );
    for bad in [
        "http://user@keys.example/",
        "http://keys.example:0/",
        "http://:80/",
        "https://a b/",
    ] {
        let r = RemoteJwks {
            uri: bad.into(),
            ..Default::default()
        };
        assert_eq!(r.url(), None, "{bad}");
    }
    // Every field survives a round trip.
    let back = entry(serde_json::to_value(&e).unwrap());
    assert_eq!(back, e);
}

#[test]
fn intention_jwt_requirements_are_checked_naming_the_field() {
    let ok = entry(json!({"Kind": "service-intentions", "Name": "api",
        "JWT": {"Providers": [{"Name": "okta", "VerifyClaims": [{"Path": ["org", "unit"], "Value": "eng"}]}]},
        "Sources": [{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/"},
            "JWT": {"Providers": [{"Name": "auth0"}]}}]}]}));
    ok.validate().unwrap();
    let ConfigEntry::ServiceIntentions(si) = &ok else {
        panic!()
    };
    assert_eq!(
        si.jwt_provider_refs(),
        [
            ("JWT.Providers[0].Name".to_owned(), "okta".to_owned()),
            (
                "Sources[0].Permissions[0].JWT.Providers[0].Name".to_owned(),
                "auth0".to_owned()
            )
        ]
    );
    // The flat intentions carry the entry's requirement.
    let flat = crate::intention::from_config_entry(si);
    assert_eq!(flat[0].jwt, si.jwt);
    assert_eq!(entry(serde_json::to_value(&ok).unwrap()), ok);
    for (jwt, says) in [
        (json!({}), "JWT.Providers"),
        (json!({"Providers": [{"Name": ""}]}), "JWT.Providers[0].Name"),
        (
            json!({"Providers": [{"Name": "okta", "VerifyClaims": [{"Path": [], "Value": "x"}]}]}),
            "JWT.Providers[0].VerifyClaims[0].Path",
        ),
        (
            json!({"Providers": [{"Name": "okta", "VerifyClaims": [{"Path": ["a", ""], "Value": "x"}]}]}),
            "JWT.Providers[0].VerifyClaims[0].Path",
        ),
        (json!({"Providers": [{"Name": "okta", "Claims": []}]}), "Claims"),
    ] {
        let v = json!({"Kind": "service-intentions", "Name": "api", "JWT": jwt,
            "Sources": [{"Name": "web", "Action": "allow"}]});
        let e = problem(v);
        assert!(e.contains(says), "{jwt}: {e}");
        let v = json!({"Kind": "service-intentions", "Name": "api",
            "Sources": [{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/"}, "JWT": jwt}]}]});
        let e = problem(v);
        assert!(e.contains(says), "{e}");
    }
}

/// Why `v` is refused, when decoded or when checked.
fn problem(v: serde_json::Value) -> String {
    match ConfigEntry::from_json(v) {
        Err(e) => e.to_string(),
        Ok(e) => e.validate().unwrap_err().to_string(),
    }
}

#[test]
fn destinations_are_checked_naming_the_field() {
    let ok = entry(json!({"Kind": "service-defaults", "Name": "ext", "Protocol": "tcp",
        "Destination": {"Addresses": ["192.0.2.10", "2001:db8::1", "api.example.com", "example.com."], "Port": 443}}));
    ok.validate().unwrap();
    let ConfigEntry::ServiceDefaults(d) = &ok else {
        panic!("{ok:?}")
    };
    assert_eq!(d.destination.as_ref().unwrap().port, 443);
    for (destination, says) in [
        (json!({"Port": 443}), "Destination.Addresses: required"),
        (json!({"Addresses": [], "Port": 443}), "Destination.Addresses: required"),
        (
            json!({"Addresses": ["*.example.com"], "Port": 443}),
            "Destination.Addresses[0]",
        ),
        (
            json!({"Addresses": ["a..b"], "Port": 443}),
            "neither an IP address nor a host name",
        ),
        (
            json!({"Addresses": ["-a.example.com"], "Port": 443}),
            "Destination.Addresses[0]",
        ),
        (
            json!({"Addresses": ["10.0.0.1/24"], "Port": 443}),
            "Destination.Addresses[0]",
        ),
        (
            json!({"Addresses": ["a.example.com", "b.example.com", "a.example.com"], "Port": 443}),
            "Destination.Addresses[2]",
        ),
        (json!({"Addresses": ["192.0.2.10"]}), "Destination.Port: required"),
        (json!({"Addresses": ["192.0.2.10"], "Port": 443, "Bogus": 1}), "Bogus"),
    ] {
        let e = problem(json!({"Kind": "service-defaults", "Name": "ext", "Destination": destination}));
        assert!(e.contains(says), "{destination}: {e}");
    }
    let e = problem(json!({"Kind": "service-defaults", "Name": "ext",
        "Destination": {"Addresses": ["192.0.2.10"], "Port": 443},
        "UpstreamConfig": {"Defaults": {"ConnectTimeoutMs": 1000}}}));
    assert!(e.contains("Destination") && e.contains("UpstreamConfig"), "{e}");
}

#[test]
fn failover_targets_may_name_a_peer_alone() {
    let ok = entry(serde_json::json!({"Kind": "service-resolver", "Name": "api",
        "Failover": {"*": {"Targets": [{"Peer": "cluster-a"}, {"Service": "api", "Peer": "cluster-b"}]}}}));
    assert!(ok.validate().is_ok());
    for (target, want) in [
        (
            serde_json::json!({"Peer": "cluster-a", "Datacenter": "dc2"}),
            "Targets[0].Peer: not allowed",
        ),
        (
            serde_json::json!({"Peer": "cluster-a", "ServiceSubset": "v1"}),
            "Targets[0].Peer: not allowed",
        ),
        (serde_json::json!({"Peer": "Cluster A"}), "Targets[0].Peer"),
    ] {
        let bad = entry(serde_json::json!({"Kind": "service-resolver", "Name": "api",
            "Failover": {"*": {"Targets": [target]}}}));
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains(want), "{err} lacks {want}");
    }
}

#[test]
fn a_redirect_may_name_a_peer() {
    for ok in [
        json!({"Peer": "cluster-a"}),
        json!({"Service": "api-v2", "Peer": "cluster-a"}),
    ] {
        let ok = entry(json!({"Kind": "service-resolver", "Name": "api", "Redirect": ok}));
        assert!(ok.validate().is_ok());
    }
    for (redirect, want) in [
        (
            json!({"Peer": "cluster-a", "Datacenter": "dc2"}),
            "Redirect.Peer: not allowed",
        ),
        (
            json!({"Service": "x", "Peer": "cluster-a", "ServiceSubset": "v1"}),
            "Redirect.Peer: not allowed",
        ),
        (json!({"Peer": "Cluster A"}), "Redirect.Peer"),
    ] {
        let bad = entry(json!({"Kind": "service-resolver", "Name": "api", "Redirect": redirect}));
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains(want), "{err} lacks {want}");
    }
}
