//! Manager behaviour: registration, watchers, precedence, limits, shutdown (paused tokio time).

use crate::common::*;
use proxycfg::*;
use std::{sync::Arc, time::Duration};
use structs::*;

#[tokio::test(start_paused = true)]
async fn registration_change_rebuilds_the_state() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    assert_eq!(
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap(),
        Registered::Started
    );
    let mut w = f.manager.watch(&reg.id);
    let first = next_snapshot(&mut w).await;

    // Tags do not affect the proxy's config: the State keeps running.
    let mut tagged = (*reg.service).clone();
    tagged.tags = vec!["blue".into()];
    let tagged = ProxyRegistration {
        service: Arc::new(tagged),
        ..reg.clone()
    };
    assert_eq!(
        f.manager.register(tagged, ProxySource::Local, false).await.unwrap(),
        Registered::Unchanged
    );
    assert_eq!(f.manager.metrics().states_started, 1);

    // A new upstream and port change the config: a fresh State with the new watches.
    let changed = sidecar("web", 21001, &[("api", 9191), ("cache", 9193)]);
    assert_eq!(
        f.manager.register(changed, ProxySource::Local, false).await.unwrap(),
        Registered::Rebuilt
    );
    let snap = next_snapshot(&mut w).await;
    assert_eq!(snap.service.port, 21001);
    assert!(snap.version > first.version, "versions keep increasing across rebuilds");
    assert_eq!(snap.connect_proxy().unwrap().upstreams.len(), 2);
    let m = f.manager.metrics();
    assert_eq!((m.states_started, m.live_states), (2, 1));
    // Only the new State's watches are alive: 7 base + 2 chains + 2 targets.
    assert_eq!(m.live_watches, 11);
    assert_eq!(f.fakes.active(), 11);

    // A token change rebuilds too.
    let with_token = ProxyRegistration {
        token: structs::Token::new("secret"),
        ..sidecar("web", 21001, &[("api", 9191), ("cache", 9193)])
    };
    assert_eq!(
        f.manager.register(with_token, ProxySource::Local, false).await.unwrap(),
        Registered::Rebuilt
    );
    settle().await;
    assert_eq!(
        f.fakes
            .leaf
            .watched_requests()
            .iter()
            .map(|r| r.token.as_ref().map(structs::Token::secret))
            .collect::<Vec<_>>(),
        vec![Some("secret")]
    );
}

#[tokio::test(start_paused = true)]
async fn deregistration_leaves_no_watch_task() {
    let f = fixture();
    let regs = [
        sidecar("web", 21000, &[("api", 9191)]),
        sidecar("api", 21001, &[("db", 9191), ("cache", 9192)]),
    ];
    for reg in &regs {
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap();
    }
    settle().await;
    assert!(f.fakes.active() > 0);
    let mut w = f.manager.watch(&regs[0].id);
    next_snapshot(&mut w).await;
    for reg in &regs {
        assert!(f.manager.deregister(&reg.id, ProxySource::Local).await);
    }
    // deregister returns after every watch task has ended: counted, no waiting needed.
    assert_eq!(f.fakes.active(), 0);
    let m = f.manager.metrics();
    assert_eq!((m.live_watches, m.live_states), (0, 0));
    assert!(matches!(w.next().await, Some(WatchEvent::Deregistered)));
    assert!(f.manager.registered().await.is_empty());
    assert!(
        !f.manager.deregister(&regs[0].id, ProxySource::Local).await,
        "second deregister is a no-op"
    );
}

#[tokio::test(start_paused = true)]
async fn watchers_share_one_snapshot() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    let mut a = f.manager.watch(&reg.id);
    let mut b = f.manager.watch(&reg.id);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let (sa, sb) = (next_snapshot(&mut a).await, next_snapshot(&mut b).await);
    assert!(Arc::ptr_eq(&sa, &sb));
    // A late watcher gets the current snapshot at once, the same allocation.
    let mut c = f.manager.watch(&reg.id);
    assert!(Arc::ptr_eq(&next_snapshot(&mut c).await, &sa));
    assert_eq!(f.manager.metrics().watchers, 3);
    drop((a, b, c));
    assert_eq!(f.manager.metrics().watchers, 0);
}

#[tokio::test(start_paused = true)]
async fn slow_watcher_gets_only_the_latest() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut slow = f.manager.watch(&reg.id);
    let first = next_snapshot(&mut slow).await;
    for i in 1..=5 {
        f.fakes.health.set(
            &health_req("api", "dc1"),
            Arc::new(vec![instance("api", &format!("10.0.0.{i}"))]),
        );
        settle().await; // each change is published on its own
    }
    assert_eq!(f.manager.metrics().snapshots_built, first.version + 5);
    let latest = next_snapshot(&mut slow).await;
    assert_eq!(latest.version, first.version + 5);
    let api = &latest.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert_eq!(
        api.endpoints[&TargetId::new("", "api", "default", "dc1")][0]
            .node
            .address,
        "10.0.0.5"
    );
    // Nothing is queued behind it.
    assert!(tokio::time::timeout(Duration::from_secs(1), slow.next()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn watch_before_register() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[]);
    let mut w = f.manager.watch(&reg.id);
    assert!(w.current().is_none());
    assert!(
        tokio::time::timeout(Duration::from_secs(1), w.next()).await.is_err(),
        "nothing before registration"
    );
    f.manager
        .register(reg.clone(), ProxySource::Catalog, false)
        .await
        .unwrap();
    let snap = next_snapshot(&mut w).await;
    assert_eq!(*snap.proxy_id, reg.id);
}

#[tokio::test(start_paused = true)]
async fn source_precedence() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let err = f
        .manager
        .register(sidecar("web", 21005, &[]), ProxySource::Catalog, false)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RegisterError::SourceConflict {
            id: reg.id.clone(),
            existing: ProxySource::Local
        }
    );
    assert!(
        !f.manager.deregister(&reg.id, ProxySource::Catalog).await,
        "another source cannot deregister it"
    );
    f.manager
        .register(sidecar("web", 21005, &[]), ProxySource::Catalog, true)
        .await
        .unwrap();
    assert_eq!(f.manager.registration(&reg.id).await.unwrap().1, ProxySource::Catalog);

    let typical = ProxyRegistration {
        service: Arc::new(NodeService {
            service: "web".into(),
            ..Default::default()
        }),
        ..reg.clone()
    };
    assert!(matches!(
        f.manager.register(typical, ProxySource::Local, false).await,
        Err(RegisterError::NotAProxy { .. })
    ));
    let gateway = ProxyRegistration {
        service: Arc::new(NodeService {
            kind: ServiceKind::ApiGateway,
            service: "gw".into(),
            port: 443,
            ..Default::default()
        }),
        id: ProxyId::new("node-1", "gw"),
        token: None,
    };
    // Every proxy kind has a handler now, the API gateway's last.
    assert!(f.manager.register(gateway, ProxySource::Local, false).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn global_rate_limit_spaces_deliveries() {
    let f = fixture_with(ManagerConfig {
        rate_limit: Some(RateLimit {
            per_second: 10.0,
            burst: 1,
        }),
        ..Default::default()
    });
    let regs: Vec<_> = (0..4).map(|i| sidecar(&format!("svc{i}"), 21000 + i, &[])).collect();
    let start = tokio::time::Instant::now();
    let mut watchers = Vec::new();
    for reg in &regs {
        watchers.push(f.manager.watch(&reg.id));
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap();
    }
    let mut times = Vec::new();
    for w in &mut watchers {
        next_snapshot(w).await;
        times.push(tokio::time::Instant::now() - start);
    }
    times.sort();
    // Four first snapshots at 10/s: the last one at least 300 ms after the first.
    assert!(times[3] - times[0] >= Duration::from_millis(300), "{times:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_everything_and_refuses_new_work() {
    let f = fixture();
    f.manager
        .register(sidecar("web", 21000, &[("api", 9191)]), ProxySource::Local, false)
        .await
        .unwrap();
    settle().await;
    f.manager.shutdown().await;
    assert_eq!(f.fakes.active(), 0);
    assert_eq!(f.manager.metrics().live_states, 0);
    assert_eq!(
        f.manager
            .register(sidecar("api", 21001, &[]), ProxySource::Local, false)
            .await
            .unwrap_err(),
        RegisterError::Closed
    );
}
