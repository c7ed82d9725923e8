//! The proxy's `Config` as `connect envoy` reads it for the bootstrap: the registration's
//! keys over `proxy-defaults`' (Consul's layering), decoded into the bootstrap options.

use super::lookup::{Answer, Forbidden, lookup};
use crate::cli::EnvoyArgs;
use anyhow::{Context, Result};
use api_client::{Servers, paths};
use serde_json::Value;
use structs::bootstrap::BootstrapOptions;
use structs::proxy::OpaqueConfig;

/// The proxy `id`'s registered `Config`: from the agent (`/v1/agent/service/:id`), else from
/// the catalog (the instances of `service`, its sidecars then the service itself, for a
/// gateway), matching the id and (when given) the node. An unknown proxy has none: its
/// Envoy waits for it to be registered, as without these keys.
async fn registered(api: &Servers, args: &EnvoyArgs, node: &str, id: &str, service: &str) -> Result<OpaqueConfig> {
    let config = |v: &Value| v.as_object().cloned().unwrap_or_default();
    if let Answer { body: Some(svc), .. } =
        lookup(api, args, &format!("/v1/agent/service/{}", paths::segment(id))).await?
    {
        return Ok(config(&svc["Proxy"]["Config"]));
    }
    for path in [paths::catalog_connect(service), paths::catalog_service(service)] {
        let Answer {
            body: Some(Value::Array(rows)),
            ..
        } = lookup(api, args, &path).await?
        else {
            continue;
        };
        if let Some(row) = rows
            .iter()
            .find(|r| r["ServiceID"] == id && (node.is_empty() || r["Node"] == node))
        {
            return Ok(config(&row["ServiceProxy"]["Config"]));
        }
    }
    Ok(OpaqueConfig::new())
}

/// `proxy-defaults`' `Config` (readable with any token the servers know, as Consul; for a
/// managed proxy's agent-local token the agent reads it with its own); none without the
/// entry. A token that may not read it: the bootstrap goes without its keys, and says so
/// once on stderr.
async fn defaults(api: &Servers, args: &EnvoyArgs) -> Result<OpaqueConfig> {
    let path = paths::config_entry("proxy-defaults", "global");
    match lookup(api, args, &path).await {
        Ok(Answer { body: Some(entry), .. }) => Ok(entry["Config"].as_object().cloned().unwrap_or_default()),
        Ok(Answer { body: None, .. }) => Ok(OpaqueConfig::new()),
        Err(e) if e.downcast_ref::<Forbidden>().is_some() => {
            tracing::warn!(error = %e, "cannot read proxy-defaults with this token: the bootstrap goes without its Config keys (the proxy's own still apply)");
            Ok(OpaqueConfig::new())
        }
        Err(e) => Err(e),
    }
}

/// The bootstrap options of proxy `id` (of `service`, on `node` when known): its registered
/// `Config` over `proxy-defaults`', `$NAME` values from this process's environment. A value
/// that does not decode is an error naming the key.
pub(super) async fn bootstrap_options(
    args: &EnvoyArgs,
    node: &str,
    id: &str,
    service: &str,
) -> Result<BootstrapOptions> {
    let api = Servers::new(&[args.http_addr.to_string()]);
    let mut config = defaults(&api, args).await?;
    config.extend(registered(&api, args, node, id, service).await?);
    let env = |var: &str| std::env::var(var).ok();
    BootstrapOptions::parse(&config, &env).with_context(|| format!("the Config of proxy {id:?}"))
}
