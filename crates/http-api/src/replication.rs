//! Replication from the primary datacenter, the HTTP side: what the primary serves its
//! secondaries to copy (every config entry; the ACL system), and how a secondary's copies
//! are doing (`/v1/operator/replication`, Consul's `/v1/acl/replication`). The loop that
//! copies is the server's (`server-mode`).

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::extract::{RawQuery, State};
use axum::http::HeaderValue;
use axum::response::Response;
use catalog::IndexKey;
use catalog::federation::{Replicated, ReplicationStatus};
use structs::acl::AclReplica;
use structs::{ConfigEntryKind, Timestamp};

/// On a replication answer: when the primary answered (ms since the epoch), from which a
/// secondary measures its lag.
pub const ANSWERED_AT: &str = "x-meshd-answered-at";
/// On a replication answer: the index of the whole state it was read from (`X-Consul-Index`
/// is the replicated tables'), so that a secondary never applies an older copy over a newer.
pub const STATE_INDEX: &str = "x-meshd-state-index";

/// A replication answer: `value` at `index`, read from `state`, stamped with the time.
fn answer<T: serde::Serialize>(value: &T, index: structs::Index, state: &catalog::State) -> Response {
    let mut resp = query::json(value, Some(index), false);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    for (name, value) in [(ANSWERED_AT, now_ms), (STATE_INDEX, u128::from(state.index.0))] {
        if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
            resp.headers_mut().insert(name, v);
        }
    }
    resp
}

/// `GET /v1/internal/replication/config-entries`: every config entry of every kind,
/// blocking on any entry's change. The token needs `operator:read` and the read of every
/// entry (as `/v1/config` checks it; `mesh:write` for an inline certificate, whose private
/// key it carries): all or nothing, since a secondary deletes what its
/// copy lacks, and `operator:read` alone must not read entries the token could not.
pub(crate) async fn config_entries(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let state = api.read(&params, &IndexKey::ConfigEntries).await?;
    let all: Vec<_> = ConfigEntryKind::ALL
        .into_iter()
        .flat_map(|kind| state.config_entries(kind))
        .collect();
    for entry in &all {
        let what = format!("{}/{}", entry.kind(), entry.name());
        authz.need(
            |a| crate::config_routes::can_read(a, entry.kind(), entry.name()),
            "read",
            &what,
        )?;
        // It carries a private key: only to who could write it (a copy without the key
        // would break the secondary's gateways, so none is sent instead).
        if entry.kind() == ConfigEntryKind::InlineCertificate {
            authz.need(|a| a.mesh_write(), "mesh:write", &what)?;
        }
    }
    Ok(answer(&all, state.index_of(&IndexKey::ConfigEntries), &state))
}

/// `GET /v1/internal/replication/acl`: every ACL policy and role and every global token,
/// secrets included (`acl:write`, as Consul's token replication needs), blocking on any
/// change of the ACL system. Answered with ACLs off too (empty), so a secondary with ACLs
/// on sees what the primary has.
pub(crate) async fn acl(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.acl_write(), "acl:write", "")?;
    let state = api.read(&params, &IndexKey::Acl).await?;
    let replica = AclReplica {
        policies: state.acl_policies().map(|p| (**p).clone()).collect(),
        roles: state.acl_roles().map(|r| (**r).clone()).collect(),
        tokens: state.acl_tokens().filter(|t| !t.local).map(|t| (**t).clone()).collect(),
    };
    Ok(answer(&replica, state.index_of(&IndexKey::Acl), &state))
}

/// One kind's status as the operator endpoint shows it.
#[derive(serde::Serialize)]
struct StatusView {
    #[serde(rename = "Running")]
    running: bool,
    #[serde(rename = "ReplicatedIndex")]
    replicated_index: u64,
    #[serde(rename = "LastSuccess", skip_serializing_if = "Option::is_none")]
    last_success: Option<Timestamp>,
    #[serde(rename = "LastError", skip_serializing_if = "Option::is_none")]
    last_error: Option<Timestamp>,
    #[serde(rename = "LastErrorMessage")]
    last_error_message: String,
    #[serde(rename = "LastLagMs")]
    last_lag_ms: u64,
}

impl From<ReplicationStatus> for StatusView {
    fn from(s: ReplicationStatus) -> Self {
        let (last_error, last_error_message) = match s.last_error {
            Some((at, why)) => (Some(Timestamp(at)), why),
            None => (None, String::new()),
        };
        StatusView {
            running: s.running,
            replicated_index: s.replicated_index,
            last_success: s.last_success.map(Timestamp),
            last_error,
            last_error_message,
            last_lag_ms: s.last_lag_ms,
        }
    }
}

/// `GET /v1/operator/replication` (`operator:read`): this server's copies of the primary's
/// config entries and ACL system (on the primary: nothing runs).
pub(crate) async fn status(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let fed = api.store.federation();
    let view = |what| StatusView::from(fed.replication(what).borrow().clone());
    let body = serde_json::json!({
        "Datacenter": fed.local(),
        "PrimaryDatacenter": fed.primary(),
        "ConfigEntries": view(Replicated::ConfigEntries),
        "Acl": view(Replicated::Acl),
    });
    Ok(query::json(&body, None, params.pretty()))
}

/// `GET /v1/acl/replication` (no permission needed, as Consul), in Consul's shape.
pub(crate) fn acl_status(api: &Api) -> serde_json::Value {
    let fed = api.store.federation();
    let s = fed.replication(Replicated::Acl).borrow().clone();
    let never = Timestamp::default();
    let (last_error, message) = match &s.last_error {
        Some((at, why)) => (Timestamp(*at), why.clone()),
        None => (never, String::new()),
    };
    serde_json::json!({
        "Enabled": !fed.is_primary(),
        "Running": s.running,
        "SourceDatacenter": if fed.is_primary() { "" } else { fed.primary() },
        "ReplicationType": if fed.is_primary() { "" } else { "tokens" },
        "ReplicatedIndex": s.replicated_index,
        "ReplicatedRoleIndex": s.replicated_index,
        "ReplicatedTokenIndex": s.replicated_index,
        "LastSuccess": s.last_success.map_or(never, Timestamp),
        "LastError": last_error,
        "LastErrorMessage": message,
    })
}
