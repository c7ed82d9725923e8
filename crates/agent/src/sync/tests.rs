//! Anti-entropy against an in-memory catalog, under paused time.

use super::*;
use crate::local::{LocalCheck, LocalService, Source};
use parking_lot::Mutex;
use serde_json::{Value, json};
use structs::HealthStatus;
use tokio::time::Instant;

/// A catalog of one node, in memory, that can be "down" and logs every request.
#[derive(Default)]
struct FakeCatalog {
    inner: Mutex<Fake>,
}

#[derive(Default)]
struct Fake {
    down: bool,
    node: Option<Value>,
    services: BTreeMap<String, Value>,
    checks: BTreeMap<String, Value>,
    log: Vec<(Instant, String)>,
}

impl FakeCatalog {
    fn set_down(&self, down: bool) {
        self.inner.lock().down = down;
    }
    fn take_log(&self) -> Vec<(Instant, String)> {
        std::mem::take(&mut self.inner.lock().log)
    }
    fn service_ids(&self) -> Vec<String> {
        self.inner.lock().services.keys().cloned().collect()
    }
    fn check_status(&self, id: &str) -> Option<String> {
        self.inner
            .lock()
            .checks
            .get(id)
            .map(|c| c["Status"].as_str().unwrap_or("").to_owned())
    }
}

fn unreachable() -> ApiError {
    ApiError::Unreachable {
        tried: 1,
        last: "connection refused".into(),
    }
}

impl CatalogApi for FakeCatalog {
    async fn get(&self, path: String) -> Result<Value, ApiError> {
        let mut f = self.inner.lock();
        f.log.push((Instant::now(), format!("GET {path}")));
        if f.down {
            return Err(unreachable());
        }
        if path.starts_with("/v1/catalog/node/") {
            return Ok(match &f.node {
                None => Value::Null,
                Some(n) => json!({"Node": n, "Services": f.services}),
            });
        }
        Ok(Value::Array(f.checks.values().cloned().collect()))
    }

    async fn write(&self, _token: Option<&structs::Token>, write: &CatalogWrite) -> Result<(), ApiError> {
        let (path, body) = match write {
            CatalogWrite::Register(r) => ("/v1/catalog/register", serde_json::to_value(r).unwrap()),
            CatalogWrite::Deregister(d) => ("/v1/catalog/deregister", serde_json::to_value(d).unwrap()),
        };
        let mut f = self.inner.lock();
        if f.down {
            f.log.push((Instant::now(), format!("PUT {path} (down)")));
            return Err(unreachable());
        }
        if path.ends_with("/register") {
            if !body["SkipNodeUpdate"].as_bool().unwrap_or(false) || f.node.is_none() {
                f.node = Some(
                    json!({"Node": body["Node"], "ID": body["ID"], "Address": body["Address"],
                    "TaggedAddresses": body["TaggedAddresses"], "Meta": body["NodeMeta"], "Datacenter": "dc1"}),
                );
                f.log.push((Instant::now(), "register node".into()));
            }
            if let Some(svc) = body.get("Service") {
                let id = svc["ID"].as_str().unwrap_or_default().to_owned();
                f.log.push((Instant::now(), format!("register service {id}")));
                f.services.insert(id, svc.clone());
            }
            let checks: Vec<Value> = body
                .get("Check")
                .into_iter()
                .cloned()
                .chain(
                    body.get("Checks")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                )
                .collect();
            for c in checks {
                let id = c["CheckID"].as_str().unwrap_or_default().to_owned();
                if body.get("Service").is_none() {
                    f.log.push((Instant::now(), format!("register check {id}")));
                }
                f.checks.insert(id, c);
            }
        } else if let Some(id) = body["ServiceID"].as_str().filter(|id| !id.is_empty()) {
            f.log.push((Instant::now(), format!("deregister service {id}")));
            f.services.remove(id);
            f.checks.retain(|_, c| c["ServiceID"] != id);
        } else if let Some(id) = body["CheckID"].as_str().filter(|id| !id.is_empty()) {
            f.log.push((Instant::now(), format!("deregister check {id}")));
            f.checks.remove(id);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

const NODE_ID: &str = "6b7c2f3e-1d2a-4c5b-8e9f-0a1b2c3d4e5f";

fn setup() -> (Arc<LocalState>, Arc<FakeCatalog>, Arc<Syncer<FakeCatalog>>) {
    let state = Arc::new(LocalState::new("n1"));
    let fake = Arc::new(FakeCatalog::default());
    let syncer = Arc::new(Syncer::new(
        Arc::clone(&state),
        Arc::clone(&fake),
        NodeInfo {
            node: "n1".into(),
            id: NODE_ID.into(),
            address: "10.0.0.1".into(),
            tagged_addresses: crate::sync::tagged_addresses("10.0.0.1"),
            datacenter: "dc1".into(),
            meta: crate::sync::with_agent_meta(BTreeMap::new()),
            server_owned_services: vec!["consul".into()],
        },
        SyncConfig::default(),
    ));
    (state, fake, syncer)
}

fn register_web(state: &LocalState) {
    state.apply(
        vec![LocalService::new(
            NodeService {
                id: "web".into(),
                service: "web".into(),
                port: 80,
                ..NodeService::default()
            },
            None,
            Source::Api,
        )],
        vec![LocalCheck::new(
            HealthCheck {
                check_id: "ttl".into(),
                name: "ttl".into(),
                service_id: "web".into(),
                service_name: "web".into(),
                check_type: "ttl".into(),
                ..HealthCheck::default()
            },
            None,
            None,
            Source::Api,
        )],
        &[],
    );
}

fn spawn(syncer: &Arc<Syncer<FakeCatalog>>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let s = Arc::clone(syncer);
    let st = stop.clone();
    (stop, tokio::spawn(async move { s.run(st).await }))
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_is_pushed_once_after_the_debounce() {
    let (state, fake, syncer) = setup();
    register_web(&state);
    let (stop, task) = spawn(&syncer);
    syncer.wait_first_sync().await;
    assert!(syncer.in_sync());
    assert_eq!(fake.service_ids(), ["web"]);
    fake.take_log();
    let start = Instant::now();
    for i in 0..5 {
        state.update_check("ttl", HealthStatus::Passing, format!("update {i}"));
    }
    tokio::time::sleep(SyncConfig::default().debounce * 2).await;
    let log = fake.take_log();
    let pushes: Vec<&(Instant, String)> = log.iter().filter(|(_, l)| l.starts_with("register")).collect();
    assert_eq!(pushes.len(), 1, "{log:?}");
    assert_eq!(pushes[0].1, "register check ttl");
    assert!(
        pushes[0].0 - start >= SyncConfig::default().debounce,
        "pushed before the debounce"
    );
    assert_eq!(fake.check_status("ttl").as_deref(), Some("passing"));
    assert!(syncer.in_sync());
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn while_no_server_answers_attempts_back_off_then_converge() {
    let (state, fake, syncer) = setup();
    register_web(&state);
    fake.set_down(true);
    let (stop, task) = spawn(&syncer);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let attempts: Vec<Instant> = fake
        .take_log()
        .into_iter()
        .filter(|(_, l)| l.starts_with("GET /v1/catalog/node/"))
        .map(|(t, _)| t)
        .collect();
    // Delays 1, 2, 4, 8, 16 s (each jittered down by at most a quarter): 6 attempts at most.
    assert!((4..=6).contains(&attempts.len()), "{} attempts", attempts.len());
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let nominal = Duration::from_secs(1 << i);
        assert!(*gap <= nominal && *gap >= nominal.mul_f64(0.75), "gap {i}: {gap:?}");
    }
    assert!(!syncer.in_sync());
    fake.set_down(false);
    // The next attempt (at most the 30 s cap away) is a full sync that converges.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(fake.service_ids(), ["web"]);
    assert!(syncer.in_sync());
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_periodic_full_sync_removes_foreign_entries_and_restores_lost_ones() {
    let (state, fake, syncer) = setup();
    register_web(&state);
    let (stop, task) = spawn(&syncer);
    syncer.wait_first_sync().await;
    {
        let mut f = fake.inner.lock();
        f.services.clear();
        f.checks.clear();
        f.services
            .insert("rogue".into(), json!({"ID": "rogue", "Service": "rogue"}));
        // A server's own service and its check are the server's, not anti-entropy's.
        f.services
            .insert("consul".into(), json!({"ID": "consul", "Service": "consul"}));
        f.checks.insert(
            "consul-check".into(),
            json!({"CheckID": "consul-check", "ServiceID": "consul", "Status": "passing"}),
        );
        f.checks.insert(
            "serfHealth".into(),
            json!({"CheckID": "serfHealth", "Status": "passing"}),
        );
        f.checks
            .insert("stray".into(), json!({"CheckID": "stray", "Status": "passing"}));
    }
    // Nothing changed locally: only the next full sync (≤ 60 s) notices.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(fake.service_ids(), ["consul", "web"]);
    let checks: Vec<String> = fake.inner.lock().checks.keys().cloned().collect();
    assert_eq!(
        checks,
        ["consul-check", "serfHealth", "ttl"],
        "the stray check is gone; the liveness check and the server's own stay"
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn local_removals_reach_the_catalog() {
    let (state, fake, syncer) = setup();
    register_web(&state);
    let (stop, task) = spawn(&syncer);
    syncer.wait_first_sync().await;
    state.remove_service("web");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(fake.service_ids().is_empty());
    assert!(fake.check_status("ttl").is_none());
    assert!(syncer.in_sync());
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_node_is_registered_with_its_id_tagged_addresses_and_meta_once() {
    let (_state, fake, syncer) = setup();
    syncer.full_sync().await.unwrap();
    let node = fake.inner.lock().node.clone().unwrap();
    assert_eq!(node["ID"], NODE_ID);
    assert_eq!(
        node["TaggedAddresses"],
        json!({"lan": "10.0.0.1", "lan_ipv4": "10.0.0.1", "wan": "10.0.0.1", "wan_ipv4": "10.0.0.1"})
    );
    assert_eq!(node["Meta"]["consul-network-segment"], "");
    assert_eq!(node["Meta"]["consul-version"], env!("CARGO_PKG_VERSION"));
    // Unchanged, the next full sync leaves the node as it is.
    fake.take_log();
    syncer.full_sync().await.unwrap();
    assert!(!fake.take_log().iter().any(|(_, l)| l == "register node"));
}

#[test]
fn tagged_addresses_follow_the_address_family() {
    let v6 = crate::sync::tagged_addresses("fd00::1");
    assert_eq!(v6.get("lan_ipv6").map(String::as_str), Some("fd00::1"));
    assert!(!v6.contains_key("lan_ipv4"));
    let name = crate::sync::tagged_addresses("node-a.example");
    assert_eq!(name.keys().collect::<Vec<_>>(), ["lan", "wan"]);
}
