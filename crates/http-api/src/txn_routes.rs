//! `PUT /v1/txn`: operations on KV keys, nodes, services and checks, applied all or none,
//! with Consul's answers: 200 and each operation's result, or 409 and the operation that
//! rolled it back. Each operation needs what its own endpoint needs.

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use catalog::{Op, WriteError};
use structs::txn::{MAX_OPS, TxnOp, TxnResponse, TxnResult};

pub(crate) async fn txn(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let ops: Vec<TxnOp> = query::decode(&body, "a list of operations")?;
    if ops.len() > MAX_OPS {
        return Err(ApiError::TooLarge(format!(
            "Transaction contains too many operations ({} > {MAX_OPS})",
            ops.len()
        )));
    }
    let before = api.store.read();
    for op in &ops {
        authorize(&authz, op)?;
        // An instance the operation overwrites or deletes needs the same right on the
        // service it is now.
        if let TxnOp::Service(s) = op
            && let Some(existing) = before.service(&s.node, &s.service.id)
            && !op.reads_only()
        {
            authz.need(
                |a| a.service_write(&existing.service),
                "service:write",
                &existing.service,
            )?;
        }
    }
    drop(before);
    match api.store.write(Op::Txn(ops.clone())).await {
        Ok(_) => {}
        Err(WriteError::Txn(errors)) => {
            let answer = TxnResponse {
                results: None,
                errors: Some(errors),
            };
            let mut resp = query::json(&answer, None, params.pretty());
            *resp.status_mut() = StatusCode::CONFLICT;
            return Ok(resp);
        }
        Err(e) => return Err(e.into()),
    }
    let state = api.store.read();
    let a = authz.get()?;
    let results = ops
        .iter()
        .flat_map(|op| results(&state, op))
        .filter(|r| match r {
            TxnResult::Kv(e) => a.key_read(&e.key),
            _ => true,
        })
        .collect();
    let answer = TxnResponse {
        results: Some(results),
        errors: None,
    };
    Ok(query::json(&answer, Some(state.index), params.pretty()).into_response())
}

/// What each operation needs, as its own endpoint: `key:read`/`key:write` (a tree delete:
/// on everything under the prefix), `node:write`, `service:write`, and `node:read` or
/// `service:read` for gets. A `get-tree` needs a valid token; its results are filtered.
fn authorize(authz: &Authz, op: &TxnOp) -> Result<(), ApiError> {
    let reads = op.reads_only();
    match op {
        TxnOp::Kv(kv) if kv.verb == "delete-tree" => authz.need(|a| a.key_write_prefix(&kv.key), "key:write", &kv.key),
        // Its results are filtered by `key:read` on each key instead.
        TxnOp::Kv(kv) if kv.verb == "get-tree" => authz.get().map(|_| ()),
        TxnOp::Kv(kv) if reads => authz.need(|a| a.key_read(&kv.key), "key:read", &kv.key),
        TxnOp::Kv(kv) => authz.need(|a| a.key_write(&kv.key), "key:write", &kv.key),
        TxnOp::Node(n) if reads => authz.need(|a| a.node_read(&n.node.node), "node:read", &n.node.node),
        TxnOp::Node(n) => authz.need(|a| a.node_write(&n.node.node), "node:write", &n.node.node),
        TxnOp::Service(s) if reads => authz.need(
            |a| a.service_read(&s.service.service),
            "service:read",
            &s.service.service,
        ),
        TxnOp::Service(s) => authz.need(
            |a| a.service_write(&s.service.service),
            "service:write",
            &s.service.service,
        ),
        TxnOp::Check(c) if reads => authz.need(|a| a.node_read(&c.check.node), "node:read", &c.check.node),
        TxnOp::Check(c) => authz.need(|a| a.node_write(&c.check.node), "node:write", &c.check.node),
    }
}

/// An applied operation's results, read from the state it left: a KV entry carries its
/// value only for `get` and `get-tree` (as Consul blanks it elsewhere); deletes and
/// `check-not-exists` give none.
fn results(state: &catalog::State, op: &TxnOp) -> Vec<TxnResult> {
    match op {
        TxnOp::Kv(kv) => match kv.verb.as_str() {
            "delete" | "delete-tree" | "delete-cas" | "check-not-exists" => Vec::new(),
            "get-tree" => state.kv_range(&kv.key).map(|e| TxnResult::Kv((**e).clone())).collect(),
            verb => state
                .kv_get(&kv.key)
                .map(|e| {
                    let mut e = (*e).clone();
                    if verb != "get" {
                        e.value.clear();
                    }
                    TxnResult::Kv(e)
                })
                .into_iter()
                .collect(),
        },
        _ if matches!(verb_of(op), "delete" | "delete-cas") => Vec::new(),
        TxnOp::Node(n) => state
            .node(&n.node.node)
            .map(|n| TxnResult::Node((*n).clone()))
            .into_iter()
            .collect(),
        TxnOp::Service(s) => state
            .service(&s.node, &s.service.id)
            .map(|s| TxnResult::Service((*s).clone()))
            .into_iter()
            .collect(),
        TxnOp::Check(c) => state
            .check(&c.check.node, &c.check.check_id)
            .map(|c| TxnResult::Check((*c).clone()))
            .into_iter()
            .collect(),
    }
}

fn verb_of(op: &TxnOp) -> &str {
    match op {
        TxnOp::Kv(o) => &o.verb,
        TxnOp::Node(o) => &o.verb,
        TxnOp::Service(o) => &o.verb,
        TxnOp::Check(o) => &o.verb,
    }
}
