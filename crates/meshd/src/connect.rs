//! `meshd connect envoy`: find the proxy, build its bootstrap, print it or exec Envoy.

use crate::cli::{EnvoyArgs, GrpcAddr};
use anyhow::{Context, Result, bail};
use api_client::{Servers, paths};
use std::future::Future;
use structs::listing::CatalogService;
use structs::{ServiceKind, Token};
use supervisor::bootstrap::{BootstrapConfig, XdsServer, XdsTls, bootstrap_json};
use supervisor::envoy::AdminAddr;

use lookup::{Answer, Forbidden, lookup};

/// The proxy's (node, service id, service name) for the flags given.
async fn resolve(args: &EnvoyArgs) -> Result<(String, String, String)> {
    if let Some(gw) = crate::connect_gateway::gateway(args)? {
        let id = args.proxy_id.clone().unwrap_or_else(|| gw.service.clone());
        return Ok((gateway_node(args).await?, id, gw.service));
    }
    match (&args.proxy_id, &args.sidecar_for) {
        (Some(id), _) => Ok((
            args.node.clone(),
            id.clone(),
            // `<service>-sidecar-proxy`, or Consul 1.4's managed `<service>-proxy`.
            id.strip_suffix("-sidecar-proxy")
                .or_else(|| id.strip_suffix("-proxy"))
                .unwrap_or(id)
                .to_owned(),
        )),
        (None, Some(service)) => {
            let api = Servers::new(&[args.http_addr.to_string()]);
            match sidecar_from_agent(&api, args, service).await? {
                Some(found) => Ok(found),
                None => sidecar_from_catalog(&api, args, service).await,
            }
        }
        (None, None) => bail!("one of -proxy-id, -sidecar-for or -gateway is required"),
    }
}

/// The sources of the proxy's token, as a message names them.
const TOKEN_SOURCES: &str = "-token-file, -token or CONNECT_PROXY_TOKEN";

/// The error for a sidecar of `service` the token cannot see: `at` (the agent or server
/// asked) `why` ("filtered its answer by ACLs", "refused it: ..."), naming where the token
/// comes from.
fn token_cannot_see(args: &EnvoyArgs, service: &str, at: &str, why: &str) -> anyhow::Error {
    if args.token.is_none() {
        return anyhow::anyhow!(
            "no token was given ({TOKEN_SOURCES}), and without one the sidecar proxy of service {service:?} cannot be seen ({at} {why}): give a token with service:read on it"
        );
    }
    anyhow::anyhow!(
        "the token cannot see the sidecar proxy of service {service:?} ({at} {why}): give one with service:read on it through {TOKEN_SOURCES}"
    )
}

/// ACLs hid part of a listing.
const FILTERED: &str = "filtered its answer by ACLs";

/// A lookup's error, saying it is the token's when the API refused it.
fn lookup_error(args: &EnvoyArgs, service: &str, at: &str, e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<Forbidden>() {
        Some(f) => token_cannot_see(args, service, at, &format!("refused it: {}", f.message)),
        None => e,
    }
}

/// The sidecar of local service `service` (by id, else by name), as the agent at
/// `-http-addr` registered it, with the agent's node: what Envoy then asks that agent's xDS
/// for. `None` when `-http-addr` is a server (no local services there).
async fn sidecar_from_agent(
    api: &Servers,
    args: &EnvoyArgs,
    service: &str,
) -> Result<Option<(String, String, String)>> {
    let at = format!("the agent at {}", args.http_addr);
    let services = match lookup(api, args, paths::AGENT_SERVICES).await {
        Ok(Answer { body: None, .. }) => return Ok(None),
        Ok(answer) => answer,
        Err(e) => return Err(lookup_error(args, service, &at, e)),
    };
    // The node name needs agent:read, which a proxy's token may not hold: the agent's xDS
    // then finds the proxy by id among its own.
    let (node, server) = match lookup(api, args, paths::AGENT_SELF).await {
        Ok(Answer { body: Some(me), .. }) => (
            me["Config"]["NodeName"].as_str().unwrap_or_default().to_owned(),
            me["Config"]["Server"] == true,
        ),
        Ok(Answer { body: None, .. }) => return Ok(None),
        Err(e) if e.downcast_ref::<Forbidden>().is_some() => (String::new(), false),
        Err(e) => return Err(e),
    };
    let body = services.body.unwrap_or_default();
    match local_sidecars(&body, service).as_slice() {
        // A server is an agent of its own node too; a sidecar not registered there is
        // looked up in the catalog.
        [] if server => Ok(None),
        // The token may not read the agent, which may then be a server: the catalog, else
        // not registered here.
        [] if node.is_empty() && !services.filtered => match sidecar_from_catalog(api, args, service).await {
            Ok(found) => Ok(Some(found)),
            Err(_) => bail!("no sidecar proxy for service {service:?} is registered with {at}"),
        },
        [one] => {
            let id = one["ID"].as_str().unwrap_or_default().to_owned();
            let name = one["Proxy"]["DestinationServiceName"]
                .as_str()
                .unwrap_or(service)
                .to_owned();
            Ok(Some((node, id, name)))
        }
        [] if services.filtered => Err(token_cannot_see(args, service, &at, FILTERED)),
        [] => {
            let node = if node.is_empty() {
                String::new()
            } else {
                format!(" (node {node:?})")
            };
            bail!("no sidecar proxy for service {service:?} is registered with {at}{node}")
        }
        more => bail!(
            "{} sidecar proxies for {service:?} are registered with {at}: pick one with -proxy-id",
            more.len()
        ),
    }
}

/// The sidecars among the agent's `services` (`/v1/agent/services`) whose destination is the
/// service with id `service`, else those with that name.
fn local_sidecars<'a>(services: &'a serde_json::Value, service: &str) -> Vec<&'a serde_json::Value> {
    let sidecars: Vec<&serde_json::Value> = services
        .as_object()
        .map(|m| m.values().filter(|s| s["Kind"] == "connect-proxy").collect())
        .unwrap_or_default();
    let by = |field: &str| -> Vec<&serde_json::Value> {
        sidecars
            .iter()
            .copied()
            .filter(|s| s["Proxy"][field] == service)
            .collect()
    };
    let by_id = by("DestinationServiceID");
    if by_id.is_empty() {
        by("DestinationServiceName")
    } else {
        by_id
    }
}

/// The sidecar of `service` as the catalog knows it (`-http-addr` is a server).
/// The node a gateway's proxy is on: at an agent, the agent's (a `-node` naming another is
/// refused: the agent serves only its own node's proxies); at a server, `-node`.
async fn gateway_node(args: &EnvoyArgs) -> Result<String> {
    let api = Servers::new(&[args.http_addr.to_string()]);
    // At a server, `-node` is the catalog's node (a server serves every node's proxies).
    if lookup(&api, args, paths::AGENT_SERVICES).await?.body.is_none() {
        return Ok(args.node.clone());
    }
    let node = match lookup(&api, args, paths::AGENT_SELF).await {
        Ok(Answer { body: Some(me), .. }) if me["Config"]["Server"] == true => return Ok(args.node.clone()),
        Ok(Answer { body: Some(me), .. }) => me["Config"]["NodeName"].as_str().unwrap_or_default().to_owned(),
        Ok(Answer { body: None, .. }) => String::new(),
        // Without agent:read, the agent's xDS finds the proxy by id among its own.
        Err(e) if e.downcast_ref::<Forbidden>().is_some() => String::new(),
        Err(e) => return Err(e),
    };
    if !args.node.is_empty() && !node.is_empty() && node != args.node {
        bail!(
            "-node {:?}: the agent at {} is node {node:?}, and serves only its own node's proxies (drop -node, or \
             use that node's agent)",
            args.node,
            args.http_addr
        );
    }
    Ok(if node.is_empty() { args.node.clone() } else { node })
}

async fn sidecar_from_catalog(api: &Servers, args: &EnvoyArgs, service: &str) -> Result<(String, String, String)> {
    let at = format!("the server at {}", args.http_addr);
    let path = paths::catalog_connect(service);
    let answer = lookup(api, args, &path)
        .await
        .map_err(|e| lookup_error(args, service, &at, e))?;
    let body = answer.body.unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
    let instances: Vec<CatalogService> = structs::json::from_value(body).context("decoding the sidecar lookup")?;
    let proxies: Vec<CatalogService> = instances
        .into_iter()
        .filter(|s| s.service_kind == ServiceKind::ConnectProxy)
        .filter(|s| args.node.is_empty() || s.node == args.node)
        .collect();
    match <[CatalogService; 1]>::try_from(proxies) {
        Ok([one]) => Ok((one.node, one.service_id, service.to_owned())),
        Err(proxies) if proxies.is_empty() && answer.filtered => Err(token_cannot_see(args, service, &at, FILTERED)),
        Err(proxies) if proxies.is_empty() => {
            let node = if args.node.is_empty() {
                String::new()
            } else {
                format!(" on node {:?}", args.node)
            };
            bail!("no sidecar proxy is registered for service {service:?}{node} in the catalog of {at}")
        }
        Err(proxies) => bail!(
            "{} sidecar proxies are registered for {service:?}: pick one with -proxy-id or -node",
            proxies.len()
        ),
    }
}

/// The bootstrap for the flags as they stand now (resolving the proxy, reading the token),
/// with Envoy's admin interface at `admin`.
async fn bootstrap(args: &EnvoyArgs, admin: &AdminAddr) -> Result<String> {
    let token = token_of(args)?;
    // The lookups of the proxy run with the same token as its stream.
    let with_token = EnvoyArgs {
        token: token.clone(),
        ..args.clone()
    };
    // The flags alone first: a wrong combination is reported without asking anything.
    prometheus_bind(args, None)?;
    let (node_name, proxy_id, cluster) = resolve(&with_token).await?;
    let options = proxy_config::bootstrap_options(&with_token, &node_name, &proxy_id, &cluster).await?;
    let (xds_servers, xds_tls) = xds_targets(args).await?;
    let cfg = BootstrapConfig {
        proxy_id,
        node_name,
        cluster,
        admin: admin.clone(),
        xds_servers,
        token,
        xds_tls,
        prometheus_bind: prometheus_bind(args, options.prometheus_bind)?,
        options,
    };
    serde_json::to_string_pretty(&bootstrap_json(&cfg)).context("encoding the bootstrap")
}

/// `-prometheus-bind` (else the proxy's `envoy_prometheus_bind_addr`, `from_config`), which
/// forwards to the admin interface and so needs its address known.
fn prometheus_bind(
    args: &EnvoyArgs,
    from_config: Option<std::net::SocketAddr>,
) -> Result<Option<std::net::SocketAddr>> {
    let which = if args.prometheus_bind.is_some() {
        "-prometheus-bind"
    } else {
        "the proxy's Config.envoy_prometheus_bind_addr"
    };
    match (args.prometheus_bind.or(from_config), args.admin_bind) {
        (Some(_), Some(admin)) if admin.port() == 0 => {
            bail!(
                "{which} serves the admin interface's metrics: it needs -admin-bind with a fixed port, not 0 (or no -admin-bind: the admin's Unix socket)"
            )
        }
        (other, _) => Ok(other),
    }
}

/// The file name of the admin socket in the run dir.
const ADMIN_SOCKET: &str = "admin.sock";

/// Where Envoy's files go: `-run-dir`, else a private temporary directory (mode 0700, a name
/// nobody can guess), removed when this is dropped: when a supervised Envoy has stopped, or
/// when this process fails. An Envoy run by `-exec` keeps it (its process replaces this one,
/// which drops nothing), so does one started from a `-bootstrap` ([`RunDir::keep`]).
struct RunDir {
    path: std::path::PathBuf,
    temp: Option<tempfile::TempDir>,
}

impl RunDir {
    fn new(args: &EnvoyArgs, supervised: bool) -> Result<Self> {
        if let Some(dir) = &args.run_dir {
            let path = std::path::absolute(dir).with_context(|| format!("-run-dir {}", dir.display()))?;
            if !supervised {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&path)
                    .with_context(|| format!("-run-dir {}: cannot create it", path.display()))?;
            }
            supervisor::envoy::check_socket_dir(&path).context("-run-dir")?;
            return Ok(Self { path, temp: None });
        }
        use std::os::unix::fs::PermissionsExt;
        let temp = tempfile::Builder::new()
            .prefix("meshd-envoy-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .context("creating a run dir")?;
        Ok(Self {
            path: temp.path().to_owned(),
            temp: Some(temp),
        })
    }

    /// Leaves a temporary run dir in place after this process, for the Envoy that uses it.
    fn keep(mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = temp.keep();
        }
    }
}

/// Envoy's admin interface: `-admin-bind` on TCP, else the Unix socket of the run dir.
fn admin_of(args: &EnvoyArgs, dir: Option<&RunDir>) -> Result<AdminAddr> {
    match (args.admin_bind, dir) {
        (Some(addr), _) => Ok(AdminAddr::Tcp(addr)),
        (None, Some(dir)) => Ok(AdminAddr::Unix(dir.path.join(ADMIN_SOCKET))),
        (None, None) => bail!("no directory for Envoy's admin socket: give -run-dir or -admin-bind"),
    }
}

/// The proxy's token as the flags give it now: `-token-file`, `-token`, else
/// `CONNECT_PROXY_TOKEN`.
fn token_of(args: &EnvoyArgs) -> Result<Option<Token>> {
    Ok(match &args.token_file {
        Some(path) => Token::new(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read -token-file {}", path.display()))?
                .trim(),
        ),
        // A proxy the agent runs gets its token in the environment, never on the command line.
        None if args.token.is_none() => Token::new(&std::env::var("CONNECT_PROXY_TOKEN").unwrap_or_default()),
        None => args.token.clone(),
    })
}

/// Where Envoy reaches xDS: every server of `-grpc-addr` (host names resolved now: the
/// bootstrap's cluster is static; each server's certificate must carry the host given) and,
/// for `https://`, the CA it verifies the servers with.
async fn xds_targets(args: &EnvoyArgs) -> Result<(Vec<XdsServer>, Option<XdsTls>)> {
    let targets = &args.grpc_addr;
    let list = || targets.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let Some(first) = targets.first() else {
        bail!("-grpc-addr: give at least one xDS address");
    };
    if targets.iter().any(|t| t.tls != first.tls) {
        bail!(
            "-grpc-addr {}: mixes plaintext and https:// servers; give all plaintext or all https://",
            list()
        );
    }
    let mut servers = Vec::with_capacity(targets.len());
    for target in targets {
        servers.push(XdsServer {
            addr: resolve_server(target).await?,
            host: target.host.clone(),
        });
    }
    let tls = match (&args.grpc_ca_file, first.tls) {
        (Some(path), true) => {
            let ca_pem = std::fs::read_to_string(path)
                .with_context(|| format!("-grpc-ca-file {}: cannot read", path.display()))?;
            if !ca_pem.contains("-----BEGIN CERTIFICATE-----") {
                bail!("-grpc-ca-file {}: no PEM certificate in the file", path.display());
            }
            Some(XdsTls { ca_pem })
        }
        (None, true) => {
            bail!(
                "-grpc-addr {}: xDS over TLS needs -grpc-ca-file (the CA Envoy verifies the server with)",
                list()
            )
        }
        (Some(_), false) => bail!("-grpc-ca-file is for xDS over TLS: give -grpc-addr as https://HOST:PORT"),
        (None, false) => None,
    };
    Ok((servers, tls))
}

/// The address of one `-grpc-addr` server: an IP as given, a host name's first address.
async fn resolve_server(target: &GrpcAddr) -> Result<std::net::SocketAddr> {
    match target.host.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(std::net::SocketAddr::new(ip, target.port)),
        Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .with_context(|| format!("-grpc-addr {target}: cannot resolve {}", target.host))?
            .next()
            .with_context(|| format!("-grpc-addr {target}: {} has no address", target.host)),
    }
}

/// `-bootstrap` prints the bootstrap; `-exec` replaces this process with Envoy; by default
/// Envoy runs supervised until `shutdown` (then drains) or until it cannot be kept running.
pub async fn run(args: EnvoyArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    if args.register {
        let gw = crate::connect_gateway::gateway(&args)?.context("-register is for gateways: give -gateway")?;
        crate::connect_gateway::register(&args, &gw, token_of(&args)?.as_ref()).await?;
    }
    if args.bootstrap {
        // A bootstrap with a TCP admin names no directory.
        let dir = match args.admin_bind {
            Some(_) => None,
            None => Some(RunDir::new(&args, false)?),
        };
        let json = bootstrap(&args, &admin_of(&args, dir.as_ref())?).await?;
        #[allow(clippy::print_stdout)]
        {
            println!("{json}");
        }
        if let Some(dir) = dir {
            dir.keep();
        }
        return Ok(());
    }
    // Checked once, before anything starts: a missing Envoy is not worth retrying.
    let args = EnvoyArgs {
        envoy_binary: envoy_binary(&args.envoy_binary, std::env::var_os("PATH"))?,
        ..args
    };
    let dir = RunDir::new(&args, !args.exec)?;
    let json = bootstrap(&args, &admin_of(&args, Some(&dir))?).await?;
    if args.exec {
        return exec(&args, &dir.path, &json);
    }
    supervise(args, dir, json, shutdown).await
}

/// The Envoy binary `-envoy-binary` names: a path (with a `/`) must be an executable file;
/// a bare name (`envoy`, the default) is looked up in `path` (`PATH`).
fn envoy_binary(given: &std::path::Path, path: Option<std::ffi::OsString>) -> Result<std::path::PathBuf> {
    let shown = given.display();
    if given.as_os_str().as_encoded_bytes().contains(&b'/') {
        return match executable(given) {
            Ok(()) => Ok(given.to_owned()),
            Err(why) => bail!("-envoy-binary {shown}: {why}: give the path of the Envoy binary"),
        };
    }
    let path = path.unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(given))
        .find(|candidate| executable(candidate).is_ok())
        .with_context(|| format!("no {shown} on PATH: install Envoy, or give its path with -envoy-binary PATH"))
}

/// Whether `path` is a file this process may execute; why not, if not.
fn executable(path: &std::path::Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        _ => e.to_string(),
    })?;
    if !meta.is_file() {
        return Err("not a file".into());
    }
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable".into());
    }
    Ok(())
}

/// The arguments after `--`, preceded by `-l <-envoy-log-level>` unless they set the log
/// level themselves (Envoy refuses a flag given twice).
fn envoy_extra_args(args: &EnvoyArgs) -> Vec<String> {
    let sets_level = args
        .envoy_args
        .iter()
        .any(|a| a == "-l" || a == "--log-level" || a.starts_with("--log-level="));
    let mut out = Vec::with_capacity(args.envoy_args.len() + 2);
    if !sets_level {
        out.extend(["-l".to_owned(), args.envoy_log_level.clone()]);
    }
    out.extend(args.envoy_args.iter().cloned());
    out
}

/// Replaces this process with Envoy, its hot-restart sockets in `run_dir`.
fn exec(args: &EnvoyArgs, run_dir: &std::path::Path, json: &str) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(&args.envoy_binary);
    cmd.arg("--config-yaml").arg(json);
    if !args.envoy_args.iter().any(|a| a == "--socket-path") {
        cmd.args(supervisor::envoy::hot_restart_socket_args(run_dir));
    }
    let err = cmd.args(envoy_extra_args(args)).exec();
    bail!("cannot run {}: {err}", args.envoy_binary.display())
}

/// A base id for this proxy: stable for the same proxy and admin address (so a restarted
/// supervisor cleans what the last one left); with an ephemeral admin port the process id
/// is mixed in, since two such proxies could otherwise collide.
fn derive_base_id(args: &EnvoyArgs) -> u32 {
    let proxy = args
        .proxy_id
        .as_deref()
        .or(args.sidecar_for.as_deref())
        .or(args.service.as_deref())
        .unwrap_or_default();
    let admin = match (args.admin_bind, &args.run_dir) {
        (Some(addr), _) => addr.to_string(),
        (None, Some(dir)) => format!("unix:{}", dir.display()),
        (None, None) => "unix".to_owned(),
    };
    let pid = std::process::id().to_le_bytes();
    let mut parts: Vec<&[u8]> = vec![proxy.as_bytes(), args.node.as_bytes(), admin.as_bytes()];
    if args.admin_bind.is_some_and(|a| a.port() == 0) {
        parts.push(&pid);
    }
    supervisor::envoy::stable_base_id(&parts)
}

/// How long a `-token-file` must be quiet after an event before it is read: a writer that
/// truncates then writes raises several events, and the first may see an empty file.
const TOKEN_FILE_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// How often a `-token-file` is checked when its directory cannot be watched.
const TOKEN_FILE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// What identifies the token file's content without reading it: a replacement by rename
/// shows as a new inode, an edit in place as a new mtime or size.
type TokenStamp = Option<(std::time::SystemTime, u64, u64)>;

fn token_stamp(path: &std::path::Path) -> TokenStamp {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// Watches the directory of the token file at `path` and sends on `tx` when an event
/// concerns it. The directory, not the file: editors and kubelet replace the file by
/// renaming another over it, which a watch on the file itself would not survive.
fn watch_token_file(
    path: &std::path::Path,
    tx: tokio::sync::mpsc::Sender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::event::{AccessKind, AccessMode};
    use notify::{EventKind, RecursiveMode, Watcher};
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path.file_name().map(ToOwned::to_owned);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            // An overflowed or failed watch may have lost the event: look at the file.
            let _ = tx.try_send(());
            return;
        };
        // Reads (ours included, when the bootstrap is regenerated) change nothing.
        if matches!(event.kind, EventKind::Access(kind) if kind != AccessKind::Close(AccessMode::Write)) {
            return;
        }
        // The file itself, or kubelet's `..data` symlink swap that replaces what it points to.
        let concerns_token = event.paths.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| Some(n) == name.as_deref() || n.as_encoded_bytes().starts_with(b".."))
        });
        if concerns_token {
            // Full means a check is already pending, which will see this change too.
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Notices a rotated `-token-file` without a signal: events in its directory, once quiet
/// for the settle time, lead to a look at its stamp (polled when the directory cannot be
/// watched).
struct TokenWatch {
    file: Option<std::path::PathBuf>,
    last: TokenStamp,
    events: tokio::sync::mpsc::Receiver<()>,
    _watcher: Option<notify::RecommendedWatcher>,
    poll: Option<tokio::time::Interval>,
    settle: Option<tokio::time::Instant>,
}

impl TokenWatch {
    fn new(file: Option<std::path::PathBuf>) -> Self {
        let last = file.as_deref().and_then(token_stamp);
        let (tx, events) = tokio::sync::mpsc::channel(1);
        let (mut watcher, mut poll) = (None, None);
        if let Some(path) = &file {
            match watch_token_file(path, tx) {
                Ok(w) => watcher = Some(w),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot watch the token file; checking it every second");
                    poll = Some(tokio::time::interval(TOKEN_FILE_POLL));
                }
            }
        }
        Self {
            file,
            last,
            events,
            _watcher: watcher,
            poll,
            settle: None,
        }
    }

    /// Completes once the token file's stamp changed; never without a token file. Safe to
    /// drop at any await: what it has seen so far is kept in `self`.
    async fn changed(&mut self) {
        loop {
            tokio::select! {
                Some(()) = self.events.recv() => {
                    self.settle = Some(tokio::time::Instant::now() + TOKEN_FILE_SETTLE);
                    continue;
                }
                () = async {
                    match (self.settle, self.poll.as_mut()) {
                        (Some(at), _) => tokio::time::sleep_until(at).await,
                        (None, Some(poll)) => {
                            poll.tick().await;
                        }
                        (None, None) => std::future::pending().await,
                    }
                } => {}
            }
            self.settle = None;
            let stamp = self.file.as_deref().and_then(token_stamp);
            if stamp != self.last {
                self.last = stamp;
                return;
            }
        }
    }
}

async fn supervise(args: EnvoyArgs, dir: RunDir, first: String, shutdown: impl Future<Output = ()>) -> Result<()> {
    use supervisor::agent::{Agent, AgentOptions};
    use supervisor::envoy::{EnvoyConfig, EnvoyOptions, EnvoyProxy};
    use tokio::signal::unix::{SignalKind, signal};

    // Installed first: SIGHUP's default action would end the supervisor.
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    // A temporary run dir lives as long as `dir`: this function.
    let run_dir = dir.path.clone();
    let admin = admin_of(&args, Some(&dir))?;
    let base_id = args.base_id.unwrap_or_else(|| derive_base_id(&args));
    let mut opts = EnvoyOptions::new(&args.envoy_binary, base_id, &run_dir);
    opts.drain_time = args.drain_time;
    opts.parent_shutdown_time = args.parent_shutdown_time;
    opts.extra_args = envoy_extra_args(&args);
    let proxy = EnvoyProxy::new(opts).with_context(|| format!("preparing the run dir {}", run_dir.display()))?;
    let (agent, handle) = Agent::new(
        proxy,
        AgentOptions {
            drain_period: args.drain_time,
            ..AgentOptions::default()
        },
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let span = tracing::info_span!("envoy_agent", base_id);
    let mut task = tokio::spawn(tracing::Instrument::instrument(agent.run(cancel.clone()), span));
    tracing::info!(base_id, run_dir = %run_dir.display(), "supervising envoy");
    handle
        .set_config(EnvoyConfig(first))
        .await
        .context("the proxy agent stopped at once")?;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut token = TokenWatch::new(args.token_file.clone());
    loop {
        let why = tokio::select! {
            ended = &mut task => {
                return ended.context("the proxy agent panicked")?.context("envoy could not be kept running");
            }
            _ = &mut shutdown => break,
            _ = hangup.recv() => "SIGHUP",
            () = token.changed() => "token file changed",
        };
        match bootstrap(&args, &admin).await {
            // The agent hot-restarts only if the bootstrap changed.
            Ok(json) => {
                tracing::info!(why, "bootstrap regenerated");
                let _ = handle.set_config(EnvoyConfig(json)).await;
            }
            Err(e) => tracing::warn!(why, error = %format!("{e:#}"), "keeping the running bootstrap"),
        }
    }
    tracing::info!(drain = ?args.drain_time, "draining envoy before exit (signal again to stop at once)");
    let _ = handle.drain().await;
    tokio::select! {
        ended = &mut task => ended.context("the proxy agent panicked")?.context("envoy failed while draining"),
        _ = crate::shutdown_signal() => {
            cancel.cancel();
            task.await.context("the proxy agent panicked")?.context("envoy failed while stopping")
        }
    }
}

mod lookup;
mod proxy_config;

#[cfg(test)]
mod tests;
