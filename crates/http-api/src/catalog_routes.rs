//! `/v1/catalog/*`.

use crate::authz::{Authz, mark_filtered, retain};
use crate::query::{self, Params, ServiceFilters, meta_matches, service_key};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::{IndexKey, Op};
use serde::Serialize;
use std::collections::BTreeMap;
use structs::filter::CatalogRow;
use structs::{
    ConnectProxyConfig, DeregisterRequest, Index, Node, NodeService, RegisterRequest, ServiceKind,
    service::{ServiceAddress, ServiceConnect, Weights},
};

/// A service instance with its node, in Consul's flat catalog shape.
#[derive(Serialize)]
pub(crate) struct ServiceNode<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    #[serde(rename = "Node")]
    node: &'a str,
    #[serde(rename = "Address")]
    address: &'a str,
    #[serde(rename = "Datacenter")]
    datacenter: &'a str,
    #[serde(rename = "TaggedAddresses", serialize_with = "null_map")]
    tagged_addresses: &'a BTreeMap<String, String>,
    #[serde(rename = "NodeMeta", serialize_with = "null_map")]
    node_meta: &'a BTreeMap<String, String>,
    #[serde(rename = "ServiceKind")]
    service_kind: ServiceKind,
    #[serde(rename = "ServiceID")]
    service_id: &'a str,
    #[serde(rename = "ServiceName")]
    service_name: &'a str,
    #[serde(rename = "ServiceTags")]
    service_tags: &'a [String],
    #[serde(rename = "ServiceAddress")]
    service_address: &'a str,
    #[serde(rename = "ServiceTaggedAddresses", skip_serializing_if = "no_addresses")]
    service_tagged_addresses: &'a BTreeMap<String, ServiceAddress>,
    #[serde(rename = "ServiceWeights")]
    service_weights: &'a Weights,
    #[serde(rename = "ServiceMeta")]
    service_meta: &'a BTreeMap<String, String>,
    #[serde(rename = "ServicePort")]
    service_port: u16,
    /// Always written (`null` when unset), as Consul's.
    #[serde(rename = "ServiceLocality")]
    service_locality: Option<&'a structs::service::Locality>,
    #[serde(rename = "ServiceSocketPath")]
    service_socket_path: &'a str,
    #[serde(rename = "ServiceEnableTagOverride")]
    service_enable_tag_override: bool,
    #[serde(rename = "ServiceProxy")]
    service_proxy: &'a ConnectProxyConfig,
    #[serde(rename = "ServiceConnect")]
    service_connect: &'a ServiceConnect,
    #[serde(rename = "CreateIndex")]
    create_index: Index,
    #[serde(rename = "ModifyIndex")]
    modify_index: Index,
}

/// An empty node map as Consul writes it: `null`.
fn null_map<S: serde::Serializer>(map: &&BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    structs::json::ser::null_if_empty(*map, s)
}

/// Consul omits a service's empty tagged addresses.
fn no_addresses(map: &&BTreeMap<String, ServiceAddress>) -> bool {
    map.is_empty()
}

impl<'a> ServiceNode<'a> {
    fn new(node: &'a Node, svc: &'a NodeService) -> Self {
        ServiceNode {
            id: &node.id,
            node: &node.node,
            address: &node.address,
            datacenter: &node.datacenter,
            tagged_addresses: &node.tagged_addresses,
            node_meta: &node.meta,
            service_kind: svc.kind,
            service_id: &svc.id,
            service_name: &svc.service,
            service_tags: &svc.tags,
            service_address: &svc.address,
            service_tagged_addresses: &svc.tagged_addresses,
            service_weights: &svc.weights,
            service_meta: &svc.meta,
            service_port: svc.port,
            service_locality: svc.locality.as_ref(),
            service_socket_path: &svc.socket_path,
            service_enable_tag_override: svc.enable_tag_override,
            service_proxy: &svc.proxy,
            service_connect: &svc.connect,
            create_index: svc.create_index,
            modify_index: svc.modify_index,
        }
    }
}

pub(crate) async fn register(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let req: RegisterRequest = query::decode(&body, "a registration")?;
    check_register(&api, &authz, &req)?;
    let op = Op::Register(Box::new(req));
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}

/// What Consul asks of a registration: `node:write` when it creates or changes the node or
/// carries node checks; `service:write` on the service (and on the service a proxy fronts)
/// and on the service of every service check.
pub(crate) fn check_register(api: &Api, authz: &Authz, req: &RegisterRequest) -> Result<(), ApiError> {
    let state = api.store.read();
    let node_changes = match state.node(&req.node) {
        None => true,
        Some(n) => {
            !req.skip_node_update
                && (n.address != req.address
                    || (!req.tagged_addresses.is_empty() && n.tagged_addresses != req.tagged_addresses)
                    || (!req.node_meta.is_empty() && n.meta != req.node_meta))
        }
    };
    let node_checks = req.all_checks().any(|c| c.service_id.is_empty());
    if node_changes || node_checks {
        authz.need(|a| a.node_write(&req.node), "node:write", &req.node)?;
    }
    if let Some(svc) = &req.service {
        authz.need(|a| a.service_write(&svc.service), "service:write", &svc.service)?;
        if svc.kind == ServiceKind::ConnectProxy {
            let dest = &svc.proxy.destination_service_name;
            authz.need(|a| a.service_write(dest), "service:write", dest)?;
        }
    }
    for c in req.all_checks().filter(|c| !c.service_id.is_empty()) {
        let name = req
            .service
            .as_ref()
            .filter(|s| s.id == c.service_id)
            .map(|s| s.service.clone())
            .or_else(|| state.service(&req.node, &c.service_id).map(|s| s.service.clone()))
            .unwrap_or_else(|| c.service_name.clone());
        authz.need(|a| a.service_write(&name), "service:write", &name)?;
    }
    Ok(())
}

pub(crate) async fn deregister(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let req: DeregisterRequest = query::decode(&body, "a deregistration")?;
    // node:write covers everything on the node (an agent removes what it no longer runs
    // with its own token, as Consul allows); otherwise service:write on the service.
    let node_write = authz.get()?.node_write(&req.node);
    if !node_write {
        let state = api.store.read();
        let service_of = |id: &str| state.service(&req.node, id).map(|s| s.service.clone());
        if !req.service_id.is_empty() {
            if let Some(name) = service_of(&req.service_id) {
                authz.need(|a| a.service_write(&name), "service:write", &name)?;
            } else {
                authz.need(|a| a.node_write(&req.node), "node:write", &req.node)?;
            }
        } else if !req.check_id.is_empty() {
            match state
                .check(&req.node, &req.check_id)
                .filter(|c| !c.service_id.is_empty())
                .and_then(|c| service_of(&c.service_id))
            {
                Some(name) => authz.need(|a| a.service_write(&name), "service:write", &name)?,
                None => authz.need(|a| a.node_write(&req.node), "node:write", &req.node)?,
            }
        } else {
            authz.need(|a| a.node_write(&req.node), "node:write", &req.node)?;
        }
    }
    let op = Op::Deregister(req);
    if params.has("dry-run") {
        return crate::dry_run::answer(&api.store, api.config.dry_run.as_ref(), &authz, &op, &params).await;
    }
    api.store.write(op).await?;
    Ok(query::json(&true, None, params.pretty()))
}

pub(crate) async fn datacenters(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    Ok(query::json(
        &api.store.federation().datacenters(),
        None,
        params.pretty(),
    ))
}

pub(crate) async fn nodes(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let meta = params.node_meta()?;
    let expr = query::filter::<Node>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Nodes;
    let state = api.read(&params, &key).await?;
    let mut nodes: Vec<&Node> = state
        .nodes()
        .map(|n| &**n)
        .filter(|n| meta_matches(&n.meta, &meta) && expr.matches(n))
        .collect();
    let filtered = retain(&mut nodes, |n| a.node_read(&n.node));
    Ok(mark_filtered(
        query::json(&nodes, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

pub(crate) async fn node(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    node_view(&api, &authz, name, q.as_deref(), NodeShape::ServicesById).await
}

/// `GET /v1/catalog/node-services/:node`: the node and its services as a list (what
/// Consul's `Catalog().NodeServiceList` reads); an unknown node is `{"Node": null,
/// "Services": []}`, as Consul's.
pub(crate) async fn node_services(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    node_view(&api, &authz, name, q.as_deref(), NodeShape::ServiceList).await
}

/// How a node's services are answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NodeShape {
    /// `/v1/catalog/node/:node`: a map by service id; an unknown node is `null`.
    ServicesById,
    /// `/v1/catalog/node-services/:node`: a list; an unknown node has `Node: null`.
    ServiceList,
}

async fn node_view(
    api: &Api,
    authz: &Authz,
    name: String,
    q: Option<&str>,
    shape: NodeShape,
) -> Result<Response, ApiError> {
    #[derive(Serialize)]
    struct ById<'a> {
        #[serde(rename = "Node")]
        node: &'a Node,
        #[serde(rename = "Services")]
        services: BTreeMap<&'a str, &'a NodeService>,
    }
    #[derive(Serialize)]
    struct List<'a> {
        #[serde(rename = "Node")]
        node: Option<&'a Node>,
        #[serde(rename = "Services")]
        services: Vec<&'a NodeService>,
    }
    let params = Params::parse(q);
    let expr = query::filter::<NodeService>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Node(name.clone());
    let state = api.read(&params, &key).await?;
    let index = Some(state.index_of(&key));
    let node = state.node(&name);
    // Consul answers an unknown node, and one the token may not read, as absent.
    let Some(node) = node.filter(|_| a.node_read(&name)) else {
        let filtered = state.node(&name).is_some();
        let body = match shape {
            NodeShape::ServicesById => query::json(&serde_json::Value::Null, index, params.pretty()),
            NodeShape::ServiceList => query::json(
                &List {
                    node: None,
                    services: Vec::new(),
                },
                index,
                params.pretty(),
            ),
        };
        return Ok(mark_filtered(body, filtered));
    };
    let mut services = state.node_services(&name);
    services.retain(|s| expr.matches(s));
    let filtered = retain(&mut services, |s| a.service_read(&s.service));
    let body = match shape {
        NodeShape::ServicesById => query::json(
            &ById {
                node: &node,
                services: services.iter().map(|s| (s.id.as_str(), &**s)).collect(),
            },
            index,
            params.pretty(),
        ),
        NodeShape::ServiceList => query::json(
            &List {
                node: Some(&node),
                services: services.iter().map(|s| &**s).collect(),
            },
            index,
            params.pretty(),
        ),
    };
    Ok(mark_filtered(body, filtered))
}

pub(crate) async fn services(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    if let Some(peer) = params.get("peer").filter(|p| !p.is_empty()) {
        return imported_services(&api, &authz, &params, peer).await;
    }
    let meta = params.node_meta()?;
    let expr = query::filter::<CatalogRow>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Services;
    let state = api.read(&params, &key).await?;
    let tags = if meta.is_empty() && expr.matches_everything() {
        state.service_tags()
    } else {
        let mut out: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (node, svc) in state.all_services() {
            let admitted = state
                .node(node)
                .is_some_and(|n| meta_matches(&n.meta, &meta) && expr.matches(&(n, svc.clone())));
            if admitted {
                out.entry(svc.service.clone())
                    .or_default()
                    .extend(svc.tags.iter().cloned());
            }
        }
        out.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect()
    };
    let mut tags = tags;
    let before = tags.len();
    tags.retain(|name, _| a.service_read(name));
    let filtered = tags.len() != before;
    Ok(mark_filtered(
        query::json(&tags, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

/// `GET /v1/catalog/services?peer=`: the services a peer exports here, with their tags.
async fn imported_services(api: &Api, authz: &Authz, params: &Params, peer: &str) -> Result<Response, ApiError> {
    let a = authz.get()?;
    let key = IndexKey::PeerServices(peer.to_owned());
    let state = api.read(params, &key).await?;
    let mut tags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for service in state.imported_services(peer) {
        let mut all: Vec<String> = service
            .instances
            .iter()
            .flat_map(|i| i.service.tags.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        tags.insert(service.name.clone(), all);
    }
    let before = tags.len();
    tags.retain(|name, _| a.service_read(name));
    let filtered = tags.len() != before;
    Ok(mark_filtered(
        query::json(&tags, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

async fn service_nodes(
    api: Api,
    authz: Authz,
    name: String,
    q: Option<String>,
    connect: bool,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let filters = ServiceFilters::parse(&params)?;
    let expr = query::filter::<CatalogRow>(&params)?;
    let path = format!("/v1/catalog/{}/{name}", if connect { "connect" } else { "service" });
    api.shared_answer(&path, &params, service_key(&name, connect), &authz, |state, a| {
        let instances = if connect {
            state.connect_instances(&name)
        } else {
            state.service_instances(&name)
        };
        let mut nodes: Vec<(std::sync::Arc<Node>, std::sync::Arc<NodeService>)> = instances
            .into_iter()
            .filter_map(|(node, svc)| state.node(&node).map(|n| (n, svc)))
            // Connect instances carry their service's virtual IP (`consul-virtual`).
            .map(|(n, svc)| (n, catalog::virtual_ips::as_listed(state, &name, svc)))
            .filter(|(n, svc)| filters.admits(&svc.tags, &n.meta))
            .filter(|row| expr.matches(row))
            .collect();
        let filtered = retain(&mut nodes, |(n, s)| a.service_read(&s.service) && a.node_read(&n.node));
        let body: Vec<ServiceNode<'_>> = nodes.iter().map(|(n, s)| ServiceNode::new(n, s)).collect();
        Ok((query::encode(&body, params.pretty())?, filtered))
    })
    .await
}

pub(crate) async fn service(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    service_nodes(api, authz, name, q, false).await
}

pub(crate) async fn connect(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    service_nodes(api, authz, name, q, true).await
}
