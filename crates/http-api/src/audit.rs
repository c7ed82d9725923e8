//! The audit log (`docs/audit.md`): every write request the server accepts is recorded in
//! the catalog with the write itself (at its index, in the same commit: see
//! [`catalog::audit`]), and every one it refuses afterwards with the reason; each record is
//! also appended to the audit file when one is set. `GET /v1/internal/audit` lists them.
//!
//! A record holds the time, the token's accessor id (never its secret), the remote address,
//! the method, path and query (without `?token=`), the body with its secrets redacted
//! ([`structs::audit::redact`]; a KV value or a snapshot only as its size), the status and,
//! when refused, why.

use crate::ApiError;
use crate::HttpMetrics;
use crate::authz::Authz;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::Method;
use axum::response::Response;
use catalog::audit::{AuditOutcome, AuditScope};
use catalog::{Op, Store};
use std::net::SocketAddr;
use std::sync::Arc;
use structs::audit::AuditRecord;

mod file;

pub use file::AuditFile;

/// The largest JSON body a record keeps whole; a larger one is recorded by its size.
const MAX_RECORDED_BODY: usize = 64 * 1024;
/// How much of a refusal's answer its record keeps as the reason.
const MAX_REASON: usize = 1024;

/// What a write request to `path` writes, or `None` when it is not audited (reads, and the
/// non-GET requests that write nothing: `/v1/agent/connect/authorize`, heartbeats, CSRs).
fn kind(method: &Method, path: &str) -> Option<&'static str> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let kinds: [(&str, &'static str); 14] = [
        ("/v1/catalog/", "catalog"),
        ("/v1/config", "config"),
        ("/v1/connect/intentions", "intention"),
        ("/v1/connect/ca/", "ca"),
        ("/v1/internal/ca/", "ca"),
        ("/v1/acl/", "acl"),
        ("/v1/kv/", "kv"),
        ("/v1/session/", "session"),
        ("/v1/query", "query"),
        ("/v1/event/", "event"),
        ("/v1/txn", "txn"),
        ("/v1/snapshot", "snapshot"),
        ("/v1/operator/", "operator"),
        ("/v1/agent/", "agent"),
    ];
    if path == "/v1/agent/connect/authorize" {
        return None;
    }
    kinds
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .map(|(_, k)| *k)
}

/// What a record keeps of a body: JSON with its secrets redacted; a KV value, a snapshot
/// or anything that is not JSON only as its size.
fn recorded_body(kind: &str, body: &[u8]) -> Option<serde_json::Value> {
    if body.is_empty() {
        return None;
    }
    let size = || Some(serde_json::json!({ "Bytes": body.len() }));
    if matches!(kind, "kv" | "snapshot") || body.len() > MAX_RECORDED_BODY {
        return size();
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(mut value) => {
            structs::audit::redact(&mut value);
            Some(value)
        }
        Err(_) => size(),
    }
}

/// What auditing needs of the API.
pub(crate) struct Auditor {
    pub(crate) store: Store,
    /// Off: nothing is audited.
    pub(crate) enabled: bool,
    /// The server's node name (each record's `Server`).
    pub(crate) server: String,
    pub(crate) max_body: usize,
    pub(crate) file: Option<AuditFile>,
    pub(crate) metrics: Arc<HttpMetrics>,
}

/// Runs a request that the ACL middleware resolved: a write request is audited (see the
/// module's docs); anything else is passed to `next` untouched.
pub(crate) async fn audited<F, Fut>(api: &Auditor, req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    // A dry run writes nothing, whatever its method (its query is read only for a write).
    let audited = kind(req.method(), req.uri().path())
        .filter(|_| api.enabled && !http_kit::Params::parse(req.uri().query()).has("dry-run"));
    let Some(kind) = audited else {
        return next(req).await;
    };
    let (parts, body) = req.into_parts();
    let mut record = AuditRecord {
        time: structs::audit::format_time(std::time::SystemTime::now()),
        kind: kind.to_owned(),
        accessor_id: parts
            .extensions
            .get::<Authz>()
            .and_then(|a| a.accessor().ok().map(str::to_owned))
            .unwrap_or_default(),
        remote_addr: parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.to_string())
            .unwrap_or_default(),
        server: api.server.clone(),
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: structs::audit::redact_query(parts.uri.query().unwrap_or_default()),
        // As committed with the write; a refusal says otherwise.
        accepted: true,
        status: 200,
        ..AuditRecord::default()
    };
    // A snapshot archive is larger than any other body, and read by its handler under its
    // own limit: it is recorded by its declared size only.
    let body = if kind == "snapshot" {
        record.body = content_length(&parts.headers).map(|n| serde_json::json!({ "Bytes": n }));
        body
    } else {
        match axum::body::to_bytes(body, api.max_body).await {
            Ok(bytes) => {
                record.body = recorded_body(kind, &bytes);
                Body::from(bytes)
            }
            Err(e) => return refused(api, record, body_refusal(&e, api.max_body)).await,
        }
    };
    let scope = AuditScope::new(record);
    let resp = scope.run(next(Request::from_parts(parts, body))).await;
    match scope.outcome() {
        AuditOutcome::Recorded { seq, index } => {
            let mut record = scope.record().clone();
            (record.seq, record.index, record.accepted, record.status) = (seq, index, true, resp.status().as_u16());
            append_to_file(api, record).await;
            resp
        }
        AuditOutcome::Unchanged { applied: false } if resp.status().is_success() => {
            let mut record = scope.record().clone();
            record.error = "check-and-set did not match: nothing written".into();
            record.status = resp.status().as_u16();
            record_refusal(api, record).await;
            resp
        }
        _ if resp.status().is_client_error() || resp.status().is_server_error() => {
            refused(api, scope.record().clone(), resp).await
        }
        // Nothing written, nothing refused: a write that changed nothing.
        _ => resp,
    }
}

fn content_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The answer to a body that could not be read: too large (413 naming the limit) or cut
/// off or late (400 saying why).
fn body_refusal(e: &axum::Error, limit: usize) -> Response {
    use axum::response::IntoResponse as _;
    let too_large = std::error::Error::source(e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
    if too_large {
        (axum::http::StatusCode::PAYLOAD_TOO_LARGE, http_kit::too_large(limit)).into_response()
    } else {
        ApiError::BadRequest(format!("reading the request body failed: {e}")).into_response()
    }
}

/// Records `resp`, a refusal of the request `record` describes, with its reason, then
/// answers it.
async fn refused(api: &Auditor, mut record: AuditRecord, resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    // Refusals are short plain text; a longer answer is kept whole for the client.
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    record.status = parts.status.as_u16();
    let reason = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_REASON)])
        .trim()
        .to_owned();
    record.error = if reason.is_empty() {
        parts.status.canonical_reason().unwrap_or("refused").to_owned()
    } else {
        reason
    };
    record_refusal(api, record).await;
    Response::from_parts(parts, Body::from(bytes))
}

/// Commits the record of a refused write, then appends it to the file. A failure to record
/// is logged: the refusal is answered all the same. A write the server failed to make (a 5xx:
/// the catalog could not commit it) is not recorded in the catalog, whose write would wait on
/// the same failure before the answer: its record goes to the file (`Seq` 0) and the log.
async fn record_refusal(api: &Auditor, mut record: AuditRecord) {
    record.accepted = false;
    if record.status >= 500 {
        tracing::warn!(
            accessor = %record.accessor_id,
            method = %record.method,
            path = %record.path,
            error = %record.error,
            "a write failed; its audit record is kept in the audit file and this log only"
        );
        append_to_file(api, record).await;
        return;
    }
    let scope = AuditScope::new(record);
    let written = scope.run(api.store.write(Op::AuditOnly)).await;
    match (written, scope.outcome()) {
        (Ok(_), AuditOutcome::Recorded { seq, index }) => {
            let mut record = scope.record().clone();
            (record.seq, record.index) = (seq, index);
            append_to_file(api, record).await;
        }
        (Err(e), _) => {
            api.metrics.audit_failed();
            tracing::warn!(error = %e, path = %scope.record().path, "a refused write could not be audited");
        }
        _ => {}
    }
}

async fn append_to_file(api: &Auditor, record: AuditRecord) {
    if let Some(file) = &api.file
        && let Err(e) = file.append(record).await
    {
        api.metrics.audit_failed();
        tracing::warn!(error = %e, "the audit file could not be written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_audited_reads_and_non_writes_are_not() {
        assert_eq!(kind(&Method::PUT, "/v1/config"), Some("config"));
        assert_eq!(kind(&Method::DELETE, "/v1/acl/token/x"), Some("acl"));
        assert_eq!(kind(&Method::PUT, "/v1/agent/service/register"), Some("agent"));
        assert_eq!(kind(&Method::GET, "/v1/config/service-defaults/a"), None);
        assert_eq!(kind(&Method::POST, "/v1/agent/connect/authorize"), None);
        assert_eq!(kind(&Method::PUT, "/v1/internal/node/heartbeat"), None);
    }

    #[test]
    fn bodies_keep_no_secret_and_kv_values_only_their_size() {
        let token = br#"{"SecretID":"6a1e","Description":"ci","Policies":[{"Name":"p"}]}"#;
        let kept = recorded_body("acl", token).unwrap().to_string();
        assert!(!kept.contains("6a1e") && kept.contains("ci"), "{kept}");
        assert_eq!(
            recorded_body("kv", br#"{"a":1}"#),
            Some(serde_json::json!({"Bytes": 7}))
        );
        assert_eq!(
            recorded_body("catalog", b"not json"),
            Some(serde_json::json!({"Bytes": 8}))
        );
        assert_eq!(recorded_body("catalog", b""), None);
    }
}
