//! Small constructors of Envoy core types that every resource kind uses: socket addresses,
//! the ADS config source, durations.

use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress, address, config_source, socket_address,
};
use envoy_types::pb::google::protobuf::Duration;

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
