//! `meshd acl ...`: conveniences over the ACL HTTP API, after Consul's `consul acl` commands.
//! The token they act with comes from `-token-file` or `CONSUL_HTTP_TOKEN`, never from a
//! flag's value; output is Consul's `AccessorID: ... SecretID: ...` layout.

use crate::cli::{AclCommand, AclCommonArgs, AclPolicyCommand, AclTokenCommand};
use anyhow::{Context, Result, bail};
use api_client::{ApiError, Servers, paths};
use serde_json::{Value, json};

/// Runs an `acl` command, printing its result on stdout.
pub async fn run(command: AclCommand) -> Result<()> {
    let out = match command {
        AclCommand::Bootstrap(common) => {
            let token = request(&common, reqwest::Method::PUT, paths::ACL_BOOTSTRAP, None).await?;
            token_text(&token)
        }
        AclCommand::Policy(AclPolicyCommand::Create(args)) => {
            if args.name.is_empty() {
                bail!("-name is required");
            }
            let rules = match args.rules.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("-rules: cannot read {path}"))?,
                None => args.rules.clone(),
            };
            let body = json!({"Name": args.name, "Description": args.description, "Rules": rules});
            let policy = request(&args.common, reqwest::Method::PUT, paths::ACL_POLICY, Some(body)).await?;
            format!(
                "ID:           {}\nName:         {}\nDescription:  {}\nRules:\n{}\n",
                policy["ID"].as_str().unwrap_or_default(),
                policy["Name"].as_str().unwrap_or_default(),
                policy["Description"].as_str().unwrap_or_default(),
                policy["Rules"].as_str().unwrap_or_default()
            )
        }
        AclCommand::Token(AclTokenCommand::Create(args)) => {
            let mut node_identities = Vec::new();
            for n in &args.node_identity {
                let Some((node, dc)) = n.split_once(':') else {
                    bail!("-node-identity {n:?}: expected NODE:DATACENTER");
                };
                node_identities.push(json!({"NodeName": node, "Datacenter": dc}));
            }
            let mut body = json!({
                "Description": args.description,
                "Policies": args.policy_name.iter().map(|n| json!({"Name": n})).collect::<Vec<_>>(),
                "Roles": args.role_name.iter().map(|n| json!({"Name": n})).collect::<Vec<_>>(),
                "ServiceIdentities": args.service_identity.iter().map(|s| json!({"ServiceName": s})).collect::<Vec<_>>(),
                "NodeIdentities": node_identities,
            });
            if let Some(ttl) = &args.expires_ttl {
                body["ExpirationTTL"] = json!(ttl);
            }
            let token = request(&args.common, reqwest::Method::PUT, paths::ACL_TOKEN, Some(body)).await?;
            token_text(&token)
        }
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).context("writing the result")?;
    Ok(())
}

/// A token as Consul's CLI prints it.
fn token_text(t: &Value) -> String {
    let mut out = format!(
        "AccessorID:       {}\nSecretID:         {}\nDescription:      {}\nLocal:            {}\nCreate Time:      {}\n",
        t["AccessorID"].as_str().unwrap_or_default(),
        t["SecretID"].as_str().unwrap_or_default(),
        t["Description"].as_str().unwrap_or_default(),
        t["Local"].as_bool().unwrap_or(false),
        t["CreateTime"].as_str().unwrap_or_default(),
    );
    if let Some(expires) = t["ExpirationTime"].as_str() {
        out.push_str(&format!("Expiration Time:  {expires}\n"));
    }
    let links = |key: &str| -> Vec<String> {
        t[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|l| {
                        format!(
                            "   {} - {}",
                            l["ID"].as_str().unwrap_or_default(),
                            l["Name"].as_str().unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for (title, key) in [("Policies", "Policies"), ("Roles", "Roles")] {
        let lines = links(key);
        if !lines.is_empty() {
            out.push_str(&format!("{title}:\n{}\n", lines.join("\n")));
        }
    }
    if let Some(ids) = t["ServiceIdentities"].as_array().filter(|a| !a.is_empty()) {
        out.push_str("Service Identities:\n");
        for i in ids {
            out.push_str(&format!(
                "   {} (Datacenters: all)\n",
                i["ServiceName"].as_str().unwrap_or_default()
            ));
        }
    }
    if let Some(ids) = t["NodeIdentities"].as_array().filter(|a| !a.is_empty()) {
        out.push_str("Node Identities:\n");
        for i in ids {
            out.push_str(&format!(
                "   {} (Datacenter: {})\n",
                i["NodeName"].as_str().unwrap_or_default(),
                i["Datacenter"].as_str().unwrap_or_default()
            ));
        }
    }
    out
}

/// One request to the HTTP API with the command's token; a refusal is an error carrying
/// the server's one line.
async fn request(common: &AclCommonArgs, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
    let base = api_client::base_url(&common.http_addr);
    let api = match &common.ca_file {
        Some(ca) => {
            let pem = std::fs::read(ca).with_context(|| format!("-ca-file: cannot read {}", ca.display()))?;
            Servers::with_ca(std::slice::from_ref(&base), &pem).with_context(|| format!("-ca-file {}", ca.display()))?
        }
        None => Servers::new(std::slice::from_ref(&base)),
    };
    let token = match &common.token_file {
        Some(path) => structs::Token::new(
            std::fs::read_to_string(path)
                .with_context(|| format!("-token-file: cannot read {}", path.display()))?
                .trim(),
        ),
        None => structs::Token::new(&std::env::var("CONSUL_HTTP_TOKEN").unwrap_or_default()),
    };
    let answer = match api.call_as(token.as_ref(), method, path, body.as_ref()).await {
        Ok(answer) => answer,
        Err(e) if e.status().is_none() && e.is_unreachable() => {
            bail!("cannot reach the meshd HTTP API at {base}: {e}")
        }
        Err(ApiError::PermissionDenied(text) | ApiError::BadRequest(text) | ApiError::NotFound(text)) => {
            bail!("{text}")
        }
        Err(e) => bail!("{e}"),
    };
    serde_json::from_slice(&answer).context("decoding the answer")
}
