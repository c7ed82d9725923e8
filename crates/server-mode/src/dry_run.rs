//! The server's side of a dry run (`docs/dry-run.md`): every proxy this server serves is
//! simulated against the state the write would leave (`proxycfg_glue::what_if`), and the
//! resources that would change are diffed (`xds::resources::diff_snapshots`). Proxies the
//! change does not reach cost one comparison of their chains and intentions; only the
//! reached ones are built, and only their changed parts.

use catalog::State;
use http_api::dry_run::{DryRun, DryRunPage, DryRunProxies, MayRead};
use proxycfg::{ConfigSnapshot, Manager};
use proxycfg_glue::what_if::{Change, what_if};
use serde_json::json;
use std::sync::Arc;

/// Proxies listed as not simulated at most.
const NOT_SIMULATED_LISTED: usize = 100;

/// Dry runs over the proxies of a [`Manager`].
pub(crate) struct ProxyDryRun(pub(crate) Manager);

#[async_trait::async_trait]
impl DryRun for ProxyDryRun {
    async fn proxies(
        &self,
        before: Arc<State>,
        after: Arc<State>,
        page: DryRunPage,
        may_read: MayRead,
    ) -> DryRunProxies {
        let mut snapshots = Vec::new();
        for id in self.0.registered().await {
            if let Some(snapshot) = self.0.current(&id) {
                snapshots.push(snapshot);
            }
        }
        let simulate = move || simulate(&snapshots, &before, &after, page, &*may_read);
        tokio::task::spawn_blocking(simulate)
            .await
            .unwrap_or_else(|e| DryRunProxies {
                not_simulated: vec![json!({"Why": [format!("the simulation failed: {e}")]})],
                not_simulated_total: 1,
                ..DryRunProxies::default()
            })
    }
}

/// The proxies (sidecars and gateways) the catalog holds that the token may read and that
/// are not among `snapshots`.
fn served_elsewhere(
    snapshots: &[Arc<ConfigSnapshot>],
    state: &State,
    may_read: &(dyn Fn(&str, &str) -> bool + Send + Sync),
) -> usize {
    let here: std::collections::HashSet<(&str, &str)> = snapshots
        .iter()
        .map(|s| (s.proxy_id.node.as_str(), s.proxy_id.service_id.as_str()))
        .collect();
    state
        .all_services()
        .filter(|(node, s)| {
            s.kind != structs::ServiceKind::Typical
                && !here.contains(&(*node, s.id.as_str()))
                && may_read(&s.service, node)
        })
        .count()
}

/// Simulates every proxy; those `may_read` refuses count only as hidden, and only if the
/// change reaches them (nothing else of them is told).
fn simulate(
    snapshots: &[Arc<ConfigSnapshot>],
    before: &State,
    after: &State,
    page: DryRunPage,
    may_read: &(dyn Fn(&str, &str) -> bool + Send + Sync),
) -> DryRunProxies {
    let change = Change::new(before, after);
    let mut out = DryRunProxies {
        served_elsewhere: served_elsewhere(snapshots, before, may_read),
        ..DryRunProxies::default()
    };
    let first = (page.page - 1).saturating_mul(page.per_page);
    for snapshot in snapshots {
        let readable = may_read(&snapshot.service.service, &snapshot.proxy_id.node);
        let simulated = what_if(snapshot, &change);
        if !readable {
            out.hidden_by_acls += usize::from(simulated.snapshot.is_some());
            continue;
        }
        out.served_here += 1;
        let proxy = json!({
            "ProxyID": snapshot.proxy_id.service_id,
            "Node": snapshot.proxy_id.node,
            "Service": snapshot.service.service,
        });
        if !simulated.not_simulated.is_empty() {
            out.not_simulated_total += 1;
            if out.not_simulated.len() < NOT_SIMULATED_LISTED {
                let mut entry = proxy.clone();
                entry["Why"] = json!(simulated.not_simulated);
                out.not_simulated.push(entry);
            }
        }
        let resources = match &simulated.snapshot {
            None => Vec::new(),
            Some(new) => match xds::resources::diff_snapshots(snapshot, new, page.max_fields) {
                Ok(resources) => resources,
                Err(e) => {
                    out.not_simulated_total += 1;
                    let mut entry = proxy.clone();
                    entry["Why"] = json!([format!("its resources could not be built: {e}")]);
                    out.not_simulated.push(entry);
                    continue;
                }
            },
        };
        if resources.is_empty() {
            out.unaffected += 1;
            continue;
        }
        if out.total >= first && out.items.len() < page.per_page {
            let mut entry = proxy;
            entry["Resources"] = json!(resources);
            out.items.push(entry);
        }
        out.total += 1;
    }
    out
}
