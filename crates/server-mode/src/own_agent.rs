//! The server's own agent. A Consul server is an agent too: tools register services and
//! checks on it (`/v1/agent/service/register`, `/v1/agent/checks`, node maintenance, ...),
//! and so may they on a meshd server. Its agent is the agent crate's, reaching this server's
//! API over loopback as an agent reaches its servers, with the server's node: the server
//! registers the node and keeps it alive (see [`crate::self_registration`]), the agent keeps
//! what is registered through it in sync, persisted under `<data-dir>/agent` (in memory with
//! `-dev`). With ACLs, it carries a token only this process knows, which may write its own
//! node and read the catalog (`PUT /v1/agent/token/agent` replaces it, as on Consul).

use crate::ServerError;
use crate::args::ServerArgs;
use crate::self_registration::SelfRegistration;
use agent::{Agent, AgentConfig};
use catalog::acl::Resolver;
use std::net::SocketAddr;

/// Where the server's API is, for its agent.
pub(crate) struct OwnApi {
    /// The plain HTTP listener, else the HTTPS one.
    pub(crate) addr: SocketAddr,
    /// Whether `addr` is the HTTPS listener (the plain one is off).
    pub(crate) https: bool,
}

/// Starts the server's agent.
pub(crate) async fn start(
    args: &ServerArgs,
    registration: &SelfRegistration,
    acl: &Resolver,
    api: &OwnApi,
    ca_pem: Option<&[u8]>,
) -> Result<Agent, ServerError> {
    let node = registration.request();
    let agent_token = if args.acl_enabled {
        let token = agent::acl::AgentAcl::new_local_token()
            .map_err(|e| ServerError::Store(format!("the server's agent token: {e}")))?;
        acl.add_internal(token.clone(), "server-agent", &internal_rules(&args.node))
            .map_err(|e| ServerError::Flags(format!("-node {:?}: the agent's rules: {e}", args.node)))?;
        Some(token)
    } else {
        None
    };
    let (url, ca_pem, identity_pem) = reach(args, api, ca_pem)?;
    let config = AgentConfig {
        node: args.node.clone(),
        datacenter: args.datacenter.clone(),
        advertise: node.address.clone(),
        tagged_addresses: Some(node.tagged_addresses.clone()),
        node_id: Some(node.id.clone()),
        data_dir: (!args.dev)
            .then(|| args.data_dir.as_ref().map(|d| d.join("agent")))
            .flatten(),
        servers: vec![url],
        servers_ca_pem: ca_pem,
        servers_identity_pem: identity_pem,
        acl: agent::acl::AclConfig {
            enabled: args.acl_enabled,
            default_allow: args.acl_default_policy == "allow",
            agent_token,
            default_token: None,
        },
        listeners: [
            Some(api.addr),
            args.grpc_addr.0,
            args.tls.https_addr,
            args.tls.grpc_tls_addr,
        ]
        .into_iter()
        .flatten()
        .collect(),
        in_server: true,
        ..AgentConfig::default()
    };
    if config.data_dir.is_none() && !args.dev {
        tracing::info!(
            "no -data-dir: what is registered through this server's agent is kept in memory and goes at its restart"
        );
    }
    let agent = Agent::start(config)
        .await
        .map_err(|e| ServerError::Store(format!("the server's agent: {}", crate::error::chain(&e))))?;
    // The config files' services and checks, as at an agent's start: one that cannot be
    // used stops the start, naming the file and key.
    let loaded = match config_files(args).load() {
        Ok(file) => agent
            .load_config(file.services, file.checks)
            .await
            .map_err(|e| ServerError::Flags(format!("-config-file: {e}"))),
        Err(e) => Err(ServerError::Flags(format!("-config-file: {e}"))),
    };
    if let Err(e) = loaded {
        agent.shutdown().await;
        return Err(e);
    }
    Ok(agent)
}

/// The server's `-config-file`s: services and checks only.
pub(crate) fn config_files(args: &ServerArgs) -> agent::reload::ConfigFiles {
    agent::reload::ConfigFiles {
        paths: args.config_file.clone(),
        definitions_only: true,
    }
}

/// What the server's own agent may do: write its node, read the catalog (to compare).
fn internal_rules(node: &str) -> String {
    format!(
        "node \"{node}\" {{ policy = \"write\" }}\nnode_prefix \"\" {{ policy = \"read\" }}\nservice_prefix \"\" {{ policy = \"read\" }}\n"
    )
}

/// The URL, the CA's PEM, the client certificate's and key's PEM.
type Reach = (String, Option<Vec<u8>>, Option<Vec<u8>>);

/// The URL the agent reaches the server at (loopback when it listens on every address),
/// with, over HTTPS, the CA that verifies it (`ca_pem`, `-tls-ca-file`'s) and the
/// certificate the agent presents when the server verifies clients. Over HTTPS the name is
/// `localhost`: the server's certificate must name it (Consul's server certificates do).
fn reach(args: &ServerArgs, api: &OwnApi, ca_pem: Option<&[u8]>) -> Result<Reach, ServerError> {
    let port = api.addr.port();
    if !api.https {
        let host = match api.addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv6() => "[::1]".to_owned(),
            ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        return Ok((format!("http://{host}:{port}"), None, None));
    }
    let identity = if args.tls.verify_incoming {
        crate::flag_files::own_identity_pem(args)?
    } else {
        None
    };
    Ok((
        format!("https://localhost:{port}"),
        ca_pem.map(<[u8]>::to_vec),
        identity,
    ))
}

/// `PUT /v1/agent/token/:type` on a server (`acl:write`, as Consul's): `agent` (Consul's
/// older `acl_agent_token` too) replaces the agent's token; `default` (`acl_token`) the token
/// every request naming none runs with, on the server's whole API, its DNS and its agent.
/// `{"Token": ""}` clears it. Kept in memory until the server stops (as Consul's without
/// token persistence). Consul's other types are a 400 saying why; an unknown one a 404.
pub(crate) fn token_router(agent: Agent, acl: std::sync::Arc<Resolver>) -> axum::Router {
    use agent::http::tokens::{token_body, token_kind};
    use axum::extract::Path;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let route = move |Path(kind): Path<String>, caller: node::authz::Caller, body: axum::body::Bytes| {
        let (agent, acl) = (agent.clone(), std::sync::Arc::clone(&acl));
        async move {
            if matches!(kind.as_str(), "replication" | "acl_replication_token") {
                let why =
                    format!("{kind}: a meshd server's replication token is set with -acl-replication-token-file\n");
                return (StatusCode::BAD_REQUEST, why).into_response();
            }
            let is_agent = match token_kind(&kind, "server") {
                Ok(is_agent) => is_agent,
                Err(e) => return e.into_response(),
            };
            if let Err(denied) = caller.need(caller.0.authz.acl_write(), "acl:write", "") {
                return denied.into_response();
            }
            let token = match token_body(&body) {
                Ok(token) => token,
                Err(e) => return e.into_response(),
            };
            if !is_agent {
                acl.set_default_token(token.clone());
            }
            agent.acl().set_token(is_agent, token);
            StatusCode::OK.into_response()
        }
    };
    axum::Router::new().route("/v1/agent/token/{kind}", axum::routing::put(route))
}
