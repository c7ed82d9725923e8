//! Several servers over etcd: writes go through the leader, as Consul's servers forward
//! writes to theirs.
//!
//! Any server can commit a write (etcd orders them), but servers writing at once conflict on
//! the catalog's write guard and plan their batches again, so the throughput of three
//! writing servers is below that of one. A follower therefore hands a write request
//! (`PUT`, `POST`, `DELETE` under `/v1/`) to the leader over HTTP as `http_kit::relay`
//! relays one (its end-to-end headers, the token among them, and its body), and answers
//! with the leader's answer once its own state has applied what the leader had then (so a
//! client reads its write back from the server it wrote to). The leader marks what it
//! applied in `X-Meshd-Applied`.
//!
//! Reads are never forwarded. A request already forwarded is served where it lands (no
//! loops while leadership moves). When the leader cannot be reached at all, the follower
//! serves the write itself: every server can, the write guard keeps it correct.

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use catalog::Store;
use http_kit::relay::{self, Outgoing};
use std::sync::Arc;
use std::time::Duration;
use structs::Index;
use tracing::{debug, warn};

/// Marks a request a server forwarded (its value: the forwarding server's name).
const FORWARDED: &str = "x-meshd-forwarded";
/// On a forwarded write's answer: the index the leader had applied after it (read here, not
/// passed on).
const APPLIED: &str = "x-meshd-applied";

/// What the forwarding layer needs.
pub(crate) struct Forwarder {
    store: Store,
    client: reqwest::Client,
    max_body: usize,
    /// Knows this process's own tokens (its agent's), which no other server would accept.
    acl: Arc<catalog::acl::Resolver>,
}

impl Forwarder {
    /// Forwards for `store` (a no-op layer when the store has no cluster).
    pub(crate) fn new(store: Store, max_body: usize, acl: Arc<catalog::acl::Resolver>) -> Arc<Self> {
        Arc::new(Self {
            acl,
            store,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
            max_body,
        })
    }
}

fn is_write(method: &Method) -> bool {
    matches!(*method, Method::PUT | Method::POST | Method::DELETE | Method::PATCH)
}

/// The middleware (see the module docs).
pub(crate) async fn forward_writes(State(fwd): State<Arc<Forwarder>>, req: Request, next: Next) -> Response {
    let Some(cluster) = fwd.store.cluster() else {
        return next.run(req).await;
    };
    if req.headers().contains_key(FORWARDED) {
        // Served here; say what this server had applied after it.
        let mut resp = next.run(req).await;
        if let Ok(v) = HeaderValue::from_str(&fwd.store.read().index.0.to_string()) {
            resp.headers_mut().insert(HeaderName::from_static(APPLIED), v);
        }
        return resp;
    }
    // A snapshot restore is served where it lands: any server can write it (see
    // `catalog_etcd`), and its body is larger than a write's.
    let path = req.uri().path();
    if !is_write(req.method())
        || !path.starts_with("/v1/")
        || path == "/v1/snapshot"
        || http_kit::node_local(path)
        || *cluster.leading().borrow()
    {
        return next.run(req).await;
    }
    // This server's own agent writes with a token only this process knows: served here,
    // as a write is when the leader cannot be reached (any server may write the store).
    let params = http_kit::Params::parse(req.uri().query());
    if http_kit::token(req.headers(), &params).is_some_and(|t| fwd.acl.is_internal(&t)) {
        return next.run(req).await;
    }
    let Some(leader) = cluster.status().leader.filter(|l| l.name != cluster.me().name) else {
        return next.run(req).await;
    };
    let out = match Outgoing::read(req, fwd.max_body).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    let sent = out
        .to(&fwd.client, &format!("http://{}", leader.address))
        .header(FORWARDED, cluster.me().name.as_str())
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) if e.is_connect() => {
            debug!(leader = %leader.address, error = %e, "the leader cannot be reached: serving the write here");
            return next.run(out.into_request()).await;
        }
        Err(e) => {
            warn!(leader = %leader.address, error = %e, "forwarding a write to the leader failed");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "forwarding the write to the leader {} failed (it may or may not be applied): {e}\n",
                    leader.address
                ),
            )
                .into_response();
        }
    };
    let mut resp = match relay::answer(answer).await {
        Ok(resp) => resp,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the leader's answer failed (the write may or may not be applied): {e}\n"),
            )
                .into_response();
        }
    };
    if let Some(applied) = resp
        .headers_mut()
        .remove(APPLIED)
        .and_then(|v| v.to_str().ok().and_then(|v| v.parse().ok()))
        && !fwd.store.wait_applied(Index(applied), Duration::from_secs(5)).await
    {
        warn!(
            applied,
            "a forwarded write is not yet visible here: the etcd watch is behind"
        );
    }
    resp
}
