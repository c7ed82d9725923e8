//! `/v1/discovery-chain/:service`: the compiled chain of a service, as Consul answers it.

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use structs::{CompiledDiscoveryChain, ConfigEntry, ConfigEntryKind, GoDuration, Index, Protocol};

/// The keys a chain is compiled from: blocking on the chain waits on any of them.
fn keys() -> [IndexKey; 6] {
    [
        IndexKey::ConfigKind(ConfigEntryKind::ProxyDefaults),
        IndexKey::ConfigKind(ConfigEntryKind::ServiceDefaults),
        IndexKey::ConfigKind(ConfigEntryKind::ServiceResolver),
        IndexKey::ConfigKind(ConfigEntryKind::ServiceRouter),
        IndexKey::ConfigKind(ConfigEntryKind::ServiceSplitter),
        IndexKey::Ca,
    ]
}

/// `POST` body: compile overrides.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Overrides {
    #[serde(rename = "OverrideProtocol", alias = "override_protocol")]
    override_protocol: String,
    #[serde(rename = "OverrideConnectTimeout", alias = "override_connect_timeout")]
    override_connect_timeout: GoDuration,
    #[serde(rename = "OverrideMeshGateway", alias = "override_mesh_gateway")]
    override_mesh_gateway: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct ChainResponse<'a> {
    #[serde(rename = "Chain")]
    chain: &'a CompiledDiscoveryChain,
}

pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    answer(api, service, q, Overrides::default()).await
}

pub(crate) async fn post(
    State(api): State<Api>,
    authz: Authz,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    let overrides = if body.iter().all(u8::is_ascii_whitespace) {
        Overrides::default()
    } else {
        let value: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("request decode failed: invalid JSON: {e}")))?;
        structs::json::from_value(value).map_err(|e| ApiError::BadRequest(format!("request decode failed: {e}")))?
    };
    answer(api, service, q, overrides).await
}

async fn answer(api: Api, service: String, q: Option<String>, overrides: Overrides) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    if let Some(dc) = params.get("compile-dc")
        && !dc.is_empty()
        && dc != api.store.datacenter()
    {
        return Err(ApiError::BadRequest(format!(
            "compile-dc: datacenter {dc:?} is not served here (only {:?})",
            api.store.datacenter()
        )));
    }
    let override_protocol = match overrides.override_protocol.as_str() {
        "" => None,
        p => Some(
            p.parse::<Protocol>()
                .map_err(|e| ApiError::BadRequest(format!("OverrideProtocol: {e}")))?,
        ),
    };
    if overrides
        .override_mesh_gateway
        .as_ref()
        .and_then(|m| m.get("Mode").or_else(|| m.get("mode")))
        .and_then(|m| m.as_str())
        .is_some_and(|m| !m.is_empty() && m != "default" && m != "none")
    {
        return Err(ApiError::BadRequest(
            "OverrideMeshGateway: not supported here: meshd's compiled chains carry no mesh gateway mode (a sidecar \
             takes it from its upstream, proxy or central config)"
                .into(),
        ));
    }
    let state = read_any(&api, &params).await?;
    let index = keys().iter().map(|k| state.index_of(k)).max().unwrap_or(Index(1));
    let list = |k| state.config_entries(k);
    let proxy = list(ConfigEntryKind::ProxyDefaults);
    let (defaults, resolvers, routers, splitters): (Vec<Arc<ConfigEntry>>, _, _, _) = (
        list(ConfigEntryKind::ServiceDefaults),
        list(ConfigEntryKind::ServiceResolver),
        list(ConfigEntryKind::ServiceRouter),
        list(ConfigEntryKind::ServiceSplitter),
    );
    let entries = discovery_chain::Entries {
        proxy_defaults: structs::central_config::proxy_defaults(proxy.first()),
        service_defaults: &defaults,
        resolvers: &resolvers,
        routers: &routers,
        splitters: &splitters,
        intentions: &[],
    };
    let trust_domain = state.ca().map(|ca| ca.trust_domain()).unwrap_or_default();
    let req = discovery_chain::CompileRequest {
        service: &service,
        datacenter: api.store.datacenter(),
        trust_domain: &trust_domain,
        override_protocol,
        override_connect_timeout: Some(overrides.override_connect_timeout.0).filter(|d| !d.is_zero()),
    };
    let chain = discovery_chain::compile(&req, &entries).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(query::json(
        &ChainResponse { chain: &chain },
        Some(index),
        params.pretty(),
    ))
}

/// The state for a blocking-capable read over several keys: at once without `?index`, else
/// once any key's index passes it (or the wait ends).
async fn read_any(api: &Api, params: &Params) -> Result<Arc<catalog::State>, ApiError> {
    let blocking = params.blocking()?;
    let state = api.store.read();
    let current = keys().iter().map(|k| state.index_of(k)).max().unwrap_or(Index(1));
    match blocking.index {
        Some(after) if after >= current && after <= state.index => {
            let _waiting = api.metrics.waiting();
            let wait = blocking.wait_with_jitter();
            let keys = keys();
            let waits = keys.iter().map(|k| Box::pin(api.store.wait(k, after, wait)));
            let (state, _, _) = futures_util::future::select_all(waits).await;
            Ok(state)
        }
        _ => Ok(state),
    }
}
