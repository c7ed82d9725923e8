//! `/v1/connect/*` and the agent's leaf endpoint: CA roots and configuration, leaf
//! certificates, intentions.

use crate::authz::{Authz, mark_filtered, retain};
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::{IndexKey, Op, ca::CaConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use structs::{GoDuration, Index, Intention, intention};

pub(crate) async fn roots(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    if params.bool("pem")? {
        return Err(ApiError::BadRequest(
            "pem: PEM output is not supported; read RootCert from the JSON".into(),
        ));
    }
    let state = api.read(&params, &IndexKey::Ca).await?;
    Ok(query::json(
        &state.ca_roots(),
        Some(state.index_of(&IndexKey::Ca)),
        params.pretty(),
    ))
}

#[derive(Serialize)]
struct CaConfigurationOut<'a> {
    #[serde(rename = "Provider")]
    provider: &'static str,
    #[serde(rename = "Config")]
    config: CaConfigOut<'a>,
    #[serde(rename = "ClusterID")]
    cluster_id: &'a str,
    #[serde(rename = "ForceWithoutCrossSigning")]
    force_without_cross_signing: bool,
    #[serde(rename = "CreateIndex")]
    create_index: Index,
    #[serde(rename = "ModifyIndex")]
    modify_index: Index,
}

/// The built-in CA's settings with Consul's `IntermediateCertTTL`, which the built-in CA
/// shows at Consul's default and cannot change: it signs leaves with its root (a client that
/// writes back what it read sends the same value, which is accepted).
#[derive(serde::Serialize)]
struct CaConfigOut<'a> {
    #[serde(flatten)]
    config: &'a CaConfig,
    #[serde(rename = "IntermediateCertTTL")]
    intermediate_cert_ttl: &'static str,
}

/// Consul's default `IntermediateCertTTL` (a year), the only value the built-in CA takes.
const INTERMEDIATE_CERT_TTL: &str = "8760h0m0s";

pub(crate) async fn ca_configuration(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let params = Params::parse(q.as_deref());
    let state = api.read(&params, &IndexKey::Ca).await?;
    let ca = state
        .ca()
        .ok_or_else(|| ApiError::Internal("the CA is not initialised".into()))?;
    let out = CaConfigurationOut {
        provider: "consul",
        config: CaConfigOut {
            config: &ca.config,
            intermediate_cert_ttl: INTERMEDIATE_CERT_TTL,
        },
        cluster_id: &ca.cluster_id,
        force_without_cross_signing: false,
        create_index: ca.create_index,
        modify_index: ca.modify_index,
    };
    Ok(query::json(&out, Some(state.index_of(&IndexKey::Ca)), params.pretty()))
}

/// The parts of a CA configuration a PUT may change; unset fields keep their values.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CaConfigPatch {
    #[serde(rename = "LeafCertTTL")]
    leaf_cert_ttl: Option<GoDuration>,
    #[serde(rename = "RootCertTTL")]
    root_cert_ttl: Option<GoDuration>,
    #[serde(rename = "PrivateKeyType")]
    private_key_type: Option<String>,
    #[serde(rename = "PrivateKeyBits")]
    private_key_bits: Option<u32>,
    /// Every other key: refused unless empty (see [`CaConfigPatch::refuse_others`]).
    #[serde(flatten)]
    others: std::collections::BTreeMap<String, serde_json::Value>,
}

impl CaConfigPatch {
    /// The built-in CA makes its own keys and roots and has no other settings: a supplied
    /// key or root, or any other setting, is refused rather than accepted and ignored. A key
    /// given as empty or `null` (what clients send for unset fields) means unset.
    fn refuse_others(&self) -> Result<(), ApiError> {
        for (key, value) in &self.others {
            let unset = value.is_null() || value.as_str() == Some("") || value.as_u64() == Some(0);
            let default_intermediate = key == "IntermediateCertTTL"
                && value
                    .as_str()
                    .and_then(|s| GoDuration::parse(s).ok())
                    .is_some_and(|d| Some(d) == GoDuration::parse(INTERMEDIATE_CERT_TTL).ok());
            if unset || default_intermediate {
                continue;
            }
            let why = match key.as_str() {
                "PrivateKey" | "RootCert" => {
                    "a user-supplied root key or certificate is not supported: the built-in CA makes its own (change PrivateKeyType or PrivateKeyBits to rotate to a new root, cross-signed)"
                }
                "IntermediateCertTTL" => {
                    "only 8760h0m0s (Consul's default) is accepted: the built-in CA signs leaves with its root, without an intermediate"
                }
                _ => "not supported by the built-in CA",
            };
            return Err(ApiError::BadRequest(format!("Config.{key}: {why}")));
        }
        Ok(())
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CaConfigurationIn {
    #[serde(rename = "Provider")]
    provider: String,
    #[serde(rename = "Config")]
    config: CaConfigPatch,
    #[serde(rename = "ForceWithoutCrossSigning")]
    force_without_cross_signing: bool,
}

pub(crate) async fn set_ca_configuration(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    let req: CaConfigurationIn = query::decode(&body, "a CA configuration")?;
    if !req.provider.is_empty() && req.provider != "consul" {
        return Err(ApiError::BadRequest(format!(
            "Provider: {:?} is not available: only the built-in \"consul\" provider is supported",
            req.provider
        )));
    }
    let _ = req.force_without_cross_signing;
    req.config.refuse_others()?;
    let current = api
        .store
        .read()
        .ca()
        .ok_or_else(|| ApiError::Internal("the CA is not initialised".into()))?;
    let mut config = current.config.clone();
    let patch = req.config;
    if let Some(v) = patch.leaf_cert_ttl {
        config.leaf_cert_ttl = v;
    }
    if let Some(v) = patch.root_cert_ttl {
        config.root_cert_ttl = v;
    }
    if let Some(v) = patch.private_key_type {
        config.private_key_type = v;
    }
    if let Some(v) = patch.private_key_bits {
        config.private_key_bits = v;
    }
    api.store.write(Op::CaConfigure(config)).await?;
    Ok(query::json(&true, None, params.pretty()))
}

pub(crate) async fn leaf(
    State(api): State<Api>,
    authz: Authz,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_write(&service), "service:write", &service)?;
    structs::validate::Validate::validate(&structs::NodeService {
        service: service.clone(),
        ..Default::default()
    })
    .map_err(|e| ApiError::BadRequest(e.to_string().replacen("Service", "service", 1)))?;
    api.read(&params, &IndexKey::Ca).await?;
    let cert = api.store.leaf(&service)?;
    Ok(query::json(&*cert, Some(cert.modify_index), params.pretty()))
}

/// The body of `PUT /v1/internal/connect/ca/sign`.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct SignRequest {
    #[serde(rename = "CSR", alias = "csr", default)]
    csr: String,
}

/// Signs an agent's certificate signing request: the agent keeps the private key, the answer
/// carries the certificate only. The CSR must name one service identity of this CA's trust
/// domain and datacenter.
pub(crate) async fn sign(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    authz.get()?;
    let request: SignRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("request decode failed: invalid JSON: {e}")))?;
    if request.csr.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "CSR: missing (expected a PEM certificate signing request)".into(),
        ));
    }
    let cert = api.store.sign_csr(&request.csr).map_err(csr_error)?;
    // Signing changes nothing: a certificate for a service the token may not write is
    // dropped here, never returned.
    authz.need(|a| a.service_write(&cert.service), "service:write", &cert.service)?;
    Ok(query::json(&cert, Some(cert.modify_index), params.pretty()))
}

pub(crate) async fn list_intentions(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let state = api.read(&params, &IndexKey::Intentions).await?;
    let mut all = state.intentions();
    let filtered = retain(&mut all, |i| a.intention_read(&i.destination_name));
    Ok(mark_filtered(
        query::json(&all, Some(state.index_of(&IndexKey::Intentions)), params.pretty()),
        filtered,
    ))
}

fn exact(params: &Params) -> Result<(String, String), ApiError> {
    Ok((
        params.required("source")?.to_owned(),
        params.required("destination")?.to_owned(),
    ))
}

pub(crate) async fn get_intention(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let (source, destination) = exact(&params)?;
    authz.need(|a| a.intention_read(&destination), "intentions:read", &destination)?;
    let state = api.read(&params, &IndexKey::Intentions).await?;
    let found = state
        .intentions()
        .into_iter()
        .find(|i| i.source_name == source && i.destination_name == destination);
    match found {
        Some(ixn) => Ok(query::json(
            &ixn,
            Some(state.index_of(&IndexKey::Intentions)),
            params.pretty(),
        )),
        None => Err(ApiError::NotFound(format!(
            "Intention not found: {source} => {destination}"
        ))),
    }
}

pub(crate) async fn put_intention(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let (source, destination) = exact(&params)?;
    authz.need(|a| a.intention_write(&destination), "intentions:write", &destination)?;
    let mut req: crate::intentions_by_id::IntentionBody = query::decode(&body, "an intention")?;
    // The names are the query's; any in the body are ignored, as Consul's exact API does.
    (req.source_name, req.destination_name) = (source, destination);
    req.check()?;
    let op = req.upsert(false);
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}

pub(crate) async fn delete_intention(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let (source, destination) = exact(&params)?;
    authz.need(|a| a.intention_write(&destination), "intentions:write", &destination)?;
    let op = Op::IntentionDelete { source, destination };
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}

pub(crate) async fn match_intentions(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let by = params.required("by")?;
    if !matches!(by, "source" | "destination") {
        return Err(ApiError::BadRequest(format!(
            "by: {by:?} must be \"source\" or \"destination\""
        )));
    }
    let names = params.all("name");
    if names.is_empty() {
        return Err(ApiError::BadRequest("required query parameter 'name' not set".into()));
    }
    let state = api.read(&params, &IndexKey::Intentions).await?;
    let mut all = state.intentions();
    let filtered = retain(&mut all, |i| a.intention_read(&i.destination_name));
    let out: BTreeMap<&str, Vec<&Intention>> = names
        .iter()
        .map(|name| {
            let matched = all
                .iter()
                .filter(|i| {
                    if by == "source" {
                        i.matches_source(name)
                    } else {
                        i.matches_destination(name)
                    }
                })
                .collect();
            (*name, matched)
        })
        .collect();
    Ok(mark_filtered(
        query::json(&out, Some(state.index_of(&IndexKey::Intentions)), params.pretty()),
        filtered,
    ))
}

pub(crate) async fn check_intention(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    #[derive(Serialize)]
    struct Allowed {
        #[serde(rename = "Allowed")]
        allowed: bool,
    }
    let params = Params::parse(q.as_deref());
    let (source, destination) = exact(&params)?;
    authz.need(|a| a.intention_read(&destination), "intentions:read", &destination)?;
    let state = api.read(&params, &IndexKey::Intentions).await?;
    // The mesh's default follows the ACL default policy, as Consul's (allow without ACLs).
    let default_allow = api.config.acl.intention_default_allow();
    let decision = intention::decide(&state.intentions(), &source, &destination, default_allow);
    Ok(query::json(
        &Allowed {
            allowed: decision.allowed,
        },
        Some(state.index_of(&IndexKey::Intentions)),
        params.pretty(),
    ))
}

/// The answer to a CSR the CA refused: the requester's fault (a 400 naming what is wrong),
/// or the CA's (a 500).
pub(crate) fn csr_error(e: catalog::ca::CsrError) -> ApiError {
    match e {
        catalog::ca::CsrError::Ca(catalog::ca::CaError::NoActiveRoot) => ApiError::Internal(e.to_string()),
        catalog::ca::CsrError::Ca(catalog::ca::CaError::InvalidDnsSan(_) | catalog::ca::CaError::ReservedDnsSan(_)) => {
            ApiError::BadRequest(e.to_string())
        }
        catalog::ca::CsrError::Ca(_) => ApiError::Internal(crate::error::chain(&e)),
        _ => ApiError::BadRequest(e.to_string()),
    }
}
