//! The cache types in front of the servers' HTTP API: each turns one kind of request into a
//! blocking query and decodes the answer. Values are `Arc`s, shared by every watcher.

use crate::cache::{CacheType, FetchError, Fetched};
use api_client::{Blocked, Servers};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use structs::{CheckServiceNode, ConfigEntry, ConfigEntryKind, GatewayService, IndexedCaRoots, Intention, Token};

/// How long one blocking query waits at a server (its default).
pub const BLOCKING_WAIT: Duration = Duration::from_secs(300);

/// The servers, shared by every cache type.
#[derive(Clone)]
pub struct Http {
    servers: Arc<Servers>,
    wait: Duration,
}

impl Http {
    /// Blocking queries against `servers`, each waiting at most `wait` at the server.
    pub fn new(servers: Arc<Servers>, wait: Duration) -> Self {
        Self { servers, wait }
    }

    /// The servers.
    pub fn servers(&self) -> &Arc<Servers> {
        &self.servers
    }

    async fn blocking(&self, path: &str, min_index: u64) -> Result<Blocked, FetchError> {
        self.blocking_as(None, path, min_index).await
    }

    /// A blocking query with `token` (none: the agent's).
    async fn blocking_as(&self, token: Option<&Token>, path: &str, min_index: u64) -> Result<Blocked, FetchError> {
        let token = token.cloned().or_else(|| self.servers.token());
        let answer = self
            .servers
            .get_blocking_as(token.as_ref(), path, min_index, self.wait)
            .await
            .map_err(|e| FetchError::api(&format!("GET {path}"), &e))?;
        if answer.index == 0 {
            return Err(FetchError::Unavailable(format!(
                "GET {path}: the server sent no X-Consul-Index; it cannot answer blocking queries"
            )));
        }
        Ok(answer)
    }

    /// A blocking query whose answer must exist, decoded.
    async fn decoded<T: DeserializeOwned>(&self, path: &str, min_index: u64) -> Result<Fetched<T>, FetchError> {
        self.decoded_as(None, path, min_index).await
    }

    /// As `decoded`, with `token` (none: the agent's).
    async fn decoded_as<T: DeserializeOwned>(
        &self,
        token: Option<&Token>,
        path: &str,
        min_index: u64,
    ) -> Result<Fetched<T>, FetchError> {
        let answer = self.blocking_as(token, path, min_index).await?;
        Self::body_of(path, answer)
    }

    /// A blocking query's answer to `GET path`, which must exist, decoded.
    fn body_of<T: DeserializeOwned>(path: &str, answer: Blocked) -> Result<Fetched<T>, FetchError> {
        let Some(body) = answer.body else {
            return Err(FetchError::Unavailable(format!("GET {path}: 404 not found")));
        };
        let value =
            structs::json::from_slice(&body).map_err(|e| FetchError::Unavailable(format!("GET {path}: {e}")))?;
        Ok(Fetched {
            value,
            index: answer.index,
        })
    }
}

/// The trust bundle (`/v1/connect/ca/roots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RootsKey;

/// CA roots.
#[derive(Clone)]
pub struct Roots(pub Http);

impl CacheType for Roots {
    type Request = RootsKey;
    type Value = Arc<IndexedCaRoots>;

    async fn fetch(&self, _: &RootsKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let f: Fetched<IndexedCaRoots> = self.0.decoded(api_client::paths::CA_ROOTS, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// Instances of a service with their checks, as one token may read them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthKey {
    /// Service name.
    pub service: String,
    /// Its connect-capable instances (sidecars, or itself if native) instead.
    pub connect: bool,
    /// Only instances whose every check passes.
    pub passing: bool,
    /// The reader's token (none: the agent's).
    pub token: Option<Token>,
    /// Another datacenter's instances (`?dc=`, relayed by the servers); none: this one's.
    pub datacenter: Option<String>,
}

/// Service health (`/v1/health/service/:name`, `/v1/health/connect/:name`).
#[derive(Clone)]
pub struct Health(pub Http);

impl CacheType for Health {
    type Request = HealthKey;
    type Value = Arc<Vec<CheckServiceNode>>;

    async fn fetch(&self, key: &HealthKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = match &key.datacenter {
            Some(dc) => api_client::paths::health_service_in(&key.service, key.connect, key.passing, dc),
            None => api_client::paths::health_service(&key.service, key.connect, key.passing),
        };
        let f: Fetched<Vec<CheckServiceNode>> = self.0.decoded_as(key.token.as_ref(), &path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// Intentions whose destination matches a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IntentionsKey {
    /// Destination service name.
    pub destination: String,
}

/// Intentions by destination, in evaluation order (`/v1/connect/intentions/match`).
#[derive(Clone)]
pub struct Intentions(pub Http);

impl CacheType for Intentions {
    type Request = IntentionsKey;
    type Value = Arc<Vec<Intention>>;

    async fn fetch(&self, key: &IntentionsKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::intentions_match_destination(&key.destination);
        let f: Fetched<BTreeMap<String, Vec<Intention>>> = self.0.decoded(&path, min_index).await?;
        let mut by_name = f.value;
        Ok(Fetched {
            value: Arc::new(by_name.remove(&key.destination).unwrap_or_default()),
            index: f.index,
        })
    }
}

/// One config entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigEntryKey {
    /// Kind.
    pub kind: ConfigEntryKind,
    /// Name.
    pub name: String,
}

/// One config entry, or `None` while it does not exist (`/v1/config/:kind/:name`).
#[derive(Clone)]
pub struct ConfigEntryType(pub Http);

impl CacheType for ConfigEntryType {
    type Request = ConfigEntryKey;
    type Value = Option<Arc<ConfigEntry>>;

    async fn fetch(&self, key: &ConfigEntryKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::config_entry(key.kind.as_str(), &key.name);
        let answer = self.0.blocking(&path, min_index).await?;
        let value = match answer.body {
            None => None,
            Some(body) => Some(Arc::new(decode_entry(&path, &body)?)),
        };
        Ok(Fetched {
            value,
            index: answer.index,
        })
    }
}

fn decode_entry(path: &str, body: &[u8]) -> Result<ConfigEntry, FetchError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| FetchError::Unavailable(format!("GET {path}: invalid JSON: {e}")))?;
    ConfigEntry::from_json(value).map_err(|e| FetchError::Unavailable(format!("GET {path}: {e}")))
}

/// Every config entry of a kind, as one token may read them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigEntriesKey {
    /// The kind.
    pub kind: ConfigEntryKind,
    /// The reader's token (none: the agent's).
    pub token: Option<Token>,
}

/// Every config entry of a kind (`/v1/config/:kind`).
#[derive(Clone)]
pub struct ConfigEntries(pub Http);

impl CacheType for ConfigEntries {
    type Request = ConfigEntriesKey;
    type Value = Arc<Vec<Arc<ConfigEntry>>>;

    async fn fetch(&self, key: &ConfigEntriesKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let kind = key.kind;
        let path = api_client::paths::config_entries(kind.as_str());
        let answer = self.0.blocking_as(key.token.as_ref(), &path, min_index).await?;
        // Entries of these kinds are all readable or none (`mesh:read`): a token that may
        // not read them gets an empty list, which would silently drop routes, certificates
        // or exports. It is refused instead, and the proxy's status says so.
        if answer.filtered && kind.read_beyond_services() {
            return Err(FetchError::PermissionDenied(format!(
                "GET {path}: the token may not read {} entries",
                kind.as_str()
            )));
        }
        let f: Fetched<Vec<serde_json::Value>> = Http::body_of(&path, answer)?;
        let entries = f
            .value
            .into_iter()
            .map(|v| {
                ConfigEntry::from_json(v)
                    .map(Arc::new)
                    .map_err(|e| FetchError::Unavailable(format!("GET {path}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Fetched {
            value: Arc::new(entries),
            index: f.index,
        })
    }
}

/// Every service name of the datacenter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServicesKey {
    /// Only services with a typical instance (not proxies or gateways).
    pub typical_only: bool,
}

/// Service names (`/v1/catalog/services`).
#[derive(Clone)]
pub struct ServiceList(pub Http);

impl CacheType for ServiceList {
    type Request = ServicesKey;
    type Value = Arc<Vec<String>>;

    async fn fetch(&self, key: &ServicesKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = if key.typical_only {
            // `ServiceKind == ""`: the instances of the typical kind.
            format!(
                "{}?filter=ServiceKind%20%3D%3D%20%22%22",
                api_client::paths::CATALOG_SERVICES
            )
        } else {
            api_client::paths::CATALOG_SERVICES.to_owned()
        };
        let f: Fetched<BTreeMap<String, Vec<String>>> = self.0.decoded(&path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value.into_keys().collect()),
            index: f.index,
        })
    }
}

/// The services one gateway fronts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayServicesKey {
    /// The gateway service's name.
    pub gateway: String,
}

/// The services a gateway fronts (`/v1/catalog/gateway-services/:gateway`), `*` expanded by
/// the servers.
#[derive(Clone)]
pub struct GatewayServices(pub Http);

impl CacheType for GatewayServices {
    type Request = GatewayServicesKey;
    type Value = Arc<Vec<GatewayService>>;

    async fn fetch(&self, key: &GatewayServicesKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::catalog_gateway_services(&key.gateway);
        let f: Fetched<Vec<GatewayService>> = self.0.decoded(&path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// A service a peer exports here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeeredUpstreamKey {
    /// The peer, by the name this cluster gives it.
    pub peer: String,
    /// The service.
    pub service: String,
}

/// A service a peer exports here with the peer's trust bundle
/// (`/v1/internal/peering/upstream/:peer/:service`).
#[derive(Clone)]
pub struct PeeredUpstream(pub Http);

impl CacheType for PeeredUpstream {
    type Request = PeeredUpstreamKey;
    type Value = Arc<structs::peering::PeeredUpstream>;

    async fn fetch(&self, key: &PeeredUpstreamKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::peered_upstream(&key.peer, &key.service);
        let f: Fetched<structs::peering::PeeredUpstream> = self.0.decoded(&path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// The peers a service is exported to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerTrustBundlesKey {
    /// The exported service.
    pub service: String,
}

/// The trust bundles of the peers a service is exported to
/// (`/v1/internal/peering/trust-bundles/:service`).
#[derive(Clone)]
pub struct PeerTrustBundles(pub Http);

impl CacheType for PeerTrustBundles {
    type Request = PeerTrustBundlesKey;
    type Value = Arc<Vec<structs::peering::PeerTrustBundle>>;

    async fn fetch(&self, key: &PeerTrustBundlesKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::peer_trust_bundles(&key.service);
        let f: Fetched<Vec<structs::peering::PeerTrustBundle>> = self.0.decoded(&path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// Where the peering calls go (one value per agent).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeeringServersKey;

/// Where the peering calls go: this cluster's servers and the dialed peers'
/// (`/v1/internal/peering/servers`).
#[derive(Clone)]
pub struct PeeringServers(pub Http);

impl CacheType for PeeringServers {
    type Request = PeeringServersKey;
    type Value = Arc<structs::peering::PeeringServers>;

    async fn fetch(&self, _key: &PeeringServersKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let f: Fetched<structs::peering::PeeringServers> =
            self.0.decoded(api_client::paths::PEERING_SERVERS, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value),
            index: f.index,
        })
    }
}

/// A prepared query, by id or name (a template's rendering included).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PreparedQueryKey {
    /// The id or name asked.
    pub query: String,
}

/// The connect-capable instances a prepared query selects
/// (`/v1/query/:query/execute?connect=true`, which meshd's servers answer as a blocking
/// query on the queries and the service's instances), ordered by node then id.
#[derive(Clone)]
pub struct PreparedQuery(pub Http);

impl CacheType for PreparedQuery {
    type Request = PreparedQueryKey;
    type Value = Arc<Vec<CheckServiceNode>>;

    async fn fetch(&self, key: &PreparedQueryKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Executed {
            #[serde(default)]
            nodes: Vec<CheckServiceNode>,
        }
        let path = format!(
            "/v1/query/{}/execute?connect=true",
            api_client::paths::segment(&key.query)
        );
        let answer = self.0.blocking(&path, min_index).await?;
        let Some(body) = answer.body else {
            return Err(FetchError::Unavailable(format!(
                "prepared query {:?} does not exist",
                key.query
            )));
        };
        let executed: Executed =
            structs::json::from_slice(&body).map_err(|e| FetchError::Unavailable(format!("GET {path}: {e}")))?;
        let mut nodes = executed.nodes;
        // The servers shuffle; a proxy's endpoints should not churn for it.
        nodes.sort_by(|a, b| (&a.node.node, &a.service.id).cmp(&(&b.node.node, &b.service.id)));
        Ok(Fetched {
            value: Arc::new(nodes),
            index: answer.index,
        })
    }
}

/// Every datacenter's mesh gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MeshGatewaysKey;

/// Every datacenter's mesh gateways by datacenter, as the servers know them from the
/// federation states (`/v1/internal/federation-states/mesh-gateways`, with the agent's
/// token).
#[derive(Clone)]
pub struct MeshGateways(pub Http);

impl CacheType for MeshGateways {
    type Request = MeshGatewaysKey;
    type Value = Arc<BTreeMap<String, Arc<Vec<CheckServiceNode>>>>;

    async fn fetch(&self, _: &MeshGatewaysKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let path = api_client::paths::FEDERATION_MESH_GATEWAYS;
        let f: Fetched<BTreeMap<String, Vec<CheckServiceNode>>> = self.0.decoded(path, min_index).await?;
        Ok(Fetched {
            value: Arc::new(f.value.into_iter().map(|(dc, g)| (dc, Arc::new(g))).collect()),
            index: f.index,
        })
    }
}

/// Every known datacenter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatacentersKey;

/// Datacenter names (`/v1/catalog/datacenters`, which does not block): fetched at once, then
/// polled every [`Datacenters::POLL`]; the index moves only when the list changes.
pub struct Datacenters {
    http: Http,
    /// The last list read and the index it was given.
    last: Mutex<Option<(Arc<Vec<String>>, u64)>>,
}

impl Datacenters {
    /// How often the list is read again.
    pub const POLL: Duration = Duration::from_secs(600);

    /// Datacenter names from `http`'s servers.
    pub fn new(http: Http) -> Self {
        Self {
            http,
            last: Mutex::new(None),
        }
    }
}

impl CacheType for Datacenters {
    type Request = DatacentersKey;
    type Value = Arc<Vec<String>>;

    async fn fetch(&self, _: &DatacentersKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        loop {
            let last = self.last.lock().clone();
            match &last {
                Some((names, index)) if *index > min_index => {
                    return Ok(Fetched {
                        value: Arc::clone(names),
                        index: *index,
                    });
                }
                // The caller has the current list: poll until it changes.
                Some(_) => tokio::time::sleep(Self::POLL).await,
                None => {}
            }
            let now: Vec<String> = self
                .http
                .servers
                .get_json(api_client::paths::CATALOG_DATACENTERS)
                .await
                .map_err(|e| FetchError::api("GET /v1/catalog/datacenters", &e))?;
            let mut last = self.last.lock();
            match &*last {
                Some((names, _)) if **names == now => {}
                Some((_, index)) => *last = Some((Arc::new(now), index + 1)),
                None => *last = Some((Arc::new(now), 1)),
            }
        }
    }
}
