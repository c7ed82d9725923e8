//! `meshd agent` as a [`node::Mode`]: reads flags and config files, starts the agent (local
//! state, checks, anti-entropy, its cache of the servers' state, managed proxies), serves
//! its HTTP API and the proxies on this host over xDS (configured from the agent cache),
//! reloads the config files' services and checks on SIGHUP, and on shutdown leaves (unless
//! `-leave-on-terminate=false`).

mod args;
mod dns;
mod error;
mod local;
mod settings;

pub use args::AgentArgs;
pub use error::StartError;

use ::agent::Agent;
use local::{AgentLocal, ManagedTokens};
use node::authz::{LocalTokens, Tokens};
use node::{Bound, Engine, Listeners, Mode};
use parking_lot::Mutex;
use proxycfg::{ConfigSource, DataSources, Manager, ManagerConfig};
use proxycfg_glue::LocalChecks;
use proxycfg_sources::LocalSource;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::Signal;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

/// Runs an agent until `shutdown` completes. Logging is set up here, once the config files
/// (which may set the log level) are read. `on_ready` is called once the HTTP API listens.
pub async fn run(
    args: AgentArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Bound),
) -> Result<(), StartError> {
    let loaded = settings::settings(&args);
    let (level, json) = match &loaded {
        Ok(s) => (
            args.log_level.clone().or_else(|| s.file.log_level.clone()),
            args.log_json || s.file.log_json.unwrap_or(false),
        ),
        Err(_) => (args.log_level.clone(), args.log_json),
    };
    node::init_logging(level.as_deref().unwrap_or("info"), json);
    let settings = loaded?;
    let listeners = node::bind(Listeners {
        http: Some(settings.http_addr),
        grpc: Some(settings.grpc_addr),
        tls: args.tls.clone(),
        http_max_conns_per_client: args.http_max_conns_per_client,
        http_versions: node::http_serve::Versions::Http1,
        admission: node::engine::admission(args.xds_max_streams, args.xds_setup_rate),
        dns: args
            .dns
            .dns_addr
            .0
            .map(|a| (a, args.dns.config(&settings.agent.datacenter))),
        grpc_tls_own_names: false,
    })
    .await
    .map_err(StartError::Node)?;
    let bound = listeners.bound;
    let mut config = settings.agent;
    config.servers_ca_pem = listeners.tls().ca_pem.clone();
    // Checks registered through the API never probe the agent's own listeners.
    config.listeners = bound.all();
    config.ports = bound.ports();
    let agent = Agent::start(config)
        .await
        .map_err(|e| StartError::Agent(::agent::servers::chain(&e)))?;
    if let Err(e) = agent.load_config(settings.file.services, settings.file.checks).await {
        agent.shutdown().await;
        return Err(StartError::Flags(format!("config files: {e}")));
    }
    if let Err(e) = start_managed(&agent, &bound, settings.allow_managed_root, settings.envoy_binary) {
        agent.shutdown().await;
        return Err(e);
    }
    // Before the ready line: SIGHUP's default action would end the agent.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let mode = AgentMode {
        agent,
        leave_on_terminate: settings.leave_on_terminate,
        config_files: ::agent::reload::ConfigFiles {
            paths: args.config_file.clone(),
            definitions_only: false,
        },
        hup: Mutex::new(Some(hup)),
        followers: TaskTracker::new(),
    };
    node::serve(listeners, mode, shutdown, on_ready)
        .await
        .map_err(StartError::Node)
}

/// Starts the managed proxies (the agent runs their Envoys).
fn start_managed(
    agent: &Agent,
    bound: &Bound,
    allow_root: bool,
    envoy_binary: Option<PathBuf>,
) -> Result<(), StartError> {
    let (Some(http_addr), Some(grpc_addr)) = (bound.http_addr, bound.grpc_addr) else {
        return Err(StartError::Flags("an agent needs its HTTP and xDS listeners".into()));
    };
    let program = std::env::current_exe()
        .map_err(|e| StartError::Agent(format!("locating the meshd binary for managed proxies: {e}")))?;
    let managed = ::agent::managed::ManagedConfig {
        data_dir: agent.config().data_dir.clone(),
        allow_root,
        program,
        http_addr,
        grpc_addr,
        envoy_binary,
        drain_time: std::time::Duration::from_secs(2),
    };
    agent
        .start_managed(managed)
        .map_err(|e| StartError::Agent(format!("managed proxies: {e}")))
}

/// The agent's [`Mode`].
pub struct AgentMode {
    agent: Agent,
    leave_on_terminate: bool,
    config_files: ::agent::reload::ConfigFiles,
    /// SIGHUP, listened for before the ready line; taken by the reload task.
    hup: Mutex<Option<std::io::Result<Signal>>>,
    /// The followers proxies share (a chain compiled once per agent); each ends with its
    /// last watcher.
    followers: TaskTracker,
}

#[async_trait::async_trait]
impl Mode for AgentMode {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn node_name(&self) -> String {
        self.agent.config().node.clone()
    }

    fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            datacenter: self.agent.config().datacenter.clone(),
            intention_default_allow: self.agent.acl().intention_default_allow(),
            ..ManagerConfig::default()
        }
    }

    fn data_sources(&self) -> DataSources {
        let local = Arc::new(AgentLocal(self.agent.clone()));
        proxycfg_glue::cache_data_sources_tracked(
            self.agent.caches().clone(),
            local as Arc<dyn LocalChecks>,
            &self.followers,
        )
    }

    fn tokens(&self) -> Tokens {
        Arc::clone(self.agent.acl()) as Tokens
    }

    fn dns_catalog(&self) -> Arc<dyn ::dns::Catalog> {
        Arc::new(dns::ServersDns(self.agent.clone()))
    }

    fn local_tokens(&self) -> Option<Arc<dyn LocalTokens>> {
        Some(Arc::new(ManagedTokens(self.agent.clone())))
    }

    fn config_source(&self, manager: &Manager) -> Arc<dyn ConfigSource> {
        let local = Arc::new(AgentLocal(self.agent.clone()));
        Arc::new(LocalSource::start(manager.clone(), local, self.agent.caches().clone()))
    }

    fn routes(&self, _engine: &Engine) -> axum::Router {
        ::agent::http::router(self.agent.clone())
            .merge(::agent::reload::router(self.agent.clone(), self.config_files.clone()))
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.agent.caches().register_metrics(registry);
    }

    fn spawn(&self, _engine: &Engine, tasks: &TaskTracker, stop: CancellationToken) {
        let Some(hup) = self.hup.lock().take() else {
            return;
        };
        let (agent, files) = (self.agent.clone(), self.config_files.clone());
        tasks.spawn(::agent::reload::reload_on_sighup(agent, files, hup, stop).instrument(info_span!("reload")));
    }

    async fn engine_stopped(&self) {
        // The proxies are stopped: their shared followers end with their last watch; then
        // the cache and the agent's own work go, then the node.
        self.followers.close();
        self.followers.wait().await;
        self.agent.shutdown().await;
        if self.leave_on_terminate {
            match self.agent.leave().await {
                Ok(()) => info!("left: the node is removed from the catalog"),
                Err(error) => warn!(%error, "could not leave: the servers will mark this node critical"),
            }
        }
    }
}
