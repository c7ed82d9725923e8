//! The agent's node in the servers' catalog: the liveness heartbeat, the reaper of services
//! critical for too long, and leaving.

use super::Agent;
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

impl Agent {
    /// Tells a server this node is alive, every `heartbeat_interval`, until `stop`.
    pub(super) async fn heartbeat(&self, stop: CancellationToken) {
        let body = json!({"Node": self.0.config.node, "Address": self.0.config.advertise});
        let mut warned_missing = false;
        // `?dc=`: a server of another datacenter refuses instead of adopting this node.
        let path = crate::servers::paths::node_heartbeat(&self.0.config.datacenter);
        loop {
            match self.0.servers.put_json(&path, &body).await {
                Ok(()) => {}
                Err(e) if matches!(e.status(), Some(404 | 405)) && !warned_missing => {
                    warned_missing = true;
                    warn!("the server has no heartbeat endpoint: this node's liveness is not tracked");
                }
                // The anti-entropy loop logs while servers are away.
                Err(error) => debug!(%error, "heartbeat failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.0.config.heartbeat_interval) => {}
            }
        }
    }

    /// Deregisters services whose check has been critical longer than its
    /// `DeregisterCriticalServiceAfter`.
    pub(super) async fn reap_critical(&self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.0.config.reap_interval) => {}
            }
            let now = Instant::now();
            let doomed: Vec<(String, String)> = self
                .0
                .state
                .checks()
                .into_values()
                .filter_map(|c| {
                    let after = c.definition.as_ref()?.deregister_critical_service_after;
                    let since = c.critical_since?;
                    (!after.is_zero() && !c.check.service_id.is_empty() && now.duration_since(since) >= after.0)
                        .then(|| (c.check.service_id.clone(), c.check.check_id.clone()))
                })
                .collect();
            for (service, check) in doomed {
                warn!(%service, %check, "deregistering a service critical for longer than DeregisterCriticalServiceAfter");
                if let Err(error) = self.deregister_service(&service).await {
                    debug!(%service, %error, "reaping");
                }
            }
        }
    }

    /// Removes this node from the catalog (leave); best effort, with a short deadline.
    pub async fn leave(&self) -> Result<(), crate::servers::ApiError> {
        let body = json!({"Node": self.0.config.node});
        tokio::time::timeout(
            Duration::from_secs(5),
            self.0
                .servers
                .put_json(crate::servers::paths::CATALOG_DEREGISTER, &body),
        )
        .await
        .unwrap_or_else(|_| {
            Err(crate::servers::ApiError::Unreachable {
                tried: 1,
                last: "timed out".into(),
            })
        })
    }
}
