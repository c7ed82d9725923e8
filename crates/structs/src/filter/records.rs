//! The records a [`Filter`](super::Filter) evaluates against, each with its selectors: the
//! field names of the JSON each endpoint answers with, as Consul's filters name them.
//!
//! | record | endpoints | selectors |
//! |---|---|---|
//! | [`CheckServiceNode`] | `/v1/health/service`, `/v1/health/connect`, `/v1/health/ingress` | `Node.*`, `Service.*` |
//! | [`Node`] | `/v1/catalog/nodes` | `ID`, `Node`, `Address`, `Datacenter`, `TaggedAddresses`, `Meta` |
//! | [`CatalogRow`] | `/v1/catalog/service`, `/v1/catalog/connect`, `/v1/catalog/services` | `Node`, `Address`, `NodeMeta`, `ServiceName`, `ServiceTags`, ... |
//! | [`NodeService`] | `/v1/agent/services`, `/v1/catalog/node/:node`, `/v1/catalog/node-services/:node` | `ID`, `Service`, `Tags`, `Meta`, `Port`, `Proxy.*`, ... |
//! | [`HealthCheck`] | `/v1/health/node`, `/v1/health/checks`, `/v1/health/state`, `/v1/agent/checks` | `Node`, `CheckID`, `Name`, `Status`, `ServiceName`, ... |
//! | [`JwtIdentity`] | binding rules of `jwt` auth methods | `value.<name>`, `list.<name>` |
//! | [`ServiceAccountIdentity`] | binding rules of `kubernetes` auth methods | `serviceaccount.namespace`, `serviceaccount.name`, `serviceaccount.uid` |
//!
//! A map of strings takes `in`/`is empty` on its keys and a key as a string selector
//! (`Meta.version`, `Meta["version"]`); a missing key reads as `""`. A map of lists
//! likewise, each key a list selector (`"admins" in list.groups`); a missing key reads as
//! an empty list.

use crate::proxy::ConnectProxyConfig;
use crate::service::ServiceAddress;
use crate::{CheckServiceNode, HealthCheck, Node, NodeService};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A kind of record filters evaluate against.
pub trait Record: Sized + fmt::Debug + Clone + 'static {
    /// Its selectors.
    fn selectors() -> &'static [Selector<Self>];
}

/// One selector of a record: its name and how to read it.
pub struct Selector<T: 'static> {
    name: &'static str,
    get: Get<T>,
}

impl<T> fmt::Debug for Selector<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

enum Get<T: 'static> {
    Text(for<'a> fn(&'a T) -> &'a str),
    /// An integer and its largest value.
    Integer(fn(&T) -> u64, u64),
    Boolean(fn(&T) -> bool),
    List(for<'a> fn(&'a T) -> &'a [String]),
    /// A map of strings: its keys, and each key as a string selector.
    Strings(for<'a> fn(&'a T) -> &'a BTreeMap<String, String>),
    /// A map of addresses: its keys only.
    Addresses(for<'a> fn(&'a T) -> &'a BTreeMap<String, ServiceAddress>),
    /// A map of lists: its keys, and each key as a list selector.
    Lists(for<'a> fn(&'a T) -> &'a BTreeMap<String, Vec<String>>),
    /// One text field of each element of a list of structs (`Checks.Status`): a test
    /// matches when it matches for any element (and `!=` when none equals).
    Each(for<'a> fn(&'a T) -> Vec<&'a str>),
    /// A list of structs as a whole (`Checks`): `is empty`, and `in`/`contains` on the
    /// elements' ids.
    Collection(for<'a> fn(&'a T) -> Vec<&'a str>),
}

impl<T> Selector<T> {
    const fn text(name: &'static str, get: for<'a> fn(&'a T) -> &'a str) -> Self {
        Selector {
            name,
            get: Get::Text(get),
        }
    }
    const fn integer(name: &'static str, get: fn(&T) -> u64, max: u64) -> Self {
        Selector {
            name,
            get: Get::Integer(get, max),
        }
    }
    const fn boolean(name: &'static str, get: fn(&T) -> bool) -> Self {
        Selector {
            name,
            get: Get::Boolean(get),
        }
    }
    const fn list(name: &'static str, get: for<'a> fn(&'a T) -> &'a [String]) -> Self {
        Selector {
            name,
            get: Get::List(get),
        }
    }
    const fn strings(name: &'static str, get: for<'a> fn(&'a T) -> &'a BTreeMap<String, String>) -> Self {
        Selector {
            name,
            get: Get::Strings(get),
        }
    }
    const fn each(name: &'static str, get: for<'a> fn(&'a T) -> Vec<&'a str>) -> Self {
        Selector {
            name,
            get: Get::Each(get),
        }
    }
    const fn collection(name: &'static str, get: for<'a> fn(&'a T) -> Vec<&'a str>) -> Self {
        Selector {
            name,
            get: Get::Collection(get),
        }
    }
    const fn lists(name: &'static str, get: for<'a> fn(&'a T) -> &'a BTreeMap<String, Vec<String>>) -> Self {
        Selector {
            name,
            get: Get::Lists(get),
        }
    }
    const fn addresses(name: &'static str, get: for<'a> fn(&'a T) -> &'a BTreeMap<String, ServiceAddress>) -> Self {
        Selector {
            name,
            get: Get::Addresses(get),
        }
    }
}

/// A record that carries a proxy block, whose nested fields filters select.
trait HasProxy {
    fn proxy(&self) -> &ConnectProxyConfig;
}

impl HasProxy for NodeService {
    fn proxy(&self) -> &ConnectProxyConfig {
        &self.proxy
    }
}

impl HasProxy for CheckServiceNode {
    fn proxy(&self) -> &ConnectProxyConfig {
        &self.service.proxy
    }
}

impl HasProxy for CatalogRow {
    fn proxy(&self) -> &ConnectProxyConfig {
        &self.1.proxy
    }
}

/// The nested selectors of a proxy block under `prefix` (`Proxy`, `Service.Proxy`,
/// `ServiceProxy`), as Consul's filters name them: its mode and mesh gateway mode, its
/// upstreams (`is empty`, and each upstream's fields: a test matches when some upstream
/// passes it), its exposed paths. Built once per record type.
fn proxy_selectors<T: HasProxy + 'static>(prefix: &str) -> Vec<Selector<T>> {
    let name = |field: &str| -> &'static str { Box::leak(format!("{prefix}.{field}").into_boxed_str()) };
    vec![
        Selector::text(name("Mode"), |r: &T| r.proxy().mode.as_str()),
        Selector::text(name("MeshGateway.Mode"), |r: &T| r.proxy().mesh_gateway.mode.as_str()),
        Selector::text(name("LocalServiceSocketPath"), |r: &T| {
            r.proxy().local_service_socket_path.as_str()
        }),
        Selector::collection(name("Upstreams"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.destination_name.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.DestinationName"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.destination_name.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.DestinationType"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.destination_type.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.DestinationNamespace"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.destination_namespace.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.DestinationPeer"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.destination_peer.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.Datacenter"), |r: &T| {
            r.proxy().upstreams.iter().map(|u| u.datacenter.as_str()).collect()
        }),
        Selector::each(name("Upstreams.LocalBindAddress"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.local_bind_address.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.LocalBindSocketPath"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.local_bind_socket_path.as_str())
                .collect()
        }),
        Selector::each(name("Upstreams.MeshGateway.Mode"), |r: &T| {
            r.proxy()
                .upstreams
                .iter()
                .map(|u| u.mesh_gateway.mode.as_str())
                .collect()
        }),
        Selector::boolean(name("Expose.Checks"), |r: &T| r.proxy().expose.checks),
        Selector::each(name("Expose.Paths.Path"), |r: &T| {
            r.proxy().expose.paths.iter().map(|p| p.path.as_str()).collect()
        }),
        Selector::each(name("Expose.Paths.Protocol"), |r: &T| {
            r.proxy().expose.paths.iter().map(|p| p.protocol.as_str()).collect()
        }),
    ]
}

/// Every selector of `T`, as the unknown-selector error lists them.
pub(super) fn known<T: Record>() -> String {
    let mut out: Vec<String> = Vec::new();
    for s in T::selectors() {
        out.push(s.name.to_owned());
        if matches!(s.get, Get::Strings(_) | Get::Lists(_)) {
            out.push(format!("{}.<key>", s.name));
        }
    }
    out.join(", ")
}

/// A selector resolved against a record type: the field, and the key of a map of strings.
pub(super) struct Field<T: 'static> {
    selector: &'static Selector<T>,
    key: Option<String>,
}

impl<T> Clone for Field<T> {
    fn clone(&self) -> Self {
        Field {
            selector: self.selector,
            key: self.key.clone(),
        }
    }
}

impl<T> fmt::Debug for Field<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}[{key:?}]", self.selector.name),
            None => write!(f, "{}", self.selector.name),
        }
    }
}

/// A field's value in one record.
pub(super) enum Got<'a> {
    Text(&'a str),
    /// The values of one field across a list's elements.
    Each(Vec<&'a str>),
    /// The ids of a list's elements.
    Members(Vec<&'a str>),
    Integer(u64),
    Boolean(bool),
    List(&'a [String]),
    Keys(Keys<'a>),
}

/// The keys of a map field.
pub(super) enum Keys<'a> {
    Strings(&'a BTreeMap<String, String>),
    Addresses(&'a BTreeMap<String, ServiceAddress>),
    Lists(&'a BTreeMap<String, Vec<String>>),
}

impl Keys<'_> {
    pub(super) fn contains(&self, key: &str) -> bool {
        match self {
            Keys::Strings(m) => m.contains_key(key),
            Keys::Addresses(m) => m.contains_key(key),
            Keys::Lists(m) => m.contains_key(key),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Keys::Strings(m) => m.is_empty(),
            Keys::Addresses(m) => m.is_empty(),
            Keys::Lists(m) => m.is_empty(),
        }
    }
}

impl<T: Record> Field<T> {
    /// The field named by `path`, with `key` from a bracket index (`Service.Meta["k"]`).
    /// A map of strings also takes a key after a dot (`Service.Meta.k`).
    pub(super) fn resolve(path: &str, key: Option<String>) -> Option<Field<T>> {
        let selectors = T::selectors();
        if let Some(key) = key {
            let selector = selectors
                .iter()
                .find(|s| s.name == path && matches!(s.get, Get::Strings(_) | Get::Lists(_)))?;
            return Some(Field {
                selector,
                key: Some(key),
            });
        }
        if let Some(selector) = selectors.iter().find(|s| s.name == path) {
            return Some(Field { selector, key: None });
        }
        selectors.iter().find_map(|s| {
            let key = path.strip_prefix(s.name)?.strip_prefix('.').filter(|k| !k.is_empty())?;
            matches!(s.get, Get::Strings(_) | Get::Lists(_)).then(|| Field {
                selector: s,
                key: Some(key.to_owned()),
            })
        })
    }

    pub(super) fn get<'a>(&self, record: &'a T) -> Got<'a> {
        match (&self.selector.get, &self.key) {
            (Get::Strings(get), Some(key)) => Got::Text(get(record).get(key).map_or("", String::as_str)),
            (Get::Text(get), _) => Got::Text(get(record)),
            (Get::Integer(get, _), _) => Got::Integer(get(record)),
            (Get::Boolean(get), _) => Got::Boolean(get(record)),
            (Get::List(get), _) => Got::List(get(record)),
            (Get::Strings(get), None) => Got::Keys(Keys::Strings(get(record))),
            (Get::Addresses(get), _) => Got::Keys(Keys::Addresses(get(record))),
            (Get::Lists(get), Some(key)) => Got::List(get(record).get(key).map_or(&[], Vec::as_slice)),
            (Get::Lists(get), None) => Got::Keys(Keys::Lists(get(record))),
            (Get::Each(get), _) => Got::Each(get(record)),
            (Get::Collection(get), _) => Got::Members(get(record)),
        }
    }

    /// A string: a text field, or one key of a map of strings.
    pub(super) fn is_string(&self) -> bool {
        matches!(self.selector.get, Get::Text(_) | Get::Each(_))
            || (self.key.is_some() && matches!(self.selector.get, Get::Strings(_)))
    }

    /// The largest value of an integer field.
    pub(super) fn integer_max(&self) -> Option<u64> {
        match self.selector.get {
            Get::Integer(_, max) => Some(max),
            _ => None,
        }
    }

    pub(super) fn is_boolean(&self) -> bool {
        matches!(self.selector.get, Get::Boolean(_))
    }

    /// The type's name and the operators it takes, for errors.
    pub(super) fn kind(&self) -> (&'static str, &'static str) {
        const COLLECTION_OPS: &str =
            "\"in\", \"not in\", \"contains\", \"not contains\", \"is empty\" or \"is not empty\"";
        const SCALAR_OPS: &str = "\"==\" or \"!=\"";
        if self.is_string() {
            return ("a string", "any operator");
        }
        match self.selector.get {
            Get::Integer(..) => ("an integer", SCALAR_OPS),
            Get::Boolean(_) => ("a boolean", SCALAR_OPS),
            Get::List(_) => ("a list", COLLECTION_OPS),
            Get::Lists(_) if self.key.is_some() => ("a list", COLLECTION_OPS),
            Get::Collection(_) => ("a list", COLLECTION_OPS),
            _ => ("a map", COLLECTION_OPS),
        }
    }
}

/// What a `jwt` auth method verified of a login's token, as its binding rules select on
/// it: each `ClaimMappings` claim as `value.<name>` (every mapped name present, `""` when
/// the token lacks the claim), each `ListClaimMappings` claim as `list.<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JwtIdentity {
    /// Mapped claims.
    pub value: BTreeMap<String, String>,
    /// Mapped list claims.
    pub list: BTreeMap<String, Vec<String>>,
}

impl Record for JwtIdentity {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: &[Selector<JwtIdentity>] = &[
            Selector::strings("value", |i| &i.value),
            Selector::lists("list", |i| &i.list),
        ];
        SELECTORS
    }
}

/// What a `kubernetes` auth method verified of a login's token: the service account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAccountIdentity {
    /// Its namespace.
    pub namespace: String,
    /// Its name (or its `consul.hashicorp.com/service-name` annotation).
    pub name: String,
    /// Its uid.
    pub uid: String,
}

impl Record for ServiceAccountIdentity {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: &[Selector<ServiceAccountIdentity>] = &[
            Selector::text("serviceaccount.namespace", |i| i.namespace.as_str()),
            Selector::text("serviceaccount.name", |i| i.name.as_str()),
            Selector::text("serviceaccount.uid", |i| i.uid.as_str()),
        ];
        SELECTORS
    }
}

const PORT_MAX: u64 = u16::MAX as u64;
const WEIGHT_MAX: u64 = u32::MAX as u64;

impl Record for CheckServiceNode {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: std::sync::LazyLock<Vec<Selector<CheckServiceNode>>> = std::sync::LazyLock::new(|| {
            let mut all: Vec<Selector<CheckServiceNode>> = vec![
                Selector::text("Service.ID", |n| n.service.id.as_str()),
                Selector::text("Service.Service", |n| n.service.service.as_str()),
                Selector::text("Service.Address", |n| n.service.address.as_str()),
                Selector::text("Service.Kind", |n| n.service.kind.as_str()),
                Selector::text("Service.SocketPath", |n| n.service.socket_path.as_str()),
                Selector::list("Service.Tags", |n| n.service.tags.as_slice()),
                Selector::strings("Service.Meta", |n| &n.service.meta),
                Selector::addresses("Service.TaggedAddresses", |n| &n.service.tagged_addresses),
                Selector::integer("Service.Port", |n| u64::from(n.service.port), PORT_MAX),
                Selector::integer(
                    "Service.Weights.Passing",
                    |n| u64::from(n.service.weights.passing),
                    WEIGHT_MAX,
                ),
                Selector::integer(
                    "Service.Weights.Warning",
                    |n| u64::from(n.service.weights.warning),
                    WEIGHT_MAX,
                ),
                Selector::boolean("Service.EnableTagOverride", |n| n.service.enable_tag_override),
                Selector::boolean("Service.Connect.Native", |n| n.service.connect.native),
                Selector::text("Service.Proxy.DestinationServiceName", |n| {
                    n.service.proxy.destination_service_name.as_str()
                }),
                Selector::text("Service.Proxy.DestinationServiceID", |n| {
                    n.service.proxy.destination_service_id.as_str()
                }),
                Selector::collection("Checks", |n| n.checks.iter().map(|c| c.check_id.as_str()).collect()),
                Selector::each("Checks.Node", |n| n.checks.iter().map(|c| c.node.as_str()).collect()),
                Selector::each("Checks.CheckID", |n| {
                    n.checks.iter().map(|c| c.check_id.as_str()).collect()
                }),
                Selector::each("Checks.Name", |n| n.checks.iter().map(|c| c.name.as_str()).collect()),
                Selector::each("Checks.Status", |n| {
                    n.checks.iter().map(|c| c.status.as_str()).collect()
                }),
                Selector::each("Checks.Notes", |n| n.checks.iter().map(|c| c.notes.as_str()).collect()),
                Selector::each("Checks.Output", |n| {
                    n.checks.iter().map(|c| c.output.as_str()).collect()
                }),
                Selector::each("Checks.ServiceID", |n| {
                    n.checks.iter().map(|c| c.service_id.as_str()).collect()
                }),
                Selector::each("Checks.ServiceName", |n| {
                    n.checks.iter().map(|c| c.service_name.as_str()).collect()
                }),
                Selector::each("Checks.Type", |n| {
                    n.checks.iter().map(|c| c.check_type.as_str()).collect()
                }),
                Selector::text("Node.ID", |n| n.node.id.as_str()),
                Selector::text("Node.Node", |n| n.node.node.as_str()),
                Selector::text("Node.Address", |n| n.node.address.as_str()),
                Selector::text("Node.Datacenter", |n| n.node.datacenter.as_str()),
                Selector::strings("Node.Meta", |n| &n.node.meta),
                Selector::strings("Node.TaggedAddresses", |n| &n.node.tagged_addresses),
            ];
            all.extend(proxy_selectors::<CheckServiceNode>("Service.Proxy"));
            all
        });
        &SELECTORS
    }
}

impl Record for Node {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: &[Selector<Node>] = &[
            Selector::text("ID", |n| n.id.as_str()),
            Selector::text("Node", |n| n.node.as_str()),
            Selector::text("Address", |n| n.address.as_str()),
            Selector::text("Datacenter", |n| n.datacenter.as_str()),
            Selector::strings("TaggedAddresses", |n| &n.tagged_addresses),
            Selector::strings("Meta", |n| &n.meta),
        ];
        SELECTORS
    }
}

impl Record for NodeService {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: std::sync::LazyLock<Vec<Selector<NodeService>>> = std::sync::LazyLock::new(|| {
            let mut all: Vec<Selector<NodeService>> = vec![
                Selector::text("Kind", |s| s.kind.as_str()),
                Selector::text("ID", |s| s.id.as_str()),
                Selector::text("Service", |s| s.service.as_str()),
                Selector::list("Tags", |s| s.tags.as_slice()),
                Selector::text("Address", |s| s.address.as_str()),
                Selector::addresses("TaggedAddresses", |s| &s.tagged_addresses),
                Selector::strings("Meta", |s| &s.meta),
                Selector::integer("Port", |s| u64::from(s.port), PORT_MAX),
                Selector::text("SocketPath", |s| s.socket_path.as_str()),
                Selector::integer("Weights.Passing", |s| u64::from(s.weights.passing), WEIGHT_MAX),
                Selector::integer("Weights.Warning", |s| u64::from(s.weights.warning), WEIGHT_MAX),
                Selector::boolean("EnableTagOverride", |s| s.enable_tag_override),
                Selector::text("Proxy.DestinationServiceName", |s| {
                    s.proxy.destination_service_name.as_str()
                }),
                Selector::text("Proxy.DestinationServiceID", |s| {
                    s.proxy.destination_service_id.as_str()
                }),
                Selector::text("Proxy.LocalServiceAddress", |s| s.proxy.local_service_address.as_str()),
                Selector::integer(
                    "Proxy.LocalServicePort",
                    |s| u64::from(s.proxy.local_service_port),
                    PORT_MAX,
                ),
                Selector::boolean("Connect.Native", |s| s.connect.native),
            ];
            all.extend(proxy_selectors::<NodeService>("Proxy"));
            all
        });
        &SELECTORS
    }
}

impl Record for HealthCheck {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: &[Selector<HealthCheck>] = &[
            Selector::text("Node", |c| c.node.as_str()),
            Selector::text("CheckID", |c| c.check_id.as_str()),
            Selector::text("Name", |c| c.name.as_str()),
            Selector::text("Status", |c| c.status.as_str()),
            Selector::text("Notes", |c| c.notes.as_str()),
            Selector::text("Output", |c| c.output.as_str()),
            Selector::text("ServiceID", |c| c.service_id.as_str()),
            Selector::text("ServiceName", |c| c.service_name.as_str()),
            Selector::list("ServiceTags", |c| c.service_tags.as_slice()),
            Selector::text("Type", |c| c.check_type.as_str()),
        ];
        SELECTORS
    }
}

/// A service instance with its node, as the catalog's service endpoints answer it (Consul's
/// flat `ServiceNode`: node fields, then `Service*` fields).
pub type CatalogRow = (Arc<Node>, Arc<NodeService>);

impl Record for CatalogRow {
    fn selectors() -> &'static [Selector<Self>] {
        static SELECTORS: std::sync::LazyLock<Vec<Selector<CatalogRow>>> = std::sync::LazyLock::new(|| {
            let mut all: Vec<Selector<CatalogRow>> = vec![
                Selector::text("ID", |(n, _)| n.id.as_str()),
                Selector::text("Node", |(n, _)| n.node.as_str()),
                Selector::text("Address", |(n, _)| n.address.as_str()),
                Selector::text("Datacenter", |(n, _)| n.datacenter.as_str()),
                Selector::strings("TaggedAddresses", |(n, _)| &n.tagged_addresses),
                Selector::strings("NodeMeta", |(n, _)| &n.meta),
                Selector::text("ServiceKind", |(_, s)| s.kind.as_str()),
                Selector::text("ServiceID", |(_, s)| s.id.as_str()),
                Selector::text("ServiceName", |(_, s)| s.service.as_str()),
                Selector::list("ServiceTags", |(_, s)| s.tags.as_slice()),
                Selector::text("ServiceAddress", |(_, s)| s.address.as_str()),
                Selector::addresses("ServiceTaggedAddresses", |(_, s)| &s.tagged_addresses),
                Selector::strings("ServiceMeta", |(_, s)| &s.meta),
                Selector::integer("ServicePort", |(_, s)| u64::from(s.port), PORT_MAX),
                Selector::text("ServiceSocketPath", |(_, s)| s.socket_path.as_str()),
                Selector::integer(
                    "ServiceWeights.Passing",
                    |(_, s)| u64::from(s.weights.passing),
                    WEIGHT_MAX,
                ),
                Selector::integer(
                    "ServiceWeights.Warning",
                    |(_, s)| u64::from(s.weights.warning),
                    WEIGHT_MAX,
                ),
                Selector::boolean("ServiceEnableTagOverride", |(_, s)| s.enable_tag_override),
                Selector::text("ServiceProxy.DestinationServiceName", |(_, s)| {
                    s.proxy.destination_service_name.as_str()
                }),
                Selector::text("ServiceProxy.DestinationServiceID", |(_, s)| {
                    s.proxy.destination_service_id.as_str()
                }),
                Selector::boolean("ServiceConnect.Native", |(_, s)| s.connect.native),
            ];
            all.extend(proxy_selectors::<CatalogRow>("ServiceProxy"));
            all
        });
        &SELECTORS
    }
}
