//! What config sources hand the Manager: a proxy's registration, who made it, and what a
//! registration did. Kept apart from the Manager so the State and the kind handlers, which
//! read registrations, do not depend on the Manager.

use crate::snapshot::ProxyId;
use std::{fmt, sync::Arc};
use structs::{NodeService, Token};

/// Who registered a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxySource {
    /// The local agent's own state.
    Local,
    /// The server's catalog (agentless proxies).
    Catalog,
}

impl fmt::Display for ProxySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxySource::Local => "local",
            ProxySource::Catalog => "catalog",
        })
    }
}

/// A proxy to manage: its id, registration and the token its watches use.
#[derive(Debug, Clone)]
pub struct ProxyRegistration {
    /// The proxy's id.
    pub id: ProxyId,
    /// Its service registration (kind, address, port, proxy config).
    pub service: Arc<NodeService>,
    /// ACL token for its watches (none: the source's own, e.g. the agent's).
    pub token: Option<Token>,
}

impl ProxyRegistration {
    /// True when going from `self` to `new` changes what the proxy's State watches or builds.
    pub(crate) fn needs_rebuild(&self, new: &ProxyRegistration) -> bool {
        let (a, b) = (&*self.service, &*new.service);
        a.kind != b.kind
            || a.service != b.service
            || a.address != b.address
            || a.port != b.port
            || a.socket_path != b.socket_path
            || a.proxy != b.proxy
            || self.token != new.token
    }
}

/// What a successful registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// A new State started.
    Started,
    /// The previous State was stopped and a fresh one started.
    Rebuilt,
    /// Nothing the proxy's config depends on changed; the State keeps running.
    Unchanged,
}
