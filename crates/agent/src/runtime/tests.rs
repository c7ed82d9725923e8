//! The agent without servers: registrations, their rules, persistence and the reaper.

use super::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use structs::HealthStatus;
use structs::agent::{CheckType, ServiceDefinition};

fn def(v: serde_json::Value) -> ServiceDefinition {
    structs::json::from_value(v).unwrap()
}

fn check_def(v: serde_json::Value) -> CheckType {
    structs::json::from_value(v).unwrap()
}

async fn agent(data_dir: Option<PathBuf>) -> Agent {
    Agent::start(AgentConfig {
        node: "n1".into(),
        data_dir,
        ..AgentConfig::default()
    })
    .await
    .unwrap()
}

fn ids<T>(m: &BTreeMap<String, T>) -> Vec<&str> {
    m.keys().map(String::as_str).collect()
}

#[tokio::test(start_paused = true)]
async fn a_service_critical_too_long_is_deregistered() {
    let a = agent(None).await;
    a.register_service(
        def(json!({"Name": "web", "Check": {"TTL": "10s", "DeregisterCriticalServiceAfter": "30s"}})),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    a.register_service(def(json!({"Name": "db", "Check": {"TTL": "10s"}})), Source::Api, false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(a.state().service("web").is_some(), "critical for 20 s only");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(a.state().service("web").is_none(), "critical for more than 30 s");
    assert!(
        a.state().service("db").is_some(),
        "no DeregisterCriticalServiceAfter, kept"
    );
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn re_registration_keeps_statuses_and_replace_drops_old_checks() {
    let a = agent(None).await;
    let web = json!({"Name": "web", "Checks": [{"CheckID": "a", "TTL": "60s"}, {"CheckID": "b", "TTL": "60s"}]});
    a.register_service(def(web), Source::Api, false).await.unwrap();
    a.ttl_update("a", HealthStatus::Passing, "fine".into()).unwrap();
    let only_a = json!({"Name": "web", "Checks": [{"CheckID": "a", "TTL": "60s"}]});
    a.register_service(def(only_a.clone()), Source::Api, false)
        .await
        .unwrap();
    assert_eq!(ids(&a.state().checks()), ["a", "b"], "without replace, b stays");
    assert_eq!(a.state().check("a").unwrap().check.status, HealthStatus::Passing);
    a.register_service(def(only_a), Source::Api, true).await.unwrap();
    assert_eq!(ids(&a.state().checks()), ["a"]);
    // A TTL report to a check that is gone is a not-found.
    assert!(matches!(
        a.ttl_update("b", HealthStatus::Passing, String::new()),
        Err(AgentError::NotFound(_))
    ));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn sidecars_follow_their_parent_and_maintenance_is_a_check() {
    let a = agent(None).await;
    a.register_service(
        def(json!({"Name": "web", "Port": 80, "Connect": {"SidecarService": {}}})),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    assert_eq!(ids(&a.state().services()), ["web", "web-sidecar-proxy"]);
    // Registering the parent without its sidecar removes the sidecar.
    a.register_service(def(json!({"Name": "web", "Port": 80})), Source::Api, false)
        .await
        .unwrap();
    assert_eq!(ids(&a.state().services()), ["web"]);
    assert!(a.state().checks().is_empty(), "the sidecar's checks went with it");
    a.set_maintenance("web", true, "").await.unwrap();
    let m = a.state().check("_service_maintenance:web").unwrap();
    assert_eq!(m.check.status, HealthStatus::Critical);
    assert!(m.check.notes.starts_with("Maintenance mode is enabled"));
    a.set_maintenance("web", false, "").await.unwrap();
    assert!(a.state().checks().is_empty());
    assert!(matches!(
        a.set_maintenance("nope", true, "").await,
        Err(AgentError::NotFound(_))
    ));
    a.register_service(
        def(json!({"Name": "api", "Port": 81, "Connect": {"SidecarService": {}}})),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    a.deregister_service("api").await.unwrap();
    assert_eq!(
        ids(&a.state().services()),
        ["web"],
        "the sidecar is deregistered with its parent"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn registrations_survive_a_restart_and_config_ones_are_not_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(Some(dir.path().to_owned())).await;
    a.register_service(
        def(
            json!({"Name": "web", "Port": 80, "Check": {"TTL": "60s"}, "Connect": {"SidecarService": {"Port": 21100}}}),
        ),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    a.register_check(check_def(json!({"Name": "disk", "TTL": "60s"})), Source::Api)
        .await
        .unwrap();
    a.load_config(vec![def(json!({"Name": "from-file", "Port": 90}))], vec![])
        .await
        .unwrap();
    a.set_maintenance("web", true, "upgrade").await.unwrap();
    a.shutdown().await;

    let b = agent(Some(dir.path().to_owned())).await;
    assert_eq!(ids(&b.state().services()), ["web", "web-sidecar-proxy"]);
    assert_eq!(b.state().service("web-sidecar-proxy").unwrap().service.port, 21100);
    assert_eq!(
        b.state().service("web-sidecar-proxy").unwrap().sidecar_of.as_deref(),
        Some("web")
    );
    assert_eq!(
        ids(&b.state().checks()),
        [
            "_service_maintenance:web",
            "disk",
            "service:web",
            "service:web-sidecar-proxy:1",
            "service:web-sidecar-proxy:2"
        ]
    );
    // TTL checks run again after the restart, and keep their last report across a restart.
    b.ttl_update("disk", HealthStatus::Passing, "fine".into()).unwrap();
    b.ttl_update("service:web", HealthStatus::Warning, "slow".into())
        .unwrap();
    b.shutdown().await;
    let b = agent(Some(dir.path().to_owned())).await;
    assert_eq!(b.state().check("disk").unwrap().check.status, HealthStatus::Passing);
    let web = b.state().check("service:web").unwrap().check;
    assert_eq!((web.status, web.output.as_str()), (HealthStatus::Warning, "slow"));
    b.deregister_service("web").await.unwrap();
    b.shutdown().await;
    let c = agent(Some(dir.path().to_owned())).await;
    assert!(c.state().services().is_empty(), "deregistration removed the files");
    assert_eq!(ids(&c.state().checks()), ["disk"]);
    c.shutdown().await;
}

#[tokio::test]
async fn a_persisted_check_of_a_config_file_service_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file_services = || vec![def(json!({"Name": "from-file", "Port": 90}))];
    let a = agent(Some(dir.path().to_owned())).await;
    a.load_config(file_services(), vec![]).await.unwrap();
    a.register_check(
        check_def(json!({"Name": "extra", "TTL": "60s", "ServiceID": "from-file"})),
        Source::Api,
    )
    .await
    .unwrap();
    a.shutdown().await;
    let b = agent(Some(dir.path().to_owned())).await;
    b.load_config(file_services(), vec![]).await.unwrap();
    assert_eq!(b.state().check("extra").unwrap().check.service_id, "from-file");
    b.shutdown().await;
    // Without the file's service, the check goes (and its file with it).
    let c = agent(Some(dir.path().to_owned())).await;
    c.load_config(vec![], vec![]).await.unwrap();
    assert!(c.state().check("extra").is_none());
    c.shutdown().await;
    let d = agent(Some(dir.path().to_owned())).await;
    d.load_config(file_services(), vec![]).await.unwrap();
    assert!(d.state().check("extra").is_none());
    d.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_bad_config_changes_nothing_and_names_the_entry() {
    let a = agent(None).await;
    a.load_config(vec![def(json!({"Name": "one", "Port": 1}))], vec![])
        .await
        .unwrap();
    let err = a
        .load_config(
            vec![
                def(json!({"Name": "two"})),
                def(json!({"Name": "three", "Check": {"Interval": "1s"}})),
            ],
            vec![],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "services[1].Check.TTL: required (or HTTP, TCP or AliasService): the check has no type"
    );
    assert_eq!(ids(&a.state().services()), ["one"]);
    let err = a
        .load_config(vec![], vec![check_def(json!({"TTL": "1s"}))])
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "checks[0].Name: required");
    // A good reload replaces the file's services and leaves API ones alone.
    a.register_service(def(json!({"Name": "api-one"})), Source::Api, false)
        .await
        .unwrap();
    a.load_config(vec![def(json!({"Name": "two"}))], vec![]).await.unwrap();
    assert_eq!(ids(&a.state().services()), ["api-one", "two"]);
    a.shutdown().await;
}

#[tokio::test]
async fn unusable_settings_are_refused_naming_them() {
    let bad = |c: AgentConfig| async move { Agent::start(c).await.unwrap_err().to_string() };
    assert_eq!(
        bad(AgentConfig {
            node: "my host".into(),
            ..AgentConfig::default()
        })
        .await,
        "node: \"my host\" has the character ' ': use letters, digits, '-', '_' or '.'"
    );
    assert_eq!(
        bad(AgentConfig {
            datacenter: String::new(),
            ..AgentConfig::default()
        })
        .await,
        "datacenter: required"
    );
    assert_eq!(
        bad(AgentConfig {
            node_id: Some("node-1".into()),
            ..AgentConfig::default()
        })
        .await,
        "node_id: \"node-1\" is not a UUID (as Consul, node ids are UUIDs)"
    );
    assert_eq!(
        bad(AgentConfig {
            node_meta: [("consul-version".to_owned(), "9".to_owned())].into(),
            ..AgentConfig::default()
        })
        .await,
        "node_meta: the key \"consul-version\" is reserved: keys starting \"consul-\" are set by the agent"
    );
}

#[tokio::test(start_paused = true)]
async fn managed_proxy_registrations_and_who_may_choose_their_command() {
    let a = agent(None).await;
    // Consul 1.4's shape: `<id>-proxy` is registered and marked managed.
    a.register_service(
        def(json!({"Name": "web", "Port": 80, "Token": "t0k",
                   "Connect": {"Proxy": {"ExecMode": "daemon", "Upstreams": [{"DestinationName": "db", "LocalBindPort": 9191}]}}})),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    let proxy = a.state().service("web-proxy").unwrap();
    assert_eq!(proxy.service.kind, structs::ServiceKind::ConnectProxy);
    assert_eq!(proxy.service.proxy.destination_service_name, "web");
    assert_eq!(proxy.service.proxy.upstreams.len(), 1);
    let managed = proxy.managed.unwrap();
    assert!(managed.command.is_empty());
    assert_eq!(managed.token, structs::Token::new("t0k"), "the registration's token");
    // A command from the API is refused unless the agent allows it, naming the field...
    let with_command = def(json!({"Name": "job", "Port": 81,
        "Connect": {"Proxy": {"Command": ["/usr/bin/my-proxy"]}}}));
    let refused = a
        .register_service(with_command.clone(), Source::Api, false)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("Connect.Proxy.Command"), "{refused}");
    assert!(a.state().service("job").is_none(), "nothing half-applied");
    // ...and accepted from a config file.
    a.register_service(with_command, Source::Config, false).await.unwrap();
    assert_eq!(
        a.state().service("job-proxy").unwrap().managed.unwrap().command,
        ["/usr/bin/my-proxy"]
    );
    // A plain sidecar is not managed unless the agent manages sidecars.
    a.register_service(
        def(json!({"Name": "api", "Port": 82, "Connect": {"SidecarService": {}}})),
        Source::Api,
        false,
    )
    .await
    .unwrap();
    assert!(a.state().service("api-sidecar-proxy").unwrap().managed.is_none());
}
