//! Cluster peering between meshd clusters (Consul's cluster peering): independent meshes,
//! each with its own servers, CA and ACLs, export services to each other.
//!
//! - The lifecycle: a cluster generates a token for a peer name ([`Peerings::generate_token`]:
//!   its servers' addresses and a one-time secret); the other establishes with it
//!   ([`Peerings::establish`]: the secret is exchanged for a stream secret over gRPC).
//! - The stream ([`session`]): the establishing cluster's leading server dials ([`dialer`])
//!   and keeps one gRPC stream up to one of the peer's servers ([`acceptor`]); each side
//!   sends what it exports to the other (the `exported-services` entry: services with their
//!   instances, the mesh gateways to reach them through, their SNI, identities and
//!   protocol; its CA roots), only what changed, and writes what it receives into its
//!   catalog (`/v1/health/service/:name?peer=`; sidecars with upstreams naming the peer).
//! - [`Tracker`]: each stream's status on this server (`ACTIVE`, `FAILING`, times).
//!
//! The protocol is meshd's own ([`proto`]), shaped after Consul's.

pub mod acceptor;
pub mod dialer;
pub mod exports;
pub mod grpc;
pub mod proto;
pub mod routes;
pub mod session;
pub mod tls;
pub mod tracker;

pub use session::Context;
pub use tracker::Tracker;

use catalog::{IndexKey, Op, PeeringOp, WriteError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;
use structs::peering::{EstablishRequest, GenerateTokenRequest, Peering, PeeringRemote, PeeringState, PeeringToken};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a peering request failed.
#[derive(Debug, thiserror::Error)]
pub enum PeeringError {
    /// The catalog refused the write (it names the field or the reason).
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The request cannot be served here (it says why).
    #[error("{0}")]
    Invalid(String),
    /// The peer refused (its reason).
    #[error("the peer refused: {0}")]
    Refused(String),
    /// No server of the peer could be reached.
    #[error("cannot reach the peer's servers: {0}")]
    Unreachable(String),
}

/// Peering on one server: the lifecycle's calls, the gRPC service peers call, the dialing
/// of established peerings (on the leader), and the streams' status.
#[derive(Debug)]
pub struct Peerings {
    acceptor: Arc<acceptor::Acceptor>,
    server_cert: tls::ServerCert,
}

impl Peerings {
    /// Peering over `ctx`; everything it starts ends with `stop`.
    pub fn new(ctx: Context, stop: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            acceptor: Arc::new(acceptor::Acceptor {
                ctx,
                tasks: TaskTracker::new(),
                stop,
            }),
            server_cert: tls::ServerCert::default(),
        })
    }

    fn ctx(&self) -> &Context {
        &self.acceptor.ctx
    }

    /// The gRPC service peers call (to add to the server's gRPC listener).
    pub fn grpc_service(&self) -> grpc::PeerStreamServer {
        grpc::PeerStreamServer::new(Arc::clone(&self.acceptor) as Arc<dyn grpc::Handler>)
    }

    /// The name this cluster's servers present to peers.
    pub fn server_name(&self) -> String {
        let trust_domain = self.ctx().store.read().ca_roots().trust_domain;
        format!("server.{}.peering.{trust_domain}", self.ctx().datacenter)
    }

    /// The TLS a connection asking for `server_name` is served with: this cluster's peering
    /// name gets a certificate of its CA (see [`tls`]); any other name, none from here.
    pub fn tls_config_for(&self, server_name: &str) -> Option<Arc<rustls::ServerConfig>> {
        if server_name != self.server_name() {
            return None;
        }
        let state = self.ctx().store.read();
        match self
            .server_cert
            .config(&state, &self.ctx().datacenter, server_name, SystemTime::now())
        {
            Ok(config) => Some(config),
            Err(error) => {
                tracing::warn!(%error, "cannot serve a peer's TLS connection");
                None
            }
        }
    }

    /// `POST /v1/peering/token`: a token for `req.peer_name` (a new peering, or a new
    /// secret for one still waiting to be dialed).
    pub async fn generate_token(&self, req: &GenerateTokenRequest) -> Result<String, PeeringError> {
        req.check().map_err(WriteError::from)?;
        let (server_addresses, through_gateways) = {
            let state = self.ctx().store.read();
            (
                routes::advertised(&state, &*self.ctx().addresses),
                routes::through_gateways(&state),
            )
        };
        if server_addresses.is_empty() && req.server_external_addresses.is_empty() {
            return Err(PeeringError::Invalid(if through_gateways {
                routes::NO_GATEWAY.into()
            } else {
                "this server has no gRPC TLS address a peer could dial (serve -grpc-tls-addr on a routable address, or give ServerExternalAddresses)".into()
            }));
        }
        let new_id = || catalog::ca::new_uuid().map_err(|e| PeeringError::Invalid(e.to_string()));
        let secret = new_id()?;
        self.ctx()
            .store
            .write(Op::Peering(PeeringOp::GenerateToken {
                name: req.peer_name.clone(),
                meta: req.meta.clone(),
                id: new_id()?,
                secret: secret.clone(),
            }))
            .await?;
        let stored = self
            .ctx()
            .store
            .read()
            .peering(&req.peer_name)
            .ok_or_else(|| PeeringError::Invalid("the peering went away".into()))?;
        Ok(PeeringToken {
            ca: exports::trust_bundle(&self.ctx().store.read()).1,
            manual_server_addresses: req.server_external_addresses.clone(),
            server_addresses,
            server_name: self.server_name(),
            peer_id: stored.peering.id.clone(),
            establishment_secret: secret,
            remote: PeeringRemote {
                partition: "default".into(),
                datacenter: self.ctx().datacenter.clone(),
            },
        }
        .encode())
    }

    /// `POST /v1/peering/establish`: the token's secret exchanged with one of the peer's
    /// servers, then the peering stored (and dialed by the leading server).
    pub async fn establish(&self, req: &EstablishRequest) -> Result<(), PeeringError> {
        let token = req.check().map_err(WriteError::from)?;
        if token.server_name == self.server_name() {
            return Err(PeeringError::Invalid(format!(
                "PeeringToken: it was generated by this cluster ({}): a cluster cannot peer with itself",
                token.server_name
            )));
        }
        let peering = Peering {
            id: catalog::ca::new_uuid().map_err(|e| PeeringError::Invalid(e.to_string()))?,
            name: req.peer_name.clone(),
            meta: req.meta.clone(),
            state: PeeringState::Establishing,
            peer_id: token.peer_id.clone(),
            peer_server_name: token.server_name.clone(),
            peer_server_addresses: token.addresses().to_vec(),
            peer_ca_pems: token.ca.clone(),
            remote: token.remote.clone(),
            ..Peering::default()
        };
        // Conflicts are refused before the token's one-time secret is spent.
        let write = |stream_secret: String| {
            Op::Peering(PeeringOp::Establish {
                peering: Box::new(peering.clone()),
                stream_secret,
            })
        };
        self.ctx().store.dry_run(&write(String::new()))?;
        let secret = if routes::through_gateways(&self.ctx().store.read()) {
            self.exchange_through_gateways(&token, &peering.name, write(String::new()))
                .await?
        } else {
            exchange(&token, token.addresses()).await?
        };
        self.ctx().store.write(write(secret)).await?;
        Ok(())
    }

    /// The exchange through this cluster's mesh gateways: the peering is stored first
    /// (without a secret: nothing dials it yet) so the gateways learn to route the peer's
    /// server name, then the exchange is tried through them for a few seconds. A new
    /// peering whose exchange failed is removed again.
    async fn exchange_through_gateways(
        &self,
        token: &PeeringToken,
        name: &str,
        stored: Op,
    ) -> Result<String, PeeringError> {
        let existed = self.ctx().store.read().peering(name).is_some();
        self.ctx().store.write(stored).await?;
        let deadline = tokio::time::Instant::now() + EXCHANGE_THROUGH_GATEWAYS;
        let result = loop {
            let gateways = routes::dial_addresses(&self.ctx().store.read(), &[]).map_err(PeeringError::Invalid);
            let result = match gateways {
                Ok(gateways) => exchange(token, &gateways).await,
                Err(e) => Err(e),
            };
            match result {
                Err(PeeringError::Unreachable(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                }
                other => break other,
            }
        };
        if result.is_err() && !existed {
            let remove = Op::Peering(PeeringOp::Remove { name: name.to_owned() });
            if let Err(error) = self.ctx().store.write(remove).await {
                tracing::warn!(peer = %name, %error, "cannot remove a peering whose establish failed");
            }
        }
        result
    }

    /// `DELETE /v1/peering/:name`: marks the peering deleted; the peer is told and what it
    /// exported removed, then the peering goes.
    pub async fn delete(&self, name: &str) -> Result<(), PeeringError> {
        self.ctx()
            .store
            .write(Op::Peering(PeeringOp::Delete {
                name: name.to_owned(),
                now: SystemTime::now(),
            }))
            .await?;
        Ok(())
    }

    /// A peering as the API shows it: the stored one with this server's view of its
    /// stream, and the services it imports.
    pub fn shown(&self, state: &catalog::State, mut peering: Peering) -> Peering {
        self.ctx().tracker.overlay(&mut peering);
        peering.stream_status.imported_services =
            state.imported_services(&peering.name).map(|s| s.name.clone()).collect();
        peering.imported_service_count = peering.stream_status.imported_services.len() as u64;
        peering.stream_status.exported_services = exports::exported_names(state, &peering.name);
        peering.exported_service_count = peering.stream_status.exported_services.len() as u64;
        peering
    }

    /// Dials the peerings this cluster established, while `leading`, and removes deleted
    /// peerings once their streams told the peer; until the `stop` given to [`Peerings::new`].
    pub async fn run(self: Arc<Self>, mut leading: watch::Receiver<bool>) {
        let ctx = self.ctx().clone();
        let stop = self.acceptor.stop.clone();
        let mut dialing: HashMap<String, CancellationToken> = HashMap::new();
        let Some(mut peerings) = ctx.store.index_receiver(&IndexKey::Peerings) else {
            return;
        };
        let mut streams = ctx.tracker.subscribe();
        let mut servers = ctx.addresses_changed.clone();
        // A closed channel keeps its last value (a lone server leads for good).
        let mut followed = true;
        loop {
            let lead = *leading.borrow_and_update();
            if lead {
                self.publish_servers().await;
                self.reconcile(&mut dialing).await;
            } else {
                for (_, token) in dialing.drain() {
                    token.cancel();
                }
            }
            tokio::select! {
                () = stop.cancelled() => break,
                r = leading.changed(), if followed => followed = r.is_ok(),
                r = peerings.changed() => if r.is_err() { break },
                r = streams.changed() => if r.is_err() { break },
                r = async { servers.as_mut()?.changed().await.ok() }, if servers.is_some() => {
                    if r.is_none() {
                        servers = None;
                    }
                }
            }
        }
        for (_, token) in dialing.drain() {
            token.cancel();
        }
        self.acceptor.tasks.close();
        self.acceptor.tasks.wait().await;
    }

    /// Writes this cluster's servers' peering addresses where its mesh gateways read them
    /// (the leader, when they changed).
    async fn publish_servers(&self) {
        let addresses = (self.ctx().addresses)();
        if self.ctx().store.read().peering_servers() == addresses.as_slice() {
            return;
        }
        let op = Op::Peering(PeeringOp::LocalServers { addresses });
        if let Err(error) = self.ctx().store.write(op).await {
            tracing::warn!(%error, "cannot record the servers' peering addresses; retrying on the next change");
        }
    }

    /// Starts and stops dial tasks to match the catalog; removes deleted peerings no stream
    /// here still tells.
    async fn reconcile(&self, dialing: &mut HashMap<String, CancellationToken>) {
        let ctx = self.ctx();
        let state = ctx.store.read();
        // A deleted peering's stream ends by itself once it has told the peer (cancelling it
        // first would leave the peer unaware).
        dialing.retain(|name, token| {
            let keep = !token.is_cancelled()
                && state
                    .peering(name)
                    .is_some_and(|p| dialer::dials(&p) || p.peering.state == PeeringState::Deleting);
            if !keep {
                token.cancel();
            }
            keep
        });
        let mut deleted = Vec::new();
        for stored in state.peerings() {
            let name = &stored.peering.name;
            if stored.peering.state == PeeringState::Deleting {
                if !ctx.tracker.is_connected(name) {
                    deleted.push(name.clone());
                }
                continue;
            }
            if dialer::dials(stored) && !dialing.contains_key(name) {
                let token = self.acceptor.stop.child_token();
                dialing.insert(name.clone(), token.clone());
                self.acceptor.tasks.spawn(dialer::run(ctx.clone(), name.clone(), token));
            }
        }
        drop(state);
        for name in deleted {
            match ctx
                .store
                .write(Op::Peering(PeeringOp::Remove { name: name.clone() }))
                .await
            {
                Ok(_) => {
                    ctx.tracker.forget(&name);
                    tracing::info!(peer = %name, "peering deleted");
                }
                Err(error) => tracing::warn!(peer = %name, %error, "cannot remove a deleted peering; retrying"),
            }
        }
    }
}

/// How long an establish through the mesh gateways tries the exchange (the gateways learn
/// the route to the peer's servers meanwhile).
const EXCHANGE_THROUGH_GATEWAYS: std::time::Duration = std::time::Duration::from_secs(5);

/// Exchanges the token's secret at the first of `addresses` that answers (the token's
/// servers, or this cluster's mesh gateways).
async fn exchange(token: &PeeringToken, addresses: &[String]) -> Result<String, PeeringError> {
    let mut failures = Vec::new();
    let tls = tls::DialTls {
        ca_pems: token.ca.clone(),
        server_name: token.server_name.clone(),
    };
    for address in addresses {
        let mut client = match grpc::connect(address, &tls).await {
            Ok(c) => c,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let request = proto::ExchangeSecretRequest {
            peer_id: token.peer_id.clone(),
            establishment_secret: token.establishment_secret.clone(),
        };
        match grpc::exchange(&mut client, request).await {
            Ok(response) => return Ok(response.stream_secret),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::PermissionDenied | tonic::Code::NotFound | tonic::Code::InvalidArgument
                ) =>
            {
                return Err(PeeringError::Refused(status.message().to_owned()));
            }
            Err(status) => failures.push(format!("{address}: {}", status.message())),
        }
    }
    Err(PeeringError::Unreachable(failures.join("; ")))
}
