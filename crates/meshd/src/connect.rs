//! `meshd connect envoy`: find the proxy, build its bootstrap, print it or exec Envoy.

use crate::cli::EnvoyArgs;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use supervisor::bootstrap::{BootstrapConfig, bootstrap_json};

/// The proxy's (node, service id, service name) for the flags given.
async fn resolve(args: &EnvoyArgs) -> Result<(String, String, String)> {
    match (&args.proxy_id, &args.sidecar_for) {
        (Some(id), _) => Ok((
            args.node.clone(),
            id.clone(),
            id.trim_end_matches("-sidecar-proxy").to_owned(),
        )),
        (None, Some(service)) => {
            let url = format!("http://{}/v1/catalog/connect/{service}", args.http_addr);
            let mut req = reqwest::Client::new().get(&url);
            if !args.token.is_empty() {
                req = req.header("X-Consul-Token", &args.token);
            }
            let body: Value = req
                .send()
                .await
                .with_context(|| format!("cannot reach the meshd HTTP API at {}", args.http_addr))?
                .error_for_status()
                .context("looking up the sidecar")?
                .json()
                .await
                .context("reading the sidecar lookup")?;
            let proxies: Vec<&Value> = body
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|s| s["ServiceKind"] == "connect-proxy")
                        .filter(|s| args.node.is_empty() || s["Node"] == args.node.as_str())
                        .collect()
                })
                .unwrap_or_default();
            match proxies.as_slice() {
                [one] => Ok((
                    one["Node"].as_str().unwrap_or_default().to_owned(),
                    one["ServiceID"].as_str().unwrap_or_default().to_owned(),
                    service.clone(),
                )),
                [] => bail!("no sidecar proxy is registered for service {service:?}"),
                _ => bail!(
                    "{} sidecar proxies are registered for {service:?}: pick one with -proxy-id or -node",
                    proxies.len()
                ),
            }
        }
        (None, None) => bail!("one of -proxy-id or -sidecar-for is required"),
    }
}

/// Prints the bootstrap (`-bootstrap`) or replaces this process with Envoy.
pub async fn run(args: EnvoyArgs) -> Result<()> {
    let (node_name, proxy_id, cluster) = resolve(&args).await?;
    let cfg = BootstrapConfig {
        proxy_id,
        node_name,
        cluster,
        admin_bind: args.admin_bind,
        xds_addr: args.grpc_addr,
        token: args.token.clone(),
    };
    let json = serde_json::to_string_pretty(&bootstrap_json(&cfg)).context("encoding the bootstrap")?;
    if args.bootstrap {
        #[allow(clippy::print_stdout)]
        {
            println!("{json}");
        }
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&args.envoy_binary)
        .arg("--config-yaml")
        .arg(&json)
        .args(&args.envoy_args)
        .exec();
    bail!("cannot run {}: {err}", args.envoy_binary.display())
}
