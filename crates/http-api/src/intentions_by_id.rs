//! Consul's legacy, ID-based intentions API: `POST /v1/connect/intentions` (create, answers
//! `{"ID": ...}`), `GET|PUT|DELETE /v1/connect/intentions/:id`.
//!
//! An intention written through the legacy APIs (these and `/exact`) gets its id when it is
//! created (`LegacyID` of its source in the `service-intentions` entry); intentions written
//! as config entries have none and are reached by name (`/exact`). Errors name the id or the
//! field: an id that is not a UUID is a 400, an unknown one a 404, a create of an intention
//! that exists a 409 naming its id; changing the source or destination of an existing
//! intention is a 400 (delete it and create the other).

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::{IndexKey, Op};
use serde::Deserialize;
use std::collections::BTreeMap;
use structs::Intention;
use structs::config_entry::{IntentionAction, IntentionPermission};

/// An intention as the legacy API takes it; other keys (`ID`, `Precedence`, `CreatedAt`, ...,
/// which the Go client sends back) are read-only and ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct IntentionBody {
    #[serde(rename = "SourceName")]
    pub(crate) source_name: String,
    #[serde(rename = "DestinationName")]
    pub(crate) destination_name: String,
    #[serde(rename = "SourceNS")]
    source_ns: String,
    #[serde(rename = "DestinationNS")]
    destination_ns: String,
    #[serde(rename = "SourceType")]
    source_type: String,
    #[serde(rename = "Action")]
    action: Option<IntentionAction>,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "Meta")]
    meta: BTreeMap<String, String>,
    #[serde(rename = "Permissions")]
    permissions: Vec<IntentionPermission>,
}

impl IntentionBody {
    /// Checks what only this API can get wrong (names, namespaces, source type); the entry's
    /// own validation checks the rest when it is written.
    pub(crate) fn check(&self) -> Result<(), ApiError> {
        for (field, value) in [
            ("SourceName", &self.source_name),
            ("DestinationName", &self.destination_name),
        ] {
            if value.is_empty() {
                return Err(ApiError::BadRequest(format!("{field}: required")));
            }
        }
        for (field, value) in [("SourceNS", &self.source_ns), ("DestinationNS", &self.destination_ns)] {
            if !matches!(value.as_str(), "" | "default") {
                return Err(ApiError::BadRequest(format!(
                    "{field}: {value:?} is not supported: meshd has only the default namespace"
                )));
            }
        }
        if !matches!(self.source_type.as_str(), "" | "consul") {
            return Err(ApiError::BadRequest(format!(
                "SourceType: {:?} is not supported: use consul",
                self.source_type
            )));
        }
        Ok(())
    }

    /// The write; `create`: refused if the intention exists.
    pub(crate) fn upsert(self, create: bool) -> Op {
        Op::IntentionUpsert {
            source: self.source_name,
            destination: self.destination_name,
            action: self.action,
            permissions: self.permissions,
            description: self.description,
            meta: self.meta,
            create,
        }
    }
}

/// The id in a path: a UUID, as Consul's intention ids are.
fn parse_id(id: &str) -> Result<(), ApiError> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(ApiError::BadRequest(format!(
            "id: {id:?} is not a UUID (intention ids are UUIDs)"
        )));
    }
    Ok(())
}

/// The intention with `id`, once the caller is entitled to it: `intentions:read` (`write`
/// when `write`) on its destination. The check comes first, found or not: a 404 to a caller
/// without the right would tell which ids exist.
fn entitled(state: &catalog::State, id: &str, authz: &Authz, write: bool) -> Result<Intention, ApiError> {
    let found = state.intentions().into_iter().find(|i| i.id == id);
    let destination = found.as_ref().map(|i| i.destination_name.as_str()).unwrap_or_default();
    if write {
        authz.need(|a| a.intention_write(destination), "intentions:write", destination)?;
    } else {
        authz.need(|a| a.intention_read(destination), "intentions:read", destination)?;
    }
    found.ok_or_else(|| ApiError::NotFound(format!("Intention not found: no intention has the id {id:?}")))
}

/// `POST /v1/connect/intentions`: creates the intention and answers its id.
pub(crate) async fn create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let req: IntentionBody = query::decode(&body, "an intention")?;
    req.check()?;
    authz.need(
        |a| a.intention_write(&req.destination_name),
        "intentions:write",
        &req.destination_name,
    )?;
    let (source, destination) = (req.source_name.clone(), req.destination_name.clone());
    let existing = |state: &catalog::State| {
        state
            .intentions()
            .into_iter()
            .find(|i| i.source_name == source && i.destination_name == destination)
    };
    if let Some(found) = existing(&api.store.read()) {
        return Err(ApiError::Conflict(format!(
            "duplicate intention found: {source} => {destination} exists (ID {:?})",
            found.id
        )));
    }
    let op = req.upsert(true);
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    let id = existing(&api.store.read()).map(|i| i.id).unwrap_or_default();
    Ok(query::json(&serde_json::json!({ "ID": id }), None, params.pretty()))
}

/// `GET /v1/connect/intentions/:id`.
pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    parse_id(&id)?;
    let state = api.read(&params, &IndexKey::Intentions).await?;
    let found = entitled(&state, &id, &authz, false)?;
    Ok(query::json(
        &found,
        Some(state.index_of(&IndexKey::Intentions)),
        params.pretty(),
    ))
}

/// `PUT /v1/connect/intentions/:id`: replaces the intention's action, permissions,
/// description and meta.
pub(crate) async fn update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    parse_id(&id)?;
    let mut req: IntentionBody = query::decode(&body, "an intention")?;
    let found = entitled(&api.store.read(), &id, &authz, true)?;
    for (field, given, current) in [
        ("SourceName", &mut req.source_name, &found.source_name),
        ("DestinationName", &mut req.destination_name, &found.destination_name),
    ] {
        if given.is_empty() {
            current.clone_into(given);
        } else if given != current {
            return Err(ApiError::BadRequest(format!(
                "{field}: changing it ({current:?} to {given:?}) is not supported: delete the intention and create another"
            )));
        }
    }
    req.check()?;
    let op = req.upsert(false);
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}

/// `DELETE /v1/connect/intentions/:id`.
pub(crate) async fn delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    parse_id(&id)?;
    let found = entitled(&api.store.read(), &id, &authz, true)?;
    let op = Op::IntentionDelete {
        source: found.source_name,
        destination: found.destination_name,
    };
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}
