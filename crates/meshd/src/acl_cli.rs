//! `meshd acl ...`: conveniences over the ACL HTTP API, after Consul's `consul acl` commands.
//! The token they act with comes from `-token-file` or `CONSUL_HTTP_TOKEN`, never from a
//! flag's value; output is Consul's `AccessorID: ... SecretID: ...` layout.

use crate::cli::{AclCommand, AclPolicyCommand, AclTokenCommand, ApiArgs};
use anyhow::{Context, Result, bail};
use api_client::{ApiError, Servers, paths};
use serde::Serialize;
use serde::de::DeserializeOwned;
use structs::acl::{AclPolicy, AclToken, Link, NodeIdentity, ServiceIdentity, TokenWrite};

/// Runs an `acl` command, printing its result on stdout.
pub async fn run(command: AclCommand) -> Result<()> {
    let out = match command {
        AclCommand::Bootstrap(common) => {
            let token: AclToken = request(&common, reqwest::Method::PUT, paths::ACL_BOOTSTRAP, None::<&()>).await?;
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
            let body = AclPolicy {
                name: args.name.clone(),
                description: args.description.clone(),
                rules,
                ..AclPolicy::default()
            };
            let policy: AclPolicy = request(&args.common, reqwest::Method::PUT, paths::ACL_POLICY, Some(&body)).await?;
            format!(
                "ID:           {}\nName:         {}\nDescription:  {}\nRules:\n{}\n",
                policy.id, policy.name, policy.description, policy.rules
            )
        }
        AclCommand::Token(AclTokenCommand::Create(args)) => {
            let mut node_identities = Vec::new();
            for n in &args.node_identity {
                let Some((node, dc)) = n.split_once(':') else {
                    bail!("-node-identity {n:?}: expected NODE:DATACENTER");
                };
                node_identities.push(NodeIdentity {
                    node_name: node.to_owned(),
                    datacenter: dc.to_owned(),
                });
            }
            let by_name = |names: &[String]| -> Vec<Link> {
                names
                    .iter()
                    .map(|name| Link {
                        name: name.clone(),
                        ..Link::default()
                    })
                    .collect()
            };
            let expiration_ttl = match &args.expires_ttl {
                Some(ttl) => {
                    Some(structs::GoDuration::parse(ttl).map_err(|e| anyhow::anyhow!("-expires-ttl {ttl:?}: {e}"))?)
                }
                None => None,
            };
            let body = TokenWrite {
                description: args.description.clone(),
                policies: by_name(&args.policy_name),
                roles: by_name(&args.role_name),
                service_identities: args
                    .service_identity
                    .iter()
                    .map(|name| ServiceIdentity {
                        service_name: name.clone(),
                        ..ServiceIdentity::default()
                    })
                    .collect(),
                node_identities,
                expiration_ttl,
                ..TokenWrite::default()
            };
            let token: AclToken = request(&args.common, reqwest::Method::PUT, paths::ACL_TOKEN, Some(&body)).await?;
            token_text(&token)
        }
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).context("writing the result")?;
    Ok(())
}

/// A token as Consul's CLI prints it.
fn token_text(t: &AclToken) -> String {
    let mut out = format!(
        "AccessorID:       {}\nSecretID:         {}\nDescription:      {}\nLocal:            {}\nCreate Time:      {}\n",
        t.accessor_id, t.secret_id, t.description, t.local, t.create_time,
    );
    if let Some(expires) = &t.expiration_time {
        out.push_str(&format!("Expiration Time:  {expires}\n"));
    }
    for (title, links) in [("Policies", &t.policies), ("Roles", &t.roles)] {
        if !links.is_empty() {
            out.push_str(&format!("{title}:\n"));
            for l in links {
                out.push_str(&format!("   {} - {}\n", l.id, l.name));
            }
        }
    }
    if !t.service_identities.is_empty() {
        out.push_str("Service Identities:\n");
        for i in &t.service_identities {
            out.push_str(&format!("   {} (Datacenters: all)\n", i.service_name));
        }
    }
    if !t.node_identities.is_empty() {
        out.push_str("Node Identities:\n");
        for i in &t.node_identities {
            out.push_str(&format!("   {} (Datacenter: {})\n", i.node_name, i.datacenter));
        }
    }
    out
}

/// The servers `common` names and the token to act with (from `-token-file`, else
/// `CONSUL_HTTP_TOKEN`); the base URL, for messages.
pub(crate) fn client(common: &ApiArgs) -> Result<(Servers, Option<structs::Token>, String)> {
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
    Ok((api, token, base))
}

/// One request to the HTTP API with the command's token; a refusal is an error carrying
/// the server's one line.
pub(crate) async fn request<B: Serialize + ?Sized, T: DeserializeOwned>(
    common: &ApiArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<&B>,
) -> Result<T> {
    let (api, token, base) = client(common)?;
    let answer = match api.call_as(token.as_ref(), method, path, body).await {
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
