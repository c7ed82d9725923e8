//! Running checks: one task per TTL, HTTP, TCP or alias check, started when the check is
//! registered and cancelled when it is removed or replaced (each task has its own child
//! cancellation token and a span naming the check; the runner's tracker owns them all).
//!
//! - TTL: critical ("TTL expired") when no update arrives within the TTL; every update
//!   restarts the clock.
//! - HTTP: 2xx passing, 429 warning, anything else critical; the output keeps the status line
//!   and the start of the body.
//! - TCP: passing when a connection opens within the timeout.
//! - Alias: the worst status of another instance's checks and its node's checks: for this
//!   node re-evaluated on every local change, for another node followed through a blocking
//!   query on a server (`/v1/health/node/:node`), with back-off while no server answers.
//!
//! HTTP and TCP results pass through [`Thresholds`]: `SuccessBeforePassing` consecutive
//! successes before passing, `FailuresBeforeWarning` consecutive failures before warning and
//! `FailuresBeforeCritical` before critical.

use crate::local::{LocalState, MAX_OUTPUT};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use structs::agent::CheckKind;
use structs::{HealthCheck, HealthStatus};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span};

/// Consecutive-result thresholds of a polled check.
#[derive(Debug, Clone, Default)]
pub struct Thresholds {
    success_before_passing: u32,
    failures_before_warning: u32,
    failures_before_critical: u32,
    successes: u32,
    failures: u32,
}

impl Thresholds {
    /// Thresholds from a definition (0 and 1 both mean "at once"; a warning threshold of 0
    /// means none: failures go straight to critical at their threshold).
    pub fn new(success_before_passing: u32, failures_before_warning: u32, failures_before_critical: u32) -> Self {
        Self {
            success_before_passing,
            failures_before_warning,
            failures_before_critical,
            ..Self::default()
        }
    }

    /// Counts one result; returns the status to report, or `None` to keep the current one.
    pub fn observe(&mut self, status: HealthStatus) -> Option<HealthStatus> {
        if status == HealthStatus::Critical {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.failures_before_critical {
                Some(HealthStatus::Critical)
            } else if self.failures_before_warning > 0 && self.failures >= self.failures_before_warning {
                Some(HealthStatus::Warning)
            } else {
                None
            }
        } else {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            (self.successes >= self.success_before_passing).then_some(status)
        }
    }
}

struct Running {
    cancel: CancellationToken,
    ttl_reset: Option<Arc<Notify>>,
}

/// Why a TTL update was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    /// No such check.
    #[error("unknown check ID {0:?}")]
    NotFound(String),
    /// The check is not a TTL check.
    #[error("check {0:?} is not a TTL check: only TTL checks take updates")]
    NotTtl(String),
}

mod clients;

/// Starts, replaces and stops check tasks (see the module docs).
pub struct CheckRunner {
    state: Arc<LocalState>,
    servers: Option<Arc<crate::servers::Servers>>,
    /// HTTP clients by TLS verification and redirect confinement.
    clients: clients::Clients,
    running: Mutex<HashMap<String, Running>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl std::fmt::Debug for CheckRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckRunner")
            .field("running", &self.running.lock().len())
            .finish()
    }
}

impl CheckRunner {
    /// A runner updating `state`; its tasks end when `cancel` fires or they are stopped.
    pub fn new(state: Arc<LocalState>, cancel: CancellationToken) -> Self {
        Self {
            state,
            servers: None,
            clients: clients::Clients::new(),
            running: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            cancel,
        }
    }

    /// Lets alias checks of other nodes' services follow them through `servers`.
    pub fn with_servers(mut self, servers: Arc<crate::servers::Servers>) -> Self {
        self.servers = Some(servers);
        self
    }

    /// Starts running check `id` (replacing a running one of the same id). A `confined`
    /// check (registered through the API) follows HTTP redirects only within its URL's
    /// scheme, host and port.
    pub fn start(&self, id: &str, kind: &CheckKind, thresholds: Thresholds, confined: bool) {
        let cancel = self.cancel.child_token();
        let span = info_span!("check", check_id = %id, kind = kind.type_name());
        let state = Arc::clone(&self.state);
        let id_owned = id.to_owned();
        let mut ttl_reset = None;
        match kind.clone() {
            CheckKind::Ttl(ttl) => {
                let reset = Arc::new(Notify::new());
                ttl_reset = Some(Arc::clone(&reset));
                let stop = cancel.clone();
                self.tracker
                    .spawn(async move { run_ttl(state, id_owned, ttl, reset, stop).await }.instrument(span));
            }
            CheckKind::Alias { node, service } if !node.is_empty() && node != self.state.node() => {
                let stop = cancel.clone();
                match self.servers.clone() {
                    Some(servers) => {
                        self.tracker.spawn(
                            async move { run_remote_alias(state, id_owned, node, service, servers, stop).await }
                                .instrument(span),
                        );
                    }
                    None => {
                        state.update_check(
                            &id_owned,
                            HealthStatus::Critical,
                            format!("no server to follow node {node:?}"),
                        );
                    }
                }
            }
            CheckKind::Alias { service, .. } => {
                let stop = cancel.clone();
                self.tracker
                    .spawn(async move { run_alias(state, id_owned, service, stop).await }.instrument(span));
            }
            polled @ (CheckKind::Http { .. } | CheckKind::Tcp { .. }) => {
                let stop = cancel.clone();
                let skip_verify = matches!(
                    &polled,
                    CheckKind::Http {
                        tls_skip_verify: true,
                        ..
                    }
                );
                let http = Polled {
                    client: self.clients.pick(skip_verify, confined),
                    confined,
                };
                self.tracker.spawn(
                    async move { run_polled(state, id_owned, polled, http, thresholds, stop).await }.instrument(span),
                );
            }
        }
        if let Some(old) = self.running.lock().insert(id.to_owned(), Running { cancel, ttl_reset }) {
            old.cancel.cancel();
        }
    }

    /// Stops check `id` (nothing if it is not running).
    pub fn stop(&self, id: &str) {
        if let Some(old) = self.running.lock().remove(id) {
            old.cancel.cancel();
        }
    }

    /// Number of running check tasks.
    pub fn len(&self) -> usize {
        self.running.lock().len()
    }

    /// True when no check runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A TTL check's report (`/v1/agent/check/pass|warn|fail|update`): sets its status and
    /// output and restarts its clock.
    pub fn ttl_update(&self, id: &str, status: HealthStatus, output: String) -> Result<(), TtlError> {
        let reset = match self.running.lock().get(id) {
            Some(Running {
                ttl_reset: Some(reset), ..
            }) => Arc::clone(reset),
            Some(_) => return Err(TtlError::NotTtl(id.to_owned())),
            None if self.state.check(id).is_some() => return Err(TtlError::NotTtl(id.to_owned())),
            None => return Err(TtlError::NotFound(id.to_owned())),
        };
        if !self.state.update_check(id, status, output) {
            return Err(TtlError::NotFound(id.to_owned()));
        }
        reset.notify_one();
        Ok(())
    }

    /// Stops every check and waits for their tasks to end.
    pub async fn shutdown(&self) {
        for (_, r) in self.running.lock().drain() {
            r.cancel.cancel();
        }
        self.tracker.close();
        self.tracker.wait().await;
    }
}

async fn run_ttl(state: Arc<LocalState>, id: String, ttl: Duration, reset: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = reset.notified() => continue,
            () = tokio::time::sleep(ttl) => {}
        }
        debug!("TTL expired");
        state.update_check(&id, HealthStatus::Critical, "TTL expired".into());
        tokio::select! {
            () = stop.cancelled() => return,
            () = reset.notified() => {}
        }
    }
}

/// How a polled check makes its HTTP requests.
#[derive(Debug, Clone)]
pub struct Polled {
    /// The client (its TLS verification and redirect policy).
    pub client: reqwest::Client,
    /// Redirects only within the URL's origin (also for `TLSServerName`'s one-off client).
    pub confined: bool,
}

async fn run_polled(
    state: Arc<LocalState>,
    id: String,
    kind: CheckKind,
    http: Polled,
    mut thresholds: Thresholds,
    stop: CancellationToken,
) {
    let interval = match &kind {
        CheckKind::Http { interval, .. } | CheckKind::Tcp { interval, .. } => *interval,
        _ => return,
    };
    // Spread the first runs of many checks over their interval.
    let stagger = Duration::from_nanos(crate::backoff::below(
        interval.as_nanos().min(u128::from(u64::MAX)) as u64
    ));
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(stagger) => {}
    }
    loop {
        let (status, output) = tokio::select! {
            () = stop.cancelled() => return,
            result = run_once(&kind, &http) => result,
        };
        if let Some(status) = thresholds.observe(status) {
            state.update_check(&id, status, output);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Runs an HTTP or TCP check once.
pub async fn run_once(kind: &CheckKind, http: &Polled) -> (HealthStatus, String) {
    match kind {
        CheckKind::Http {
            url,
            method,
            header,
            body,
            timeout,
            tls_skip_verify,
            tls_server_name,
            ..
        } => {
            if tls_server_name.is_empty() {
                return http_once(&http.client, url, method, header, body, *timeout).await;
            }
            match with_server_name(url, tls_server_name, *tls_skip_verify, http.confined).await {
                Ok((client, named_url, host)) => {
                    let mut header = header.clone();
                    header.entry("Host".into()).or_insert_with(|| vec![host]);
                    http_once(&client, named_url.as_str(), method, &header, body, *timeout).await
                }
                Err(e) => (HealthStatus::Critical, format!("HTTP {method} {url}: {e}")),
            }
        }
        CheckKind::Tcp { addr, timeout, .. } => {
            match tokio::time::timeout(*timeout, tokio::net::TcpStream::connect(addr.as_str())).await {
                Ok(Ok(_)) => (HealthStatus::Passing, format!("TCP connect {addr}: Success")),
                Ok(Err(e)) => (HealthStatus::Critical, format!("dial tcp {addr}: {e}")),
                Err(_) => (
                    HealthStatus::Critical,
                    format!("dial tcp {addr}: timed out after {timeout:?}"),
                ),
            }
        }
        CheckKind::Ttl(_) | CheckKind::Alias { .. } => (HealthStatus::Critical, "not a polled check".into()),
    }
}

/// A one-off client that connects to `url`'s host but speaks TLS to `server_name` (SNI and
/// certificate name), with the URL rewritten to that name and the original `Host` header.
async fn with_server_name(
    url: &str,
    server_name: &str,
    skip_verify: bool,
    confined: bool,
) -> Result<(reqwest::Client, reqwest::Url, String), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    let host = parsed.host_str().ok_or("the URL has no host")?.to_owned();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addr = tokio::net::lookup_host((host.trim_start_matches('[').trim_end_matches(']'), port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let client = clients::build(skip_verify, confined, Some((server_name, addr))).map_err(|e| e.to_string())?;
    let mut named = parsed.clone();
    named
        .set_host(Some(server_name))
        .map_err(|e| format!("TLSServerName {server_name:?}: {e}"))?;
    let host_header = match parsed.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    };
    Ok((client, named, host_header))
}

async fn http_once(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    header: &std::collections::BTreeMap<String, Vec<String>>,
    body: &str,
    timeout: Duration,
) -> (HealthStatus, String) {
    let method = match reqwest::Method::from_bytes(method.as_bytes()) {
        Ok(m) => m,
        Err(e) => return (HealthStatus::Critical, format!("invalid method {method:?}: {e}")),
    };
    let mut req = http
        .request(method.clone(), url)
        .timeout(timeout)
        .header("Accept", "text/plain, text/*, */*");
    for (name, values) in header {
        for v in values {
            req = req.header(name.as_str(), v.as_str());
        }
    }
    if !body.is_empty() {
        req = req.body(body.to_owned());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return (
                HealthStatus::Critical,
                format!("HTTP {method} {url}: {}", crate::servers::chain(&e)),
            );
        }
    };
    let code = resp.status();
    // Only the start of the body is kept: read no more than that, however much is sent.
    let head = async {
        let mut resp = resp;
        let mut head: Vec<u8> = Vec::new();
        while head.len() < MAX_OUTPUT {
            match resp.chunk().await? {
                Some(chunk) => head.extend_from_slice(&chunk[..chunk.len().min(MAX_OUTPUT - head.len())]),
                None => break,
            }
        }
        Ok::<_, reqwest::Error>(head)
    };
    let text = match tokio::time::timeout(timeout, head).await {
        Ok(Ok(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(Err(e)) => format!("(body unreadable: {e})"),
        Err(_) => "(body timed out)".into(),
    };
    let status = if code.is_success() {
        HealthStatus::Passing
    } else if code.as_u16() == 429 {
        HealthStatus::Warning
    } else {
        HealthStatus::Critical
    };
    (status, format!("HTTP {method} {url}: {code} Output: {text}"))
}

/// The status an alias of `checks` reports: the worst one, passing when there are none.
pub fn alias_status(checks: &[HealthCheck]) -> (HealthStatus, String) {
    match checks.iter().map(|c| c.status).max() {
        None => (HealthStatus::Passing, "No checks found.".into()),
        Some(HealthStatus::Passing) => (HealthStatus::Passing, "All checks passing.".into()),
        Some(worst) => {
            let names: Vec<&str> = checks
                .iter()
                .filter(|c| c.status == worst)
                .map(|c| c.check_id.as_str())
                .collect();
            (worst, format!("Aliased checks {worst}: {}", names.join(", ")))
        }
    }
}

async fn run_alias(state: Arc<LocalState>, id: String, service: String, stop: CancellationToken) {
    let mut changes = state.subscribe();
    loop {
        if state.alias_pending(&service, &id) {
            tokio::select! {
                () = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let (status, output) = match state.alias_view(&service, &id) {
            None => (
                HealthStatus::Critical,
                format!("Service {service:?} is not registered on this node"),
            ),
            Some(checks) => alias_status(&checks),
        };
        state.update_check(&id, status, output);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// Follows `service` on another `node` with blocking queries on a server.
async fn run_remote_alias(
    state: Arc<LocalState>,
    id: String,
    node: String,
    service: String,
    servers: Arc<crate::servers::Servers>,
    stop: CancellationToken,
) {
    let mut index = 0u64;
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let path = format!("{}?index={index}&wait=5m", crate::servers::paths::health_node(&node));
        let request = servers.send(|c, base| c.get(format!("{base}{path}")).timeout(Duration::from_secs(330)));
        let answer = tokio::select! {
            () = stop.cancelled() => return,
            r = request => r,
        };
        let checks = match answer {
            Ok(resp) if resp.status().is_success() => {
                let next = resp
                    .headers()
                    .get("x-consul-index")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                // An index that went backwards means the server reset: start over.
                index = if next < index { 0 } else { next };
                let body = tokio::select! {
                    () = stop.cancelled() => return,
                    b = resp.bytes() => b,
                };
                body.ok()
                    .and_then(|b| structs::json::from_slice::<Vec<HealthCheck>>(&b).ok())
            }
            Ok(_) | Err(_) => None,
        };
        match checks {
            Some(checks) => {
                backoff.reset();
                let relevant: Vec<HealthCheck> = checks
                    .into_iter()
                    .filter(|c| c.service_id == service || c.service_id.is_empty())
                    .collect();
                let (status, output) = alias_status(&relevant);
                state.update_check(&id, status, output);
            }
            None => {
                let delay = backoff.next_delay();
                debug!(?delay, "alias: no answer about node {node:?}; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
