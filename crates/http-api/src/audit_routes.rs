//! `GET /v1/internal/audit`: the audit log's kept records (see `audit.rs`).

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use structs::audit::AuditRecord;

/// `GET /v1/internal/audit` (`operator:read`): the kept records, oldest first, filtered by
/// `?since=` / `?until=` (RFC 3339), `?kind=`, `?accessor=`, `?accepted=`, `?min_seq=`,
/// at most `?limit=` (the newest ones), blocking on the log's index.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let params = Params::parse(q.as_deref());
    let filter = Filter::parse(&params)?;
    let key = IndexKey::Audit;
    let state = api.read(&params, &key).await?;
    let mut records: Vec<&AuditRecord> = state
        .audit_records()
        .map(|r| &**r)
        .filter(|r| filter.admits(r))
        .collect();
    if let Some(limit) = filter.limit {
        records.drain(..records.len().saturating_sub(limit));
    }
    Ok(query::json(&records, Some(state.index_of(&key)), params.pretty()))
}

/// The filters of a listing.
struct Filter {
    since_ms: Option<u64>,
    until_ms: Option<u64>,
    kind: Option<String>,
    accessor: Option<String>,
    accepted: Option<bool>,
    min_seq: u64,
    limit: Option<usize>,
}

impl Filter {
    fn parse(params: &Params) -> Result<Self, ApiError> {
        let time = |name: &str| -> Result<Option<u64>, ApiError> {
            params
                .get(name)
                .map(|text| {
                    structs::audit::parse_time_ms(text)
                        .ok_or_else(|| ApiError::BadRequest(format!("{name}: {text:?} is not an RFC 3339 time")))
                })
                .transpose()
        };
        let accepted = match params.get("accepted") {
            None => None,
            Some(_) => Some(params.bool("accepted")?),
        };
        Ok(Self {
            since_ms: time("since")?,
            until_ms: time("until")?,
            kind: params.get("kind").map(str::to_owned),
            accessor: params.get("accessor").map(str::to_owned),
            accepted,
            min_seq: params.u64("min_seq")?.unwrap_or(0),
            limit: params.u64("limit")?.map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
        })
    }

    fn admits(&self, r: &AuditRecord) -> bool {
        let ms = r.time_ms();
        r.seq >= self.min_seq
            && self.since_ms.is_none_or(|s| ms >= s)
            && self.until_ms.is_none_or(|u| ms <= u)
            && self.kind.as_ref().is_none_or(|k| *k == r.kind)
            && self.accessor.as_ref().is_none_or(|a| *a == r.accessor_id)
            && self.accepted.is_none_or(|a| a == r.accepted)
    }
}
