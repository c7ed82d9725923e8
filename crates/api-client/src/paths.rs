//! The API's paths, built from typed arguments. Every name is percent-encoded as one path
//! segment or query value, so a name holding `/`, `?` or `&` cannot change what is asked.
//! Blocking parameters (`index`, `wait`) are added by [`crate::Servers::get_blocking`].

/// Everything but RFC 3986's unreserved characters is percent-encoded in a name.
const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `name` as one path segment (or query value).
pub fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, RESERVED).to_string()
}

/// `GET`: the CA roots, as a server keeps them.
pub const CA_ROOTS: &str = "/v1/connect/ca/roots";
/// `GET`: the CA roots, as an agent (or a server) hands them to its proxies.
pub const AGENT_CA_ROOTS: &str = "/v1/agent/connect/ca/roots";
/// `POST`: a server signs a leaf for a CSR the caller made.
pub const CA_SIGN: &str = "/v1/internal/connect/ca/sign";
/// `GET`: the request token's rules and the servers' default policy (its index follows
/// every ACL change).
pub const ACL_AUTHORIZER: &str = "/v1/internal/acl/authorizer";
/// `PUT`: the first management token.
pub const ACL_BOOTSTRAP: &str = "/v1/acl/bootstrap";
/// `PUT`: create a policy.
pub const ACL_POLICY: &str = "/v1/acl/policy";
/// `PUT`: create a token.
pub const ACL_TOKEN: &str = "/v1/acl/token";
/// `PUT`: register a node, a service, checks.
pub const CATALOG_REGISTER: &str = "/v1/catalog/register";
/// `PUT`: remove a node, one of its services or checks.
pub const CATALOG_DEREGISTER: &str = "/v1/catalog/deregister";
/// `GET`: service names and their tags.
pub const CATALOG_SERVICES: &str = "/v1/catalog/services";
/// `GET`: the known datacenters.
pub const CATALOG_DATACENTERS: &str = "/v1/catalog/datacenters";
/// Every datacenter's mesh gateways, by datacenter.
pub const FEDERATION_MESH_GATEWAYS: &str = "/v1/internal/federation-states/mesh-gateways";
/// `GET`: the services registered on the agent.
pub const AGENT_SERVICES: &str = "/v1/agent/services";
/// `GET`: the agent's own configuration and member.
pub const AGENT_SELF: &str = "/v1/agent/self";
/// `PUT`: register a service on the agent.
pub const AGENT_SERVICE_REGISTER: &str = "/v1/agent/service/register";

/// `GET`: a node's services.
pub fn catalog_node(node: &str) -> String {
    format!("/v1/catalog/node/{}", segment(node))
}

/// `GET`: a service's instances.
pub fn catalog_service(service: &str) -> String {
    format!("/v1/catalog/service/{}", segment(service))
}

/// `GET`: the connect-capable instances of a service (its proxies, or native ones).
pub fn catalog_connect(service: &str) -> String {
    format!("/v1/catalog/connect/{}", segment(service))
}

/// `GET`: the services a gateway serves.
pub fn catalog_gateway_services(gateway: &str) -> String {
    format!("/v1/catalog/gateway-services/{}", segment(gateway))
}

/// `GET` (meshd's own): a service a peer exports here, with the peer's trust bundle.
pub fn peered_upstream(peer: &str, service: &str) -> String {
    format!("/v1/internal/peering/upstream/{}/{}", segment(peer), segment(service))
}

/// `GET` (meshd's own): the trust bundles of the peers a service is exported to.
pub fn peer_trust_bundles(service: &str) -> String {
    format!("/v1/internal/peering/trust-bundles/{}", segment(service))
}

/// `GET` (meshd's own): where the peering calls go (this cluster's servers, the dialed
/// peers').
pub const PEERING_SERVERS: &str = "/v1/internal/peering/servers";

/// `GET`: a node's checks.
pub fn health_node(node: &str) -> String {
    format!("/v1/health/node/{}", segment(node))
}

/// `GET`: a service's instances with their checks — of the service itself, or (`connect`)
/// of its proxies; only the passing ones with `passing`.
pub fn health_service(service: &str, connect: bool, passing: bool) -> String {
    format!(
        "/v1/health/{}/{}{}",
        if connect { "connect" } else { "service" },
        segment(service),
        if passing { "?passing" } else { "" }
    )
}

/// `GET`: as [`health_service`], of datacenter `dc` (`?dc=`: relayed by the servers).
pub fn health_service_in(service: &str, connect: bool, passing: bool, dc: &str) -> String {
    let path = health_service(service, connect, passing);
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}dc={}", segment(dc))
}

/// `GET`: intentions whose destination matches `service`, in evaluation order.
pub fn intentions_match_destination(service: &str) -> String {
    format!("/v1/connect/intentions/match?by=destination&name={}", segment(service))
}

/// `GET`: one config entry.
pub fn config_entry(kind: &str, name: &str) -> String {
    format!("/v1/config/{}/{}", segment(kind), segment(name))
}

/// `GET`: every config entry of a kind.
pub fn config_entries(kind: &str) -> String {
    format!("/v1/config/{}", segment(kind))
}

/// `PUT`: an agent's heartbeat for its node.
pub fn node_heartbeat(datacenter: &str) -> String {
    format!("/v1/internal/node/heartbeat?dc={}", segment(datacenter))
}

/// `GET`: a leaf certificate for `service`, from the agent.
pub fn agent_leaf(service: &str) -> String {
    format!("/v1/agent/connect/ca/leaf/{}", segment(service))
}

/// `GET`: what the proxy config engine holds for a proxy.
pub fn proxy_status(proxy_id: &str) -> String {
    format!("/v1/internal/proxy-status/{}", segment(proxy_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_change_the_path() {
        assert_eq!(catalog_node("a/../b"), "/v1/catalog/node/a%2F..%2Fb");
        assert_eq!(
            intentions_match_destination("web&by=source"),
            "/v1/connect/intentions/match?by=destination&name=web%26by%3Dsource"
        );
        assert_eq!(health_service("api", true, true), "/v1/health/connect/api?passing");
        assert_eq!(segment("web-1.v2_x"), "web-1.v2_x");
        assert_eq!(
            config_entry("service-defaults", "a b"),
            "/v1/config/service-defaults/a%20b"
        );
    }
}
