//! Intentions' JWT requirements on a sidecar's public listener, in two halves (as Consul):
//!
//! - Envoy's `jwt_authn` HTTP filter, before the intentions' RBAC, verifies a request's
//!   token against each provider the intentions name (its keys inline, from a file, or
//!   fetched from a URL through a cluster `jwks_cluster_<provider>`), and writes the payload
//!   of a valid token into the request's dynamic metadata under `jwt_payload_<provider>`.
//!   It never refuses a request itself (`allow_missing_or_failed`): a request without a
//!   valid token simply has no payload.
//! - The RBAC ([`super::rbac`]) decides: a requirement holds when one of its providers'
//!   payloads is there with every claim it lists. A requirement that does not hold refuses
//!   the request (403), whatever the intention's action would have been.
//!
//! A provider the intentions name that does not exist (or that the proxy could not read)
//! has no payload, so its requirements fail closed; the proxy's status shows it (`jwt`).

use super::Resources;
use super::core::{millis, socket};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    BackoffStrategy, DataSource, HttpUri, RetryPolicy, TransportSocket, data_source, http_uri, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwksAsyncFetch, JwtCacheConfig, JwtHeader, JwtProvider as EnvoyProvider, JwtRequirement, JwtRequirementAndList,
    JwtRequirementOrList, RemoteJwks as EnvoyRemoteJwks, RequirementRule, jwt_provider, jwt_requirement,
    requirement_rule,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    certificate_validation_context, common_tls_context, subject_alt_name_matcher,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Any, Duration, Empty, UInt32Value};
use envoy_types::util::pack_any;
use prost::{Message, Name};
use proxycfg::ConnectProxySnapshot;
use std::collections::BTreeSet;
use structs::Intention;
use structs::config_entry::{JwksTrustedCa, JwtProvider, RemoteJwks};

/// The filter's name, also the namespace of the payloads in the dynamic metadata.
pub(crate) const FILTER: &str = "envoy.filters.http.jwt_authn";

/// Where a provider's verified payload is put in the dynamic metadata.
pub(crate) fn payload_key(provider: &str) -> String {
    format!("jwt_payload_{provider}")
}

/// The cluster that fetches a provider's remote key set.
pub(crate) fn cluster_name(provider: &str) -> String {
    format!("jwks_cluster_{provider}")
}

/// The providers `intentions` require (the entries' `JWT` and their permissions'), sorted.
pub(crate) fn required(intentions: &[Intention]) -> BTreeSet<&str> {
    let mut names = BTreeSet::new();
    for ixn in intentions {
        let reqs = ixn
            .jwt
            .iter()
            .chain(ixn.permissions.iter().filter_map(|p| p.jwt.as_ref()));
        for req in reqs {
            names.extend(req.providers.iter().map(|p| p.name.as_str()));
        }
    }
    names
}

/// The `jwt_authn` filter's configuration for the required providers that exist, and the
/// JWKS clusters of the remote ones, into `out`; a missing provider is a problem (`jwt`).
/// `None` when no intention requires a token, or none of the providers exists.
pub(crate) fn build(cp: &ConnectProxySnapshot, intentions: &[Intention], out: &mut Resources) -> Option<Any> {
    let names = required(intentions);
    if names.is_empty() {
        return None;
    }
    let mut providers = Vec::new();
    let mut missing = Vec::new();
    for name in names {
        match cp.jwt_provider(name) {
            Some(p) => {
                if let Some(remote) = &p.json_web_key_set.remote
                    && let Some(c) = jwks_cluster(name, remote)
                {
                    out.insert(super::CLUSTER, c.name.clone(), pack_any(c));
                }
                providers.push((name.to_owned(), provider(p)));
            }
            None => missing.push(name),
        }
    }
    if !missing.is_empty() {
        out.problems.insert(
            "jwt".into(),
            format!(
                "intentions require tokens of jwt-provider {} that does not exist (or the proxy may not read): requests needing it are refused",
                missing.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
            ),
        );
    }
    // With no provider there is nothing to verify: no filter, and every requirement fails
    // closed in the RBAC.
    (!providers.is_empty()).then(|| filter_config(providers))
}

/// The JWKS cluster names of the remote providers a snapshot's intentions require.
pub(crate) fn cluster_names(cp: &ConnectProxySnapshot) -> Vec<String> {
    let Some(intentions) = cp.intentions.as_deref() else {
        return Vec::new();
    };
    required(intentions)
        .into_iter()
        .filter(|n| {
            cp.jwt_provider(n)
                .is_some_and(|p| p.json_web_key_set.remote.as_ref().and_then(RemoteJwks::url).is_some())
        })
        .map(cluster_name)
        .collect()
}

/// One provider as Envoy's.
fn provider(p: &JwtProvider) -> EnvoyProvider {
    let mut e = EnvoyProvider {
        issuer: p.issuer.clone(),
        audiences: p.audiences.clone(),
        payload_in_metadata: payload_key(&p.name),
        clock_skew_seconds: if p.clock_skew_seconds == 0 {
            30
        } else {
            p.clock_skew_seconds
        },
        ..Default::default()
    };
    if let Some(f) = &p.forwarding {
        e.forward_payload_header = f.header_name.clone();
        e.pad_forward_payload_header = f.pad_forward_payload_header;
    }
    if let Some(c) = &p.cache_config
        && c.size > 0
    {
        e.jwt_cache_config = Some(JwtCacheConfig {
            jwt_cache_size: c.size,
            ..Default::default()
        });
    }
    for l in &p.locations {
        if let Some(h) = &l.header {
            e.forward |= h.forward;
            e.from_headers.push(JwtHeader {
                name: h.name.clone(),
                value_prefix: h.value_prefix.clone(),
            });
        } else if let Some(q) = &l.query_param {
            e.from_params.push(q.name.clone());
        } else if let Some(c) = &l.cookie {
            e.from_cookies.push(c.name.clone());
        }
    }
    let set = &p.json_web_key_set;
    e.jwks_source_specifier = if let Some(local) = &set.local {
        let specifier = if local.filename.is_empty() {
            data_source::Specifier::InlineString(local.jwks_json().unwrap_or_default())
        } else {
            data_source::Specifier::Filename(local.filename.clone())
        };
        Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(specifier),
            ..Default::default()
        }))
    } else {
        set.remote
            .as_ref()
            .map(|r| jwt_provider::JwksSourceSpecifier::RemoteJwks(remote(&p.name, r)))
    };
    e
}

fn duration(d: std::time::Duration) -> Option<Duration> {
    Some(Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    })
}

/// A remote key set: fetched through its cluster, cached for `CacheDuration` (Envoy's 5
/// minutes by default), on the first request or (`FetchAsynchronously`) before the listener
/// takes requests.
fn remote(provider: &str, r: &RemoteJwks) -> EnvoyRemoteJwks {
    EnvoyRemoteJwks {
        http_uri: Some(HttpUri {
            uri: r.uri.clone(),
            timeout: millis(if r.request_timeout_ms == 0 {
                1000
            } else {
                r.request_timeout_ms
            }),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster_name(provider))),
        }),
        cache_duration: r.cache_duration.and_then(|d| duration(d.0)),
        async_fetch: r.fetch_asynchronously.then_some(JwksAsyncFetch {
            fast_listener: false,
            ..Default::default()
        }),
        retry_policy: r.retry_policy.as_ref().map(|p| RetryPolicy {
            num_retries: Some(UInt32Value { value: p.num_retries }),
            retry_back_off: p.retry_policy_back_off.as_ref().map(|b| BackoffStrategy {
                base_interval: b.base_interval.and_then(|d| duration(d.0)),
                max_interval: b.max_interval.and_then(|d| duration(d.0)),
            }),
            ..Default::default()
        }),
    }
}

/// The cluster to a remote key set's host: DNS for a name, static for an address; TLS for
/// `https`, checking the host's certificate against `TrustedCA` (else the system's roots)
/// and its name.
fn jwks_cluster(provider: &str, r: &RemoteJwks) -> Option<Cluster> {
    let url = r.url()?;
    let config = r.jwks_cluster.clone().unwrap_or_default();
    let is_ip = url.host.parse::<std::net::IpAddr>().is_ok();
    let discovery = match config.discovery_type.as_str() {
        "STATIC" => cluster::DiscoveryType::Static,
        "LOGICAL_DNS" => cluster::DiscoveryType::LogicalDns,
        "STRICT_DNS" => cluster::DiscoveryType::StrictDns,
        _ if is_ip => cluster::DiscoveryType::Static,
        _ => cluster::DiscoveryType::StrictDns,
    };
    let name = cluster_name(provider);
    let mut c = Cluster {
        name: name.clone(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(discovery as i32)),
        connect_timeout: config.connect_timeout.and_then(|d| duration(d.0)).or(millis(5000)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name,
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket(&url.host, u32::from(url.port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    if url.tls {
        let trusted = config.tls_certificates.as_ref().and_then(|t| t.trusted_ca.as_ref());
        c.transport_socket = Some(jwks_tls(&url.host, is_ip, r.use_sni, trusted));
    }
    Some(c)
}

fn jwks_tls(host: &str, is_ip: bool, use_sni: bool, trusted: Option<&JwksTrustedCa>) -> TransportSocket {
    let mut validation = CertificateValidationContext {
        match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
            san_type: if is_ip {
                subject_alt_name_matcher::SanType::IpAddress
            } else {
                subject_alt_name_matcher::SanType::Dns
            } as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(host.to_owned())),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    match trusted {
        Some(ca) => {
            let specifier = if !ca.filename.is_empty() {
                data_source::Specifier::Filename(ca.filename.clone())
            } else if !ca.environment_variable.is_empty() {
                data_source::Specifier::EnvironmentVariable(ca.environment_variable.clone())
            } else if !ca.inline_string.is_empty() {
                data_source::Specifier::InlineString(ca.inline_string.clone())
            } else {
                data_source::Specifier::InlineBytes(ca.inline_bytes_decoded().unwrap_or_default())
            };
            validation.trusted_ca = Some(DataSource {
                specifier: Some(specifier),
                ..Default::default()
            });
        }
        None => validation.system_root_certs = Some(certificate_validation_context::SystemRootCerts {}),
    }
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(validation)),
            ..Default::default()
        }),
        sni: if use_sni { host.to_owned() } else { String::new() },
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// Every request, whatever its path, is checked against every provider; none is refused
/// here (the RBAC decides).
fn requirement(names: &[String]) -> JwtRequirement {
    let each = |name: &String| JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::RequiresAny(JwtRequirementOrList {
            requirements: vec![
                JwtRequirement {
                    requires_type: Some(jwt_requirement::RequiresType::ProviderName(name.clone())),
                },
                JwtRequirement {
                    requires_type: Some(jwt_requirement::RequiresType::AllowMissingOrFailed(Empty {})),
                },
            ],
        })),
    };
    if names.len() == 1 {
        return each(&names[0]);
    }
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::RequiresAll(JwtRequirementAndList {
            requirements: names.iter().map(each).collect(),
        })),
    }
}

/// `JwtAuthentication`'s providers (a map) and rules, encoded with the providers in name
/// order: the same wire form as the map's, in an order that does not change between builds.
#[derive(Clone, PartialEq, prost::Message)]
struct OrderedJwtAuthentication {
    #[prost(message, repeated, tag = "1")]
    providers: Vec<ProviderEntry>,
    #[prost(message, repeated, tag = "2")]
    rules: Vec<RequirementRule>,
}

/// One entry of the providers map on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct ProviderEntry {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    provider: Option<EnvoyProvider>,
}

/// The filter's configuration for `providers` (in name order, at least one).
fn filter_config(providers: Vec<(String, EnvoyProvider)>) -> Any {
    let names: Vec<String> = providers.iter().map(|(n, _)| n.clone()).collect();
    let rules = vec![RequirementRule {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        requirement_type: Some(requirement_rule::RequirementType::Requires(requirement(&names))),
    }];
    let value = OrderedJwtAuthentication {
        providers: providers
            .into_iter()
            .map(|(name, provider)| ProviderEntry {
                name,
                provider: Some(provider),
            })
            .collect(),
        rules,
    }
    .encode_to_vec();
    Any {
        type_url: envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication::type_url(),
        value,
    }
}
