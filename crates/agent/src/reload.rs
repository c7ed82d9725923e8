//! Reloading the config files' services and checks: on SIGHUP and `PUT /v1/agent/reload`,
//! on an agent and on a server (whose agent reads only services and checks from config
//! files: its settings are flags).

use crate::config_file::FileConfig;
use crate::runtime::Agent;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The config files an agent reloads.
#[derive(Debug, Clone)]
pub struct ConfigFiles {
    /// The files, merged in order.
    pub paths: Vec<PathBuf>,
    /// Only `services`/`service` and `checks`/`check` may be in them (a server's agent).
    pub definitions_only: bool,
}

impl ConfigFiles {
    /// Reads and merges the files (see [`FileConfig::load`]).
    pub fn load(&self) -> Result<FileConfig, crate::config_file::ConfigError> {
        if self.definitions_only {
            FileConfig::load_definitions(&self.paths)
        } else {
            FileConfig::load(&self.paths)
        }
    }
}

/// Re-reads the config files on every SIGHUP until `stop`; a file that cannot be used
/// changes nothing and is logged.
pub async fn reload_on_sighup(
    agent: Agent,
    files: ConfigFiles,
    hup: std::io::Result<tokio::signal::unix::Signal>,
    stop: CancellationToken,
) {
    let Ok(mut hup) = hup else {
        warn!("cannot listen for SIGHUP: config files are read at start only");
        return;
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hup.recv() => if got.is_none() { return },
        }
        info!("SIGHUP: reloading the config files' services and checks");
        // Logged by `reload` either way.
        let _ = reload(&agent, &files).await;
    }
}

/// Re-reads the config files' services and checks once; a file that cannot be used changes
/// nothing, and the error says why.
pub async fn reload(agent: &Agent, files: &ConfigFiles) -> Result<(), String> {
    let result = match files.load() {
        Ok(file) => agent
            .load_config(file.services, file.checks)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match &result {
        Ok(()) => info!("config reloaded"),
        Err(error) => warn!(%error, "config not reloaded: nothing changed"),
    }
    result
}

/// `PUT /v1/agent/reload` (`agent:write` on the node, as Consul's): reloads as SIGHUP does;
/// a config file that cannot be used is a 500 with the reason, and nothing changed.
pub fn router(agent: Agent, files: ConfigFiles) -> axum::Router {
    use crate::http::answer::{need, resolve};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    let files = Arc::new(files);
    axum::Router::new().route(
        "/v1/agent/reload",
        axum::routing::put(move |q: http_kit::Params, headers: HeaderMap| {
            let (agent, files) = (agent.clone(), Arc::clone(&files));
            async move {
                let node = agent.config().node.clone();
                let who = match resolve(&agent, &headers, &q).await {
                    Ok((_, who)) => who,
                    Err(e) => return e.into_response(),
                };
                if let Err(refused) = need(&who, who.authz.agent_write(&node), "agent:write", &node) {
                    return refused.into_response();
                }
                match reload(&agent, &files).await {
                    Ok(()) => StatusCode::OK.into_response(),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("Failed to reload configs: {}\n", e.replace('\n', " ")),
                    )
                        .into_response(),
                }
            }
        }),
    )
}
