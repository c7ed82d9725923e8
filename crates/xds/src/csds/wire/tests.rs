use super::*;
use envoy_types::pb::envoy::admin::v3::UpdateFailureState;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ClientStatusResponse};
use prost::Message as _;
use std::time::Duration;

fn timestamp(at: SystemTime) -> envoy_types::pb::google::protobuf::Timestamp {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    envoy_types::pb::google::protobuf::Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

/// The same row built as prost's message.
fn generic(r: &ResourceRef<'_>) -> GenericXdsConfig {
    let (config_status, client_status) = statuses(r.state);
    GenericXdsConfig {
        error_state: r.error.map(|details| UpdateFailureState {
            details: details.to_owned(),
            version_info: r.version.to_owned(),
            last_update_attempt: r.updated.map(timestamp),
            ..UpdateFailureState::default()
        }),
        type_url: r.type_url.to_owned(),
        name: r.name.to_owned(),
        version_info: r.version.to_owned(),
        xds_config: r.value.cloned(),
        last_updated: r.updated.map(timestamp),
        config_status: config_status as i32,
        client_status: client_status as i32,
        is_static_resource: false,
    }
}

#[test]
fn the_answer_is_the_bytes_prost_writes_for_the_same_message() {
    let any = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        // Long enough that its length takes two bytes of varint.
        value: vec![7; 300],
    };
    let empty_any = Any::default();
    let at = SystemTime::UNIX_EPOCH + Duration::new(1_764_000_000, 123_456_789);
    let whole_second = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
    let row = |state, error, updated, value| ResourceRef {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        name: "api.default.dc1.internal.example.consul",
        version: "0123456789abcdef0123456789abcdef",
        state,
        error,
        updated,
        value,
    };
    let rows = [
        row(ResourceState::Synced, None, Some(at), Some(&any)),
        row(ResourceState::NotSent, None, None, None),
        row(ResourceState::Stale, None, Some(whole_second), Some(&empty_any)),
        row(ResourceState::Error, Some("cluster: bad thing"), Some(at), None),
        row(ResourceState::Error, Some(""), None, Some(&any)),
        ResourceRef {
            name: "",
            version: "",
            ..row(ResourceState::Synced, None, None, None)
        },
    ];
    let clients: [(&str, &[ResourceRef<'_>]); 3] = [("web-sidecar-proxy", &rows), ("", &[]), ("db", &rows[1..3])];

    let mut answer = Answer::with_capacity(0);
    for (node, rows) in clients {
        answer.client(node, rows);
    }
    let framed = answer.finish();

    let expected = ClientStatusResponse {
        config: clients
            .iter()
            .map(|(node, rows)| ClientConfig {
                node: Some(core::Node {
                    id: (*node).to_owned(),
                    ..core::Node::default()
                }),
                generic_xds_configs: rows.iter().map(generic).collect(),
                ..ClientConfig::default()
            })
            .collect(),
    }
    .encode_to_vec();
    assert_eq!(framed[0], 0, "uncompressed");
    assert_eq!(&framed[1..HEADER_BYTES], &(expected.len() as u32).to_be_bytes());
    assert_eq!(&framed[HEADER_BYTES..], expected.as_slice());
}

#[test]
fn no_proxy_is_an_empty_message() {
    assert_eq!(&Answer::with_capacity(0).finish()[..], &[0, 0, 0, 0, 0]);
}
