//! Cluster peering: two independent meshes (their own servers, CAs and ACLs) that export
//! services to each other. The shapes follow Consul's `/v1/peering` API; the secrets that
//! authenticate the peering stream are kept apart from what the API shows.

use crate::Timestamp;
use crate::validate::{Problem, ValidationError};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Where a peering stands, with Consul's names and meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PeeringState {
    /// A token was generated here and no peer has used it yet.
    #[default]
    Pending,
    /// This side established the peering with a token and has not opened the stream yet.
    Establishing,
    /// The stream is up (or was, last time it was seen).
    Active,
    /// The stream broke or was refused, and is being tried again.
    Failing,
    /// Deleted here: the peer is told, imported data removed, then the peering is gone.
    Deleting,
    /// The peer deleted the peering; only a delete here is left to do.
    Terminated,
}

impl PeeringState {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PeeringState::Pending => "PENDING",
            PeeringState::Establishing => "ESTABLISHING",
            PeeringState::Active => "ACTIVE",
            PeeringState::Failing => "FAILING",
            PeeringState::Deleting => "DELETING",
            PeeringState::Terminated => "TERMINATED",
        }
    }

    /// Whether services flow in this state (the stream may carry them).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            PeeringState::Pending | PeeringState::Establishing | PeeringState::Active | PeeringState::Failing
        )
    }
}

impl fmt::Display for PeeringState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the peer is: its datacenter (partitions are always `default` here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeringRemote {
    /// The peer's partition.
    #[serde(rename = "Partition")]
    pub partition: String,
    /// The peer's datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
}

/// How the stream is doing, as the server holding it sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeringStreamStatus {
    /// Services the peer exports to this cluster.
    #[serde(rename = "ImportedServices")]
    pub imported_services: Vec<String>,
    /// Services this cluster exports to the peer.
    #[serde(rename = "ExportedServices")]
    pub exported_services: Vec<String>,
    /// When the peer last sent a heartbeat.
    #[serde(rename = "LastHeartbeat", skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Timestamp>,
    /// When anything was last received.
    #[serde(rename = "LastReceive", skip_serializing_if = "Option::is_none")]
    pub last_receive: Option<Timestamp>,
    /// When anything was last sent.
    #[serde(rename = "LastSend", skip_serializing_if = "Option::is_none")]
    pub last_send: Option<Timestamp>,
}

/// A peering, as `GET /v1/peering/:name` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Peering {
    /// This side's id of the peering.
    #[serde(rename = "ID")]
    pub id: String,
    /// The name this cluster gives the peer.
    #[serde(rename = "Name")]
    pub name: String,
    /// Always `default`.
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// When a delete was asked.
    #[serde(rename = "DeletedAt", skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<Timestamp>,
    /// User metadata.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Where the peering stands.
    #[serde(rename = "State")]
    pub state: PeeringState,
    /// The peer's id of the peering (empty until the peer is known).
    #[serde(rename = "PeerID", skip_serializing_if = "String::is_empty")]
    pub peer_id: String,
    /// The peer's CA roots: what its services' certificates chain to.
    #[serde(rename = "PeerCAPems")]
    pub peer_ca_pems: Vec<String>,
    /// The peer's trust domain (the host of its SPIFFE ids).
    #[serde(rename = "PeerTrustDomain", skip_serializing_if = "String::is_empty")]
    pub peer_trust_domain: String,
    /// The name the peer's servers present (`server.<dc>.peering.<trust domain>`).
    #[serde(rename = "PeerServerName", skip_serializing_if = "String::is_empty")]
    pub peer_server_name: String,
    /// The peer's servers' gRPC addresses, set on the side that dials (the one that
    /// established with a token).
    #[serde(rename = "PeerServerAddresses")]
    pub peer_server_addresses: Vec<String>,
    /// How many services the peer exports here.
    #[serde(rename = "ImportedServiceCount")]
    pub imported_service_count: u64,
    /// How many services this cluster exports to the peer.
    #[serde(rename = "ExportedServiceCount")]
    pub exported_service_count: u64,
    /// The stream's status (filled by the server answering).
    #[serde(rename = "StreamStatus")]
    pub stream_status: PeeringStreamStatus,
    /// Where the peer is.
    #[serde(rename = "Remote")]
    pub remote: PeeringRemote,
    /// A failure worth showing (meshd's own: why the stream is failing).
    #[serde(rename = "LastError", skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: crate::Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: crate::Index,
}

impl Peering {
    /// Whether this side dials the peer (it established the peering with a token).
    pub fn is_dialer(&self) -> bool {
        !self.peer_server_addresses.is_empty()
    }
}

/// The secrets of one peering. Never shown by the API, never logged.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeringSecrets {
    /// The acceptor's one-time secret of the last generated token, until a peer exchanges it.
    pub establishment: Option<String>,
    /// The stream secret in use.
    pub stream_active: Option<String>,
    /// A stream secret handed out by an exchange and not yet used to open a stream; it
    /// becomes the active one when it is.
    pub stream_pending: Option<String>,
}

impl fmt::Debug for PeeringSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |s: &Option<String>| if s.is_some() { "<redacted>" } else { "None" };
        f.debug_struct("PeeringSecrets")
            .field("establishment", &shown(&self.establishment))
            .field("stream_active", &shown(&self.stream_active))
            .field("stream_pending", &shown(&self.stream_pending))
            .finish()
    }
}

/// A peering as the catalog keeps it: what the API shows and the secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoredPeering {
    /// What the API shows (its stream status is filled when read).
    pub peering: Peering,
    /// The secrets.
    pub secrets: PeeringSecrets,
    /// The peer's healthy mesh gateways (at the addresses this cluster reaches them at):
    /// where proxies here connect to reach every service the peer exports here.
    pub gateways: Vec<crate::CheckServiceNode>,
}

/// What a peering token carries: base64 of this JSON, as Consul's.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeringToken {
    /// The acceptor's CA roots (PEM): what its servers' TLS is verified with.
    #[serde(rename = "CA")]
    pub ca: Vec<String>,
    /// Addresses given by `ServerExternalAddresses`, used instead of the servers' own.
    #[serde(rename = "ManualServerAddresses")]
    pub manual_server_addresses: Vec<String>,
    /// The acceptor's servers' gRPC addresses.
    #[serde(rename = "ServerAddresses")]
    pub server_addresses: Vec<String>,
    /// The name the acceptor's servers present.
    #[serde(rename = "ServerName")]
    pub server_name: String,
    /// The acceptor's id of the peering.
    #[serde(rename = "PeerID")]
    pub peer_id: String,
    /// The one-time secret exchanged for a stream secret.
    #[serde(rename = "EstablishmentSecret")]
    pub establishment_secret: String,
    /// Where the acceptor is.
    #[serde(rename = "Remote")]
    pub remote: PeeringRemote,
}

impl fmt::Debug for PeeringToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeeringToken")
            .field("server_addresses", &self.server_addresses)
            .field("manual_server_addresses", &self.manual_server_addresses)
            .field("server_name", &self.server_name)
            .field("peer_id", &self.peer_id)
            .field("establishment_secret", &"<redacted>")
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl PeeringToken {
    /// The token as users pass it around: base64 of its JSON.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    /// Reads a token, naming what is wrong with it.
    pub fn decode(token: &str) -> Result<Self, ValidationError> {
        let bad = |why: String| ValidationError::new("PeeringToken", Problem::Invalid(why));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(token.trim())
            .map_err(|e| bad(format!("not base64: {e}")))?;
        let token: PeeringToken =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a peering token: {e}")))?;
        if token.peer_id.is_empty() {
            return Err(bad("has no PeerID".into()));
        }
        if token.establishment_secret.is_empty() {
            return Err(bad("has no EstablishmentSecret".into()));
        }
        if token.addresses().is_empty() {
            return Err(bad("has no server address".into()));
        }
        if token.ca.is_empty() {
            return Err(bad(
                "has no CA: the peer's servers serve no gRPC TLS (generate it on a server with -grpc-tls-addr)".into(),
            ));
        }
        for address in token.addresses() {
            check_address(address).map_err(bad)?;
        }
        Ok(token)
    }

    /// Where to dial: the manual addresses when given, else the servers'.
    pub fn addresses(&self) -> &[String] {
        if self.manual_server_addresses.is_empty() {
            &self.server_addresses
        } else {
            &self.manual_server_addresses
        }
    }
}

/// `POST /v1/peering/token`'s body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateTokenRequest {
    /// The name this cluster gives the peer.
    #[serde(rename = "PeerName")]
    pub peer_name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition")]
    pub partition: String,
    /// User metadata for the peering.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Addresses the peer should dial instead of the servers' own.
    #[serde(rename = "ServerExternalAddresses")]
    pub server_external_addresses: Vec<String>,
}

/// `POST /v1/peering/token`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateTokenResponse {
    /// The token to hand to the peer.
    #[serde(rename = "PeeringToken")]
    pub peering_token: String,
}

/// `POST /v1/peering/establish`'s body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EstablishRequest {
    /// The name this cluster gives the peer.
    #[serde(rename = "PeerName")]
    pub peer_name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition")]
    pub partition: String,
    /// The token the peer generated.
    #[serde(rename = "PeeringToken")]
    pub peering_token: String,
    /// User metadata for the peering.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
}

pub use crate::validate::check_peer_name;

/// Checks the partition of a peering request: only `default`.
pub fn check_partition(partition: &str) -> Result<(), ValidationError> {
    if partition.is_empty() || partition == "default" {
        Ok(())
    } else {
        Err(ValidationError::new(
            "Partition",
            Problem::Invalid(format!("only \"default\" is supported, got {partition:?}")),
        ))
    }
}

/// Checks one server address (`host:port`).
pub fn check_address(address: &str) -> Result<(), String> {
    let ok = !address.contains('/')
        && address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if ok {
        Ok(())
    } else {
        Err(format!("server address {address:?} is not host:port"))
    }
}

impl GenerateTokenRequest {
    /// Refuses a request that cannot be honoured, naming the field.
    pub fn check(&self) -> Result<(), ValidationError> {
        check_peer_name("PeerName", &self.peer_name)?;
        check_partition(&self.partition)?;
        for (i, address) in self.server_external_addresses.iter().enumerate() {
            check_address(address)
                .map_err(|why| ValidationError::new(format!("ServerExternalAddresses[{i}]"), Problem::Invalid(why)))?;
        }
        Ok(())
    }
}

impl EstablishRequest {
    /// Refuses a request that cannot be honoured, naming the field; the token decoded.
    pub fn check(&self) -> Result<PeeringToken, ValidationError> {
        check_peer_name("PeerName", &self.peer_name)?;
        check_partition(&self.partition)?;
        if self.peering_token.is_empty() {
            return Err(ValidationError::new("PeeringToken", Problem::Required("")));
        }
        PeeringToken::decode(&self.peering_token)
    }
}

/// One service a peer exports to this cluster, as the exporter last sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImportedService {
    /// The service's name (in the exporting cluster, and here).
    #[serde(rename = "Name")]
    pub name: String,
    /// Its instances with their checks, as `/v1/health/service/:name?peer=` shows them.
    #[serde(rename = "Instances")]
    pub instances: Vec<crate::CheckServiceNode>,
    /// Where proxies here connect to reach it: the exporter's healthy mesh gateways, at
    /// their WAN addresses (the exporter routes the connection by SNI).
    #[serde(rename = "MeshGateways")]
    pub mesh_gateways: Vec<crate::CheckServiceNode>,
    /// The SNI the exporter's gateways route to the service.
    #[serde(rename = "SNI")]
    pub sni: String,
    /// The SPIFFE ids its instances present (in the exporter's trust domain).
    #[serde(rename = "SpiffeIDs")]
    pub spiffe_ids: Vec<String>,
    /// Its protocol in the exporting cluster (`tcp`, `http`, ...).
    #[serde(rename = "Protocol")]
    pub protocol: String,
    /// The exporter's digest of the rest: what a reconnecting stream compares to send only
    /// what changed.
    #[serde(rename = "Digest")]
    pub digest: String,
}

/// The CA roots of a peer, as a proxy here needs them: to verify the peer's services (an
/// upstream there) or to accept the peer's callers (a service exported to it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerTrustBundle {
    /// The peer, by the name this cluster gives it.
    #[serde(rename = "PeerName")]
    pub peer: String,
    /// Its trust domain.
    #[serde(rename = "TrustDomain")]
    pub trust_domain: String,
    /// Its datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Its CA roots (PEM).
    #[serde(rename = "RootPEMs")]
    pub root_pems: Vec<String>,
}

/// What a proxy here needs of one service a peer exports: the service (its mesh gateways,
/// SNI, identities, protocol) and the peer's roots to verify it with. Either is `None` while
/// unknown (the peer does not export it, or the peering is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeredUpstream {
    /// The service as the peer exports it.
    #[serde(rename = "Service")]
    pub service: Option<ImportedService>,
    /// The peer's trust bundle.
    #[serde(rename = "Bundle")]
    pub bundle: Option<PeerTrustBundle>,
}

/// Where the peering calls go, for mesh gateways carrying them
/// (`Peering.PeerThroughMeshGateways`): this cluster's servers, and the servers of each peer
/// this cluster dials.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeeringServers {
    /// This cluster's servers' peering (gRPC TLS) addresses.
    #[serde(rename = "Local")]
    pub local: Vec<String>,
    /// The peers this cluster dials.
    #[serde(rename = "Dialed")]
    pub dialed: Vec<DialedServers>,
    /// The services peers export here: where this cluster's gateways send the connections
    /// of sidecars in mesh gateway mode `local`.
    #[serde(rename = "Imported")]
    pub imported: Vec<ImportedRoute>,
}

/// One service a peer exports here, as a mesh gateway routes connections to it: by its SNI,
/// to the peer's gateways.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImportedRoute {
    /// The peer, by the name this cluster gives it.
    #[serde(rename = "Peer")]
    pub peer: String,
    /// The SNI the peer's gateways route to the service.
    #[serde(rename = "SNI")]
    pub sni: String,
    /// The peer's gateways, `host:port` as this cluster reaches them.
    #[serde(rename = "Gateways")]
    pub gateways: Vec<String>,
}

/// One peer this cluster dials: the name its servers present and where they are reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DialedServers {
    /// The name this cluster gives the peer.
    #[serde(rename = "Peer")]
    pub peer: String,
    /// `server.<dc>.peering.<trust domain>` of the peer.
    #[serde(rename = "ServerName")]
    pub server_name: String,
    /// The peer's servers (or its mesh gateways), `host:port`.
    #[serde(rename = "Addresses")]
    pub addresses: Vec<String>,
}

/// An SNI name for a service exported to a peer, as the exporting cluster's mesh gateway
/// routes it: `<service>.default.default.<peer>.external.<trust domain>`, where the peer is
/// the name the exporting cluster gives the importing one.
pub fn peered_service_sni(service: &str, peer: &str, trust_domain: &str) -> String {
    format!("{service}.default.default.{peer}.external.{trust_domain}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_ones_are_named() {
        let token = PeeringToken {
            server_addresses: vec!["127.0.0.1:8502".into()],
            server_name: "server.dc1.peering.example".into(),
            peer_id: "id-1".into(),
            establishment_secret: "s3cret".into(),
            ca: vec!["-----BEGIN CERTIFICATE-----".into()],
            ..PeeringToken::default()
        };
        let decoded = PeeringToken::decode(&token.encode()).expect("decodes");
        assert_eq!(decoded, token);
        assert!(!format!("{token:?}").contains("s3cret"));
        let err = PeeringToken::decode("%%%").expect_err("not base64");
        assert_eq!(err.field, "PeeringToken");
        let no_address = PeeringToken {
            server_addresses: vec![],
            ..token.clone()
        };
        assert!(PeeringToken::decode(&no_address.encode()).is_err());
        let bad_address = PeeringToken {
            server_addresses: vec!["nope".into()],
            ..token
        };
        let err = PeeringToken::decode(&bad_address.encode()).expect_err("bad address");
        assert!(err.to_string().contains("not host:port"), "{err}");
        // Never plaintext: a token without the CA to verify the servers with is refused.
        let no_ca = PeeringToken {
            ca: vec![],
            server_addresses: vec!["127.0.0.1:8503".into()],
            ..bad_address
        };
        let err = PeeringToken::decode(&no_ca.encode()).expect_err("no CA");
        assert!(err.to_string().contains("has no CA"), "{err}");
    }

    #[test]
    fn peer_names_are_dns_labels() {
        assert!(check_peer_name("PeerName", "cluster-b").is_ok());
        for bad in ["", "Cluster", "a.b", "-a", "a_b", &"x".repeat(64)] {
            assert!(check_peer_name("PeerName", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_are_never_printed() {
        let secrets = PeeringSecrets {
            establishment: Some("s3cret-a".into()),
            stream_active: Some("s3cret-b".into()),
            stream_pending: None,
        };
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
