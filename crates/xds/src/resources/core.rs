//! Small constructors of Envoy core types that every resource kind uses: socket addresses,
//! the ADS config source, durations.

use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, CidrRange, ConfigSource, SocketAddress, address, config_source,
    socket_address,
};
use envoy_types::pb::envoy::config::listener::v3::{ListenerFilter, listener_filter};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::util::pack_any;
use std::net::IpAddr;

/// A TCP socket address.
pub(crate) fn socket(address: &str, port: u32) -> Option<Address> {
    Some(Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    })
}

/// A protobuf duration of `ms` milliseconds.
pub(crate) fn millis(ms: u32) -> Option<Duration> {
    Some(Duration {
        seconds: i64::from(ms / 1000),
        nanos: ((ms % 1000) * 1_000_000) as i32,
    })
}

/// The config source "over this same ADS stream".
pub(crate) fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    })
}

/// The range holding just `ip`.
pub(crate) fn cidr(ip: IpAddr) -> CidrRange {
    CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(UInt32Value {
            value: if ip.is_ipv4() { 32 } else { 128 },
        }),
    }
}

/// The listener filter that reads a TLS connection's SNI (and ALPN) for chain matching.
pub(crate) fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
            TlsInspector::default(),
        ))),
        ..Default::default()
    }
}
