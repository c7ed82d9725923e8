//! `meshd peering generate-token|establish|list|read|delete`, after `consul peering`: the
//! peering lifecycle over the HTTP API (`/v1/peering`). A token holds a secret: it is
//! printed (or written with mode 0600), and read back from a file, never from a flag's
//! value.

use crate::acl_cli::client;
use crate::cli::{ApiArgs, PeeringCommand};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use structs::peering::Peering;

/// An establish dials the peer's servers: it may take a while.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a `peering` command, printing its result on stdout.
pub async fn run(command: PeeringCommand) -> Result<()> {
    let out = match command {
        PeeringCommand::GenerateToken(args) => {
            let body = json!({"PeerName": args.name, "Meta": meta(&args.meta)?,
                "ServerExternalAddresses": args.server_external_addresses});
            let answer = call(&args.api, reqwest::Method::POST, "/v1/peering/token", Some(body)).await?;
            let token = answer["PeeringToken"]
                .as_str()
                .context("the server's answer has no PeeringToken")?;
            match &args.out {
                Some(path) => {
                    atomic_file::write_atomic(path, token.as_bytes(), 0o600)
                        .with_context(|| format!("writing {}", path.display()))?;
                    format!("Wrote the peering token for {:?} to {}\n", args.name, path.display())
                }
                None => format!("{token}\n"),
            }
        }
        PeeringCommand::Establish(args) => {
            let token = read_token(&args.peering_token_file)?;
            let body = json!({"PeerName": args.name, "PeeringToken": token, "Meta": meta(&args.meta)?});
            call(&args.api, reqwest::Method::POST, "/v1/peering/establish", Some(body)).await?;
            format!("Successfully established peering connection with {}\n", args.name)
        }
        PeeringCommand::List(args) => {
            let answer = call(&args.api, reqwest::Method::GET, "/v1/peerings", None).await?;
            if args.json {
                format!("{}\n", serde_json::to_string_pretty(&answer)?)
            } else {
                let list: Vec<Peering> = serde_json::from_value(answer).context("decoding the peerings")?;
                list_text(&list)
            }
        }
        PeeringCommand::Read(args) => {
            let path = format!("/v1/peering/{}", api_client::paths::segment(&args.name));
            let answer = call(&args.api, reqwest::Method::GET, &path, None).await?;
            if args.json {
                format!("{}\n", serde_json::to_string_pretty(&answer)?)
            } else {
                let peering: Peering = serde_json::from_value(answer).context("decoding the peering")?;
                read_text(&peering)
            }
        }
        PeeringCommand::Delete(args) => {
            let path = format!("/v1/peering/{}", api_client::paths::segment(&args.name));
            call(&args.api, reqwest::Method::DELETE, &path, None).await?;
            format!(
                "Successfully submitted peering connection, {}, for deletion\n",
                args.name
            )
        }
    };
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .context("writing the result")?;
    Ok(())
}

fn meta(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => bail!("-meta {p:?}: expected KEY=VALUE"),
        })
        .collect()
}

fn read_token(path: &std::path::Path) -> Result<String> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the peering token from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("-peering-token-file: cannot read {}", path.display()))?
    };
    let token = text.trim();
    if token.is_empty() {
        bail!("-peering-token-file {}: empty", path.display());
    }
    Ok(token.to_owned())
}

/// One request with a JSON body (or none); the answer's JSON (`null` when empty), or the
/// server's one line.
async fn call(api: &ApiArgs, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
    let (servers, token, base) = client(api)?;
    let resp = servers
        .send_as(token.as_ref(), |c, base| {
            let req = c.request(method.clone(), format!("{base}{path}")).timeout(TIMEOUT);
            match &body {
                Some(b) => req.json(b),
                None => req,
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the meshd HTTP API at {base}: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.context("reading the answer")?;
    if !status.is_success() {
        bail!("{} ({status})", text.trim());
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).context("the server's answer is not JSON")
}

fn list_text(list: &[Peering]) -> String {
    if list.is_empty() {
        return "There are no peering connections.\n".into();
    }
    let mut out = format!(
        "{:<20} {:<12} {:<16} {}\n",
        "Name", "State", "Imported Svcs", "Exported Svcs"
    );
    for p in list {
        // The state's text is padded (its `Display` does not pad itself).
        out.push_str(&format!(
            "{:<20} {:<12} {:<16} {}\n",
            p.name,
            p.state.to_string(),
            p.imported_service_count,
            p.exported_service_count
        ));
    }
    out
}

fn read_text(p: &Peering) -> String {
    let time = |t: &Option<structs::Timestamp>| t.as_ref().map(ToString::to_string).unwrap_or_default();
    let mut out = String::new();
    for (k, v) in [
        ("Name", p.name.clone()),
        ("ID", p.id.clone()),
        ("State", p.state.to_string()),
        ("PeerID", p.peer_id.clone()),
        ("PeerServerName", p.peer_server_name.clone()),
        ("PeerServerAddresses", p.peer_server_addresses.join(", ")),
        ("PeerTrustDomain", p.peer_trust_domain.clone()),
        ("Remote Datacenter", p.remote.datacenter.clone()),
        ("Imported Services", p.stream_status.imported_services.join(", ")),
        ("Exported Services", p.stream_status.exported_services.join(", ")),
        ("Last Heartbeat", time(&p.stream_status.last_heartbeat)),
        ("Last Receive", time(&p.stream_status.last_receive)),
        ("Last Send", time(&p.stream_status.last_send)),
        ("Last Error", p.last_error.clone()),
    ] {
        if !v.is_empty() {
            out.push_str(&format!("{k}: {v}\n"));
        }
    }
    for (k, v) in &p.meta {
        out.push_str(&format!("Meta {k}: {v}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_in_columns() {
        let peering = |name: &str, state| Peering {
            name: name.into(),
            state,
            imported_service_count: 3,
            ..Peering::default()
        };
        let text = list_text(&[
            peering("cluster-a", structs::peering::PeeringState::Active),
            peering("b", structs::peering::PeeringState::Establishing),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        let column = lines[0].find("Imported").unwrap_or_default();
        assert!(column > 0, "{text}");
        for line in &lines[1..] {
            assert_eq!(line.find('3'), Some(column), "{text}");
        }
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{text:?}");
    }
}
