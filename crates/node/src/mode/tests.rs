//! The drain against a mode whose last step never finishes: the grace deadline ends it.

use super::*;
use acl::{BoxFuture, ResolveError, Resolved, Token, TokenResolver};

/// ACLs off: everything may do everything.
struct Open;

impl TokenResolver for Open {
    fn enabled(&self) -> bool {
        false
    }

    fn resolve(&self, _: Option<&Token>) -> BoxFuture<'_, Result<Resolved, ResolveError>> {
        Box::pin(std::future::ready(Err(ResolveError::Unavailable(
            "not in this test".into(),
        ))))
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

/// Registers no proxy.
struct NoProxies;

impl SnapshotSource for NoProxies {
    fn watch(
        &self,
        _: &proxycfg::ProxyRequest<'_>,
    ) -> Result<(proxycfg::Watcher, proxycfg::SourceLease), proxycfg::SourceError> {
        Err(proxycfg::SourceError::NotFound("none here".into()))
    }
}

impl ConfigSource for NoProxies {
    fn shutdown(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

/// A catalog with nothing in it.
struct NoNames;

#[async_trait::async_trait]
impl dns::Catalog for NoNames {
    async fn service_nodes(&self, _: &str, _: dns::Wanted) -> Result<Vec<dns::Instance>, dns::LookupError> {
        Ok(Vec::new())
    }
    async fn node(&self, _: &str) -> Result<Option<structs::Node>, dns::LookupError> {
        Ok(None)
    }
    async fn prepared_query(&self, _: &str) -> Result<Option<Vec<dns::Instance>>, dns::LookupError> {
        Ok(None)
    }
}

/// A mode whose `engine_stopped` never returns (a leave that hangs, say).
struct Stuck(proxycfg::fake::FakeDataSources);

#[async_trait::async_trait]
impl Mode for Stuck {
    fn name(&self) -> &'static str {
        "test"
    }
    fn node_name(&self) -> String {
        "n1".into()
    }
    fn manager_config(&self) -> ManagerConfig {
        ManagerConfig::default()
    }
    fn data_sources(&self) -> DataSources {
        self.0.data_sources()
    }
    fn tokens(&self) -> Tokens {
        Arc::new(Open)
    }
    fn config_source(&self, _: &Manager) -> Arc<dyn ConfigSource> {
        Arc::new(NoProxies)
    }
    fn routes(&self, _: &Engine) -> axum::Router {
        axum::Router::new()
    }
    fn dns_catalog(&self) -> Arc<dyn dns::Catalog> {
        Arc::new(NoNames)
    }
    fn spawn(&self, _: &Engine, _: &TaskTracker, _: CancellationToken) {}
    async fn engine_stopped(&self) {
        std::future::pending::<()>().await;
    }
}

#[tokio::test]
async fn a_drain_that_does_not_finish_ends_at_the_grace_deadline() {
    let listeners = bind(Listeners {
        http: Some("127.0.0.1:0".parse().unwrap()),
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        tls: TlsArgs::default(),
        http_max_conns_per_client: 0,
        http_versions: crate::http_serve::Versions::Http1And2,
        admission: crate::engine::admission(10, 10),
        dns: Some(("127.0.0.1:0".parse().unwrap(), dns::Config::new("dc1"))),
        grpc_tls_own_names: false,
    })
    .await
    .unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mode = Stuck(proxycfg::fake::FakeDataSources::with_defaults(
        "11111111-2222-3333-4444-555555555555.consul",
    ));
    let served = tokio::spawn(serve_with_grace(
        listeners,
        mode,
        async move {
            let _ = ready_rx.await;
        },
        |bound: &Bound| assert!(bound.http_addr.is_some() && bound.grpc_addr.is_some()),
        Duration::from_millis(300),
    ));
    // The shutdown starts at once; the mode's stuck step holds the drain until the deadline.
    ready_tx.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("the drain outlived its grace deadline")
        .unwrap();
    let error = result.unwrap_err().to_string();
    assert!(error.contains("did not finish within"), "{error}");
}
