//! Reloading the config files' services and checks on SIGHUP.

use ::agent::Agent;
use ::agent::config_file::FileConfig;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Re-reads the config files on every SIGHUP; a file that cannot be used changes nothing and
/// is logged.
pub(crate) async fn reload_on_sighup(
    agent: Agent,
    files: Vec<PathBuf>,
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

/// Re-reads the config files' services and checks once (SIGHUP, `PUT /v1/agent/reload`); a
/// file that cannot be used changes nothing, and the error says why.
pub(crate) async fn reload(agent: &Agent, files: &[PathBuf]) -> Result<(), String> {
    let result = match FileConfig::load(files) {
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
pub(crate) fn router(agent: Agent, files: Vec<PathBuf>) -> axum::Router {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let files = std::sync::Arc::new(files);
    axum::Router::new().route(
        "/v1/agent/reload",
        axum::routing::put(move |caller: node::authz::Caller| {
            let (agent, files) = (agent.clone(), std::sync::Arc::clone(&files));
            async move {
                let node = agent.config().node.clone();
                if let Err(refused) = caller.need(caller.0.authz.agent_write(&node), "agent:write", &node) {
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
