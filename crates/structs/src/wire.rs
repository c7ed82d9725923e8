//! Names that cross process boundaries: HTTP headers, gRPC metadata keys and Envoy node
//! metadata fields that meshd, its proxies and Consul's clients agree on. One definition
//! each, so a writer and its reader cannot drift apart.

/// HTTP header and gRPC metadata key that carries an ACL token (Consul's).
pub const TOKEN_HEADER: &str = "x-consul-token";

/// Envoy node metadata field naming the catalog node of the proxy.
pub const NODE_NAME_METADATA: &str = "node_name";

/// The certificate provider instance a proxyless gRPC client's bootstrap defines (over the
/// files `meshd connect grpc-bootstrap -cert-dir` writes) and meshd's clusters refer to.
pub const PROXYLESS_CERT_PROVIDER: &str = "meshd";

/// HTTP response header carrying the catalog index of a blocking-capable read.
pub const INDEX_HEADER: &str = "x-consul-index";

/// HTTP response header saying whether the answering server knows a leader.
pub const KNOWN_LEADER_HEADER: &str = "x-consul-knownleader";

/// HTTP response header with the milliseconds since the server last heard from the leader.
pub const LAST_CONTACT_HEADER: &str = "x-consul-lastcontact";

/// On a listing the token could not see all of: `true`.
pub const FILTERED_HEADER: &str = "x-consul-results-filtered-by-acls";
