//! `meshd connect redirect-traffic`, after Consul's: installs in a network namespace (this
//! one, or `-netns`) the NAT rules that send its TCP traffic through a transparent sidecar,
//! with the ports read from the sidecar's registration at the agent (`-proxy-id`), and
//! removes them (`-remove`). The rules are an nftables table written over netlink (crate
//! `redirect`): no iptables binary is needed, and a run replaces the table whole.

use crate::acl_cli::request;
use crate::cli::RedirectTrafficArgs;
use anyhow::{Context, Result, bail};
use redirect::Rules;
use std::net::SocketAddrV4;

/// Runs the command; prints one line saying what it did.
pub async fn run(args: RedirectTrafficArgs) -> Result<()> {
    let netns = args.netns.as_deref();
    let place = match netns {
        Some(p) => format!("network namespace {}", p.display()),
        None => "this network namespace".to_owned(),
    };
    let said = if args.remove {
        if redirect::remove(netns).context("-remove")? {
            format!("Removed the redirection rules of {place}\n")
        } else {
            format!("No redirection rules to remove in {place}\n")
        }
    } else {
        let rules = rules(&args).await?;
        redirect::apply(&rules, netns)?;
        format!(
            "Redirected {place}: inbound TCP to port {}, outbound TCP to port {} (the proxy's user {} excluded){}\n",
            rules.inbound_port,
            rules.outbound_port,
            rules.proxy_uid,
            rules.dns.map(|d| format!(", DNS to {d}")).unwrap_or_default()
        )
    };
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(said.as_bytes())
        .context("writing the result")
}

/// The rules for the flags, the sidecar's registration filling in what they leave out.
async fn rules(args: &RedirectTrafficArgs) -> Result<Rules> {
    let Some(proxy_uid) = args.proxy_uid else {
        bail!("-proxy-uid is required: the user the proxy runs as, whose traffic is never redirected");
    };
    let mut rules = Rules {
        proxy_uid,
        inbound_port: 0,
        outbound_port: redirect::DEFAULT_OUTBOUND_PORT,
        exclude_inbound_ports: args.exclude_inbound_ports.clone(),
        exclude_outbound_ports: args.exclude_outbound_ports.clone(),
        exclude_outbound_cidrs: args.exclude_outbound_cidrs.clone(),
        exclude_uids: args.exclude_uids.clone(),
        dns: None,
    };
    if let Some(id) = &args.proxy_id {
        from_registration(args, id, &mut rules).await?;
    }
    if let Some(port) = args.proxy_inbound_port {
        rules.inbound_port = port;
    }
    if let Some(port) = args.proxy_outbound_port {
        rules.outbound_port = port;
    }
    if rules.inbound_port == 0 {
        bail!("-proxy-id or -proxy-inbound-port is required: the port of the proxy's public listener");
    }
    if let Some(ip) = args.dns_ip {
        rules.dns = Some(SocketAddrV4::new(ip, args.dns_port));
    }
    Ok(rules)
}

/// Reads the sidecar `id` from the agent: its port (inbound), its outbound listener port,
/// and the ports it serves outside the mesh (exposed paths, Envoy's metrics), which inbound
/// traffic must reach without being redirected.
async fn from_registration(args: &RedirectTrafficArgs, id: &str, rules: &mut Rules) -> Result<()> {
    let path = format!("/v1/agent/service/{}", api_client::paths::segment(id));
    let svc: serde_json::Value = request(&args.api, reqwest::Method::GET, &path, None::<&()>)
        .await
        .with_context(|| format!("-proxy-id {id}: reading its registration from the agent"))?;
    if svc["Kind"].as_str() != Some("connect-proxy") {
        bail!(
            "-proxy-id {id}: the service is not a sidecar proxy (its Kind is {})",
            svc["Kind"]
        );
    }
    let port = svc["Port"].as_u64().unwrap_or(0);
    rules.inbound_port = u16::try_from(port).unwrap_or(0);
    let proxy = &svc["Proxy"];
    if let Some(p) = proxy["TransparentProxy"]["OutboundListenerPort"]
        .as_u64()
        .filter(|p| *p != 0)
    {
        rules.outbound_port = u16::try_from(p).unwrap_or(redirect::DEFAULT_OUTBOUND_PORT);
    }
    for path in proxy["Expose"]["Paths"].as_array().into_iter().flatten() {
        if let Some(p) = path["ListenerPort"].as_u64().and_then(|p| u16::try_from(p).ok()) {
            rules.exclude_inbound_ports.push(p);
        }
    }
    for key in ["envoy_prometheus_bind_addr", "envoy_stats_bind_addr"] {
        if let Some(p) = proxy["Config"][key]
            .as_str()
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok())
        {
            rules.exclude_inbound_ports.push(p);
        }
    }
    Ok(())
}
