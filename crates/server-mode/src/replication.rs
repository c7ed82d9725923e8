//! Replication from the primary datacenter, a secondary server's side: its config entries
//! (intentions among them) and, with ACLs on, its ACL policies, roles and global tokens kept
//! equal to the primary's, and its writes of those sent to the primary.
//!
//! Each kind is followed with a blocking query on the primary
//! (`/v1/internal/replication/...`) and every answer that moved is written here as one write
//! that makes the copy equal (`catalog::Op::ReplicateConfig`, `ReplicateAcl`). A write of a
//! replicated kind made here is relayed to a primary server (the caller's token with it);
//! once it answers, the copy is refreshed from that server before the answer goes back, so
//! the writer reads its write here at once. How the copies are doing:
//! `/v1/operator/replication`, `/v1/acl/replication`, and the
//! `meshd_replication_lag_seconds` / `meshd_replication_index` metrics.

use crate::peer::{Answered, FORWARDED_DC, Peer, RETRY};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use catalog::federation::{Federation, Replicated};
use catalog::{Op, Store};
use http_kit::relay::{self, Outgoing};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::ConfigEntry;
use structs::acl::AclReplica;
use tracing::{info, warn};

type Labels = Vec<(&'static str, &'static str)>;

/// The replication metrics (a secondary's server registers them).
#[derive(Clone)]
pub(crate) struct ReplicationMetrics {
    lag: Family<Labels, Histogram, fn() -> Histogram>,
    index: Family<Labels, Gauge>,
}

fn lag_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

impl Default for ReplicationMetrics {
    fn default() -> Self {
        Self {
            lag: Family::new_with_constructor(lag_histogram),
            index: Family::default(),
        }
    }
}

impl ReplicationMetrics {
    pub(crate) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "meshd_replication_lag_seconds",
            "From the primary's answer to its copy written here, per replicated kind (rounds that changed something)",
            self.lag.clone(),
        );
        registry.register(
            "meshd_replication_index",
            "The primary's index of the last copy written here, per replicated kind",
            self.index.clone(),
        );
    }
}

/// Names a kind in messages, paths and labels.
fn label(what: Replicated) -> &'static str {
    match what {
        Replicated::ConfigEntries => "config-entries",
        Replicated::Acl => "acl",
    }
}

fn slot(what: Replicated) -> usize {
    match what {
        Replicated::ConfigEntries => 0,
        Replicated::Acl => 1,
    }
}

/// What an answer of the primary says besides its rows.
struct Stamp {
    /// The replicated tables' index (`X-Consul-Index`).
    index: u64,
    /// The index of the primary's whole state the answer was read from.
    state_index: u64,
    /// When the primary answered, ms since the epoch.
    answered_at_ms: Option<u64>,
}

/// A secondary server's copies of the primary's data (see the module docs).
pub(crate) struct Replicator {
    fed: Arc<Federation>,
    store: Store,
    peer: Peer,
    /// ACLs are on here: the ACL system is replicated (and its writes sent to the primary).
    acl: bool,
    metrics: ReplicationMetrics,
    /// Per kind, the primary's state index of the copy written here: an older answer (the
    /// loop's, overtaken by a refresh after a write) is not written over a newer one.
    applied: tokio::sync::Mutex<[u64; 2]>,
}

impl Replicator {
    pub(crate) fn new(fed: Arc<Federation>, store: Store, peer: Peer, acl: bool, metrics: ReplicationMetrics) -> Self {
        Self {
            fed,
            store,
            peer,
            acl,
            metrics,
            applied: tokio::sync::Mutex::new([0; 2]),
        }
    }

    /// True when ACLs are replicated.
    pub(crate) fn acl(&self) -> bool {
        self.acl
    }

    /// Follows the primary's config entries, and its ACL system when ACLs are on, forever.
    pub(crate) async fn run(&self) {
        let acl = async {
            if self.acl {
                self.follow(Replicated::Acl).await;
            }
        };
        tokio::join!(self.follow(Replicated::ConfigEntries), acl);
    }

    /// Follows one kind: a round per link to a primary server, retried with back-off;
    /// failures logged once per outage and shown in the status.
    async fn follow(&self, what: Replicated) {
        let status = self.fed.replication(what);
        status.send_modify(|s| s.running = true);
        let (mut failures, mut failing, mut index) = (0u32, false, 0u64);
        loop {
            tokio::time::sleep(RETRY.delay(failures + 1)).await;
            let Err(e) = self.follow_once(what, &mut index).await;
            status.send_modify(|s| s.last_error = Some((SystemTime::now(), e.clone())));
            if !failing {
                warn!(primary = %self.fed.primary(), kind = label(what), error = %e, "cannot copy from the primary datacenter; retrying");
            }
            (failures, failing) = (failures.saturating_add(1), true);
        }
    }

    /// Follows `what` at the first primary server that answers, until it fails.
    async fn follow_once(&self, what: Replicated, index: &mut u64) -> Result<std::convert::Infallible, String> {
        let servers = self.fed.servers_known(self.fed.primary()).await;
        let mut last = format!(
            "no server of the primary datacenter {:?} is known yet",
            self.fed.primary()
        );
        for server in &servers {
            let mut linked = false;
            loop {
                let (op, stamp) = match self.fetch(server, what, Some(*index)).await {
                    Ok(answer) => answer,
                    Err(e) if linked => return Err(e),
                    Err(e) => {
                        last = e;
                        break;
                    }
                };
                linked = true;
                // An index that went backwards: the primary lost its state (a restart
                // without one); the copy starts over. One that did not move: the wait ran
                // out, nothing to write.
                let restarted = stamp.index < *index;
                if stamp.index == *index && *index != 0 {
                    continue;
                }
                let measure = *index != 0 && !restarted;
                *index = stamp.index;
                self.apply(what, op, &stamp, measure, restarted).await?;
            }
        }
        Err(last)
    }

    /// The primary's rows of `what` at `server` (with `after`, once they pass that index),
    /// as the write that makes the copy here equal.
    async fn fetch(&self, server: &str, what: Replicated, after: Option<u64>) -> Result<(Op, Stamp), String> {
        let path = format!("/v1/internal/replication/{}", label(what));
        let req = self.peer.get(server, &path, after);
        let asked = format!("copying the primary's {}", label(what));
        let (op, answer) = match what {
            Replicated::ConfigEntries => {
                let a = Peer::call::<Vec<ConfigEntry>>(server, req, &asked).await?;
                let stamp = stamp(&a);
                (Op::ReplicateConfig(a.value), stamp)
            }
            Replicated::Acl => {
                let a = Peer::call::<AclReplica>(server, req, &asked).await?;
                let stamp = stamp(&a);
                (Op::ReplicateAcl(Box::new(a.value)), stamp)
            }
        };
        Ok((op, answer))
    }

    /// Writes a copy (unless a newer one is here already), then notes it in the status and
    /// the metrics; `measure`: the copy followed a change in the primary, its lag counts.
    async fn apply(
        &self,
        what: Replicated,
        op: Op,
        stamp: &Stamp,
        measure: bool,
        restarted: bool,
    ) -> Result<(), String> {
        {
            let mut applied = self.applied.lock().await;
            let kept = &mut applied[slot(what)];
            if restarted {
                *kept = 0;
            }
            if stamp.state_index < *kept {
                return Ok(());
            }
            self.store
                .write(op)
                .await
                .map_err(|e| format!("writing the copy of the primary's {}: {e}", label(what)))?;
            *kept = stamp.state_index;
        }
        let now = SystemTime::now();
        let lag_ms = stamp.answered_at_ms.filter(|_| measure).map(|at| {
            let now_ms = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now_ms.saturating_sub(at)
        });
        let labels = vec![("kind", label(what))];
        if let Some(ms) = lag_ms {
            self.metrics.lag.get_or_create(&labels).observe(ms as f64 / 1000.0);
        }
        self.metrics
            .index
            .get_or_create(&labels)
            .set(i64::try_from(stamp.index).unwrap_or(i64::MAX));
        let status = self.fed.replication(what);
        let was_failing = status.borrow().last_error.is_some();
        status.send_modify(|s| {
            s.replicated_index = stamp.index;
            s.last_success = Some(now);
            s.last_error = None;
            if let Some(ms) = lag_ms {
                s.last_lag_ms = ms;
            }
        });
        if was_failing {
            info!(kind = label(what), "copying from the primary datacenter again");
        }
        Ok(())
    }

    /// Refreshes the copy of `what` from `server` now (after a write there).
    async fn refresh(&self, what: Replicated, server: &str) -> Result<(), String> {
        let (op, stamp) = self.fetch(server, what, None).await?;
        self.apply(what, op, &stamp, false, false).await
    }

    /// Serves a write of a replicated kind made here: a write of a local token is this
    /// datacenter's; anything else is relayed to a primary server (the next one when one
    /// cannot be reached), and the copy refreshed from it before its answer goes back.
    pub(crate) async fn write_in_primary(
        &self,
        what: Replicated,
        req: Request,
        max_body: usize,
        next: Next,
    ) -> Response {
        let mut out = match Outgoing::read(req, max_body).await {
            Ok(out) => out,
            Err(too_large) => return too_large,
        };
        if what == Replicated::Acl && self.local_token_write(&out) {
            return next.run(out.into_request()).await;
        }
        out.parts.uri = without_dc(&out.parts.uri);
        let primary = self.fed.primary();
        let mut last = format!("no server of the primary datacenter {primary:?} is known yet");
        for server in self.fed.servers_of(primary) {
            let mut relayed = out
                .to(&self.peer.client, &Peer::base(&server))
                .timeout(Duration::from_secs(30));
            if let Ok(v) = HeaderValue::from_str(self.fed.local()) {
                relayed = relayed.header(FORWARDED_DC, v);
            }
            let resp = match relayed.send().await {
                Ok(resp) => resp,
                Err(e) => {
                    last = format!("{server}: {e}");
                    continue;
                }
            };
            let written = resp.status().is_success();
            return match relay::answer(resp).await {
                Ok(answer) => {
                    if written && let Err(e) = self.refresh(what, &server).await {
                        warn!(kind = label(what), error = %e, "a write went to the primary; its copy here follows within the next round");
                    }
                    answer
                }
                // Not sent again elsewhere: it may have been applied.
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the primary datacenter's answer to this write broke off ({server}: {e}); it may have been applied"),
                )
                    .into_response(),
            };
        }
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "{} are written in the primary datacenter {primary:?}, which cannot be reached: {last}",
                match what {
                    Replicated::ConfigEntries => "config entries and intentions",
                    Replicated::Acl => "ACL policies, roles and global tokens",
                }
            ),
        )
            .into_response()
    }

    /// True for a write of a token local to this datacenter: one that exists here as local
    /// (update, delete, clone by accessor id), or a create whose body says `Local: true`.
    fn local_token_write(&self, out: &Outgoing) -> bool {
        let Some(rest) = out.parts.uri.path().strip_prefix("/v1/acl/token") else {
            return false;
        };
        let id = rest.trim_start_matches('/').split('/').next().unwrap_or_default();
        if !id.is_empty()
            && let Some(token) = self.store.read().acl_token(id)
        {
            return token.local;
        }
        serde_json::from_slice::<serde_json::Value>(&out.body)
            .is_ok_and(|b| b["Local"] == serde_json::Value::Bool(true))
    }
}

fn stamp<T>(a: &Answered<T>) -> Stamp {
    Stamp {
        index: a.index,
        state_index: a.number(http_api::replication::STATE_INDEX).unwrap_or(a.index),
        answered_at_ms: a.number(http_api::replication::ANSWERED_AT),
    }
}

/// The kind a request writes when it is a write the primary holds, on a secondary: config
/// entries and intentions; with ACLs (`acl`), bootstrap, policies, roles and tokens.
pub(crate) fn replicated_write(req: &Request, acl: bool) -> Option<Replicated> {
    if !matches!(
        *req.method(),
        Method::PUT | Method::POST | Method::DELETE | Method::PATCH
    ) {
        return None;
    }
    let path = req.uri().path();
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|r| r.is_empty() || r.starts_with('/'))
    };
    if under("/v1/config") || under("/v1/connect/intentions") {
        return Some(Replicated::ConfigEntries);
    }
    let acl_write =
        under("/v1/acl/bootstrap") || under("/v1/acl/policy") || under("/v1/acl/role") || under("/v1/acl/token");
    (acl && acl_write).then_some(Replicated::Acl)
}

/// `uri` without its `dc` parameter: the primary serves the write as its own.
fn without_dc(uri: &Uri) -> Uri {
    let Some(query) = uri.query() else {
        return uri.clone();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("dc"))
        .collect();
    let path = uri.path();
    let rebuilt = if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    rebuilt.parse().unwrap_or_else(|_| uri.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str) -> Request {
        Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap_or_default()
    }

    #[test]
    fn writes_of_replicated_kinds_are_recognised() {
        let cases = [
            (Method::PUT, "/v1/config", true, Some(Replicated::ConfigEntries)),
            (
                Method::DELETE,
                "/v1/config/service-defaults/web",
                true,
                Some(Replicated::ConfigEntries),
            ),
            (
                Method::POST,
                "/v1/connect/intentions",
                false,
                Some(Replicated::ConfigEntries),
            ),
            (
                Method::PUT,
                "/v1/connect/intentions/exact?source=a&destination=b",
                false,
                Some(Replicated::ConfigEntries),
            ),
            (Method::GET, "/v1/config/proxy-defaults/global", true, None),
            (Method::PUT, "/v1/configuration", true, None),
            (Method::PUT, "/v1/acl/policy", true, Some(Replicated::Acl)),
            (Method::PUT, "/v1/acl/token/abc/clone", true, Some(Replicated::Acl)),
            (Method::PUT, "/v1/acl/bootstrap", true, Some(Replicated::Acl)),
            (Method::PUT, "/v1/acl/policy", false, None),
            (Method::PUT, "/v1/acl/login", true, None),
            (Method::PUT, "/v1/catalog/register", true, None),
        ];
        for (method, path, acl, want) in cases {
            assert_eq!(
                replicated_write(&req(method.clone(), path), acl),
                want,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn the_dc_parameter_is_dropped_and_the_others_kept() {
        let uri: Uri = "/v1/config?dc=dc2&cas=4".parse().unwrap_or_default();
        assert_eq!(without_dc(&uri).to_string(), "/v1/config?cas=4");
        let uri: Uri = "/v1/config?dc=dc2".parse().unwrap_or_default();
        assert_eq!(without_dc(&uri).to_string(), "/v1/config");
        let uri: Uri = "/v1/connect/intentions/exact?source=a&destination=b"
            .parse()
            .unwrap_or_default();
        assert_eq!(without_dc(&uri), uri);
    }
}
