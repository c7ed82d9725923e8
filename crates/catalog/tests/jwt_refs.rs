//! Intentions may only require JWT providers that exist, and a provider they require cannot
//! be deleted.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use ::catalog::*;
use serde_json::{Value, json};
use structs::*;

fn set(v: Value) -> Op {
    Op::ConfigSet {
        entry: Box::new(ConfigEntry::from_json(v).unwrap()),
        cas: None,
    }
}

async fn refused(store: &Store, op: Op) -> String {
    match store.write(op).await {
        Err(WriteError::Invalid(e)) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn provider(name: &str) -> Op {
    set(
        json!({"Kind": "jwt-provider", "Name": name, "Issuer": "https://issuer.example",
        "JSONWebKeySet": {"Remote": {"URI": "https://issuer.example/.well-known/jwks.json"}}}),
    )
}

fn delete_provider(name: &str) -> Op {
    Op::ConfigDelete {
        kind: ConfigEntryKind::JwtProvider,
        name: name.into(),
        cas: None,
    }
}

#[tokio::test]
async fn intentions_require_only_providers_that_exist() {
    let s = Store::open(StoreConfig::default()).await.unwrap();
    s.write(set(
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
    ))
    .await
    .unwrap();
    let entry_level = json!({"Kind": "service-intentions", "Name": "api",
        "JWT": {"Providers": [{"Name": "okta"}]},
        "Sources": [{"Name": "web", "Action": "allow"}]});
    let err = refused(&s, set(entry_level.clone())).await;
    assert_eq!(
        err,
        "service-intentions \"api\" JWT.Providers[0].Name: no jwt-provider named \"okta\" exists: write it first"
    );
    let per_permission = json!({"Kind": "service-intentions", "Name": "api",
        "Sources": [{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/"},
            "JWT": {"Providers": [{"Name": "auth0", "VerifyClaims": [{"Path": ["role"], "Value": "admin"}]}]}}]}]});
    let err = refused(&s, set(per_permission.clone())).await;
    assert!(
        err.starts_with("service-intentions \"api\" Sources[0].Permissions[0].JWT.Providers[0].Name: no jwt-provider named \"auth0\""),
        "{err}"
    );
    s.write(provider("okta")).await.unwrap();
    s.write(provider("auth0")).await.unwrap();
    s.write(set(entry_level)).await.unwrap();
    // A required provider stays; one no intention requires goes.
    let err = refused(&s, delete_provider("okta")).await;
    assert_eq!(
        err,
        "service-intentions \"api\" JWT.Providers[0].Name: requires jwt-provider \"okta\": remove the requirement before deleting the provider"
    );
    s.write(delete_provider("auth0")).await.unwrap();
    s.write(provider("auth0")).await.unwrap();
    s.write(set(per_permission)).await.unwrap();
    s.write(delete_provider("okta")).await.unwrap();
    let err = refused(&s, delete_provider("auth0")).await;
    assert!(err.contains("Sources[0].Permissions[0].JWT.Providers[0].Name"), "{err}");
    // The requirement is kept as written.
    let stored = s
        .read()
        .config_entry(ConfigEntryKind::ServiceIntentions, "api")
        .unwrap();
    let ConfigEntry::ServiceIntentions(si) = stored.as_ref() else {
        panic!()
    };
    assert_eq!(
        si.sources[0].permissions[0].jwt.as_ref().unwrap().providers[0].verify_claims[0].path,
        ["role"]
    );
}
