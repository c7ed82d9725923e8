//! `meshd snapshot save|restore|inspect FILE`, after `consul snapshot`: the whole catalog
//! to and from an archive over the HTTP API (`/v1/snapshot`). An archive holds the CA's
//! private keys and every ACL secret: a saved file is written atomically with mode 0600, and
//! the token comes from `-token-file` or `CONSUL_HTTP_TOKEN`, never from a flag's value.
//! Archives are verified on this side too: a save checks what it received before it keeps
//! it, a restore checks the file before it sends it.

use crate::acl_cli::client;
use crate::cli::{ApiArgs, SnapshotCommand};
use anyhow::{Context, Result, bail};
use snapshot_archive::{MAX_ARCHIVE, MAX_INFLATED, Meta, unpack};
use std::path::Path;
use std::time::Duration;

/// A save or a restore of a large catalog takes a while.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Runs a `snapshot` command, printing its result on stdout.
pub async fn run(command: SnapshotCommand) -> Result<()> {
    let out = match command {
        SnapshotCommand::Save(args) => {
            let path = if args.stale {
                "/v1/snapshot?stale"
            } else {
                "/v1/snapshot"
            };
            let archive = exchange(&args.api, reqwest::Method::GET, path, None).await?;
            let meta = unpack(&archive, MAX_INFLATED)
                .context("the server sent an archive that does not verify; nothing was written")?
                .meta;
            atomic_file::write_atomic(&args.file, &archive, 0o600)
                .with_context(|| format!("writing {}", args.file.display()))?;
            format!("Saved and verified snapshot to index {}\n", meta.index)
        }
        SnapshotCommand::Restore(args) => {
            let archive = read(&args.file)?;
            unpack(&archive, MAX_INFLATED).with_context(|| format!("{} cannot be restored", args.file.display()))?;
            exchange(&args.api, reqwest::Method::PUT, "/v1/snapshot", Some(archive)).await?;
            "Restored snapshot\n".to_owned()
        }
        SnapshotCommand::Inspect(args) => {
            let archive = read(&args.file)?;
            let unpacked = unpack(&archive, MAX_INFLATED).with_context(|| format!("{}", args.file.display()))?;
            inspect_text(&unpacked.meta)
        }
    };
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .context("writing the result")?;
    Ok(())
}

fn read(file: &Path) -> Result<Vec<u8>> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    if size > MAX_ARCHIVE as u64 {
        bail!(
            "{} has {size} bytes; a server takes archives of at most {MAX_ARCHIVE}",
            file.display()
        );
    }
    std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
}

/// One request with a raw body (or none); the answer's body, or the server's one line.
async fn exchange(api: &ApiArgs, method: reqwest::Method, path: &str, body: Option<Vec<u8>>) -> Result<Vec<u8>> {
    let (servers, token, base) = client(api)?;
    let resp = servers
        .send_as(token.as_ref(), |c, base| {
            let req = c.request(method.clone(), format!("{base}{path}")).timeout(TIMEOUT);
            match &body {
                Some(b) => req.header("Content-Type", "application/x-gzip").body(b.clone()),
                None => req,
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the meshd HTTP API at {base}: {e}"))?;
    let status = resp.status();
    let bytes = resp.bytes().await.context("reading the answer")?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        bail!("{} ({status})", text.trim());
    }
    Ok(bytes.to_vec())
}

/// What `inspect` prints: the archive's metadata, then its rows per table.
fn inspect_text(meta: &Meta) -> String {
    let mut out = String::new();
    for (k, v) in [
        ("ID", meta.id.clone()),
        ("Size", meta.size.to_string()),
        ("Index", meta.index.to_string()),
        ("Datacenter", meta.datacenter.clone()),
        ("Created", meta.created.clone()),
        ("Version", meta.version.to_string()),
        ("meshd", meta.meshd_version.clone()),
    ] {
        out.push_str(&format!(" {k:<12} {v}\n"));
    }
    out.push_str(&format!("\n {:<18} {}\n", "Table", "Rows"));
    for (table, rows) in &meta.counts {
        out.push_str(&format!(" {table:<18} {rows}\n"));
    }
    out
}
