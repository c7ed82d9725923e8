//! The contract between a config source and whatever serves snapshots to proxies (the xDS
//! server): a consumer names the proxy it serves and gets a [`Watcher`] of its snapshots,
//! kept followed while the returned lease lives. Catalog (server) and local (agent) sources
//! both implement [`SnapshotSource`], so a server of snapshots needs no adapter per source.

use crate::Watcher;

/// Who is asking: what a proxy's stream says about itself.
#[derive(Debug, Clone, Copy)]
pub struct ProxyRequest<'a> {
    /// The proxy's service instance id (Envoy's node id).
    pub proxy_id: &'a str,
    /// The catalog node of the proxy, when the proxy names it.
    pub node_name: Option<&'a str>,
    /// The ACL token the proxy presented, if any.
    pub token: Option<&'a structs::Token>,
}

/// Keeps a proxy followed by its source while held; dropping it lets the source stop.
pub type SourceLease = Box<dyn Send + Sync>;

/// Why a source cannot serve a proxy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The request does not say which proxy it is.
    #[error("the node id must be the proxy's service id")]
    MissingProxyId,
    /// No proxy with that id is registered.
    #[error("no proxy {0:?} is registered")]
    NotFound(String),
    /// The id names proxies on several nodes and the request did not say which.
    #[error("proxy {0:?} is registered on several nodes: set node_name in the bootstrap metadata")]
    Ambiguous(String),
    /// The proxy is registered with the source, but the engine cannot manage it.
    #[error("proxy {proxy:?} cannot be served: {reason}")]
    Refused {
        /// The proxy.
        proxy: String,
        /// Why (for example a kind not supported yet).
        reason: String,
    },
}

/// Where a consumer gets snapshots for the proxies it serves.
pub trait SnapshotSource: Send + Sync + 'static {
    /// Follows the proxy `request` names, with its token; the lease keeps it followed.
    fn watch(&self, request: &ProxyRequest<'_>) -> Result<(Watcher, SourceLease), SourceError>;

    /// The listeners a client following `request` subscribes to by name: a proxyless gRPC
    /// client asks for one per `xds:///NAME` target, and a source that serves such clients
    /// follows those names as its upstreams. Envoy subscribes to every listener (no names);
    /// sources that serve only proxies ignore this.
    fn request_listeners(&self, request: &ProxyRequest<'_>, names: &[String]) {
        let _ = (request, names);
    }
}

/// A config source: what registers proxies with a Manager and serves their snapshots (the
/// catalog source on servers, the local source on agents), as a node runs it.
pub trait ConfigSource: SnapshotSource {
    /// Why proxy `id` is not registered yet, when the source knows.
    fn waiting(&self, _id: &str) -> Option<String> {
        None
    }

    /// Stops the source, deregistering what it registered.
    fn shutdown(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}
