//! Resources for proxyless gRPC clients (a connect-native service's own gRPC channels,
//! `xds:///api`): no sockets of their own, so no public or outbound listeners.
//!
//! For each target the client asks for by name (the snapshot's upstreams):
//! - the listener named after it is an API listener: an HTTP connection manager with the
//!   router filter and RDS for the route configuration of the same name;
//! - that route configuration comes from the target's compiled discovery chain, as a
//!   sidecar's does (routes, splits, retries), matching any authority;
//! - the clusters are the chain's targets (EDS) and an aggregate cluster per resolver with
//!   failover (which the routes name), the targets with the mesh's mTLS expressed with gRPC's
//!   certificate providers: the client's bootstrap names a provider instance `meshd` whose
//!   `default` certificate is the service's leaf and whose `ROOTCA` certificate is the CA
//!   bundle (`meshd connect grpc-bootstrap` writes both files and keeps them current). A
//!   channel with xDS credentials verifies the server's SPIFFE id; a plaintext channel
//!   ignores the security settings.
//! - load assignments are the chain targets' healthy instances, one weighted locality each.

use super::clusters::failover_clusters;
use super::core::{ads, millis};
use super::listeners::{http_filter, route_to};
use super::routes::{RouteError, route_config, tcp_cluster};
use super::{BuildError, CLUSTER, LISTENER, ROUTE, Resources};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext, UpstreamTlsContext,
    common_tls_context,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::util::pack_any;
use proxycfg::{ConfigSnapshot, ConnectProxySnapshot};
use structs::{CompiledDiscoveryChain, SpiffeIdService};

/// The certificate provider instance a proxyless client's bootstrap must define.
pub const PROVIDER_INSTANCE: &str = structs::wire::PROXYLESS_CERT_PROVIDER;
/// Its certificate holding the service's leaf.
pub const LEAF_CERTIFICATE: &str = "default";
/// Its certificate holding the CA bundle.
pub const ROOTS_CERTIFICATE: &str = "ROOTCA";

fn provider(certificate: &str) -> Option<CertificateProviderPluginInstance> {
    Some(CertificateProviderPluginInstance {
        instance_name: PROVIDER_INSTANCE.into(),
        certificate_name: certificate.into(),
    })
}

/// mTLS to a target: the leaf and roots from the certificate provider, the target's SPIFFE id
/// required.
fn upstream_tls(sni: &str, spiffe_id: &str) -> TransportSocket {
    #[allow(deprecated)]
    let validation = CertificateValidationContext {
        ca_certificate_provider_instance: provider(ROOTS_CERTIFICATE),
        // gRPC matches this (every SAN type); it does not read the typed matchers.
        match_subject_alt_names: vec![StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(spiffe_id.to_owned())),
            ..Default::default()
        }],
        ..Default::default()
    };
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_provider_instance: provider(LEAF_CERTIFICATE),
            validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(validation)),
            ..Default::default()
        }),
        sni: sni.to_owned(),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

fn api_listener(name: &str) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: name.to_owned(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: name.to_owned(),
        })),
        http_filters: vec![http_filter("envoy.filters.http.router", pack_any(Router::default()))],
        ..Default::default()
    };
    Listener {
        name: name.to_owned(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(hcm)),
        }),
        ..Default::default()
    }
}

/// The clusters of a chain for a proxyless client: one EDS cluster per target, and the
/// aggregate cluster of each resolver with failover, which the chain's routes name (gRPC
/// implements `envoy.clusters.aggregate`: the members in order, the next one used while
/// those before it have no reachable endpoint).
fn chain_clusters(roots: &structs::IndexedCaRoots, chain: &CompiledDiscoveryChain, out: &mut Resources) {
    for target in chain.targets.values() {
        let spiffe = SpiffeIdService {
            trust_domain: roots.trust_domain.clone(),
            namespace: target.namespace.clone(),
            datacenter: target.datacenter.clone(),
            service: target.service.clone(),
        };
        let cluster = Cluster {
            name: target.sni.clone(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(cluster::EdsClusterConfig {
                eds_config: ads(),
                service_name: String::new(),
            }),
            connect_timeout: millis(target.connect_timeout_ms),
            lb_policy: cluster::LbPolicy::RoundRobin as i32,
            transport_socket: Some(upstream_tls(&target.sni, &spiffe.to_string())),
            ..Default::default()
        };
        out.insert(CLUSTER, target.sni.clone(), pack_any(cluster));
    }
    // gRPC refuses an aggregate cluster whose policy it does not implement (Envoy's
    // CLUSTER_PROVIDED among them); round robin is what it uses within each member.
    failover_clusters(chain, cluster::LbPolicy::RoundRobin, out);
}

/// The route configuration `name` for a chain: its routes when it has any, else every
/// request to the cluster its resolver names.
fn routes(
    name: &str,
    chain: &CompiledDiscoveryChain,
) -> Result<envoy_types::pb::envoy::config::route::v3::RouteConfiguration, RouteError> {
    match route_config(name, chain) {
        Ok(r) => Ok(r),
        Err(_) => tcp_cluster(chain).map(|cluster| route_to(name, &cluster)),
    }
}

/// Every listener, route configuration and cluster of a proxyless client.
pub(crate) fn build(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    for (id, upstream) in cp.upstreams.iter() {
        let Some(chain) = &upstream.chain else { continue };
        let name = id.name.clone();
        match routes(&name, chain) {
            Ok(r) => out.insert(ROUTE, name.clone(), pack_any(r)),
            Err(RouteError(why)) => {
                out.fail(id.to_string(), why, []);
                continue;
            }
        }
        out.insert(LISTENER, name.clone(), pack_any(api_listener(&name)));
        chain_clusters(roots, chain, out);
    }
    Ok(())
}
