//! Several datacenters: what this server knows of the others (their federation states:
//! servers and mesh gateways), and the endpoints over it.
//!
//! The primary datacenter's servers hold every datacenter's state; each secondary's servers
//! send theirs to the primary (`PUT /v1/internal/federation-state`) and keep a copy of the
//! primary's list (a blocking `GET /v1/internal/federation-states`), so every server knows
//! every datacenter. The states are soft: held in memory and sent again by their datacenter
//! whenever they change and whenever its link to the primary is made again (a primary that
//! restarted hears from every secondary within its next retry). The loop that sends and
//! copies them is the server's (`server-mode`).

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use structs::federation::FederationState;
use tokio::sync::watch;

/// Every datacenter's state this server knows, with an index that grows on each change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FederationStates {
    /// Grows by one with each change (blocking queries wait on it).
    pub index: u64,
    /// By datacenter.
    pub by_dc: BTreeMap<String, Arc<FederationState>>,
}

/// This server's view of the federation.
#[derive(Debug)]
pub struct Federation {
    local: String,
    primary: String,
    states: watch::Sender<Arc<FederationStates>>,
    /// Set when the server drains: waiting queries answer at once.
    released: watch::Sender<bool>,
}

impl Federation {
    /// A server of datacenter `local` whose primary datacenter is `primary`.
    pub fn new(local: &str, primary: &str) -> Arc<Self> {
        Arc::new(Self {
            local: local.to_owned(),
            primary: primary.to_owned(),
            states: watch::Sender::new(Arc::default()),
            released: watch::Sender::new(false),
        })
    }

    /// Answers every waiting query now, and later ones at once (the server is draining).
    pub fn release_waiters(&self) {
        self.released.send_replace(true);
    }

    /// This server's datacenter.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The primary datacenter.
    pub fn primary(&self) -> &str {
        &self.primary
    }

    /// True on a server of the primary datacenter.
    pub fn is_primary(&self) -> bool {
        self.local == self.primary
    }

    /// The states now.
    pub fn states(&self) -> Arc<FederationStates> {
        Arc::clone(&self.states.borrow())
    }

    /// Follows the states.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FederationStates>> {
        self.states.subscribe()
    }

    /// Every known datacenter: this one first, then the others by name (Consul's order is
    /// by round-trip time, which meshd does not measure).
    pub fn datacenters(&self) -> Vec<String> {
        let states = self.states();
        let mut out = vec![self.local.clone()];
        out.extend(states.by_dc.keys().filter(|dc| **dc != self.local).cloned());
        out
    }

    /// The HTTP addresses of `dc`'s servers (none: an unknown datacenter).
    pub fn servers_of(&self, dc: &str) -> Vec<String> {
        self.states()
            .by_dc
            .get(dc)
            .map(|s| s.servers.clone())
            .unwrap_or_default()
    }

    /// Sets one datacenter's state; false when it changed nothing (its time aside).
    pub fn put(&self, state: FederationState) -> bool {
        self.states.send_if_modified(|states| {
            if states.by_dc.get(&state.datacenter).is_some_and(|s| s.same_as(&state)) {
                return false;
            }
            let next = Arc::make_mut(states);
            next.index += 1;
            next.by_dc.insert(state.datacenter.clone(), Arc::new(state));
            true
        })
    }

    /// Takes the primary's list (on a secondary), keeping this datacenter's own state as
    /// this server knows it.
    pub fn replace(&self, states: Vec<FederationState>) {
        let _changed = self.states.send_if_modified(|current| {
            let mut by_dc: BTreeMap<String, Arc<FederationState>> = states
                .into_iter()
                .filter(|s| s.datacenter != self.local)
                .map(|s| match current.by_dc.get(&s.datacenter) {
                    Some(kept) if kept.same_as(&s) => (s.datacenter.clone(), Arc::clone(kept)),
                    _ => (s.datacenter.clone(), Arc::new(s)),
                })
                .collect();
            if let Some(own) = current.by_dc.get(&self.local) {
                by_dc.insert(self.local.clone(), Arc::clone(own));
            }
            if by_dc.len() == current.by_dc.len()
                && by_dc
                    .iter()
                    .all(|(dc, s)| current.by_dc.get(dc).is_some_and(|c| Arc::ptr_eq(c, s)))
            {
                return false;
            }
            let next = Arc::make_mut(current);
            next.index += 1;
            next.by_dc = by_dc;
            true
        });
    }

    /// The states once their index passes `after`, or when `wait` is over.
    async fn wait(&self, after: u64, wait: Duration) -> Arc<FederationStates> {
        let (mut states, mut released) = (self.subscribe(), self.released.subscribe());
        let _ = tokio::time::timeout(wait, async {
            tokio::select! {
                _ = states.wait_for(|s| s.index > after) => {}
                _ = released.wait_for(|r| *r) => {}
            }
        })
        .await;
        self.states()
    }
}

/// The federation of `api`, or the 404 of a server that has none.
fn federation(api: &Api) -> Result<&Arc<Federation>, ApiError> {
    api.config
        .federation
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("this server is not federated with other datacenters".into()))
}

/// `GET /v1/internal/federation-states`: every datacenter's state (`operator:read`),
/// blocking on their index.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let fed = federation(&api)?;
    let blocking = params.blocking()?;
    let states = match blocking.index {
        Some(after) => fed.wait(after.0, blocking.wait_with_jitter()).await,
        None => fed.states(),
    };
    let all: Vec<&FederationState> = states.by_dc.values().map(|s| &**s).collect();
    Ok(query::json(&all, Some(structs::Index(states.index)), params.pretty()))
}

/// `GET /v1/internal/federation-state/:dc`: one datacenter's state (`operator:read`).
pub(crate) async fn one(
    State(api): State<Api>,
    authz: Authz,
    Path(dc): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let states = federation(&api)?.states();
    let state = states
        .by_dc
        .get(&dc)
        .ok_or_else(|| ApiError::NotFound(format!("no federation state for datacenter {dc:?}")))?;
    Ok(query::json(
        &**state,
        Some(structs::Index(states.index)),
        params.pretty(),
    ))
}

/// `PUT /v1/internal/federation-state`: a secondary datacenter's state, sent by its servers
/// to the primary's (`operator:write`: a state says where requests for a datacenter go,
/// tokens with them). Only the primary takes them, and never for itself.
pub(crate) async fn put(State(api): State<Api>, authz: Authz, body: Bytes) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    let fed = federation(&api)?;
    let state: FederationState = query::decode(&body, "a federation state")?;
    state.check().map_err(ApiError::BadRequest)?;
    if !fed.is_primary() {
        return Err(ApiError::BadRequest(format!(
            "this server is in datacenter {:?}: federation states are sent to the primary, {:?}",
            fed.local(),
            fed.primary()
        )));
    }
    if state.datacenter == fed.local() {
        return Err(ApiError::BadRequest(format!(
            "Datacenter: {:?} is the primary itself; its state is its own servers'",
            state.datacenter
        )));
    }
    fed.put(state);
    Ok(query::json(&true, None, false))
}

/// `PUT /v1/internal/ca/intermediate` body.
#[derive(serde::Deserialize)]
struct IntermediateRequest {
    #[serde(rename = "CSR", alias = "csr", default)]
    csr: String,
}

/// Its answer.
#[derive(serde::Serialize)]
struct IntermediateAnswer {
    #[serde(rename = "CertPEM")]
    cert_pem: String,
    #[serde(rename = "RootID")]
    root_id: String,
}

/// `PUT /v1/internal/ca/intermediate`: the primary signs a secondary datacenter's
/// intermediate for the key of its CSR (`operator:write`; see `catalog::ca`). A server of a
/// secondary datacenter refuses: its CA follows the primary's.
pub(crate) async fn sign_intermediate(State(api): State<Api>, authz: Authz, body: Bytes) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    if let Some(fed) = api.config.federation.as_ref().filter(|f| !f.is_primary()) {
        return Err(ApiError::BadRequest(format!(
            "this server is in datacenter {:?}: intermediates are signed by the primary, {:?}",
            fed.local(),
            fed.primary()
        )));
    }
    let request: IntermediateRequest = query::decode(&body, "{\"CSR\": PEM}")?;
    if request.csr.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "CSR: missing (expected a PEM certificate signing request)".into(),
        ));
    }
    let (cert_pem, root_id) = api
        .store
        .sign_intermediate(&request.csr)
        .map_err(crate::connect::csr_error)?;
    Ok(query::json(&IntermediateAnswer { cert_pem, root_id }, None, false))
}
