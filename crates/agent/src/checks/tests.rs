use super::*;
use crate::local::{LocalCheck, LocalService, Source};
use structs::NodeService;

fn state_with(checks: &[(&str, &str, HealthStatus)]) -> Arc<LocalState> {
    let s = Arc::new(LocalState::new("n1"));
    let svc = LocalService::new(
        NodeService {
            id: "web".into(),
            service: "web".into(),
            ..NodeService::default()
        },
        None,
        Source::Api,
    );
    let checks = checks
        .iter()
        .map(|(id, service, status)| {
            LocalCheck::new(
                HealthCheck {
                    check_id: (*id).into(),
                    service_id: (*service).into(),
                    status: *status,
                    ..HealthCheck::default()
                },
                None,
                None,
                Source::Api,
            )
        })
        .collect();
    s.apply(vec![svc], checks, &[]);
    s
}

fn status(s: &LocalState, id: &str) -> HealthStatus {
    s.check(id).unwrap().check.status
}

/// Lets spawned tasks run to their next wait.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn ttl_expires_unless_updated_and_updates_restart_the_clock() {
    let s = state_with(&[("t", "web", HealthStatus::Critical)]);
    let runner = CheckRunner::new(Arc::clone(&s), CancellationToken::new());
    runner.start(
        "t",
        &CheckKind::Ttl(Duration::from_secs(10)),
        Thresholds::default(),
        false,
    );
    settle().await;
    runner.ttl_update("t", HealthStatus::Passing, "up".into()).unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(status(&s, "t"), HealthStatus::Passing);
    runner
        .ttl_update("t", HealthStatus::Passing, "still up".into())
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(status(&s, "t"), HealthStatus::Passing, "the update restarted the clock");
    tokio::time::sleep(Duration::from_secs(3)).await;
    settle().await;
    assert_eq!(status(&s, "t"), HealthStatus::Critical);
    assert_eq!(s.check("t").unwrap().check.output, "TTL expired");
    // Passing again after expiry, then expiring again.
    runner.ttl_update("t", HealthStatus::Warning, "meh".into()).unwrap();
    settle().await;
    assert_eq!(status(&s, "t"), HealthStatus::Warning);
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(status(&s, "t"), HealthStatus::Critical);
    runner.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn ttl_updates_are_refused_for_other_kinds_and_unknown_ids() {
    let s = state_with(&[
        ("a", "web", HealthStatus::Critical),
        ("t", "web", HealthStatus::Critical),
    ]);
    let runner = CheckRunner::new(Arc::clone(&s), CancellationToken::new());
    runner.start(
        "a",
        &CheckKind::Alias {
            node: String::new(),
            service: "web".into(),
        },
        Thresholds::default(),
        false,
    );
    assert_eq!(
        runner.ttl_update("a", HealthStatus::Passing, String::new()),
        Err(TtlError::NotTtl("a".into()))
    );
    assert_eq!(
        runner.ttl_update("nope", HealthStatus::Passing, String::new()),
        Err(TtlError::NotFound("nope".into()))
    );
    // A stopped check's task ends.
    runner.stop("a");
    assert!(runner.is_empty());
    runner.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn alias_follows_the_worst_check_of_its_service() {
    let s = state_with(&[
        ("own", "web", HealthStatus::Passing),
        ("alias", "proxy", HealthStatus::Critical),
    ]);
    let runner = CheckRunner::new(Arc::clone(&s), CancellationToken::new());
    runner.start(
        "alias",
        &CheckKind::Alias {
            node: String::new(),
            service: "web".into(),
        },
        Thresholds::default(),
        false,
    );
    settle().await;
    assert_eq!(status(&s, "alias"), HealthStatus::Passing);
    s.update_check("own", HealthStatus::Critical, "down".into());
    settle().await;
    assert_eq!(status(&s, "alias"), HealthStatus::Critical);
    assert_eq!(s.check("alias").unwrap().check.output, "Aliased checks critical: own");
    s.update_check("own", HealthStatus::Warning, String::new());
    settle().await;
    assert_eq!(status(&s, "alias"), HealthStatus::Warning);
    s.remove_service("web");
    settle().await;
    runner.shutdown().await;
}

#[test]
fn thresholds_need_consecutive_results() {
    let mut t = Thresholds::new(2, 0, 3);
    assert_eq!(t.observe(HealthStatus::Passing), None);
    assert_eq!(t.observe(HealthStatus::Passing), Some(HealthStatus::Passing));
    assert_eq!(t.observe(HealthStatus::Critical), None);
    assert_eq!(t.observe(HealthStatus::Critical), None);
    assert_eq!(t.observe(HealthStatus::Passing), None, "a success resets the failures");
    assert_eq!(t.observe(HealthStatus::Critical), None);
    assert_eq!(t.observe(HealthStatus::Critical), None);
    assert_eq!(t.observe(HealthStatus::Critical), Some(HealthStatus::Critical));
    let mut warn_first = Thresholds::new(0, 2, 4);
    assert_eq!(warn_first.observe(HealthStatus::Critical), None);
    assert_eq!(warn_first.observe(HealthStatus::Critical), Some(HealthStatus::Warning));
    assert_eq!(warn_first.observe(HealthStatus::Critical), Some(HealthStatus::Warning));
    assert_eq!(warn_first.observe(HealthStatus::Critical), Some(HealthStatus::Critical));
    let mut at_once = Thresholds::default();
    assert_eq!(at_once.observe(HealthStatus::Warning), Some(HealthStatus::Warning));
    assert_eq!(at_once.observe(HealthStatus::Critical), Some(HealthStatus::Critical));
}

#[tokio::test(start_paused = true)]
async fn polled_checks_run_every_interval_through_the_thresholds() {
    // Port 0 can never be connected to: the check fails at once, deterministically.
    let addr = "127.0.0.1:0";
    let s = state_with(&[("tcp", "web", HealthStatus::Passing)]);
    let runner = CheckRunner::new(Arc::clone(&s), CancellationToken::new());
    runner.start(
        "tcp",
        &CheckKind::Tcp {
            addr: addr.to_string(),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
        },
        Thresholds::new(0, 0, 2),
        false,
    );
    // First run (within one interval of stagger): one failure is not enough.
    tokio::time::sleep(Duration::from_secs(10)).await;
    settle().await;
    assert_eq!(status(&s, "tcp"), HealthStatus::Passing);
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(status(&s, "tcp"), HealthStatus::Critical);
    assert!(s.check("tcp").unwrap().check.output.starts_with("dial tcp"));
    runner.shutdown().await;
}

#[tokio::test]
async fn http_check_maps_status_codes() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/ok", get(|| async { "fine" }))
        .route(
            "/busy",
            get(|| async { (axum::http::StatusCode::TOO_MANY_REQUESTS, "slow down") }),
        )
        .route(
            "/bad",
            get(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "broken") }),
        )
        .route("/big", get(|| async { "x".repeat(1 << 20) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server_stop = stop.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { server_stop.cancelled().await })
            .await
    });
    let client = Polled {
        client: reqwest::Client::new(),
        confined: false,
    };
    let http = |path: &str| CheckKind::Http {
        url: format!("http://{addr}{path}"),
        method: "GET".into(),
        header: Default::default(),
        body: String::new(),
        tls_skip_verify: false,
        tls_server_name: String::new(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
    };
    let (st, out) = run_once(&http("/ok"), &client).await;
    assert_eq!(st, HealthStatus::Passing);
    assert!(out.contains("200 OK") && out.ends_with("Output: fine"), "{out}");
    assert_eq!(run_once(&http("/busy"), &client).await.0, HealthStatus::Warning);
    assert_eq!(run_once(&http("/bad"), &client).await.0, HealthStatus::Critical);
    assert_eq!(run_once(&http("/missing"), &client).await.0, HealthStatus::Critical);
    let (st, out) = run_once(&http("/big"), &client).await;
    assert_eq!(st, HealthStatus::Passing);
    assert_eq!(
        out.matches('x').count(),
        MAX_OUTPUT,
        "only the start of a 1 MiB body is kept"
    );
    stop.cancel();
    server.await.unwrap().unwrap();
}

/// A confined check (registered through the API) does not follow a redirect to another
/// origin: the target's answer never reaches its output. Same-origin redirects are followed.
#[tokio::test]
async fn confined_checks_follow_redirects_only_within_their_origin() {
    use axum::routing::get;
    let serve = |app: axum::Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    };
    let secret = serve(axum::Router::new().route("/", get(|| async { "admin secret" }))).await;
    let to_secret = format!("http://{secret}/");
    let own = serve(
        axum::Router::new()
            .route(
                "/away",
                get(move || async move { axum::response::Redirect::temporary(&to_secret) }),
            )
            .route("/here", get(|| async { axum::response::Redirect::temporary("/ok") }))
            .route("/ok", get(|| async { "fine" })),
    )
    .await;
    let http = |path: &str| CheckKind::Http {
        url: format!("http://{own}{path}"),
        method: "GET".into(),
        header: Default::default(),
        body: String::new(),
        tls_skip_verify: false,
        tls_server_name: String::new(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
    };
    let clients = clients::Clients::new();
    let confined = Polled {
        client: clients.pick(false, true),
        confined: true,
    };
    let (st, out) = run_once(&http("/away"), &confined).await;
    assert_eq!(st, HealthStatus::Critical, "{out}");
    assert!(out.contains("307") && !out.contains("admin secret"), "{out}");
    let (st, out) = run_once(&http("/here"), &confined).await;
    assert_eq!(
        (st, out.ends_with("Output: fine")),
        (HealthStatus::Passing, true),
        "{out}"
    );
    // The operator's checks (config files) follow redirects anywhere, as before.
    let free = Polled {
        client: clients.pick(false, false),
        confined: false,
    };
    let (st, out) = run_once(&http("/away"), &free).await;
    assert_eq!(
        (st, out.ends_with("admin secret")),
        (HealthStatus::Passing, true),
        "{out}"
    );
}
