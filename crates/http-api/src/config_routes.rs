//! `/v1/config`: config entries.

use crate::authz::{Authz, mark_filtered, retain};
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use catalog::{IndexKey, Op};
use structs::{ConfigEntry, ConfigEntryKind, Index};

fn kind(text: &str) -> Result<ConfigEntryKind, ApiError> {
    text.parse()
        .map_err(|e: structs::config_entry::UnknownConfigEntryKind| ApiError::BadRequest(format!("kind: {e}")))
}

/// Consul's permission to read an entry: proxy-defaults and mesh are readable by anyone
/// (every proxy needs them); JWT providers need `mesh:read` or `service:write` on some
/// service (a sidecar's service identity reads the providers its intentions name); service
/// entries need `service:read` on the name; intentions `intentions:read` on their
/// destination.
pub(crate) fn can_read(a: &acl::Authorizer, kind: ConfigEntryKind, name: &str) -> bool {
    match kind {
        ConfigEntryKind::ProxyDefaults | ConfigEntryKind::Mesh => true,
        ConfigEntryKind::JwtProvider => a.mesh_read() || a.service_write_any(),
        ConfigEntryKind::HttpRoute | ConfigEntryKind::TcpRoute | ConfigEntryKind::ExportedServices => a.mesh_read(),
        // A gateway's identity reads the certificates it serves (their keys only if its
        // gateway names them: see `shown`).
        ConfigEntryKind::InlineCertificate | ConfigEntryKind::FileSystemCertificate => {
            a.mesh_read() || a.service_write_any()
        }
        ConfigEntryKind::ServiceIntentions => a.intention_read(name),
        ConfigEntryKind::ServiceDefaults
        | ConfigEntryKind::ServiceRouter
        | ConfigEntryKind::ServiceSplitter
        | ConfigEntryKind::ServiceResolver
        | ConfigEntryKind::IngressGateway
        | ConfigEntryKind::TerminatingGateway
        | ConfigEntryKind::ApiGateway => a.service_read(name),
    }
}

/// Consul's permission to write an entry: `mesh:write` for proxy-defaults, mesh, JWT
/// providers and the API gateway's entries (gateway, routes, certificates),
/// `intentions:write` on the destination for intentions, `operator:write` for gateways (they
/// open the mesh to the outside), `service:write` on the name else.
fn need_write(authz: &Authz, kind: ConfigEntryKind, name: &str) -> Result<(), ApiError> {
    match kind {
        ConfigEntryKind::ProxyDefaults
        | ConfigEntryKind::Mesh
        | ConfigEntryKind::JwtProvider
        | ConfigEntryKind::ApiGateway
        | ConfigEntryKind::HttpRoute
        | ConfigEntryKind::TcpRoute
        | ConfigEntryKind::InlineCertificate
        | ConfigEntryKind::FileSystemCertificate
        | ConfigEntryKind::ExportedServices => authz.need(|a| a.mesh_write(), "mesh:write", ""),
        ConfigEntryKind::ServiceIntentions => authz.need(|a| a.intention_write(name), "intentions:write", name),
        ConfigEntryKind::IngressGateway | ConfigEntryKind::TerminatingGateway => {
            authz.need(|a| a.operator_write(), "operator:write", "")
        }
        ConfigEntryKind::ServiceDefaults
        | ConfigEntryKind::ServiceRouter
        | ConfigEntryKind::ServiceSplitter
        | ConfigEntryKind::ServiceResolver => authz.need(|a| a.service_write(name), "service:write", name),
    }
}

fn need_read(authz: &Authz, kind: ConfigEntryKind, name: &str) -> Result<(), ApiError> {
    let permission = match kind {
        ConfigEntryKind::ServiceIntentions => "intentions:read",
        ConfigEntryKind::JwtProvider
        | ConfigEntryKind::HttpRoute
        | ConfigEntryKind::TcpRoute
        | ConfigEntryKind::InlineCertificate
        | ConfigEntryKind::FileSystemCertificate
        | ConfigEntryKind::ExportedServices => "mesh:read",
        _ => "service:read",
    };
    authz.need(|a| can_read(a, kind, name), permission, name)
}

/// Entries as a reader sees them: gateways and routes with their status derived from the
/// state they are read from, and an inline certificate's private key only for a caller who
/// could write it (`mesh:write`), the identity of a gateway serving it, or the agent of a
/// node such a gateway is registered on.
fn shown(state: &catalog::State, a: &acl::Authorizer, entries: &mut [ConfigEntry]) {
    use structs::config_entry::api_gateway_binding::statuses;
    if entries.iter().any(|e| e.status().is_some()) {
        let gateways = state.config_entries(ConfigEntryKind::ApiGateway);
        let mut routes = state.config_entries(ConfigEntryKind::HttpRoute);
        routes.extend(state.config_entries(ConfigEntryKind::TcpRoute));
        let services: std::collections::BTreeSet<String> = state.service_names().into_iter().collect();
        let mut all = statuses(
            &gateways,
            &routes,
            |s| services.contains(s),
            |k, n| state.config_entry(k, n).is_some(),
        );
        for e in entries.iter_mut() {
            let key = (e.kind(), e.name().to_owned());
            if let Some(status) = e.status_mut() {
                *status = all.remove(&key);
            }
        }
    }
    let keys = entries
        .iter()
        .any(|e| matches!(e, ConfigEntry::InlineCertificate(c) if !c.private_key.is_empty()));
    if keys && !a.mesh_write() {
        let gateways = state.config_entries(ConfigEntryKind::ApiGateway);
        // The identity of a gateway whose listener serves the certificate, or the agent of
        // a node it runs on (which hands the key to that gateway's Envoy).
        let hosts_gateway = |gw: &str| {
            state
                .service_instances(gw)
                .iter()
                .any(|(node, svc)| svc.kind == structs::ServiceKind::ApiGateway && a.node_write(node))
        };
        let entitled = |cert: &str| {
            gateways.iter().any(|g| match &**g {
                ConfigEntry::ApiGateway(gw) => {
                    (a.service_write(&gw.name) || hosts_gateway(&gw.name))
                        && gw.listeners.iter().flat_map(|l| &l.tls.certificates).any(|c| {
                            c.name == cert
                                && c.kind_or(ConfigEntryKind::InlineCertificate)
                                    == Some(ConfigEntryKind::InlineCertificate)
                        })
                }
                _ => false,
            })
        };
        for e in entries.iter_mut() {
            if let ConfigEntry::InlineCertificate(c) = e
                && !entitled(&c.name)
            {
                c.private_key = String::new();
            }
        }
    }
}

fn cas(params: &Params) -> Result<Option<Index>, ApiError> {
    Ok(params.u64("cas")?.map(Index))
}

pub(crate) async fn set(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "request body is empty: expected a config entry".into(),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("request decode failed: invalid JSON: {e}")))?;
    let entry =
        ConfigEntry::from_json(value).map_err(|e| ApiError::BadRequest(format!("request decode failed: {e}")))?;
    need_write(&authz, entry.kind(), entry.name())?;
    let op = Op::ConfigSet {
        entry: Box::new(entry),
        cas: cas(&params)?,
    };
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    let outcome = api.store.write(op).await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}

pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path((kind_text, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let kind = kind(&kind_text)?;
    need_read(&authz, kind, &name)?;
    let key = IndexKey::ConfigEntry(kind, name.clone());
    let state = api.read(&params, &key).await?;
    match state.config_entry(kind, &name) {
        Some(entry) => {
            let mut entries = vec![(*entry).clone()];
            shown(&state, authz.get()?, &mut entries);
            Ok(query::json(&entries[0], Some(state.index_of(&key)), params.pretty()))
        }
        // With the index, so a blocking query can wait for the entry to appear.
        None => {
            let mut resp = ApiError::NotFound(format!("Config entry not found for {:?} / {name:?}", kind.as_str()))
                .into_response();
            query::add_consul_headers(resp.headers_mut(), Some(state.index_of(&key)));
            Ok(resp)
        }
    }
}

pub(crate) async fn list(
    State(api): State<Api>,
    authz: Authz,
    Path(kind_text): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let kind = kind(&kind_text)?;
    let a = authz.get()?;
    let key = IndexKey::ConfigKind(kind);
    let state = api.read(&params, &key).await?;
    let mut entries: Vec<ConfigEntry> = state.config_entries(kind).iter().map(|e| (**e).clone()).collect();
    let filtered = retain(&mut entries, |e| can_read(a, kind, e.name()));
    shown(&state, a, &mut entries);
    Ok(mark_filtered(
        query::json(&entries, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

pub(crate) async fn delete(
    State(api): State<Api>,
    authz: Authz,
    Path((kind_text, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let kind = kind(&kind_text)?;
    need_write(&authz, kind, &name)?;
    let op = Op::ConfigDelete {
        kind,
        name,
        cas: cas(&params)?,
    };
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    let outcome = api.store.write(op).await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}
