//! Property tests of the ADS protocol state machines (issue 18's fuzzing, structured): any
//! sequence of requests — arbitrary types, names, nonces, versions, NACKs, subscriptions —
//! against two versions of a proxy's resources. Never a panic; and the NACK-loop guarantee:
//! once the responses a request sequence calls for are out, asking again with nothing new
//! sends nothing (a rejected version is never resent on its own).
//!
//! `cargo xtask fuzz` runs many more cases (`PROPTEST_CASES`).
#![allow(clippy::unwrap_used)]

use crate::common::*;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};
use xds::delta::DeltaState;
use xds::resources::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use xds::sotw::SotwState;
use xds::versioned::VersionedResources;

/// Two versions of one proxy's resources (an endpoint change between them).
fn versions() -> &'static [Arc<VersionedResources>; 2] {
    static V: OnceLock<[Arc<VersionedResources>; 2]> = OnceLock::new();
    V.get_or_init(|| {
        let ca = Ca::new();
        let mut scenario = Scenario {
            protocol: "http",
            upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp")],
            intentions: vec![],
            instances: vec![instance("api", "10.0.0.1", 21000)],
        };
        let first = VersionedResources::build(&snapshot(&ca, &scenario), None).unwrap();
        scenario.instances.push(instance("api", "10.0.0.2", 21000));
        let second = VersionedResources::build(&snapshot(&ca, &scenario), None).unwrap();
        [Arc::new(first), Arc::new(second)]
    })
}

/// Names a request may carry: real ones of the resources, and made-up ones.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("api.default.dc1.internal.".to_owned()),
        Just("local_app".to_owned()),
        Just("public_listener".to_owned()),
        Just("*".to_owned()),
        "[a-z.:_*]{0,12}",
    ]
}

fn type_url() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(CLUSTER.to_owned()),
        Just(ENDPOINT.to_owned()),
        Just(LISTENER.to_owned()),
        Just(ROUTE.to_owned()),
        Just("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".to_owned()),
        Just(String::new()),
        "[a-z./]{0,20}",
    ]
}

/// A nonce: one the server may have sent (small numbers), or junk.
fn nonce() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (0u32..8).prop_map(|n| n.to_string()),
        "[a-z0-9]{0,6}"
    ]
}

fn nack() -> impl Strategy<Value = Option<RpcStatus>> {
    prop::option::of(Just(RpcStatus {
        code: 3,
        message: "rejected".into(),
        details: vec![],
    }))
}

fn delta_request() -> impl Strategy<Value = DeltaDiscoveryRequest> {
    (
        type_url(),
        prop::collection::vec(name(), 0..3),
        prop::collection::vec(name(), 0..2),
        nonce(),
        nack(),
        prop::collection::btree_map(name(), "[a-f0-9]{0,8}", 0..3),
    )
        .prop_map(|(type_url, sub, unsub, nonce, error, versions)| DeltaDiscoveryRequest {
            type_url,
            resource_names_subscribe: sub,
            resource_names_unsubscribe: unsub,
            response_nonce: nonce,
            error_detail: error,
            initial_resource_versions: versions.into_iter().collect(),
            ..Default::default()
        })
}

fn sotw_request() -> impl Strategy<Value = DiscoveryRequest> {
    (
        type_url(),
        prop::collection::vec(name(), 0..3),
        "[a-f0-9]{0,8}",
        nonce(),
        nack(),
    )
        .prop_map(|(type_url, names, version, nonce, error)| DiscoveryRequest {
            type_url,
            resource_names: names,
            version_info: version,
            response_nonce: nonce,
            error_detail: error,
            ..Default::default()
        })
}

proptest! {
    // Failures are kept beside this file and replayed first on every run: a crash found
    // becomes a regression test.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]
    #[test]
    fn delta_any_request_sequence(
        steps in prop::collection::vec((delta_request(), any::<bool>(), any::<bool>()), 1..24),
    ) {
        let v = versions();
        let mut state = DeltaState::default();
        let mut current = 0usize;
        for (req, ack_all, change) in steps {
            state.on_request(&req);
            if change {
                current = 1 - current;
            }
            let out = state.responses(&v[current]);
            // Asked again with nothing new: nothing is sent (no resend loop).
            prop_assert!(state.responses(&v[current]).is_empty());
            if ack_all {
                for r in &out {
                    state.on_request(&DeltaDiscoveryRequest {
                        type_url: r.type_url.clone(),
                        response_nonce: r.nonce.clone(),
                        ..Default::default()
                    });
                }
            }
        }
    }

    #[test]
    fn sotw_any_request_sequence(
        steps in prop::collection::vec((sotw_request(), any::<bool>(), any::<bool>()), 1..24),
    ) {
        let v = versions();
        let mut state = SotwState::default();
        let mut current = 0usize;
        for (req, ack_all, change) in steps {
            state.on_request(&req);
            if change {
                current = 1 - current;
            }
            let out = state.responses(&v[current]);
            prop_assert!(state.responses(&v[current]).is_empty());
            if ack_all {
                for r in &out {
                    state.on_request(&DiscoveryRequest {
                        type_url: r.type_url.clone(),
                        version_info: r.version_info.clone(),
                        response_nonce: r.nonce.clone(),
                        ..Default::default()
                    });
                }
            }
        }
    }

    /// A proxy that rejects every listener update: after its NACK nothing is sent until the
    /// resources change, and then only the new version.
    #[test]
    fn a_nacked_listener_is_never_resent(extra in prop::collection::vec(delta_request(), 0..6)) {
        let v = versions();
        let mut state = DeltaState::default();
        state.on_request(&DeltaDiscoveryRequest { type_url: LISTENER.into(), ..Default::default() });
        let first = state.responses(&v[0]);
        let lds = first.iter().find(|r| r.type_url == LISTENER).unwrap();
        state.on_request(&DeltaDiscoveryRequest {
            type_url: LISTENER.into(),
            response_nonce: lds.nonce.clone(),
            error_detail: Some(RpcStatus { code: 3, message: "no".into(), details: vec![] }),
            ..Default::default()
        });
        prop_assert!(state.responses(&v[0]).iter().all(|r| r.type_url != LISTENER));
        // Unrelated requests (other types, junk) do not bring the rejected listener back.
        for req in extra.into_iter().filter(|r| r.type_url != LISTENER) {
            state.on_request(&req);
            prop_assert!(state.responses(&v[0]).iter().all(|r| r.type_url != LISTENER));
        }
    }
}
