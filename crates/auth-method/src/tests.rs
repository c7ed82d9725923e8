#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use axum::Json;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use structs::acl::AclBindingRule;

/// An ES256 key pair: (private PKCS#8 PEM, public PEM, uncompressed public point).
fn key_pair() -> (String, String, Vec<u8>) {
    let kp = rcgen::KeyPair::generate().unwrap();
    (kp.serialize_pem(), kp.public_key_pem(), kp.public_key_raw().to_vec())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(private_pem: &str, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_ec_pem(private_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn method(kind: &str, config: Value) -> AclAuthMethod {
    AclAuthMethod {
        name: "m".into(),
        kind: kind.into(),
        config: config.as_object().unwrap().clone(),
        ..AclAuthMethod::default()
    }
}

fn jwt_method(public_pem: &str) -> AclAuthMethod {
    method(
        "jwt",
        json!({
            "JWTValidationPubKeys": [public_pem],
            "JWTSupportedAlgs": ["ES256"],
            "BoundAudiences": ["meshd"],
            "BoundIssuer": "https://issuer.example",
            "ClaimMappings": {"service": "service", "/team/name": "team"},
            "ListClaimMappings": {"groups": "groups"},
        }),
    )
}

fn good_claims() -> Value {
    json!({
        "iss": "https://issuer.example", "aud": ["meshd"], "exp": now() + 600, "iat": now(),
        "service": "web", "team": {"name": "payments"}, "groups": ["admins", "dev"],
    })
}

fn rule(selector: &str, bind_type: &str, bind_name: &str) -> AclBindingRule {
    AclBindingRule {
        id: format!("rule-{bind_type}-{bind_name}"),
        auth_method: "m".into(),
        selector: selector.into(),
        bind_type: bind_type.into(),
        bind_name: bind_name.into(),
        ..AclBindingRule::default()
    }
}

#[tokio::test]
async fn a_jwt_signed_by_the_methods_key_maps_its_claims_and_binds() {
    let (private, public, _) = key_pair();
    let m = jwt_method(&public);
    check_method(&m).unwrap();
    let id = Verifier::new()
        .verify(&m, &sign(&private, None, &good_claims()))
        .await
        .unwrap();
    let Identity::Jwt(jwt) = &id else { panic!("{id:?}") };
    assert_eq!(jwt.value["service"], "web");
    assert_eq!(jwt.value["team"], "payments");
    assert_eq!(jwt.list["groups"], vec!["admins", "dev"]);
    let rules = [
        rule("value.team == payments", "service", "${value.service}"),
        rule("\"admins\" in list.groups", "role", "admin-${ value.team }"),
        rule("\"ops\" in list.groups", "policy", "never"),
    ];
    for r in &rules {
        check_rule(&m, r).unwrap();
    }
    let b = bind(&m, &rules, &id).unwrap();
    assert_eq!(b.service_identities, vec!["web"]);
    assert_eq!(b.roles, vec!["admin-payments"]);
    assert!(b.policies.is_empty());
}

#[tokio::test]
async fn tokens_the_method_must_not_accept_are_denied_with_the_reason() {
    let (private, public, _) = key_pair();
    let (other_private, _, _) = key_pair();
    let m = jwt_method(&public);
    let v = Verifier::new();
    let mut cases = vec![
        (
            sign(&other_private, None, &good_claims()),
            "no key of the method verifies it",
        ),
        ("not.a.jwt".to_owned(), "not a JWT"),
    ];
    let mut c = good_claims();
    c["aud"] = json!(["someone-else"]);
    cases.push((sign(&private, None, &c), "audience"));
    let mut c = good_claims();
    c["iss"] = json!("https://evil.example");
    cases.push((sign(&private, None, &c), "issuer"));
    let mut c = good_claims();
    c["exp"] = json!(now() - 3600);
    cases.push((sign(&private, None, &c), "expired"));
    let mut c = good_claims();
    c["nbf"] = json!(now() + 3600);
    cases.push((sign(&private, None, &c), "not valid yet"));
    for (token, want) in cases {
        match v.verify(&m, &token).await {
            Err(LoginError::Denied(why)) => assert!(why.contains(want), "{why} (wanted {want})"),
            other => panic!("{want}: {other:?}"),
        }
    }
    // An RS256 token is refused by a method that only takes ES256, before any key is tried.
    let hs = jsonwebtoken::encode(&Header::default(), &good_claims(), &EncodingKey::from_secret(b"s")).unwrap();
    let Err(LoginError::Denied(why)) = v.verify(&m, &hs).await else {
        panic!()
    };
    assert!(why.contains("JWTSupportedAlgs"), "{why}");
}

#[test]
fn settings_that_cannot_work_are_refused_naming_the_field() {
    let (_, public, _) = key_pair();
    let cases = [
        (
            json!({"JWTValidationPubKeys": [public], "JWKSURLs": "x"}),
            "Config.JWKSURLs",
        ),
        (
            json!({"JWTValidationPubKeys": [public], "JWKSURL": "https://k.example/jwks"}),
            "Config: exactly one",
        ),
        (json!({}), "Config: exactly one"),
        (
            json!({"JWTValidationPubKeys": ["not a key"]}),
            "Config.JWTValidationPubKeys[0]",
        ),
        (json!({"JWKSURL": "ftp://x"}), "Config.JWKSURL"),
        (
            json!({"JWKSURL": "https://k.example", "JWTSupportedAlgs": ["HS256"]}),
            "Config.JWTSupportedAlgs",
        ),
        (
            json!({"JWKSURL": "https://k.example", "ClockSkewLeeway": "soon"}),
            "Config.ClockSkewLeeway",
        ),
        (
            json!({"JWKSURL": "https://k.example", "JWKSCACert": "nope"}),
            "Config.JWKSCACert",
        ),
        (
            json!({"JWKSURL": "https://k.example", "ClaimMappings": {"a": "b c"}}),
            "Config.ClaimMappings",
        ),
    ];
    for (config, want) in cases {
        let e = check_method(&method("jwt", config)).unwrap_err();
        assert!(e.to_string().starts_with(want), "{e} (wanted {want})");
    }
    let e = check_method(&method("kubernetes", json!({"Host": "https://k8s"}))).unwrap_err();
    assert_eq!(e.field, "Config.ServiceAccountJWT");
    let m = jwt_method(&public);
    for (r, want) in [
        (rule("value.team ==", "service", "x"), "Selector"),
        (rule("serviceaccount.name == x", "service", "x"), "Selector"),
        (
            rule("", "service", "${value.nope}"),
            "BindName: unknown field \"value.nope\"",
        ),
        (rule("", "service", "${value.team"), "BindName: unterminated"),
        (
            rule("", "service", "Web-${value.team}"),
            "BindName: \"Web-a\" is not a valid service name",
        ),
        (rule("", "policy", "ok-${value.team}"), ""),
    ] {
        match check_rule(&m, &r) {
            Ok(()) => assert!(want.is_empty(), "{r:?} passed"),
            Err(e) => assert!(
                !want.is_empty() && e.to_string().starts_with(want),
                "{e} (wanted {want})"
            ),
        }
    }
}

#[tokio::test]
async fn a_jwks_url_serves_the_keys_and_a_rotation_is_followed() {
    use base64::Engine;
    let (private, _, point) = key_pair();
    let (private2, _, point2) = key_pair();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = |kid: &str, p: &[u8]| json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "x": b64(&p[1..33]), "y": b64(&p[33..65])});
    let keys = std::sync::Arc::new(parking_lot::Mutex::new(json!({"keys": [jwk("one", &point)]})));
    let served = keys.clone();
    let app = axum::Router::new().route("/jwks", get(move || async move { Json(served.lock().clone()) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let m = method(
        "jwt",
        json!({"JWKSURL": format!("http://{addr}/jwks"), "JWTSupportedAlgs": ["ES256"], "ClaimMappings": {"sub": "name"}}),
    );
    let v = Verifier::new();
    let claims = json!({"sub": "api", "exp": now() + 60});
    let Identity::Jwt(id) = v.verify(&m, &sign(&private, Some("one"), &claims)).await.unwrap() else {
        panic!()
    };
    assert_eq!(id.value["name"], "api");
    // A key added to the set after it was fetched: the token names it, the set is fetched again.
    keys.lock()["keys"].as_array_mut().unwrap().push(jwk("two", &point2));
    let token = sign(&private2, Some("two"), &claims);
    // Within the refetch interval the cached set is used: not yet known.
    assert!(matches!(v.verify(&m, &token).await, Err(LoginError::Denied(_))));
    v.keys.expire_all();
    v.verify(&m, &token).await.unwrap();
}

#[tokio::test]
async fn a_kubernetes_service_account_is_reviewed_and_its_annotation_names_the_service() {
    let review = post(|headers: HeaderMap, Json(body): Json<Value>| async move {
        assert_eq!(headers["authorization"], "Bearer reviewer-jwt");
        let token = body["spec"]["token"].as_str().unwrap_or_default().to_owned();
        Json(match token.as_str() {
            "good" => {
                json!({"status": {"authenticated": true, "user": {"username": "system:serviceaccount:shop:web-sa", "uid": "u-1"}}})
            }
            "person" => json!({"status": {"authenticated": true, "user": {"username": "alice"}}}),
            _ => json!({"status": {"authenticated": false, "error": "token expired"}}),
        })
    });
    let account = get(|| async {
        Json(json!({"metadata": {"name": "web-sa", "annotations": {"consul.hashicorp.com/service-name": "web"}}}))
    });
    let app = axum::Router::new()
        .route("/apis/authentication.k8s.io/v1/tokenreviews", review)
        .route("/api/v1/namespaces/shop/serviceaccounts/web-sa", account);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let m = method(
        "kubernetes",
        json!({"Host": format!("http://{addr}"), "ServiceAccountJWT": "reviewer-jwt"}),
    );
    let v = Verifier::new();
    let id = v.verify(&m, "good").await.unwrap();
    assert_eq!(
        id,
        Identity::ServiceAccount(structs::filter::ServiceAccountIdentity {
            namespace: "shop".into(),
            name: "web".into(),
            uid: "u-1".into(),
        })
    );
    let r = rule("serviceaccount.namespace == shop", "service", "${serviceaccount.name}");
    check_rule(&m, &r).unwrap();
    assert_eq!(bind(&m, [&r], &id).unwrap().service_identities, vec!["web"]);
    let Err(LoginError::Denied(why)) = v.verify(&m, "expired").await else {
        panic!()
    };
    assert!(why.contains("token expired"), "{why}");
    let Err(LoginError::Denied(why)) = v.verify(&m, "person").await else {
        panic!()
    };
    assert!(why.contains("not a service account"), "{why}");
}
