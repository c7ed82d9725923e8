//! `meshd troubleshoot upstream` (`docs/troubleshoot.md`): a request walked as the proxy
//! would carry it to an upstream, from the proxy's own snapshot — its certificate, the
//! upstream's listener, the route that matches the request, the split legs, each leg's
//! resolver target with its subset filter, the healthy instances (and failover targets), the
//! instances to dial for the handshakes (`crate::troubleshoot_handshake`, done by the
//! caller) — and, when this node also serves the destination's proxies, their certificates against
//! the source's roots and back. One step per line; the first failing step is where the
//! request fails. The caller adds the handshakes and the intention that decides at each
//! service reached (`crate::status`).

use proxycfg::ConfigSnapshot;
use proxycfg::snapshot::UpstreamSnapshot;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use serde::Serialize;
use std::sync::Arc;
use structs::discovery_chain::NodeType;
use structs::{CompiledDiscoveryChain, IndexedCaRoots, IssuedCert};

/// The request to walk.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The upstream's destination name (or its id).
    pub upstream: String,
    /// The request's path (HTTP upstreams).
    pub path: String,
    /// Its method.
    pub method: String,
    /// Its headers.
    pub headers: Vec<(String, String)>,
}

/// One step of the walk.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Step {
    /// `certificate`, `upstream`, `listener`, `route`, `split`, `target`, `instances`, ...
    pub step: String,
    /// Whether the request gets past it.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// A step named `name`.
pub(crate) fn step(name: &str, ok: bool, detail: String) -> Step {
    Step {
        step: name.to_owned(),
        ok,
        detail,
    }
}

/// Whether `cert` is valid now and chains to one of `roots`; the verifier's reason if not.
pub fn check_cert(cert: &IssuedCert, roots: &IndexedCaRoots) -> Result<(), String> {
    let mut chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes());
    let leaf = match chain.next() {
        Some(Ok(leaf)) => leaf,
        Some(Err(e)) => return Err(format!("unreadable: {e}")),
        None => return Err("unreadable: no certificate".into()),
    };
    let intermediates: Vec<CertificateDer<'static>> = chain.filter_map(Result::ok).collect();
    verify_chain(&leaf, &intermediates, roots)
}

/// Whether `leaf` (with `intermediates`) is valid now and chains to one of `roots`.
pub fn verify_chain(
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &IndexedCaRoots,
) -> Result<(), String> {
    let mut store = rustls::RootCertStore::empty();
    for root in &roots.roots {
        for der in CertificateDer::pem_slice_iter(root.root_cert.as_bytes()).flatten() {
            let _ = store.add(der);
        }
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(store), crate::tls::config::provider())
            .build()
            .map_err(|e| format!("no usable root: {e}"))?;
    verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// How many instances of one target the `handshake` steps dial.
pub const MAX_PROBED_INSTANCES: usize = 3;

/// The instances of one target to dial, and where their steps go in the walk.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The walk's step index the handshake steps are inserted at.
    pub at: usize,
    /// The destination service (whose identity the instances must present).
    pub service: String,
    /// The SNI the source's Envoy sends for the target.
    pub sni: String,
    /// Each instance: (who, for people; `host:port` of its proxy).
    pub instances: Vec<(String, String)>,
}

/// A walk: its steps, and the services its request reaches (where intentions decide).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Walk {
    /// The steps, in the request's order.
    pub steps: Vec<Step>,
    /// The destination services the request reaches (each target's).
    pub reaches: Vec<String>,
    /// The instances to dial for the `handshake` steps (`crate::troubleshoot_handshake`).
    #[serde(skip)]
    pub probes: Vec<Probe>,
}

/// Walks `req` through `source`'s snapshot; `destinations` are the snapshots of the
/// destination's proxies this node serves (their certificates are checked too).
pub fn walk(source: &ConfigSnapshot, req: &Request, destinations: &[Arc<ConfigSnapshot>]) -> Walk {
    let mut reaches = Vec::new();
    let mut probes = Vec::new();
    let steps = walk_steps(source, req, destinations, &mut reaches, &mut probes);
    reaches.sort();
    reaches.dedup();
    Walk { steps, reaches, probes }
}

fn walk_steps(
    source: &ConfigSnapshot,
    req: &Request,
    destinations: &[Arc<ConfigSnapshot>],
    reaches: &mut Vec<String>,
    probes: &mut Vec<Probe>,
) -> Vec<Step> {
    let mut out = Vec::new();
    let Some(cp) = source.connect_proxy() else {
        out.push(step(
            "proxy",
            false,
            format!("{:?} proxies have no upstreams to walk", source.service_kind()),
        ));
        return out;
    };
    let roots = source.roots.as_deref();
    match (&cp.leaf, roots) {
        (Some(leaf), Some(roots)) => match check_cert(leaf, roots) {
            Ok(()) => out.push(step(
                "certificate",
                true,
                format!("{} valid until {}", leaf.service_uri, leaf.valid_before),
            )),
            Err(why) => out.push(step("certificate", false, format!("{}: {why}", leaf.service_uri))),
        },
        _ => out.push(step(
            "certificate",
            false,
            "the proxy has no certificate or no roots yet".into(),
        )),
    }
    let found = cp.upstreams.iter().find(|(id, u)| {
        id.name == req.upstream
            || id.to_string() == req.upstream
            || u.chain.as_ref().is_some_and(|c| c.service_name == req.upstream)
    });
    let Some((id, upstream)) = found else {
        let names: Vec<String> = cp.upstreams.keys().map(|id| id.to_string()).collect();
        out.push(step(
            "upstream",
            false,
            format!(
                "{} has no upstream {} (its upstreams: {})",
                source.proxy_id.service_id,
                req.upstream,
                names.join(", ")
            ),
        ));
        return out;
    };
    out.push(listener_step(source, upstream, id));
    let Some(chain) = &upstream.chain else {
        out.push(step(
            "chain",
            false,
            format!("the discovery chain of {id} is not known yet"),
        ));
        return out;
    };
    let mut reached = Vec::new();
    walk_node(chain, &chain.start_node, req, 1.0, &mut out, &mut reached);
    for (target, share) in reached {
        if let Some(t) = chain.targets.get(&target) {
            reaches.push(t.service.clone());
        }
        if let Some(probe) = target_steps(chain, upstream, &target, share, &mut out) {
            probes.push(probe);
        }
        destination_steps(source, chain, &target, destinations, &mut out);
    }
    out
}

fn listener_step(source: &ConfigSnapshot, upstream: &UpstreamSnapshot, id: &structs::UpstreamId) -> Step {
    match source.upstream_config(upstream) {
        Some(u) if !u.local_bind_socket_path.is_empty() => step(
            "listener",
            true,
            format!("upstream {id} listens on the socket {}", u.local_bind_socket_path),
        ),
        Some(u) if u.local_bind_port == 0 => step(
            "listener",
            true,
            format!(
                "upstream {id} has no local listener: the client resolves it itself (proxyless gRPC: xds:///{})",
                id.name
            ),
        ),
        Some(u) => {
            let addr = if u.local_bind_address.is_empty() {
                "127.0.0.1"
            } else {
                &u.local_bind_address
            };
            step(
                "listener",
                true,
                format!("upstream {id} listens on {addr}:{}", u.local_bind_port),
            )
        }
        None => step(
            "listener",
            true,
            format!("upstream {id} is reached through the outbound listener (transparent)"),
        ),
    }
}

/// Follows the chain from `name`, recording each router and splitter decision; the
/// resolvers reached, with the share of requests that reach each, go to `reached`.
fn walk_node(
    chain: &CompiledDiscoveryChain,
    name: &str,
    req: &Request,
    share: f64,
    out: &mut Vec<Step>,
    reached: &mut Vec<(structs::TargetId, f64)>,
) {
    let Some(node) = chain.nodes.get(name) else {
        out.push(step(
            "chain",
            false,
            format!("the chain names a node it does not have: {name}"),
        ));
        return;
    };
    match node.node_type {
        NodeType::Router => {
            let matched = node
                .routes
                .iter()
                .enumerate()
                .find(|(_, r)| route_matches(&r.definition, req));
            match matched {
                Some((i, r)) => {
                    out.push(step(
                        "route",
                        true,
                        format!(
                            "route {} of {} matches {}: to {}",
                            i + 1,
                            node.routes.len(),
                            req.path,
                            r.next_node
                        ),
                    ));
                    walk_node(chain, &r.next_node, req, share, out, reached);
                }
                None => out.push(step(
                    "route",
                    false,
                    format!("no route of {} matches {} {}", node.name, req.method, req.path),
                )),
            }
        }
        NodeType::Splitter => {
            let legs: Vec<String> = node
                .splits
                .iter()
                .map(|s| format!("{}% to {}", s.weight, s.next_node))
                .collect();
            out.push(step("split", true, legs.join(", ")));
            for leg in &node.splits {
                walk_node(
                    chain,
                    &leg.next_node,
                    req,
                    share * f64::from(leg.weight) / 100.0,
                    out,
                    reached,
                );
            }
        }
        NodeType::Resolver => match &node.resolver {
            Some(r) => reached.push((r.target.clone(), share)),
            None => out.push(step("chain", false, format!("resolver node {name} has no resolver"))),
        },
    }
}

/// Whether `route` matches the request (path, method, headers; query parameters are not
/// part of the walked request and count as matching).
fn route_matches(route: &structs::config_entry::ServiceRoute, req: &Request) -> bool {
    let Some(http) = route.match_.as_ref().and_then(|m| m.http.as_ref()) else {
        return true;
    };
    let path = req.path.split('?').next().unwrap_or_default();
    let path_ok = if !http.path_exact.is_empty() {
        path == http.path_exact
    } else if !http.path_prefix.is_empty() {
        path.starts_with(&http.path_prefix)
    } else if !http.path_regex.is_empty() {
        regex::Regex::new(&format!("^(?:{})$", http.path_regex)).is_ok_and(|re| re.is_match(path))
    } else {
        true
    };
    let method_ok = http.methods.is_empty() || http.methods.iter().any(|m| m.eq_ignore_ascii_case(&req.method));
    let headers_ok = http.header.iter().all(|h| {
        let value = req
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&h.name))
            .map(|(_, v)| v.as_str());
        let hit = match value {
            None => false,
            Some(_) if h.present => true,
            Some(v) if !h.exact.is_empty() => v == h.exact,
            Some(v) if !h.prefix.is_empty() => v.starts_with(&h.prefix),
            Some(v) if !h.suffix.is_empty() => v.ends_with(&h.suffix),
            Some(v) if !h.regex.is_empty() => {
                regex::Regex::new(&format!("^(?:{})$", h.regex)).is_ok_and(|re| re.is_match(v))
            }
            Some(_) => true,
        };
        hit != h.invert
    });
    path_ok && method_ok && headers_ok
}

/// The target's subset and healthy instances, and its failover targets when it has none.
fn target_steps(
    chain: &CompiledDiscoveryChain,
    upstream: &UpstreamSnapshot,
    target: &structs::TargetId,
    share: f64,
    out: &mut Vec<Step>,
) -> Option<Probe> {
    let describe = |t: &structs::TargetId| match chain.targets.get(t) {
        Some(d) if !d.subset.filter.is_empty() => format!("{} (subset {}: {})", t, d.service_subset, d.subset.filter),
        _ => t.to_string(),
    };
    let pct = share * 100.0;
    out.push(step(
        "target",
        true,
        format!("{pct:.0}% of requests resolve to {}", describe(target)),
    ));
    let healthy = |t: &structs::TargetId| upstream.endpoints.get(t).map_or(0, |nodes| nodes.len());
    let here = healthy(target);
    if here > 0 {
        out.push(step(
            "instances",
            true,
            format!("{} has {here} healthy instances", target),
        ));
        return probe(chain, upstream, target, out.len());
    }
    let failover = chain
        .nodes
        .values()
        .filter_map(|n| n.resolver.as_ref())
        .find(|r| r.target == *target)
        .and_then(|r| r.failover.as_ref())
        .and_then(|f| f.targets.iter().find(|t| healthy(t) > 0));
    match failover {
        Some(t) => {
            out.push(step(
                "instances",
                true,
                format!(
                    "{target} has no healthy instance: its requests fail over to {t} ({} healthy)",
                    healthy(t)
                ),
            ));
            probe(chain, upstream, t, out.len())
        }
        None => {
            out.push(step(
                "instances",
                false,
                format!(
                    "{target} has no healthy instance (and no failover target has one): {pct:.0}% of requests fail"
                ),
            ));
            None
        }
    }
}

/// The first healthy instances of `target` to dial, their steps to go at `at`.
fn probe(
    chain: &CompiledDiscoveryChain,
    upstream: &UpstreamSnapshot,
    target: &structs::TargetId,
    at: usize,
) -> Option<Probe> {
    let t = chain.targets.get(target)?;
    let instances = upstream
        .endpoints
        .get(target)?
        .iter()
        .take(MAX_PROBED_INSTANCES)
        .map(|n| {
            let host = n.address();
            let addr = if host.contains(':') {
                format!("[{host}]:{}", n.service.port)
            } else {
                format!("{host}:{}", n.service.port)
            };
            (format!("{} on {}", n.service.id, n.node.node), addr)
        })
        .collect();
    Some(Probe {
        at,
        service: t.service.clone(),
        sni: t.sni.clone(),
        instances,
    })
}

/// The certificates of the target service's proxies served here, checked against the
/// source's roots (the source verifies them) and the source's leaf against theirs.
fn destination_steps(
    source: &ConfigSnapshot,
    chain: &CompiledDiscoveryChain,
    target: &structs::TargetId,
    destinations: &[Arc<ConfigSnapshot>],
    out: &mut Vec<Step>,
) {
    let Some(service) = chain.targets.get(target).map(|t| t.service.as_str()) else {
        return;
    };
    let serving: Vec<&Arc<ConfigSnapshot>> = destinations
        .iter()
        .filter(|d| d.service.proxy.destination_service_name == service)
        .collect();
    if serving.is_empty() {
        return;
    }
    let (Some(roots), Some(leaf)) = (
        source.roots.as_deref(),
        source.connect_proxy().and_then(|c| c.leaf.as_ref()),
    ) else {
        return;
    };
    for dest in serving {
        let who = format!("{} on {}", dest.proxy_id.service_id, dest.proxy_id.node);
        let Some(dest_leaf) = dest.connect_proxy().and_then(|c| c.leaf.as_ref()) else {
            continue;
        };
        let theirs =
            check_cert(dest_leaf, roots).map_err(|e| format!("{who}'s certificate is not trusted by the source: {e}"));
        let ours = dest
            .roots
            .as_deref()
            .map_or(Ok(()), |r| check_cert(leaf, r))
            .map_err(|e| format!("the source's certificate is not trusted by {who}: {e}"));
        match theirs.and(ours) {
            Ok(()) => out.push(step(
                "mtls",
                true,
                format!("{who}: the certificates meshd issued it and the source trust each other"),
            )),
            Err(why) => out.push(step("mtls", false, why)),
        }
    }
}

/// Certificates for the tests of the walk and its handshakes.
#[cfg(test)]
pub(crate) mod test_certs {
    #![allow(clippy::unwrap_used)]
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};
    use structs::{IndexedCaRoots, IssuedCert};

    /// A CA: its PEM and its issuer.
    pub(crate) fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), Issuer::new(params, key))
    }

    /// A leaf for `spiffe://t.consul/ns/default/dc/dc1/svc/web`.
    pub(crate) fn leaf(issuer: &Issuer<'_, KeyPair>, expired: bool) -> IssuedCert {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let uri = "spiffe://t.consul/ns/default/dc/dc1/svc/web";
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth, ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 2);
        }
        IssuedCert {
            cert_pem: params.signed_by(&key, issuer).unwrap().pem(),
            service_uri: uri.into(),
            ..IssuedCert::default()
        }
    }

    /// Roots of trust domain `t.consul` holding `pem`.
    pub(crate) fn roots(pem: String) -> IndexedCaRoots {
        IndexedCaRoots {
            trust_domain: "t.consul".into(),
            roots: vec![structs::CaRoot {
                root_cert: pem,
                ..structs::CaRoot::default()
            }],
            ..IndexedCaRoots::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::test_certs::{ca, leaf, roots};
    use super::*;

    #[test]
    fn an_expired_or_untrusted_certificate_is_named_as_such() {
        let (ours, issuer) = ca("ours");
        let (_theirs, other) = ca("theirs");
        assert_eq!(check_cert(&leaf(&issuer, false), &roots(ours.clone())), Ok(()));
        let expired = check_cert(&leaf(&issuer, true), &roots(ours.clone())).unwrap_err();
        assert!(expired.to_lowercase().contains("expired"), "{expired}");
        let untrusted = check_cert(&leaf(&other, false), &roots(ours)).unwrap_err();
        assert!(
            untrusted.to_lowercase().contains("unknown") || untrusted.contains("issuer"),
            "{untrusted}"
        );
    }
}
