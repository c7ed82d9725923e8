//! `meshd config write [-dry-run] FILE` and `meshd config delete -kind K -name N [-dry-run]`,
//! after `consul config write|delete`, over `/v1/config`. A dry run writes nothing and prints
//! the proxies whose resources the write would change, each changed field with its value
//! before and after (`docs/dry-run.md`).

use crate::acl_cli::request;
use crate::cli::ConfigCommand;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::io::Read as _;

/// Runs a `config` command, printing its result on stdout.
pub async fn run(command: ConfigCommand) -> Result<()> {
    let out = match command {
        ConfigCommand::Write(args) => {
            let text = if args.file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading standard input")?;
                text
            } else {
                std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?
            };
            let entry: Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a JSON config entry", args.file.display()))?;
            let mut path = String::from("/v1/config");
            let mut query = Vec::new();
            if let Some(cas) = args.cas {
                query.push(format!("cas={cas}"));
            }
            if args.dry_run {
                query.push("dry-run".to_owned());
            }
            if !query.is_empty() {
                path = format!("{path}?{}", query.join("&"));
            }
            let answer: Value = request(&args.api, reqwest::Method::PUT, &path, Some(&entry)).await?;
            let what = format!(
                "{} {:?}",
                entry["Kind"].as_str().unwrap_or("entry"),
                entry["Name"].as_str().unwrap_or_default()
            );
            match (args.dry_run, args.json) {
                (true, true) => format!("{answer:#}\n"),
                (true, false) => dry_run_text(&answer),
                (false, _) if answer == Value::Bool(true) => format!("Config entry written: {what}\n"),
                (false, _) => anyhow::bail!("{what} was not written: its ModifyIndex is not {:?}", args.cas),
            }
        }
        ConfigCommand::Delete(args) => {
            let mut path = format!("/v1/config/{}/{}", args.kind, args.name);
            if args.dry_run {
                path.push_str("?dry-run");
            }
            let answer: Value = request::<(), _>(&args.api, reqwest::Method::DELETE, &path, None).await?;
            match (args.dry_run, args.json) {
                (true, true) => format!("{answer:#}\n"),
                (true, false) => dry_run_text(&answer),
                (false, _) => format!("Config entry deleted: {} {:?}\n", args.kind, args.name),
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

/// A dry run's answer, for people: the proxies that would change and every changed field.
fn dry_run_text(answer: &Value) -> String {
    let mut out = format!(
        "Dry run: nothing was written (the catalog is at index {}).\n",
        answer["Index"]
    );
    if answer["ChangesCatalog"] == false {
        out.push_str("The write would change nothing.\n");
        return out;
    }
    let proxies = &answer["Proxies"];
    if proxies.is_null() {
        out.push_str("This server serves no proxy: only the entry was checked.\n");
        return out;
    }
    let items = proxies["Items"].as_array().map(Vec::as_slice).unwrap_or_default();
    let _ = writeln!(
        out,
        "{} proxies would change ({} would not){}:",
        proxies["Total"],
        proxies["Unaffected"],
        if items.len() < proxies["Total"].as_u64().unwrap_or(0) as usize {
            format!("; {} listed (-json and the API page through them)", items.len())
        } else {
            String::new()
        }
    );
    for item in items {
        let _ = writeln!(
            out,
            "  {} on {} ({}):",
            text(&item["ProxyID"]),
            text(&item["Node"]),
            text(&item["Service"])
        );
        for resource in item["Resources"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let _ = writeln!(
                out,
                "    {} {} {}",
                text(&resource["Type"]),
                text(&resource["Name"]),
                text(&resource["Change"])
            );
            for field in resource["Fields"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let side = |v: &Value| {
                    if v.is_null() {
                        "(unset)".to_owned()
                    } else {
                        v.to_string()
                    }
                };
                let _ = writeln!(
                    out,
                    "      {}: {} -> {}",
                    text(&field["Path"]),
                    side(&field["Before"]),
                    side(&field["After"])
                );
            }
            if let Some(more) = resource["MoreFields"].as_u64() {
                let _ = writeln!(out, "      ... and {more} more fields");
            }
        }
    }
    if let Some(elsewhere) = proxies["ServedElsewhere"].as_u64().filter(|n| *n > 0) {
        let _ = writeln!(
            out,
            "{elsewhere} proxies registered in the catalog are not served by this server (agents' or other servers'): not simulated."
        );
    }
    let not = proxies["NotSimulated"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !not.is_empty() {
        let _ = writeln!(out, "Not simulated ({} proxies):", proxies["NotSimulatedTotal"]);
        for item in not {
            for why in item["Why"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let _ = writeln!(out, "  {}: {}", text(&item["ProxyID"]), text(why));
            }
        }
    }
    out
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}
