//! `POST /v1/agent/connect/authorize` (PUT too, as py-consul sends; Consul's, for
//! connect-native services): may a client
//! presenting the certificate URI `ClientCertURI` connect to `Target`? The caller is the
//! target service, so it needs `service:write` on it, as Consul's. Answers
//! `{"Authorized", "Reason"}`: a client of another trust domain is refused; otherwise the
//! intentions decide as for the proxies (the highest-precedence match, else the default,
//! which follows the ACL default policy); an intention with L7 permissions cannot authorize
//! a connection here (it needs the request), so it answers false, saying so. Agents forward
//! it to a server with the caller's token. `ClientCertSerial` is accepted and not used
//! (Consul's is not either).

use crate::authz::Authz;
use crate::query;
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use serde::{Deserialize, Serialize};
use structs::{SpiffeIdService, intention};

#[derive(Deserialize, Default)]
#[serde(default)]
struct AuthorizeRequest {
    #[serde(rename = "Target")]
    target: String,
    #[serde(rename = "ClientCertURI")]
    client_cert_uri: String,
    #[serde(rename = "ClientCertSerial")]
    _client_cert_serial: String,
}

#[derive(Serialize)]
struct Answer {
    #[serde(rename = "Authorized")]
    authorized: bool,
    #[serde(rename = "Reason")]
    reason: String,
}

pub(crate) async fn authorize(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let req: AuthorizeRequest = query::decode(&body, "an authorization request")?;
    for (field, value) in [("Target", &req.target), ("ClientCertURI", &req.client_cert_uri)] {
        if value.is_empty() {
            return Err(ApiError::BadRequest(format!("{field}: required")));
        }
    }
    authz.need(|a| a.service_write(&req.target), "service:write", &req.target)?;
    let client: SpiffeIdService = req
        .client_cert_uri
        .parse()
        .map_err(|e| ApiError::BadRequest(format!("ClientCertURI: {:?}: {e}", req.client_cert_uri)))?;
    let state = api.read(&params, &IndexKey::Intentions).await?;
    let trust_domain = state.ca().map(|ca| ca.trust_domain()).unwrap_or_default();
    let answer = if client.trust_domain != trust_domain {
        Answer {
            authorized: false,
            reason: format!(
                "Client certificate is from trust domain {:?}, not this cluster's ({trust_domain:?})",
                client.trust_domain
            ),
        }
    } else {
        let source = &client.service;
        let decision = intention::decide(
            &state.intentions(),
            source,
            &req.target,
            api.config.acl.intention_default_allow(),
        );
        let reason = decision.reason(source, &req.target);
        Answer {
            authorized: decision.allowed,
            reason,
        }
    };
    Ok(query::json(&answer, None, params.pretty()))
}
