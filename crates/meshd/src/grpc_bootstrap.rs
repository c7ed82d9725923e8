//! `meshd connect grpc-bootstrap -service NAME [-cert-dir DIR]`: the xDS bootstrap of a
//! proxyless gRPC client (`GRPC_XDS_BOOTSTRAP`), and the certificate files its xDS
//! credentials read (kept current with `-watch`).
//!
//! The client's identity is a connect-native instance of the service (registered with
//! `Connect.Native = true`, no sidecar): the bootstrap's node id is that instance's id and
//! its node metadata names the catalog node. Its token (`-token-file`), when ACLs are on,
//! travels in the node metadata under `x-consul-token`: gRPC's xDS client sends no custom
//! call headers. The bootstrap holds that token, so it is written with mode 0600 when it
//! goes to a file (`-output`).
//!
//! The service's leaf (`DIR/cert.pem`, `DIR/key.pem`, mode 0600) and the CA bundle
//! (`DIR/roots.pem`) are written to `-cert-dir DIR` — by default a directory of this user's
//! under the OS temp dir (see [`default_cert_dir`]) — and the bootstrap defines the certificate
//! provider `meshd` over them (a `file_watcher`), which the clusters meshd sends refer to: a
//! channel with xDS credentials does mTLS with them, a plaintext channel ignores them (but
//! gRPC still refuses clusters naming a provider its bootstrap lacks, so it is always
//! defined). `-watch` keeps running and rewrites the files whenever the leaf or the roots change
//! (rotation), until SIGINT or SIGTERM.

use crate::cli::GrpcBootstrapArgs;
use anyhow::{Context, Result, bail};
use api_client::{Servers, paths};
use serde_json::{Value, json};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use structs::listing::CatalogService;
use structs::{IndexedCaRoots, IssuedCert, Token};
use tracing::{info, warn};

/// A connect-native instance of the service: (node, instance id).
async fn instance(api: &Servers, token: Option<&Token>, args: &GrpcBootstrapArgs) -> Result<(String, String)> {
    let path = paths::catalog_service(&args.service);
    let entries: Vec<CatalogService> = api
        .get_json_as(token, &path)
        .await
        .with_context(|| format!("GET {path}"))?;
    let native: Vec<(String, String)> = entries
        .into_iter()
        .filter(|e| e.service_connect.native)
        .filter(|e| args.node.is_empty() || e.node == args.node)
        .filter(|e| args.service_id.as_deref().is_none_or(|id| e.service_id == id))
        .map(|e| (e.node, e.service_id))
        .collect();
    match native.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "-service {}: no connect-native instance registered (register it with \"Connect\": {{\"Native\": true}}; -node and -service-id narrow the search)",
            args.service
        ),
        many => bail!(
            "-service {}: {} connect-native instances; choose one with -service-id (and -node)",
            args.service,
            many.len()
        ),
    }
}

/// A blocking `GET path` once its index passes `after` (or after five minutes), decoded,
/// with the index it was answered at.
async fn blocking<T: serde::de::DeserializeOwned>(
    api: &Servers,
    token: Option<&Token>,
    path: &str,
    after: u64,
) -> Result<(T, u64)> {
    let answer = api
        .get_blocking_as(token, path, after, Duration::from_secs(300))
        .await
        .with_context(|| format!("GET {path}"))?;
    let Some(body) = answer.body else {
        bail!("GET {path}: 404 not found");
    };
    let value = structs::json::from_slice(&body).with_context(|| format!("GET {path}: decoding"))?;
    Ok((value, answer.index))
}

/// Where the certificate files go without `-cert-dir`: `<temp dir>/meshd-grpc-<uid>/<instance
/// id>` (the temp dir is `$TMPDIR`, else `/tmp`), the same on every run for the instance (so a
/// `-watch` and the bootstrap agree). The temp dir is shared: each level is created mode 0700
/// and refused unless it is a directory (not a link) of this user's that nobody else may
/// open, so that no one else can read the key or plant the files.
pub fn default_cert_dir(instance: &str) -> Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let base = std::env::temp_dir().join(format!("meshd-grpc-{uid}"));
    // The id as one path component: no separators, no `..`.
    let leaf: String = instance
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = base.join(leaf);
    private_dir(&base, uid)?;
    private_dir(&dir, uid)?;
    Ok(dir)
}

/// Creates `dir` with mode 0700 unless it exists, then checks that it is this user's
/// directory and closed to everyone else.
fn private_dir(dir: &Path, uid: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        bail!(
            "{} is not a private directory of this user's (want a directory owned by uid {uid}, mode 0700): remove it, or give -cert-dir",
            dir.display()
        );
    }
    Ok(())
}

/// The bootstrap JSON for node `instance` on `node`, its certificate provider reading the
/// files of `dir`.
pub fn bootstrap(args: &GrpcBootstrapArgs, node: &str, instance: &str, token: Option<&Token>, dir: &Path) -> Value {
    let servers: Vec<Value> = args
        .grpc_addr
        .iter()
        .map(|addr| {
            json!({
                "server_uri": addr,
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            })
        })
        .collect();
    let mut metadata = serde_json::Map::new();
    metadata.insert(structs::wire::NODE_NAME_METADATA.into(), json!(node));
    if let Some(token) = token {
        metadata.insert(structs::wire::TOKEN_HEADER.into(), json!(token.secret()));
    }
    let mut out = json!({
        "xds_servers": servers,
        "node": {"id": instance, "cluster": args.service, "metadata": metadata, "locality": {}},
    });
    {
        out["certificate_providers"] = json!({
            structs::wire::PROXYLESS_CERT_PROVIDER: {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": dir.join("cert.pem"),
                    "private_key_file": dir.join("key.pem"),
                    "ca_certificate_file": dir.join("roots.pem"),
                    "refresh_interval": "5s",
                },
            },
        });
    }
    out
}

/// Writes the leaf files; returns the leaf's index.
async fn write_leaf(api: &Servers, token: Option<&Token>, service: &str, dir: &Path, after: u64) -> Result<u64> {
    let path = paths::agent_leaf(service);
    let (leaf, index): (IssuedCert, u64) = blocking(api, token, &path, after).await?;
    let (cert, key) = (leaf.cert_pem.as_str(), leaf.private_key_pem.as_str());
    if cert.is_empty() || key.is_empty() {
        bail!("GET {path}: no certificate in the answer");
    }
    // The key first: a reader that sees the new certificate finds its key in place.
    atomic_file::write_atomic(&dir.join("key.pem"), key.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", dir.join("key.pem").display()))?;
    atomic_file::write_atomic(&dir.join("cert.pem"), cert.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", dir.join("cert.pem").display()))?;
    Ok(index)
}

/// Writes the CA bundle; returns the roots' index.
async fn write_roots(api: &Servers, token: Option<&Token>, dir: &Path, after: u64) -> Result<u64> {
    let (roots, index): (IndexedCaRoots, u64) = blocking(api, token, paths::CA_ROOTS, after).await?;
    let pems: Vec<&str> = roots
        .roots
        .iter()
        .map(|r| r.root_cert.as_str())
        .filter(|pem| !pem.is_empty())
        .collect();
    if pems.is_empty() {
        bail!("GET {}: no root certificate", paths::CA_ROOTS);
    }
    atomic_file::write_atomic(&dir.join("roots.pem"), pems.join("\n").as_bytes(), 0o644)
        .with_context(|| format!("writing {}", dir.join("roots.pem").display()))?;
    Ok(index)
}

/// Runs the command: prints (or writes) the bootstrap, writes the certificate files, and
/// with `-watch` keeps them current until `shutdown`.
pub async fn run(args: GrpcBootstrapArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let token = match &args.token_file {
        Some(path) => Token::new(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read -token-file {}", path.display()))?
                .trim(),
        ),
        None => None,
    };
    let api = Servers::new(&[args.http_addr.to_string()]);
    let (node, id) = instance(&api, token.as_ref(), &args).await?;
    let dir = match &args.cert_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("-cert-dir {}: cannot create", dir.display()))?;
            dir.clone()
        }
        None => default_cert_dir(&id)?,
    };
    // The provider needs absolute paths: gRPC reads them from wherever the client runs.
    let dir = std::path::absolute(&dir).with_context(|| format!("-cert-dir {}", dir.display()))?;
    let indexes = (
        write_leaf(&api, token.as_ref(), &args.service, &dir, 0).await?,
        write_roots(&api, token.as_ref(), &dir, 0).await?,
    );
    let text = serde_json::to_string_pretty(&bootstrap(&args, &node, &id, token.as_ref(), &dir))
        .context("encoding the bootstrap")?;
    match &args.output {
        Some(path) => atomic_file::write_atomic(path, format!("{text}\n").as_bytes(), 0o600)
            .with_context(|| format!("-output {}: cannot write", path.display()))?,
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{text}")
                .and_then(|()| out.flush())
                .context("writing the bootstrap to stdout")?;
        }
    }
    if !args.watch {
        return Ok(());
    }
    info!(service = %args.service, dir = %dir.display(), "keeping the certificate files current");
    let keep = async {
        let (mut leaf, mut roots) = indexes;
        loop {
            tokio::select! {
                r = write_leaf(&api, token.as_ref(), &args.service, &dir, leaf) => match r {
                    Ok(i) if i != leaf => { info!(index = i, "leaf certificate written"); leaf = i; }
                    Ok(_) => {}
                    Err(e) => { warn!(error = %format!("{e:#}"), "cannot refresh the leaf; retrying"); tokio::time::sleep(Duration::from_secs(2)).await; }
                },
                r = write_roots(&api, token.as_ref(), &dir, roots) => match r {
                    Ok(i) if i != roots => { info!(index = i, "CA roots written"); roots = i; }
                    Ok(_) => {}
                    Err(e) => { warn!(error = %format!("{e:#}"), "cannot refresh the CA roots; retrying"); tokio::time::sleep(Duration::from_secs(2)).await; }
                },
            }
        }
    };
    tokio::select! {
        () = shutdown => Ok(()),
        () = keep => Ok(()),
    }
}
