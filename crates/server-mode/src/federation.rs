//! Several datacenters, the server's side: keeping this datacenter's federation state (its
//! servers and mesh gateways) current, sending it to the primary datacenter and copying the
//! primary's list of every datacenter (`catalog::federation` holds the states, the HTTP API
//! serves them), and forwarding a request that names another datacenter (`?dc=`) to a server of it.
//!
//! A secondary's server finds the primary through `-retry-join-wan` (any federated server:
//! each lists every datacenter's servers), sends its state there, then follows the primary's
//! list with a blocking query. It sends its state again whenever it changes and whenever the
//! list it gets back lacks it (the primary restarted and lost it). Failures are retried with
//! back-off and logged once per outage, not per attempt.

use crate::peer::{FORWARDED_DC, Peer, RETRY};
use crate::replication::Replicator;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use catalog::federation::Federation;
use catalog::{IndexKey, Store};
use http_kit::relay::{self, Outgoing};
use std::sync::Arc;
use std::time::Duration;
use structs::ServiceKind;
use structs::federation::FederationState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What the server's federation work needs.
pub(crate) struct Link {
    pub(crate) fed: Arc<Federation>,
    pub(crate) store: Store,
    /// This server's HTTP API address as other datacenters reach it.
    pub(crate) advertise: String,
    /// Servers of other datacenters to join through (`-retry-join-wan`).
    pub(crate) join: Vec<String>,
    pub(crate) peer: Peer,
    /// A secondary's copies of the primary's config entries and ACL system.
    pub(crate) replicator: Option<Arc<Replicator>>,
}

/// This datacenter's state as `store` and `advertise` say: its servers (this one first, as
/// `advertise` says; the others sharing its store as they report themselves), and every
/// mesh gateway instance with its health.
fn own_state(fed: &Federation, store: &Store, advertise: &str) -> FederationState {
    let mut servers = vec![advertise.to_owned()];
    if let Some(cluster) = store.cluster() {
        let me = &cluster.me().name;
        servers.extend(
            cluster
                .status()
                .servers
                .into_iter()
                .filter(|s| s.name != *me && !s.address.is_empty())
                .map(|s| s.address),
        );
    }
    let state = store.read();
    let mut names: Vec<&str> = state
        .all_services()
        .filter(|(_, s)| s.kind == ServiceKind::MeshGateway)
        .map(|(_, s)| s.service.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mesh_gateways = names.into_iter().flat_map(|n| state.health(n, false)).collect();
    FederationState {
        datacenter: fed.local().to_owned(),
        mesh_gateways,
        servers,
        updated_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }
}

impl Link {
    /// Runs until `stop`: the own state kept current, then sent (primary: kept here) and the
    /// primary's list followed (secondary).
    pub(crate) async fn run(self, stop: CancellationToken) {
        let own = watch::Sender::new(own_state(&self.fed, &self.store, &self.advertise));
        let follow = self.follow_own(&own, &stop);
        let share = async {
            if self.fed.is_primary() {
                self.keep_own(own.subscribe()).await;
            } else {
                let replicate = async {
                    if let Some(replicator) = &self.replicator {
                        replicator.run().await;
                    }
                };
                tokio::join!(self.secondary(own.subscribe()), self.follow_ca(), replicate);
            }
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = follow => {}
            () = share => {}
        }
    }

    /// Recomputes the own state after every change of the service list or of a mesh
    /// gateway's instances and checks (not on every check of the datacenter: with
    /// thousands of services, that would be a scan per write).
    async fn follow_own(&self, own: &watch::Sender<FederationState>, stop: &CancellationToken) {
        let mut followed: Vec<(IndexKey, structs::Index)> = vec![(IndexKey::Services, structs::Index(0))];
        loop {
            let state = tokio::select! {
                () = stop.cancelled() => return,
                s = first_change(&self.store, &followed, Duration::from_secs(60)) => s,
            };
            if followed.iter().all(|(key, index)| state.index_of(key) == *index) {
                // Nothing moved: the wait ran out, or the store answers waits at once while
                // the server drains. Look again a second later, not in a tight loop.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            let next = own_state(&self.fed, &self.store, &self.advertise);
            let mut gateways: Vec<&str> = next.mesh_gateways.iter().map(|n| n.service.service.as_str()).collect();
            gateways.dedup();
            followed = std::iter::once(IndexKey::Services)
                .chain(gateways.into_iter().map(|name| IndexKey::Service(name.to_owned())))
                .map(|key| {
                    let index = state.index_of(&key);
                    (key, index)
                })
                .collect();
            own.send_if_modified(|now| {
                let changed = !now.same_as(&next);
                if changed {
                    *now = next;
                }
                changed
            });
        }
    }

    /// The primary keeps its own state in its list.
    async fn keep_own(&self, mut own: watch::Receiver<FederationState>) {
        loop {
            self.fed.put(own.borrow_and_update().clone());
            if own.changed().await.is_err() {
                return;
            }
        }
    }

    /// A secondary: its state sent to the primary, the primary's list followed.
    async fn secondary(&self, mut own: watch::Receiver<FederationState>) {
        let (mut failures, mut failing) = (0u32, false);
        loop {
            tokio::time::sleep(RETRY.delay(failures + 1)).await;
            self.fed.put(own.borrow_and_update().clone());
            match self.link_once(&mut own).await {
                Ok(()) => {
                    if failing {
                        info!(primary = %self.fed.primary(), "linked to the primary datacenter again");
                    }
                    (failures, failing) = (0, false);
                }
                Err(e) => {
                    if !failing {
                        warn!(primary = %self.fed.primary(), error = %e, "cannot reach the primary datacenter; retrying");
                    }
                    (failures, failing) = (failures.saturating_add(1), true);
                }
            }
        }
    }

    /// One link to the primary: found, told this datacenter's state, followed until the
    /// state changes (`Ok`: send again) or the primary fails (`Err`). The primary's servers
    /// are those of the list held here, then, when none of them answers (a primary that
    /// moved), those a server of `-retry-join-wan` knows.
    async fn link_once(&self, own: &mut watch::Receiver<FederationState>) -> Result<(), String> {
        let mut last = format!("no server of the primary datacenter {:?} is known", self.fed.primary());
        for discover in [false, true] {
            let primary = if discover {
                self.discover().await?
            } else {
                self.fed.servers_of(self.fed.primary())
            };
            // Every primary server is told (each holds the states it was sent), then one
            // that took it is followed.
            let state = own.borrow().clone();
            let mut told = None;
            for server in &primary {
                match self.announce(server, &state).await {
                    Ok(()) => told = told.or(Some(server)),
                    Err(e) => last = e,
                }
            }
            if let Some(server) = told {
                return self.follow(server, own).await;
            }
        }
        Err(last)
    }

    /// The primary's servers as the first server of `-retry-join-wan` that answers knows
    /// them (its list is copied here).
    async fn discover(&self) -> Result<Vec<String>, String> {
        let mut last = format!("-retry-join-wan names no server (primary {:?})", self.fed.primary());
        for server in &self.join {
            match self.list(server, None).await {
                Ok((states, _)) => {
                    self.fed.replace(states);
                    let found = self.fed.servers_of(self.fed.primary());
                    if !found.is_empty() {
                        return Ok(found);
                    }
                    last = format!(
                        "{server} does not know the primary datacenter {:?} yet",
                        self.fed.primary()
                    );
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn announce(&self, server: &str, state: &FederationState) -> Result<(), String> {
        let req = self
            .peer
            .request(
                reqwest::Method::PUT,
                format!("{}/v1/internal/federation-state", Peer::base(server)),
            )
            .json(state)
            .timeout(Duration::from_secs(10));
        Peer::call::<serde_json::Value>(server, req, "sending this datacenter's state")
            .await
            .map(drop)
    }

    /// The list `server` holds, and its index; with `after`, once it passes it.
    async fn list(&self, server: &str, after: Option<u64>) -> Result<(Vec<FederationState>, u64), String> {
        let req = self.peer.get(server, "/v1/internal/federation-states", after);
        let answered = Peer::call(server, req, "reading the federation states").await?;
        Ok((answered.value, answered.index))
    }

    /// Follows the primary's list at `server` until this datacenter's state changes or the
    /// list lacks it (`Ok`), or the primary fails (`Err`).
    async fn follow(&self, server: &str, own: &mut watch::Receiver<FederationState>) -> Result<(), String> {
        let mut index = 0;
        loop {
            let listed = tokio::select! {
                r = self.list(server, Some(index)) => r?,
                _ = own.changed() => return Ok(()),
            };
            let (states, next) = listed;
            let has_own = states.iter().any(|s| s.datacenter == self.fed.local());
            self.fed.replace(states);
            if !has_own {
                return Ok(());
            }
            // An index that went backwards: the primary restarted (its states are soft). One
            // that did not move: the wait ran out; this datacenter's state is sent again to
            // every primary server (one that restarted alone learns it so, within a wait).
            if next <= index {
                return Ok(());
            }
            index = next;
        }
    }
}

impl Link {
    /// A secondary's CA follows the primary's: its roots followed (a blocking query), and a
    /// new intermediate asked for whenever the active root is not the one that signed this
    /// datacenter's (first link, rotation in the primary). Leaves signed by the previous
    /// intermediate stay trusted while the primary keeps its root in the bundle.
    async fn follow_ca(&self) {
        let (mut failures, mut failing, mut index) = (0u32, false, 0u64);
        loop {
            tokio::time::sleep(RETRY.delay(failures + 1)).await;
            match self.ca_once(&mut index).await {
                Ok(()) => {
                    if failing {
                        info!(primary = %self.fed.primary(), "this datacenter's CA follows the primary's again");
                    }
                    (failures, failing) = (0, false);
                }
                Err(e) => {
                    if !failing {
                        warn!(primary = %self.fed.primary(), error = %e, "cannot follow the primary datacenter's CA; retrying");
                    }
                    (failures, failing) = (failures.saturating_add(1), true);
                }
            }
        }
    }

    /// One round: the primary's roots once they pass `index`, then this CA made to follow
    /// them.
    async fn ca_once(&self, index: &mut u64) -> Result<(), String> {
        let servers = self.fed.servers_known(self.fed.primary()).await;
        let mut last = format!(
            "no server of the primary datacenter {:?} is known yet",
            self.fed.primary()
        );
        for server in &servers {
            let req = self.peer.get(server, "/v1/connect/ca/roots", Some(*index));
            let (roots, next) = match Peer::call::<structs::IndexedCaRoots>(server, req, "reading the CA roots").await {
                Ok(answer) => (answer.value, answer.index),
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            self.adopt(server, roots).await?;
            *index = next;
            return Ok(());
        }
        Err(last)
    }

    /// Makes this datacenter's CA follow the primary's `roots`, asking `server` for a new
    /// intermediate when the current one was not signed by their active root.
    async fn adopt(&self, server: &str, roots: structs::IndexedCaRoots) -> Result<(), String> {
        let active = roots.active().ok_or("the primary's CA has no active root")?.id.clone();
        let current = self.store.read().ca();
        let kept = current
            .as_ref()
            .filter(|c| c.trust_domain() == roots.trust_domain)
            .and_then(|c| c.intermediate.clone())
            .filter(|i| i.root_id == active);
        let intermediate = match kept {
            Some(i) => i,
            None => {
                let config = current.map(|c| c.config.clone()).unwrap_or_default();
                let (csr, key) =
                    catalog::ca::intermediate_csr(&roots.trust_domain, &config).map_err(|e| e.to_string())?;
                let (cert_pem, root_id) = self.signed(server, &csr).await?;
                info!(root = %root_id, "the primary signed this datacenter's intermediate");
                catalog::ca::Intermediate {
                    cert_pem,
                    private_key_pem: key,
                    root_id,
                }
            }
        };
        let op = catalog::Op::CaFollowPrimary {
            roots: Box::new(roots),
            intermediate,
        };
        self.store
            .write(op)
            .await
            .map(drop)
            .map_err(|e| format!("storing the CA: {e}"))
    }

    /// The intermediate `server` signs for `csr`: its PEM and the id of the root that signed.
    async fn signed(&self, server: &str, csr: &str) -> Result<(String, String), String> {
        let req = self
            .peer
            .request(
                reqwest::Method::PUT,
                format!("{}/v1/internal/ca/intermediate", Peer::base(server)),
            )
            .json(&serde_json::json!({ "CSR": csr }))
            .timeout(Duration::from_secs(10));
        let answer = Peer::call::<serde_json::Value>(server, req, "asking for this datacenter's intermediate")
            .await?
            .value;
        match (answer["CertPEM"].as_str(), answer["RootID"].as_str()) {
            (Some(cert), Some(root)) if !cert.is_empty() => Ok((cert.to_owned(), root.to_owned())),
            _ => Err(format!("{server} answered no intermediate: {answer}")),
        }
    }
}

/// The state once any of `followed`'s keys passes its index (or `wait` is over).
async fn first_change(store: &Store, followed: &[(IndexKey, structs::Index)], wait: Duration) -> Arc<catalog::State> {
    let mut waits: Vec<_> = followed
        .iter()
        .map(|(key, index)| Box::pin(store.wait(key, *index, wait)))
        .collect();
    std::future::poll_fn(|cx| {
        for w in &mut waits {
            if let std::task::Poll::Ready(state) = w.as_mut().poll(cx) {
                return std::task::Poll::Ready(state);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Forwards a request naming another datacenter this server knows (`?dc=`) to one of its
/// servers, and relays the answer. Unknown datacenters are answered here (Consul's 500 "No
/// path to datacenter"); a request already forwarded is served where it lands.
pub(crate) async fn forward_dc(State(fwd): State<Arc<DcForwarder>>, req: Request, next: Next) -> Response {
    let Some(dc) = other_dc(&req, fwd.fed.local()) else {
        if let Some(replicator) = &fwd.replicator
            && let Some(what) = crate::replication::replicated_write(&req, replicator.acl())
        {
            return replicator.write_in_primary(what, req, fwd.max_body, next).await;
        }
        return next.run(req).await;
    };
    let servers = fwd.fed.servers_of(&dc);
    if servers.is_empty() || req.headers().contains_key(FORWARDED_DC) {
        return next.run(req).await;
    }
    // Blocking queries wait at the other end: the relay waits as long, and a little more.
    let timeout = http_kit::Params::parse(req.uri().query())
        .blocking()
        .ok()
        .filter(|b| b.index.is_some())
        .map_or(Duration::from_secs(30), |b| b.wait + Duration::from_secs(30));
    let out = match Outgoing::read(req, fwd.max_body).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    let mut last = String::new();
    for server in &servers {
        let mut relayed = out.to(&fwd.client, &Peer::base(server)).timeout(timeout);
        if let Ok(v) = HeaderValue::from_str(fwd.fed.local()) {
            relayed = relayed.header(FORWARDED_DC, v);
        }
        match relayed.send().await {
            Ok(resp) => match relay::answer(resp).await {
                Ok(resp) => return resp,
                Err(e) => last = format!("{server}: {e}"),
            },
            Err(e) => last = format!("{server}: {e}"),
        }
    }
    (
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        format!("No path to datacenter {dc:?}: no server of it answered ({last})"),
    )
        .into_response()
}

/// The datacenter `?dc=` names, when it is not `local`.
fn other_dc(req: &Request, local: &str) -> Option<String> {
    if http_kit::node_local(req.uri().path()) {
        return None;
    }
    let query = req.uri().query().filter(|q| q.contains("dc="))?;
    let params = http_kit::Params::parse(Some(query));
    params
        .get("dc")
        .filter(|dc| !dc.is_empty() && *dc != local)
        .map(str::to_owned)
}

/// What the forwarding layer needs.
pub(crate) struct DcForwarder {
    pub(crate) fed: Arc<Federation>,
    /// A secondary's: its writes of what the primary replicates go there.
    pub(crate) replicator: Option<Arc<Replicator>>,
    pub(crate) client: reqwest::Client,
    pub(crate) max_body: usize,
}
