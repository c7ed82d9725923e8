//! `meshd server` as a [`node::Mode`]: the catalog store (embedded log, in memory, or etcd),
//! the Consul HTTP API over it, the proxy config engine over the catalog's event publisher,
//! ACLs resolved against the store, and the leader's and every server's background work —
//! node liveness, CA root pruning, xDS stream balancing between servers over etcd — with
//! writes forwarded to the leader.

mod args;
mod balance;
mod dns;
mod dry_run;
mod error;
mod federation;
mod flag_files;
mod forward;
mod own_agent;
mod peer;
mod replication;
mod self_registration;
mod store;

pub use args::ServerArgs;
pub use error::ServerError;

use catalog::acl::{AclSettings, Resolver};
use catalog::{Store, StoreTokens};
use node::authz::Tokens;
use node::{Bound, Engine, Listeners, Mode};
use proxycfg::{ConfigSource, DataSources, Manager, ManagerConfig};
use proxycfg_sources::CatalogSource;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info_span};
use xds::XdsServer;

/// Runs a server until `shutdown` completes: xDS streams end, in-flight HTTP requests
/// finish, the store closes. `on_ready` is called once every listener serves.
pub async fn run(
    args: ServerArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Bound),
) -> Result<(), ServerError> {
    let listeners = node::bind(Listeners {
        http: args.http_addr.0,
        grpc: args.grpc_addr.0,
        tls: args.tls.clone(),
        http_max_conns_per_client: args.http_max_conns_per_client,
        http_versions: node::http_serve::Versions::Http1And2,
        admission: node::engine::admission(args.xds_max_streams, args.xds_setup_rate),
        dns: args.dns.dns_addr.0.map(|a| (a, args.dns.config(&args.datacenter))),
        // The peering name is served with the CA's certificate (no -tls-cert-file needed).
        grpc_tls_own_names: true,
    })
    .await
    .map_err(ServerError::Node)?;
    check_listeners(&args, listeners.tls().server.is_some())?;
    let bound = listeners.bound;
    // What this server is known by: its plain listeners, else its TLS ones.
    let api_addr = bound.http_addr.or(bound.https_addr).unwrap_or_else(unspecified);
    let own_api = own_agent::OwnApi {
        addr: api_addr,
        https: bound.http_addr.is_none(),
    };
    let xds_addr = bound.grpc_addr.or(bound.grpc_tls_addr).unwrap_or_else(unspecified);
    let store = store::open(&args, api_addr, xds_addr, bound.grpc_tls_addr).await?;
    let mode = ServerMode::start(args, store, own_api, bound.grpc_tls_addr)
        .await?
        .with_ports(bound.ports());
    node::serve(listeners, mode, shutdown, on_ready)
        .await
        .map_err(ServerError::Node)
}

/// How a server reaches other datacenters and is reached by them.
struct WanSettings {
    /// Its API as they reach it (`-advertise-wan`).
    advertise: String,
    /// The token it presents to them.
    token: Option<structs::Token>,
    /// The CA (PEM) that verifies their HTTPS (`-tls-ca-file`).
    ca_pem: Option<Vec<u8>>,
}

/// The [`WanSettings`] of a server with `args` whose API is at `api_addr`. A server outside
/// the primary datacenter needs a server to join through.
fn federation_settings(args: &ServerArgs, api_addr: SocketAddr) -> Result<WanSettings, ServerError> {
    let primary = args
        .primary_datacenter
        .clone()
        .unwrap_or_else(|| args.datacenter.clone());
    if primary != args.datacenter && args.retry_join_wan.is_empty() {
        return Err(ServerError::Flags(format!(
            "-primary-datacenter {primary} needs -retry-join-wan ADDR (a server of another datacenter to join through)"
        )));
    }
    let advertise = args.advertise_wan.clone().unwrap_or_else(|| api_addr.to_string());
    let federated = primary != args.datacenter || !args.retry_join_wan.is_empty();
    if federated && args.http_addr.0.is_none() && !advertise.starts_with("https://") {
        return Err(ServerError::Flags(format!(
            "-http-addr off needs -advertise-wan https://HOST:PORT on a federated server: servers of other \
             datacenters call its API (federation states, replication, ?dc= requests), and {advertise} is not its \
             plain HTTP API"
        )));
    }
    if federated && args.advertise_wan.is_none() && api_addr.ip().is_unspecified() {
        return Err(ServerError::Flags(format!(
            "-advertise-wan ADDR is needed: the API listens on {api_addr}, which other datacenters cannot dial"
        )));
    }
    let check = structs::federation::FederationState {
        datacenter: args.datacenter.clone(),
        servers: vec![advertise.clone()],
        ..Default::default()
    };
    check.check().map_err(|e| {
        ServerError::Flags(format!(
            "-advertise-wan {advertise:?}: {}",
            e.trim_start_matches("Servers[0]: ")
        ))
    })?;
    let ca_pem = args
        .tls
        .ca_file
        .as_deref()
        .map(|p| flag_files::read("-tls-ca-file", p))
        .transpose()?;
    let token = match &args.acl_replication_token_file {
        None => None,
        Some(p) => structs::Token::new(
            std::fs::read_to_string(p)
                .map_err(|e| {
                    ServerError::Flags(format!("-acl-replication-token-file: cannot read {}: {e}", p.display()))
                })?
                .trim(),
        ),
    };
    Ok(WanSettings {
        advertise,
        token,
        ca_pem,
    })
}

/// The client for other datacenters' servers: their HTTPS verified with `ca_pem` when given,
/// this server's certificate presented when it has one (servers that verify clients ask).
fn federation_client(args: &ServerArgs, ca_pem: Option<&[u8]>) -> Result<reqwest::Client, ServerError> {
    let identity = flag_files::own_identity_pem(args)?;
    peer::Peer::client(ca_pem, identity.as_deref()).map_err(ServerError::Flags)
}

/// `0.0.0.0:0`: an address for nothing.
fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

/// A plain listener may be off only where its TLS twin serves instead; servers forward
/// writes to the leader over plain HTTP, so several servers over etcd keep it.
fn check_listeners(args: &ServerArgs, tls: bool) -> Result<(), ServerError> {
    let refuse = |m: &str| Err(ServerError::Flags(m.to_owned()));
    if args.http_addr.0.is_none() {
        if args.tls.https_addr.is_none() || !tls {
            return refuse("-http-addr off needs -https-addr (with -tls-cert-file and -tls-key-file) to serve the API");
        }
        if args.store == "etcd" {
            return refuse(
                "-http-addr off is not available with -store etcd: servers forward writes to the leader's plain HTTP API",
            );
        }
    }
    if args.grpc_addr.0.is_none() && (args.tls.grpc_tls_addr.is_none() || !tls) {
        return refuse("-grpc-addr off needs -grpc-tls-addr (with -tls-cert-file and -tls-key-file) to serve xDS");
    }
    Ok(())
}

/// The server's [`Mode`].
pub struct ServerMode {
    args: ServerArgs,
    store: Store,
    acl: Arc<Resolver>,
    tokens: StoreTokens,
    /// The shared followers of the catalog the data sources and the token resolver run.
    followers: TaskTracker,
    api_addr: SocketAddr,
    /// The ports it listens on.
    ports: http_kit::Ports,
    liveness: Arc<catalog::liveness::Liveness>,
    /// The HTTP API's request counters.
    http_metrics: Arc<http_api::HttpMetrics>,
    /// The other datacenters (the store's).
    fed: Arc<catalog::federation::Federation>,
    /// Where other datacenters reach this server's API, and the token it presents to them.
    wan: (String, Option<structs::Token>),
    /// How it calls other datacenters' servers.
    peer: peer::Peer,
    /// A secondary's copies of the primary's config entries and ACL system.
    replicator: Option<Arc<replication::Replicator>>,
    replication_metrics: replication::ReplicationMetrics,
    /// The file audit records are appended to (`-audit-file`).
    audit_file: Option<http_api::AuditFile>,
    /// Cluster peering: the lifecycle, the peering gRPC service, the streams.
    peerings: Arc<peering::Peerings>,
    /// Ends the peering streams (when the server drains).
    peering_stop: CancellationToken,
    /// This server's node id (its node in the catalog, `/v1/agent/self`).
    node_id: String,
    /// Its agent: the node's local services and checks (see [`own_agent`]).
    agent: agent::Agent,
    /// SIGHUP, listened for before the ready line; taken by the reload task.
    hup: parking_lot::Mutex<Option<std::io::Result<tokio::signal::unix::Signal>>>,
}

/// What peers dial to reach this cluster's servers: this server's gRPC TLS address and those
/// the other servers sharing its store report (none that a peer could not dial).
fn peering_addresses(store: &Store, own: Option<SocketAddr>) -> Vec<String> {
    let dialable = |a: &SocketAddr| !a.ip().is_unspecified() && a.port() != 0;
    let mut out: Vec<String> = own.filter(dialable).map(|a| a.to_string()).into_iter().collect();
    if let Some(cluster) = store.cluster() {
        for server in cluster.status().servers {
            let address = server.grpc_tls_address;
            if address.parse::<SocketAddr>().is_ok_and(|a| dialable(&a)) && !out.contains(&address) {
                out.push(address);
            }
        }
    }
    out
}

/// The peering name served on the gRPC TLS listener (see [`peering::tls`]).
struct PeeringNames(Arc<peering::Peerings>);

impl node::tls::ServerNames for PeeringNames {
    fn config_for(&self, name: &str) -> Option<Arc<rustls::ServerConfig>> {
        self.0.tls_config_for(name)
    }
}

/// The file audit records go to (`-audit-file`), which needs the audit log.
fn audit_file(args: &ServerArgs) -> Result<Option<http_api::AuditFile>, ServerError> {
    match (&args.audit_file, args.audit_retention) {
        (Some(_), 0) => Err(ServerError::Flags(
            "-audit-file needs the audit log: -audit-retention is 0".into(),
        )),
        (Some(path), _) => Ok(Some(
            http_api::AuditFile::open(path, args.audit_file_rotate_bytes, args.audit_file_rotate_max_files)
                .map_err(|e| ServerError::Flags(format!("-audit-file {}: {e}", path.display())))?,
        )),
        (None, _) => Ok(None),
    }
}

/// `-node-id`, else the id kept in the data dir, else (`-dev`) a new one.
fn server_node_id(args: &ServerArgs) -> Result<String, ServerError> {
    let is_uuid = |id: &str| uuid::Uuid::parse_str(id).is_ok();
    let new_id = || catalog::ca::new_uuid().map_err(std::io::Error::other);
    match (&args.node_id, &args.data_dir) {
        (Some(id), _) if is_uuid(id) => Ok(id.clone()),
        (Some(id), _) => Err(ServerError::Flags(format!("-node-id {id:?}: not a UUID"))),
        (None, Some(dir)) if !args.dev => atomic_file::kept_id(&dir.join("node-id"), is_uuid, new_id)
            .map_err(|e| ServerError::Store(format!("-data-dir {}: the node id: {e}", dir.display()))),
        _ => new_id().map_err(|e| ServerError::Store(format!("a node id: {e}"))),
    }
}

impl ServerMode {
    /// What this server registers of itself in its catalog.
    fn self_registration(&self) -> self_registration::SelfRegistration {
        Self::registration(
            &self.args,
            &self.store,
            &self.liveness,
            &self.node_id,
            self.api_addr,
            &self.wan.0,
        )
    }

    fn registration(
        args: &ServerArgs,
        store: &Store,
        liveness: &Arc<catalog::liveness::Liveness>,
        node_id: &str,
        api_addr: SocketAddr,
        wan: &str,
    ) -> self_registration::SelfRegistration {
        self_registration::SelfRegistration {
            store: store.clone(),
            liveness: Arc::clone(liveness),
            node: args.node.clone(),
            node_id: node_id.to_owned(),
            api_addr,
            wan: wan.to_owned(),
            failing: Arc::default(),
        }
    }

    /// The mode over an open `store`: ACLs initialised when enabled.
    async fn start(
        args: ServerArgs,
        store: Store,
        own_api: own_agent::OwnApi,
        grpc_tls_addr: Option<SocketAddr>,
    ) -> Result<Self, ServerError> {
        let api_addr = own_api.addr;
        let node_id = server_node_id(&args)?;
        let acl = Arc::new(Resolver::new(AclSettings {
            enabled: args.acl_enabled,
            default_allow: args.acl_default_policy == "allow",
            datacenter: args.datacenter.clone(),
        }));
        if args.acl_enabled {
            store::init_acls(&store, args.acl_initial_management_token_file.as_deref()).await?;
        }
        let WanSettings {
            advertise,
            token,
            ca_pem,
        } = federation_settings(&args, api_addr)?;
        let fed = Arc::clone(store.federation());
        if let Some(pem) = &ca_pem {
            fed.set_peer_ca(pem.clone());
        }
        let peer = peer::Peer {
            client: federation_client(&args, ca_pem.as_deref())?,
            token: token.clone(),
        };
        let wan = (advertise, token);
        let replication_metrics = replication::ReplicationMetrics::default();
        let replicator = (!fed.is_primary()).then(|| {
            Arc::new(replication::Replicator::new(
                Arc::clone(&fed),
                store.clone(),
                peer.clone(),
                args.acl_enabled,
                replication_metrics.clone(),
            ))
        });
        let audit_file = audit_file(&args)?;
        let followers = TaskTracker::new();
        let tokens = StoreTokens::start(store.clone(), Arc::clone(&acl), &followers);
        let liveness = Arc::new(catalog::liveness::Liveness::new(
            store.clone(),
            catalog::liveness::LivenessConfig {
                timeout: args.node_liveness_timeout,
                reap_after: args.node_reap_after,
                ..Default::default()
            },
        ));
        let peering_stop = CancellationToken::new();
        let peerings = peering::Peerings::new(
            peering::Context {
                store: store.clone(),
                datacenter: args.datacenter.clone(),
                tracker: peering::Tracker::new(),
                addresses: Arc::new({
                    let store = store.clone();
                    move || peering_addresses(&store, grpc_tls_addr)
                }),
                addresses_changed: store.cluster().map(|c| c.subscribe_status()),
            },
            peering_stop.clone(),
        );
        let registration = Self::registration(&args, &store, &liveness, &node_id, api_addr, &wan.0);
        // In its own catalog before it serves: its first clients find it in place.
        registration.once().await;
        let agent = own_agent::start(&args, &registration, &acl, &own_api, ca_pem.as_deref()).await?;
        // Before the ready line: SIGHUP's default action would end the server.
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        let mode = Self {
            agent,
            hup: parking_lot::Mutex::new(Some(hup)),
            peerings,
            peering_stop,
            node_id,
            args,
            store,
            acl,
            tokens,
            followers,
            api_addr,
            ports: http_kit::Ports::default(),
            liveness,
            http_metrics: Arc::default(),
            fed,
            wan,
            peer,
            replicator,
            replication_metrics,
            audit_file,
        };
        Ok(mode)
    }

    /// The node's own services and checks, its tokens and reload: its agent's routes,
    /// answered by the server asked (never forwarded: [`http_kit::node_local`]).
    fn local_routes(&self) -> axum::Router {
        agent::http::server_local_router(self.agent.clone())
            .merge(own_agent::token_router(self.agent.clone(), Arc::clone(&self.acl)))
            .merge(agent::reload::router(
                self.agent.clone(),
                own_agent::config_files(&self.args),
            ))
    }

    /// The same, listening on `ports` (`/v1/agent/self` shows them).
    pub fn with_ports(mut self, ports: http_kit::Ports) -> Self {
        self.ports = ports;
        self
    }
}

#[async_trait::async_trait]
impl Mode for ServerMode {
    fn name(&self) -> &'static str {
        "server"
    }

    fn node_name(&self) -> String {
        self.args.node.clone()
    }

    fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            datacenter: self.args.datacenter.clone(),
            intention_default_allow: self.acl.intention_default_allow(),
            ..ManagerConfig::default()
        }
    }

    fn data_sources(&self) -> DataSources {
        proxycfg_glue::server_data_sources_tracked(self.store.clone(), &self.followers)
    }

    fn tokens(&self) -> Tokens {
        Arc::new(self.tokens.clone())
    }

    fn config_source(&self, manager: &Manager) -> Arc<dyn ConfigSource> {
        Arc::new(CatalogSource::new(self.store.clone(), manager.clone()))
    }

    fn dns_catalog(&self) -> Arc<dyn ::dns::Catalog> {
        Arc::new(dns::StoreDns::new(self.store.clone(), self.tokens()))
    }

    fn configure_xds(&self, xds: &XdsServer) {
        xds.set_status_tracking(self.args.xds_status_tracking);
    }

    fn grpc_routes(&self) -> tonic::service::Routes {
        tonic::service::Routes::new(self.peerings.grpc_service())
    }

    fn grpc_tls_names(&self) -> Option<Arc<dyn node::tls::ServerNames>> {
        Some(Arc::new(PeeringNames(Arc::clone(&self.peerings))))
    }

    fn routes(&self, engine: &Engine) -> axum::Router {
        let api = http_api::ApiConfig {
            node_name: self.args.node.clone(),
            node_id: self.node_id.clone(),
            server_addr: self.api_addr.to_string(),
            ports: self.ports,
            metrics: Arc::clone(&self.http_metrics),
            liveness: Some(Arc::clone(&self.liveness)),
            acl: Arc::clone(&self.acl),
            audit: self.args.audit_retention > 0,
            audit_file: self.audit_file.clone(),
            dry_run: Some(Arc::new(dry_run::ProxyDryRun(engine.manager.clone()))),
            peering: Some(Arc::clone(&self.peerings)),
            local: Some(self.local_routes()),
            ..http_api::ApiConfig::default()
        };
        let max_body = api.max_body;
        let router = http_api::router(self.store.clone(), api);
        // Only servers that share a store have a leader to forward writes to; a layer costs
        // every request, so a lone server has none.
        let router = match self.store.cluster() {
            None => router,
            Some(_) => router.layer(axum::middleware::from_fn_with_state(
                forward::Forwarder::new(self.store.clone(), max_body, Arc::clone(&self.acl)),
                forward::forward_writes,
            )),
        };
        // Outermost: a request for another datacenter goes there before anything here.
        router.layer(axum::middleware::from_fn_with_state(
            Arc::new(federation::DcForwarder {
                fed: Arc::clone(&self.fed),
                replicator: self.replicator.clone(),
                client: self.peer.client.clone(),
                max_body,
            }),
            federation::forward_dc,
        ))
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(http_api::CatalogMetrics::new(self.store.clone())));
        self.http_metrics.register(registry);
        if self.replicator.is_some() {
            self.replication_metrics.register(registry);
        }
    }

    fn spawn(&self, engine: &Engine, tasks: &TaskTracker, stop: CancellationToken) {
        if let Some(hup) = self.hup.lock().take() {
            let reload = agent::reload::reload_on_sighup(
                self.agent.clone(),
                own_agent::config_files(&self.args),
                hup,
                stop.clone(),
            );
            tasks.spawn(reload.instrument(info_span!("reload")));
        }
        let grace = self.args.etcd_lease_ttl * 2;
        tasks.spawn(
            balance::run(self.store.clone(), engine.xds.clone(), grace, stop.clone())
                .instrument(info_span!("xds_balance")),
        );
        let (liveness, until) = (Arc::clone(&self.liveness), stop.clone());
        tasks.spawn(async move { liveness.run(until.cancelled()).await }.instrument(info_span!("node_liveness")));
        tasks.spawn(
            self.self_registration()
                .run(stop.clone())
                .instrument(info_span!("self_registration")),
        );
        // Leader work (every server runs it; it acts only while leading): removing CA roots
        // rotated out once no leaf they signed can still be valid.
        let pruner = catalog::ca_pruning::RootPruner::new(self.store.clone());
        let until = stop.clone();
        tasks.spawn(async move { pruner.run(until.cancelled()).await }.instrument(info_span!("ca_root_pruning")));
        // And ending sessions whose TTL ran out or whose node or checks failed.
        let reaper = catalog::session_reaper::SessionReaper::new(self.store.clone());
        let until = stop.clone();
        tasks.spawn(async move { reaper.run(until.cancelled()).await }.instrument(info_span!("session_reaper")));
        // Every server: this datacenter's federation state kept, sent to the primary, the
        // primary's list of datacenters copied.
        let link = federation::Link {
            fed: Arc::clone(&self.fed),
            store: self.store.clone(),
            advertise: self.wan.0.clone(),
            join: self.args.retry_join_wan.clone(),
            peer: self.peer.clone(),
            replicator: self.replicator.clone(),
        };
        tasks.spawn(link.run(stop).instrument(info_span!("federation")));
        // Leader work: dialing the peerings this cluster established, removing deleted
        // ones. A lone server leads.
        let leading = match self.store.cluster() {
            Some(cluster) => cluster.leading(),
            None => tokio::sync::watch::channel(true).1,
        };
        tasks.spawn(
            Arc::clone(&self.peerings)
                .run(leading)
                .instrument(info_span!("peering")),
        );
    }

    async fn draining(&self) {
        // Parked blocking queries answer now (they would hold the HTTP shutdown for their
        // whole wait), and later ones at once.
        self.store.release_waiters();
        self.fed.release_waiters();
        // Peering streams end before the gRPC listeners close (they would hold them open).
        self.peering_stop.cancel();
        // The agent's checks and anti-entropy stop while the API still answers them.
        self.agent.shutdown().await;
    }

    async fn engine_stopped(&self) {
        // With every proxy gone, the shared followers end with their last watch.
        self.followers.close();
        self.followers.wait().await;
    }

    async fn close(&self) {
        self.store.close().await;
    }
}
