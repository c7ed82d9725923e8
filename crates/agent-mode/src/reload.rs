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
        let result = match FileConfig::load(&files) {
            Ok(file) => agent
                .load_config(file.services, file.checks)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => info!("config reloaded"),
            Err(error) => warn!(%error, "config not reloaded: nothing changed"),
        }
    }
}
