//! Planning a transaction (`PUT /v1/txn`): each operation is planned on the state the ones
//! before it left, and the transaction's changes are theirs in order, committed as one
//! write; the first operation that fails rolls it all back, naming its position.

use crate::error::WriteError;
use crate::kv_ops;
use crate::op::Op;
use crate::plan::Plan;
use crate::session_ops;
use crate::state::{Change, State};
use std::time::SystemTime;
use structs::txn::{CheckOp, KvOp, MAX_OPS, NodeOp, ServiceOp, TxnError, TxnOp};
use structs::{DeregisterRequest, Index, KvEntry, RegisterRequest};

/// The transaction's changes, or why it was rolled back.
/// Planning of one catalog write (`ops::plan`, passed in: this module is called from it).
pub(crate) type PlanOne<'a> = &'a dyn Fn(&Op, &State) -> Result<Plan, WriteError>;

pub(crate) fn plan_txn(ops: &[TxnOp], state: &State, now: SystemTime, plan: PlanOne<'_>) -> Result<Plan, WriteError> {
    if ops.len() > MAX_OPS {
        return Err(WriteError::Txn(vec![TxnError {
            op_index: MAX_OPS,
            what: format!("{} operations: a transaction holds at most {MAX_OPS}", ops.len()),
        }]));
    }
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut scratch = state.clone();
    let mut changes = Vec::new();
    for (op_index, op) in ops.iter().enumerate() {
        let planned = match op {
            TxnOp::Kv(op) => kv(op, &scratch, now_ms),
            TxnOp::Node(op) => node(op, &scratch, plan),
            TxnOp::Service(op) => service(op, &scratch, plan),
            TxnOp::Check(op) => check(op, &scratch, plan),
        };
        let planned = planned.map_err(|what| WriteError::Txn(vec![TxnError { op_index, what }]))?;
        if !planned.is_empty() {
            let index = scratch.index.next();
            scratch.apply(index, &planned);
        }
        changes.extend(planned);
    }
    Ok(Plan::write(changes))
}

/// A sub-plan's changes, or its refusal (a failed check-and-set) or error as text.
fn applied(planned: Result<Plan, WriteError>, refused: impl FnOnce() -> String) -> Result<Vec<Change>, String> {
    match planned {
        Ok(plan) if plan.applied => Ok(plan.changes),
        Ok(_) => Err(refused()),
        Err(e) => Err(e.to_string()),
    }
}

fn kv(op: &KvOp, state: &State, now_ms: u64) -> Result<Vec<Change>, String> {
    let key = op.key.as_str();
    let entry = || KvEntry {
        key: key.to_owned(),
        value: op.value.clone(),
        flags: op.flags,
        ..KvEntry::default()
    };
    let existing = state.kv_get(key);
    let missing = || format!("key {key:?} doesn't exist");
    match op.verb.as_str() {
        "set" => applied(kv_ops::plan_set(state, key, &op.value, op.flags, None), String::new),
        "cas" => applied(
            kv_ops::plan_set(state, key, &op.value, op.flags, Some(Index(op.index))),
            || format!("failed to set key {key:?}, index is stale"),
        ),
        "lock" => applied(session_ops::plan_lock(state, entry(), &op.session, now_ms), || {
            format!("failed to lock key {key:?}, lock wasn't acquired")
        }),
        "unlock" => applied(Ok(session_ops::plan_unlock(state, entry(), &op.session)), || {
            format!("failed to unlock key {key:?}, lock isn't held, or is held by another session")
        }),
        "get" => existing.map(|_| Vec::new()).ok_or_else(missing),
        "get-tree" => Ok(Vec::new()),
        "check-index" => match existing {
            Some(e) if e.modify_index == Index(op.index) => Ok(Vec::new()),
            Some(e) => Err(format!("current modify index {} != {}", e.modify_index, op.index)),
            None => Err(missing()),
        },
        "check-session" => match existing {
            Some(e) if e.session == op.session => Ok(Vec::new()),
            Some(e) => Err(format!("current session {:?} != {:?}", e.session, op.session)),
            None => Err(missing()),
        },
        "check-not-exists" => match existing {
            Some(_) => Err(format!("key {key:?} exists")),
            None => Ok(Vec::new()),
        },
        "delete" => applied(kv_ops::plan_delete(state, key, None), String::new),
        "delete-tree" => Ok(kv_ops::plan_delete_tree(state, key).changes),
        "delete-cas" => applied(kv_ops::plan_delete(state, key, Some(Index(op.index))), || {
            format!("failed to delete key {key:?}, index is stale")
        }),
        other => Err(format!("unknown KV verb {other:?}")),
    }
}

/// The verbs every catalog object takes: `current` is the object's modify index (`None`:
/// absent), `index` the one a cas verb names.
fn catalog_verb(
    verb: &str,
    what: &str,
    current: Option<Index>,
    index: Index,
    set: impl FnOnce() -> Result<Plan, WriteError>,
    delete: impl FnOnce() -> Result<Plan, WriteError>,
) -> Result<Vec<Change>, String> {
    let stale = || format!("failed to {verb} {what}, index is stale");
    match verb {
        "get" => current
            .map(|_| Vec::new())
            .ok_or_else(|| format!("{what} doesn't exist")),
        "set" => applied(set(), String::new),
        "cas" if current.unwrap_or_default() != index => Err(stale()),
        "cas" => applied(set(), String::new),
        "delete" => applied(delete(), String::new),
        "delete-cas" if current.is_none_or(|c| c != index) => Err(stale()),
        "delete-cas" => applied(delete(), String::new),
        other => Err(format!("unknown verb {other:?} for {what}")),
    }
}

fn node(op: &NodeOp, state: &State, plan: PlanOne<'_>) -> Result<Vec<Change>, String> {
    let n = &op.node;
    let current = state.node(&n.node).map(|e| e.modify_index);
    let register = RegisterRequest {
        id: n.id.clone(),
        node: n.node.clone(),
        address: n.address.clone(),
        datacenter: n.datacenter.clone(),
        tagged_addresses: n.tagged_addresses.clone(),
        node_meta: n.meta.clone(),
        ..RegisterRequest::default()
    };
    let deregister = DeregisterRequest {
        node: n.node.clone(),
        ..DeregisterRequest::default()
    };
    catalog_verb(
        &op.verb,
        &format!("node {:?}", n.node),
        current,
        n.modify_index,
        || plan(&Op::Register(Box::new(register)), state),
        || plan(&Op::Deregister(deregister), state),
    )
}

fn service(op: &ServiceOp, state: &State, plan: PlanOne<'_>) -> Result<Vec<Change>, String> {
    if op.verb != "get" && state.node(&op.node).is_none() {
        return Err(format!("node {:?} doesn't exist", op.node));
    }
    let current = state.service(&op.node, &op.service.id).map(|s| s.modify_index);
    let register = RegisterRequest {
        node: op.node.clone(),
        service: Some(op.service.clone()),
        skip_node_update: true,
        ..RegisterRequest::default()
    };
    let deregister = DeregisterRequest {
        node: op.node.clone(),
        service_id: op.service.id.clone(),
        ..DeregisterRequest::default()
    };
    catalog_verb(
        &op.verb,
        &format!("service {:?} on node {:?}", op.service.id, op.node),
        current,
        op.service.modify_index,
        || plan(&Op::Register(Box::new(register)), state),
        || plan(&Op::Deregister(deregister), state),
    )
}

fn check(op: &CheckOp, state: &State, plan: PlanOne<'_>) -> Result<Vec<Change>, String> {
    let c = &op.check;
    if op.verb != "get" && state.node(&c.node).is_none() {
        return Err(format!("node {:?} doesn't exist", c.node));
    }
    let current = state.check(&c.node, &c.check_id).map(|e| e.modify_index);
    let register = RegisterRequest {
        node: c.node.clone(),
        check: Some(c.clone()),
        skip_node_update: true,
        ..RegisterRequest::default()
    };
    let deregister = DeregisterRequest {
        node: c.node.clone(),
        check_id: c.check_id.clone(),
        ..DeregisterRequest::default()
    };
    catalog_verb(
        &op.verb,
        &format!("check {:?} on node {:?}", c.check_id, c.node),
        current,
        c.modify_index,
        || plan(&Op::Register(Box::new(register)), state),
        || plan(&Op::Deregister(deregister), state),
    )
}
