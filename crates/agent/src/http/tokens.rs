//! `PUT /v1/agent/token/:type` (`acl:write`, as Consul's): replaces the agent's `default`
//! token (what requests naming none run with) or its `agent` token (what the agent's own
//! requests to the servers carry), Consul's older names `acl_token` and `acl_agent_token`
//! too. `{"Token": ""}` clears it. The change lasts until the agent stops (not persisted,
//! as Consul's without `enable_token_persistence`); the tokens of its config files or flags
//! apply again at the next start. Consul's other token types are a 400 saying meshd has no
//! use for them; an unknown type is a 404 naming it.

use super::answer::{HttpError, decode, need, ok_empty, resolve};
use crate::runtime::Agent;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use http_kit::Params;

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct TokenBody {
    #[serde(rename = "Token")]
    token: String,
}

pub(super) async fn set_token(
    State(agent): State<Agent>,
    Path(kind): Path<String>,
    q: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let is_agent = token_kind(&kind, "agent")?;
    let (_, who) = resolve(&agent, &headers, &q).await?;
    need(&who, who.authz.acl_write(), "acl:write", "")?;
    agent.acl().set_token(is_agent, token_body(&body)?);
    Ok(ok_empty())
}

/// Whether `/v1/agent/token/:kind` names the `agent` token (else the `default` one); Consul's
/// other types are a 400 saying a meshd `node` (agent, server) has neither, an unknown one a
/// 404 naming it. Servers answer this path themselves, through this.
pub fn token_kind(kind: &str, node: &str) -> Result<bool, HttpError> {
    match kind {
        "default" | "acl_token" => Ok(false),
        "agent" | "acl_agent_token" => Ok(true),
        "agent_recovery"
        | "agent_master"
        | "acl_agent_master_token"
        | "replication"
        | "acl_replication_token"
        | "config_file_service_registration"
        | "dns" => Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!("{kind}: not supported: a meshd {node} has a default and an agent token only"),
        )),
        _ => Err(HttpError(StatusCode::NOT_FOUND, format!("Token {kind:?} is unknown"))),
    }
}

/// The token of a `/v1/agent/token/:kind` body (`{"Token": ""}`: none, clearing it).
pub fn token_body(body: &Bytes) -> Result<Option<structs::Token>, HttpError> {
    let req: TokenBody = decode(body, "a token")?;
    // It travels in a header: visible ASCII without spaces, as token secrets are.
    if req.token.len() > 256 || !req.token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            "Token: must be at most 256 visible ASCII characters without spaces".into(),
        ));
    }
    Ok(structs::Token::new(&req.token))
}
