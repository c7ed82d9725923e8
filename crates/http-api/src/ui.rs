//! `/v1/internal/ui/services`: the one summary the dashboard (crate `dashboard`, served at
//! `/ui`) needs that the API has no single call for (every service with its instance count
//! and health).

use crate::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use serde::Serialize;
use std::collections::BTreeMap;
use structs::{HealthStatus, ServiceKind};

/// One service in the dashboard's list.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
struct ServiceSummary {
    name: String,
    /// The kinds of its instances (`""` for typical services).
    kinds: Vec<String>,
    instances: usize,
    /// Instances by their worst check: passing, warning, critical.
    passing: usize,
    warning: usize,
    critical: usize,
    connect_native: bool,
    tags: Vec<String>,
}

/// `GET /v1/internal/ui/services`: every service the token may read, with its instances'
/// health, computed in one pass over the catalog.
pub(crate) async fn services(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let key = IndexKey::Services;
    let state = api.read(&params, &key).await?;
    let mut out: BTreeMap<String, ServiceSummary> = BTreeMap::new();
    let mut filtered = false;
    for (node, svc) in state.all_services() {
        if !a.service_read(&svc.service) {
            filtered = true;
            continue;
        }
        let s = out.entry(svc.service.clone()).or_insert_with(|| ServiceSummary {
            name: svc.service.clone(),
            ..ServiceSummary::default()
        });
        s.instances += 1;
        let kind = match svc.kind {
            ServiceKind::Typical => String::new(),
            other => other.to_string(),
        };
        if !s.kinds.contains(&kind) {
            s.kinds.push(kind);
        }
        s.connect_native |= svc.connect.native;
        for t in &svc.tags {
            if !s.tags.contains(t) {
                s.tags.push(t.clone());
            }
        }
        let worst = state
            .node_checks(node)
            .iter()
            .filter(|c| c.service_id.is_empty() || c.service_id == svc.id)
            .map(|c| c.status)
            .fold(HealthStatus::Passing, |w, s| match (w, s) {
                (HealthStatus::Critical | HealthStatus::Maintenance, _)
                | (_, HealthStatus::Critical | HealthStatus::Maintenance) => HealthStatus::Critical,
                (HealthStatus::Warning, _) | (_, HealthStatus::Warning) => HealthStatus::Warning,
                _ => HealthStatus::Passing,
            });
        match worst {
            HealthStatus::Critical | HealthStatus::Maintenance => s.critical += 1,
            HealthStatus::Warning => s.warning += 1,
            _ => s.passing += 1,
        }
    }
    let list: Vec<ServiceSummary> = out.into_values().collect();
    Ok(crate::authz::mark_filtered(
        query::json(&list, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

/// One service's virtual IP.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct VirtualIp<'a> {
    service_name: &'a str,
    #[serde(rename = "VirtualIP")]
    virtual_ip: String,
}

/// `GET /v1/internal/service-virtual-ip`: every service's virtual IP the token may read, by
/// name (blocking on the virtual IPs).
pub(crate) async fn virtual_ips(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let key = IndexKey::VirtualIps;
    let state = api.read(&params, &key).await?;
    let mut filtered = false;
    let all: Vec<VirtualIp<'_>> = state
        .virtual_ips()
        .filter(|(name, _)| {
            let readable = a.service_read(name);
            filtered |= !readable;
            readable
        })
        .map(|(name, ip)| VirtualIp {
            service_name: name,
            virtual_ip: ip.to_string(),
        })
        .collect();
    Ok(crate::authz::mark_filtered(
        query::json(&all, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

/// `GET /v1/internal/service-virtual-ip/:service`: the service's virtual IP (404 until it
/// has one: a connect instance, or a terminating gateway linking it), blocking on its
/// connect instances.
pub(crate) async fn virtual_ip(
    State(api): State<Api>,
    authz: Authz,
    axum::extract::Path(service): axum::extract::Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    let key = IndexKey::ServiceConnect(service.clone());
    let state = api.read(&params, &key).await?;
    let Some(ip) = state.virtual_ip(&service) else {
        return Err(ApiError::NotFound(format!(
            "service {service:?} has no virtual IP (it gets one with its first connect instance)"
        )));
    };
    let body = VirtualIp {
        service_name: &service,
        virtual_ip: ip.to_string(),
    };
    Ok(query::json(&body, Some(state.index_of(&key)), params.pretty()))
}
