//! Dry runs of config writes (`PUT /v1/config?dry-run`, `DELETE /v1/config/:kind/:name?dry-run`,
//! `docs/dry-run.md`): the write is planned exactly as it would be — the same checks, the same
//! 400 — on a copy of the current state, nothing is stored, and the answer lists the proxies
//! whose resources would change and how, as the server's [`DryRun`] finds them.

use crate::ApiError;
use catalog::{Op, State, Store};
use http_kit::Params;
use serde::Serialize;
use std::sync::Arc;

/// Which part of the answer's proxies to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DryRunPage {
    /// 1-based.
    pub page: usize,
    /// Proxies per page.
    pub per_page: usize,
    /// Fields listed per changed resource at most.
    pub max_fields: usize,
}

/// Whether the caller may see a proxy, by its service and node: a dry run lists only the
/// proxies the caller's token may read (the others are counted as hidden).
pub type MayRead = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The proxies a change would reach, as the server knows them.
#[async_trait::async_trait]
pub trait DryRun: Send + Sync {
    /// The proxies whose resources would change from `before` to `after`, among those
    /// `may_read` admits.
    async fn proxies(
        &self,
        before: Arc<State>,
        after: Arc<State>,
        page: DryRunPage,
        may_read: MayRead,
    ) -> DryRunProxies;
}

/// The proxies part of a dry run's answer.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DryRunProxies {
    /// The proxies considered: those this server serves (a proxy served by an agent, or by
    /// another server of an etcd cluster, is not among them).
    pub served_here: usize,
    /// The proxies registered in the catalog that this server does not serve (served by
    /// agents, by other servers, or not connected): not simulated, counted so that a short
    /// answer is not read as the whole mesh's.
    pub served_elsewhere: usize,
    /// Proxies whose resources would change.
    pub total: usize,
    /// This page's.
    pub items: Vec<serde_json::Value>,
    /// Proxies whose resources would not change.
    pub unaffected: usize,
    /// Proxies some part of which could not be simulated (each with why), at most 100.
    pub not_simulated: Vec<serde_json::Value>,
    /// How many such proxies there are in all.
    pub not_simulated_total: usize,
    /// Proxies left out because the token may not read them (`service:read` on the proxy's
    /// service and `node:read` on its node).
    pub hidden_by_acls: usize,
}

/// A dry run's answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    dry_run: bool,
    /// The index the write was planned at (nothing was written: it is still the current one).
    index: u64,
    /// Whether the catalog would change at all.
    changes_catalog: bool,
    page: usize,
    per_page: usize,
    /// `None` when this server cannot say which proxies (no proxy is served here).
    proxies: Option<DryRunProxies>,
}

/// The page a dry run's query asks for.
pub(crate) fn page(params: &Params) -> Result<DryRunPage, ApiError> {
    let number = |name: &str, default: u64, max: u64| -> Result<usize, ApiError> {
        let n = params.u64(name)?.unwrap_or(default);
        if n == 0 || n > max {
            return Err(ApiError::BadRequest(format!("{name}: {n} is out of range 1..={max}")));
        }
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    };
    Ok(DryRunPage {
        page: number("page", 1, u64::from(u32::MAX))?,
        per_page: number("per-page", 100, 1000)?,
        max_fields: number("max-fields", 20, 1000)?,
    })
}

/// Answers a dry run of `op`: the write's own error if it would be refused; else what it
/// would change.
pub(crate) async fn answer(
    store: &Store,
    dry_run: Option<&Arc<dyn DryRun>>,
    authz: &crate::authz::Authz,
    op: &Op,
    params: &Params,
) -> Result<axum::response::Response, ApiError> {
    let page = page(params)?;
    let (before, after) = store.dry_run(op)?;
    let changes_catalog = !same_rows(&before, &after);
    let a = authz.get()?.clone();
    let may_read: MayRead = Arc::new(move |service, node| a.service_read(service) && a.node_read(node));
    let proxies = match dry_run {
        Some(d) if changes_catalog => Some(d.proxies(Arc::clone(&before), after, page, may_read).await),
        Some(_) => Some(DryRunProxies::default()),
        None => None,
    };
    let answer = Answer {
        dry_run: true,
        index: before.index.0,
        changes_catalog,
        page: page.page,
        per_page: page.per_page,
        proxies,
    };
    let hidden = answer.proxies.as_ref().is_some_and(|p| p.hidden_by_acls > 0);
    let resp = crate::query::json(&answer, Some(before.index), params.pretty());
    Ok(crate::authz::mark_filtered(resp, hidden))
}

/// Whether a planned write left every row as it was (`Store::dry_run` applies nothing then).
fn same_rows(before: &State, after: &State) -> bool {
    before.index == after.index
}
