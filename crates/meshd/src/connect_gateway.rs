//! `meshd connect envoy -gateway=ingress|terminating|mesh|api -service NAME [-register -address
//! HOST:PORT [-wan-address HOST:PORT]]`: which gateway the Envoy runs for, and its
//! registration through the API (the agent at `-http-addr` when it is one, else the catalog
//! of the server there).

use crate::cli::EnvoyArgs;
use anyhow::{Context, Result, bail};
use api_client::{Servers, paths};
use structs::agent::ServiceDefinition;
use structs::service::ServiceAddress;
use structs::{NodeService, RegisterRequest, ServiceKind, Token};

/// A gateway the flags name: its kind (Consul's spelling) and service name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// `ingress-gateway`, `terminating-gateway`, `mesh-gateway` or `api-gateway`.
    pub kind: &'static str,
    /// The gateway service's name.
    pub service: String,
}

/// The gateway the flags name, if any (`-gateway` needs `-service`, but for a mesh gateway,
/// named `mesh-gateway` by default as Consul's).
pub fn gateway(args: &EnvoyArgs) -> Result<Option<Gateway>> {
    let Some(kind) = args.gateway.as_deref() else {
        return Ok(None);
    };
    let kind = match kind {
        "ingress" => "ingress-gateway",
        "terminating" => "terminating-gateway",
        "mesh" => "mesh-gateway",
        "api" => "api-gateway",
        other => bail!("-gateway {other:?}: expected ingress, terminating, mesh or api"),
    };
    let named = args.service.clone().filter(|s| !s.is_empty());
    let Some(service) = named.or_else(|| (kind == "mesh-gateway").then(|| kind.to_owned())) else {
        bail!(
            "-gateway {} needs -service NAME (the gateway service's name)",
            args.gateway.as_deref().unwrap_or_default()
        );
    };
    Ok(Some(Gateway { kind, service }))
}

/// `HOST:PORT` of the flag `-<flag>`, split (an IPv6 host in brackets).
fn host_port(flag: &str, address: &str) -> Result<(String, u16)> {
    let (host, port) = address
        .rsplit_once(':')
        .with_context(|| format!("-{flag} {address:?}: expected HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .with_context(|| format!("-{flag} {address:?}: {port:?} is not a port (1-65535)"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        bail!("-{flag} {address:?}: the host is missing");
    }
    Ok((host.to_owned(), port))
}

/// Registers `gw` with the agent at `-http-addr` (`PUT /v1/agent/service/register`; a
/// server is the agent of its own node), or, when that is a server and `-node` names
/// another node, in its catalog on that node (`PUT /v1/catalog/register`). Name and ID are the gateway's name (or `-proxy-id`).
pub async fn register(args: &EnvoyArgs, gw: &Gateway, token: Option<&Token>) -> Result<()> {
    let address = args
        .address
        .as_deref()
        .context("-register needs -address HOST:PORT (where the gateway listens)")?;
    let (host, port) = host_port("address", address)?;
    let id = args.proxy_id.clone().unwrap_or_else(|| gw.service.clone());
    let kind: ServiceKind = gw
        .kind
        .parse()
        .map_err(|e| anyhow::anyhow!("-gateway {}: {e}", gw.kind))?;
    let tagged_addresses = tagged_addresses(args, kind, &host, port)?;
    let api = Servers::new(&[args.http_addr.to_string()]);
    let definition = ServiceDefinition {
        kind,
        id: id.clone(),
        name: gw.service.clone(),
        address: host.clone(),
        port,
        tagged_addresses: tagged_addresses.clone(),
        ..ServiceDefinition::default()
    };
    // A server is an agent of its own node too; `-node` naming another node registers in
    // its catalog there.
    let own_node = api
        .get_json_as::<serde_json::Value>(token, paths::AGENT_SELF)
        .await
        .ok()
        .filter(|me| me["Config"]["Server"] == true)
        .map(|me| me["Config"]["NodeName"].as_str().unwrap_or_default().to_owned());
    let elsewhere = own_node.is_some_and(|own| !args.node.is_empty() && args.node != own);
    let catalog = NodeService {
        kind,
        id,
        service: gw.service.clone(),
        address: definition.address.clone(),
        port,
        tagged_addresses,
        ..NodeService::default()
    };
    let registered = if elsewhere {
        register_in_catalog(&api, args, token, catalog, host).await
    } else {
        match api.put_json_as(token, paths::AGENT_SERVICE_REGISTER, &definition).await {
            // No agent route (an older server): its catalog, on the node given.
            Err(e) if matches!(e.status(), Some(404 | 405)) => {
                if args.node.is_empty() {
                    bail!(
                        "-register against a server ({}) needs -node NAME (the catalog node of the gateway)",
                        args.http_addr
                    );
                }
                register_in_catalog(&api, args, token, catalog, host).await
            }
            other => other.map_err(|e| (paths::AGENT_SERVICE_REGISTER, e)),
        }
    };
    match registered {
        Ok(()) => Ok(()),
        Err((_, e)) if e.is_unreachable() && e.status().is_none() => {
            bail!("cannot reach the meshd HTTP API at {}: {e}", args.http_addr)
        }
        Err((path, e)) => bail!("registering {} {:?}: PUT {path}: {e}", gw.kind, gw.service),
    }
}

/// Registers `service` in the catalog of the server at `-http-addr`, on `-node` (not empty).
async fn register_in_catalog(
    api: &Servers,
    args: &EnvoyArgs,
    token: Option<&Token>,
    service: NodeService,
    node_address: String,
) -> Result<(), (&'static str, api_client::ApiError)> {
    let register = RegisterRequest {
        node: args.node.clone(),
        address: node_address,
        skip_node_update: true,
        service: Some(service),
        ..RegisterRequest::default()
    };
    api.put_json_as(token, paths::CATALOG_REGISTER, &register)
        .await
        .map_err(|e| (paths::CATALOG_REGISTER, e))
}

/// A mesh gateway's `lan` and `wan` tagged addresses (where this datacenter's proxies and
/// other datacenters reach it); none for other kinds, which refuse `-wan-address`.
fn tagged_addresses(
    args: &EnvoyArgs,
    kind: ServiceKind,
    host: &str,
    port: u16,
) -> Result<std::collections::BTreeMap<String, ServiceAddress>> {
    let mut tagged = std::collections::BTreeMap::new();
    if kind != ServiceKind::MeshGateway {
        if let Some(wan) = &args.wan_address {
            bail!("-wan-address {wan:?}: only a mesh gateway (-gateway mesh) has one");
        }
        return Ok(tagged);
    }
    let (wan_host, wan_port) = match &args.wan_address {
        Some(wan) => host_port("wan-address", wan)?,
        None => (host.to_owned(), port),
    };
    let at = |address: String, port: u16| ServiceAddress { address, port };
    tagged.insert("lan".to_owned(), at(host.to_owned(), port));
    tagged.insert("wan".to_owned(), at(wan_host, wan_port));
    Ok(tagged)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(
            host_port("address", "10.0.0.5:8443").unwrap(),
            ("10.0.0.5".to_owned(), 8443)
        );
        assert_eq!(host_port("address", "[::1]:443").unwrap(), ("::1".to_owned(), 443));
        assert_eq!(
            host_port("address", "gw.local:80").unwrap(),
            ("gw.local".to_owned(), 80)
        );
        for bad in ["10.0.0.5", "10.0.0.5:0", "10.0.0.5:http", ":80"] {
            assert!(host_port("address", bad).is_err(), "{bad}");
        }
    }
}
