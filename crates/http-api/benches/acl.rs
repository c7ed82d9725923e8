//! ACL check cost (prints figures; asserts nothing). Issue 14's target: an HTTP request's ACL
//! check with a cached token costs at most 5 µs.
//!
//! 1. Resolution and check alone: a token linking three policies of 20 rules each, a role
//!    and a service identity; its secret resolved from the cache and `service:write` checked.
//! 2. Whole requests through the router (`GET /v1/catalog/service/web`, whose body is
//!    encoded once and shared), ACLs off and on; the difference is what ACLs add per request
//!    (token read, resolution, check, filtering).
//!
//! Run: `cargo xtask bench acl`. Scale with `ITERS=` (200000) and `REQUESTS=` (20000).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use axum::body::Body;
use axum::http::Request;
use catalog::acl::{AclSettings, Resolver};
use catalog::{Op, Store, StoreConfig};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::figures::env_usize;
use tower::ServiceExt;

fn rules(p: usize) -> String {
    let mut out = String::new();
    for r in 0..20 {
        out.push_str(&format!("service \"svc-{p}-{r}\" {{ policy = \"read\" }}\n"));
        out.push_str(&format!("node_prefix \"rack-{p}-{r}-\" {{ policy = \"read\" }}\n"));
    }
    out.push_str("service_prefix \"web\" { policy = \"write\" }\n");
    out
}

async fn store_with_token() -> (Store, String) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    store.write(Op::AclInit).await.unwrap();
    let mut links = Vec::new();
    for p in 0..3 {
        let id = catalog::ca::new_uuid().unwrap();
        store
            .write(Op::AclPolicySet {
                policy: Box::new(structs::acl::AclPolicy {
                    id: id.clone(),
                    name: format!("policy-{p}"),
                    rules: rules(p),
                    ..Default::default()
                }),
                create: true,
            })
            .await
            .unwrap();
        links.push(structs::acl::Link {
            id,
            name: String::new(),
        });
    }
    let role = catalog::ca::new_uuid().unwrap();
    store
        .write(Op::AclRoleSet {
            role: Box::new(structs::acl::AclRole {
                id: role.clone(),
                name: "ops".into(),
                policies: vec![links[0].clone()],
                ..Default::default()
            }),
            create: true,
        })
        .await
        .unwrap();
    let secret = catalog::ca::new_uuid().unwrap();
    store
        .write(Op::AclTokenSet {
            token: Box::new(structs::acl::AclToken {
                accessor_id: catalog::ca::new_uuid().unwrap(),
                secret_id: secret.clone(),
                policies: links,
                roles: vec![structs::acl::Link {
                    id: role,
                    name: String::new(),
                }],
                service_identities: vec![structs::acl::ServiceIdentity {
                    service_name: "api".into(),
                    datacenters: Vec::new(),
                }],
                ..Default::default()
            }),
            create: true,
            ttl: None,
        })
        .await
        .unwrap();
    (store, secret)
}

fn settings(enabled: bool) -> AclSettings {
    AclSettings {
        enabled,
        default_allow: false,
        datacenter: "dc1".into(),
    }
}

async fn per_request(app: &axum::Router, token: &str, n: usize) -> Duration {
    let call = || {
        let req = Request::get("/v1/catalog/service/web")
            .header("X-Consul-Token", token)
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    };
    for _ in 0..1000 {
        assert!(call().await.unwrap().status().is_success());
    }
    let t0 = Instant::now();
    for _ in 0..n {
        let resp = call().await.unwrap();
        std::hint::black_box(resp);
    }
    t0.elapsed() / n as u32
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let iters = env_usize("ITERS", 200_000);
    let requests = env_usize("REQUESTS", 20_000);
    let (store, secret) = store_with_token().await;
    let token = structs::Token::new(&secret);

    let resolver = Resolver::new(settings(true));
    let state = store.read();
    let first = Instant::now();
    let r = resolver.resolve(&state, token.as_ref()).unwrap();
    let miss = first.elapsed();
    assert!(r.authz.service_write("web-frontend") && r.authz.service_write("api"));
    let t0 = Instant::now();
    let mut allowed = 0usize;
    for i in 0..iters {
        let r = resolver.resolve(&state, token.as_ref()).unwrap();
        let name = if i % 2 == 0 { "web-frontend" } else { "svc-2-19" };
        allowed += usize::from(r.authz.service_write(std::hint::black_box(name)));
    }
    let hit = t0.elapsed() / iters as u32;
    std::hint::black_box(allowed);

    let reg = json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web", "Port": 80}});
    store
        .write(Op::Register(Box::new(structs::json::from_value(reg).unwrap())))
        .await
        .unwrap();
    let (apps, management) = {
        let off = http_api::router(store.clone(), http_api::ApiConfig::default());
        let on = http_api::router(
            store.clone(),
            http_api::ApiConfig {
                acl: Arc::new(Resolver::new(settings(true))),
                ..Default::default()
            },
        );
        ((off, on), secret.clone())
    };
    // Each shape twice, interleaved, the best of each kept (the host is shared).
    let mut off = Duration::MAX;
    let mut on = Duration::MAX;
    for _ in 0..2 {
        off = off.min(per_request(&apps.0, &management, requests).await);
        on = on.min(per_request(&apps.1, &management, requests).await);
    }
    println!("ACL check benchmark (a token of 3 policies x 41 rules, a role and a service identity)");
    println!(
        "  first resolution (cache miss: policies parsed and merged): {:.1} us",
        miss.as_secs_f64() * 1e6
    );
    println!(
        "  cached resolution + service:write check: {:.3} us   [target <= 5 us]",
        hit.as_secs_f64() * 1e6
    );
    println!(
        "  GET /v1/catalog/service/web through the router: {:.2} us with ACLs off, {:.2} us on: ACLs add {:.2} us per request   [target <= 5 us]",
        off.as_secs_f64() * 1e6,
        on.as_secs_f64() * 1e6,
        on.as_secs_f64() * 1e6 - off.as_secs_f64() * 1e6
    );
}
