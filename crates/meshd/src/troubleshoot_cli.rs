//! `meshd troubleshoot proxy -envoy-admin ADDR` (`docs/troubleshoot.md`): meshd's findings
//! on the proxy (`GET /v1/internal/troubleshoot/proxy/:id`: rejected and stale types, watches
//! failing, parts that cannot be built) and Envoy's own, from its admin interface (clusters
//! with no healthy endpoint, certificates about to expire, and its config dump compared
//! resource by resource with what meshd sent: `crate::troubleshoot_compare`), what is wrong
//! first.

use crate::acl_cli::request;
use crate::cli::{TroubleshootCommand, TroubleshootProxyArgs, TroubleshootUpstreamArgs};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Duration;

/// How long Envoy's admin may take to answer before it counts as not answering.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// A certificate expiring within this many days is about to expire.
const EXPIRES_SOON_DAYS: u64 = 1;

/// Runs a `troubleshoot` command, printing its findings on stdout.
pub async fn run(command: TroubleshootCommand) -> Result<()> {
    let out = match command {
        TroubleshootCommand::Proxy(args) => {
            let findings = proxy(&args).await?;
            if args.json {
                format!("{findings:#}\n")
            } else {
                text(&findings)
            }
        }
        TroubleshootCommand::Upstream(args) => {
            let walk = upstream(&args).await?;
            if args.json {
                format!("{walk:#}\n")
            } else {
                walk_text(&walk)
            }
        }
    };
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .context("writing the result")?;
    Ok(())
}

fn finding(kind: &str, message: String) -> Value {
    json!({"Kind": kind, "Message": message})
}

async fn proxy(args: &TroubleshootProxyArgs) -> Result<Value> {
    let admin = args.envoy_admin.trim_end_matches('/');
    let admin = if admin.starts_with("http://") || admin.starts_with("https://") {
        admin.to_owned()
    } else {
        format!("http://{admin}")
    };
    let envoy = reqwest::Client::builder()
        .timeout(ADMIN_TIMEOUT)
        .build()
        .context("an HTTP client")?;
    let get = |path: &str| {
        let req = envoy.get(format!("{admin}{path}"));
        async move {
            let resp = req.send().await.ok()?.error_for_status().ok()?;
            resp.json::<Value>().await.ok()
        }
    };
    let mut problems = Vec::new();
    let mut fine = Vec::new();
    let server_info = get("/server_info").await;
    let proxy_id = match (&args.proxy_id, &server_info) {
        (Some(id), _) => id.clone(),
        (None, Some(info)) => info["node"]["id"].as_str().unwrap_or_default().to_owned(),
        (None, None) => anyhow::bail!(
            "Envoy's admin at {admin} does not answer within {} s (Envoy is down, paused or overloaded): give -proxy-id to ask meshd alone",
            ADMIN_TIMEOUT.as_secs()
        ),
    };
    let meshd: Value = request::<(), _>(
        &args.api,
        reqwest::Method::GET,
        &format!("/v1/internal/troubleshoot/proxy/{proxy_id}"),
        None,
    )
    .await?;
    problems.extend(meshd["Problems"].as_array().cloned().unwrap_or_default());
    fine.extend(meshd["Fine"].as_array().cloned().unwrap_or_default());
    match server_info {
        None => problems.push(finding(
            "envoy-down",
            format!(
                "Envoy's admin at {admin} does not answer within {} s: Envoy is down, paused or overloaded",
                ADMIN_TIMEOUT.as_secs()
            ),
        )),
        Some(info) => fine.push(finding(
            "envoy",
            format!(
                "Envoy {} is {} (up {} s)",
                info["version"].as_str().unwrap_or("?").split('/').nth(1).unwrap_or("?"),
                info["state"].as_str().unwrap_or("?"),
                info["uptime_current_epoch"]
                    .as_str()
                    .unwrap_or("?")
                    .trim_end_matches('s')
            ),
        )),
    }
    if let Some(clusters) = get("/clusters?format=json").await {
        clusters_findings(&clusters, &mut problems, &mut fine);
    }
    if let Some(dump) = get("/config_dump?include_eds").await {
        crate::troubleshoot_compare::compare(&dump, &meshd["Streams"], &mut problems, &mut fine);
    }
    if let Some(certs) = get("/certs").await {
        cert_findings(&certs, &mut problems, &mut fine);
    }
    Ok(json!({"ProxyID": proxy_id, "Problems": problems, "Fine": fine}))
}

/// Clusters with no healthy endpoint (each a problem), and how many are fine.
fn clusters_findings(clusters: &Value, problems: &mut Vec<Value>, fine: &mut Vec<Value>) {
    let mut healthy_clusters = 0;
    for cluster in clusters["cluster_statuses"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let name = cluster["name"].as_str().unwrap_or("?");
        let hosts = cluster["host_statuses"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let healthy = hosts
            .iter()
            .filter(|h| {
                let status = &h["health_status"];
                status["eds_health_status"]
                    .as_str()
                    .is_none_or(|s| s == "HEALTHY" || s == "DEGRADED")
                    && status["failed_active_health_check"] != true
                    && status["failed_outlier_check"] != true
            })
            .count();
        if healthy == 0 {
            problems.push(finding(
                "no-healthy-endpoint",
                format!("cluster {name} has no healthy endpoint ({} endpoints)", hosts.len()),
            ));
        } else {
            healthy_clusters += 1;
        }
    }
    fine.push(finding(
        "clusters",
        format!("{healthy_clusters} clusters have healthy endpoints"),
    ));
}

/// Certificates that expire within [`EXPIRES_SOON_DAYS`] (each a problem).
fn cert_findings(certs: &Value, problems: &mut Vec<Value>, fine: &mut Vec<Value>) {
    let mut ok = 0;
    for cert in certs["certificates"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .flat_map(|c| c["cert_chain"].as_array().map(Vec::as_slice).unwrap_or_default())
    {
        let days: u64 = cert["days_until_expiration"]
            .as_str()
            .and_then(|d| d.parse().ok())
            .or_else(|| cert["days_until_expiration"].as_u64())
            .unwrap_or(0);
        let san = cert["subject_alt_names"]
            .as_array()
            .and_then(|s| s.first())
            .and_then(|s| s["uri"].as_str().or(s["dns"].as_str()))
            .unwrap_or("?");
        if days < EXPIRES_SOON_DAYS {
            problems.push(finding(
                "certificate",
                format!(
                    "the certificate of {san} expires at {} (within {EXPIRES_SOON_DAYS} day)",
                    cert["expiration_time"].as_str().unwrap_or("?")
                ),
            ));
        } else {
            ok += 1;
        }
    }
    if ok == 0 && problems.iter().all(|p| p["Kind"] != "certificate") {
        problems.push(finding(
            "certificate",
            "Envoy holds no certificate: its mTLS listeners and clusters are not loaded".into(),
        ));
    } else {
        fine.push(finding(
            "certificates",
            format!("{ok} certificates valid for more than a day"),
        ));
    }
}

/// The findings for people: problems first, then what is fine.
fn text(findings: &Value) -> String {
    let mut out = format!("Proxy {}\n", findings["ProxyID"].as_str().unwrap_or("?"));
    let problems = findings["Problems"].as_array().map(Vec::as_slice).unwrap_or_default();
    if problems.is_empty() {
        out.push_str("No problem found.\n");
    }
    for p in problems {
        let _ = writeln!(out, "  ! {}", p["Message"].as_str().unwrap_or_default());
    }
    for f in findings["Fine"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let _ = writeln!(out, "  ok {}", f["Message"].as_str().unwrap_or_default());
    }
    out
}

/// The walk meshd makes of the request, step by step, the intention that decides at each
/// service it reaches included.
async fn upstream(args: &TroubleshootUpstreamArgs) -> Result<Value> {
    let mut query: Vec<(String, String)> = vec![
        ("upstream".into(), args.upstream.clone()),
        ("path".into(), args.path.clone()),
        ("method".into(), args.method.clone()),
    ];
    for h in &args.header {
        let (k, v) = h
            .split_once('=')
            .with_context(|| format!("-header {h:?}: expected NAME=VALUE"))?;
        query.push(("header".into(), format!("{k}:{v}")));
    }
    let encoded: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&query)
        .finish();
    let path = format!("/v1/internal/troubleshoot/upstream/{}?{encoded}", args.proxy_id);
    // The answer has every step, the intentions at the services reached included.
    let walk: Value = request::<(), _>(&args.api, reqwest::Method::GET, &path, None).await?;
    Ok(walk)
}

/// The walk for people: one line per step, then where it fails.
fn walk_text(walk: &Value) -> String {
    let mut out = format!(
        "{} -> {}\n",
        walk["ProxyID"].as_str().unwrap_or("?"),
        walk["Upstream"].as_str().unwrap_or("?")
    );
    for s in walk["Steps"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let _ = writeln!(
            out,
            "  {} {:<11} {}",
            if s["Ok"] == true { "ok" } else { "!!" },
            s["Step"].as_str().unwrap_or_default(),
            s["Detail"].as_str().unwrap_or_default()
        );
    }
    match walk["FailsAt"].as_str() {
        Some(step) => {
            let _ = writeln!(out, "The request fails at: {step}");
        }
        None => out.push_str("The request gets through.\n"),
    }
    out
}
