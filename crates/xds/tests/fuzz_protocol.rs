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

    /// Whatever a well-behaved client subscribes to, and however the resources move, once
    /// it has taken every response it holds exactly what it wants of the current resources:
    /// every cluster (a wildcard) and the load assignments it subscribed to, each at its
    /// current version, and nothing else.
    #[test]
    fn a_delta_client_converges_on_what_it_wants(steps in prop::collection::vec(client_step(), 1..30)) {
        let v = client_versions();
        let mut state = DeltaState::default();
        let mut view = ClientView::new();
        let mut queue = Vec::new();
        let mut subscribed = std::collections::BTreeSet::new();
        let mut current = 0;
        state.on_request(&DeltaDiscoveryRequest { type_url: CLUSTER.into(), ..Default::default() });
        state.on_request(&DeltaDiscoveryRequest {
            type_url: ENDPOINT.into(),
            resource_names_subscribe: vec!["a".into()],
            ..Default::default()
        });
        subscribed.insert("a".to_owned());
        for step in steps {
            match step {
                ClientStep::Subscribe(t, names) | ClientStep::Unsubscribe(t, names) if t == 0 => {
                    let _ = names; // clusters: a wildcard subscription stays one
                }
                ClientStep::Subscribe(_, names) => {
                    let names: Vec<String> = names.iter().map(|n| CLIENT_NAMES[*n].to_owned()).collect();
                    subscribed.extend(names.iter().cloned());
                    state.on_request(&DeltaDiscoveryRequest {
                        type_url: ENDPOINT.into(),
                        resource_names_subscribe: names,
                        ..Default::default()
                    });
                }
                ClientStep::Unsubscribe(_, names) => {
                    let names: Vec<String> = names.iter().map(|n| CLIENT_NAMES[*n].to_owned()).collect();
                    for n in &names {
                        subscribed.remove(n);
                        view.entry(ENDPOINT).or_default().remove(n);
                    }
                    state.on_request(&DeltaDiscoveryRequest {
                        type_url: ENDPOINT.into(),
                        resource_names_unsubscribe: names,
                        ..Default::default()
                    });
                }
                ClientStep::Resources(i) => current = i,
                ClientStep::Take => take_all(&mut state, &mut queue, &mut view, &subscribed),
            }
            queue.extend(state.responses(&v[current]));
        }
        for _ in 0..16 {
            take_all(&mut state, &mut queue, &mut view, &subscribed);
            queue.extend(state.responses(&v[current]));
            if queue.is_empty() {
                break;
            }
        }
        prop_assert!(queue.is_empty(), "the responses ended");
        for t in CLIENT_TYPES {
            let want: std::collections::BTreeMap<String, String> = v[current]
                .of(t)
                .filter(|(n, _)| t == CLUSTER || subscribed.contains(*n))
                .map(|(n, r)| (n.to_owned(), r.version.clone()))
                .collect();
            let held = view.get(t).cloned().unwrap_or_default();
            prop_assert_eq!(held, want, "{}", t);
        }
    }
}

/// One step of a well-behaved delta client (as Envoy): subscribe or unsubscribe names of a
/// type, the proxy's resources moving to another version, or the client taking (applying
/// and ACKing) every response sent so far; responses may wait while it subscribes more.
#[derive(Debug, Clone)]
enum ClientStep {
    Subscribe(usize, Vec<usize>),
    Unsubscribe(usize, Vec<usize>),
    Resources(usize),
    Take,
}

const CLIENT_TYPES: [&str; 2] = [CLUSTER, ENDPOINT];
const CLIENT_NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

fn client_step() -> impl Strategy<Value = ClientStep> {
    let names = || prop::collection::vec(0..CLIENT_NAMES.len(), 1..3);
    prop_oneof![
        (0..2usize, names()).prop_map(|(t, n)| ClientStep::Subscribe(t, n)),
        (0..2usize, names()).prop_map(|(t, n)| ClientStep::Unsubscribe(t, n)),
        (0..4usize).prop_map(ClientStep::Resources),
        Just(ClientStep::Take),
        Just(ClientStep::Take),
    ]
}

/// Four versions of a proxy's clusters and load assignments, each made from the one before
/// as builds make them (unchanged names and resources the very same `Arc`s): names added,
/// removed, changed, and one map back to an earlier one.
fn client_versions() -> &'static [Arc<VersionedResources>; 4] {
    use xds::versioned::{TypeResources, Versioned};
    static V: OnceLock<[Arc<VersionedResources>; 4]> = OnceLock::new();
    V.get_or_init(|| {
        let res = |t: &str, body: &str| {
            Arc::new(Versioned::new(envoy_types::pb::google::protobuf::Any {
                type_url: t.to_owned(),
                value: body.as_bytes().to_vec(),
            }))
        };
        let map = |t: &str, items: &[(&str, &str)]| -> TypeResources {
            items.iter().map(|(n, b)| (Arc::<str>::from(*n), res(t, b))).collect()
        };
        let of = |c: Arc<TypeResources>, e: Arc<TypeResources>| {
            let mut v = VersionedResources::default();
            v.by_type.insert(CLUSTER, c);
            v.by_type.insert(ENDPOINT, e);
            Arc::new(v)
        };
        let c0 = Arc::new(map(CLUSTER, &[("a", "1"), ("b", "1"), ("c", "1")]));
        let e0 = Arc::new(map(ENDPOINT, &[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")]));
        let mut c1 = (*c0).clone();
        c1.insert(Arc::from("b"), res(CLUSTER, "2"));
        c1.insert(Arc::from("e"), res(CLUSTER, "1"));
        let mut e1 = (*e0).clone();
        e1.remove("c");
        let (c1, e1) = (Arc::new(c1), Arc::new(e1));
        let mut c2 = (*c1).clone();
        c2.remove("a");
        let mut e2 = (*e1).clone();
        e2.insert(Arc::from("e"), res(ENDPOINT, "1"));
        e2.insert(Arc::from("a"), res(ENDPOINT, "2"));
        let e2 = Arc::new(e2);
        let mut e3 = (*e2).clone();
        e3.remove("d");
        [
            of(Arc::clone(&c0), e0),
            of(c1, e1),
            of(Arc::new(c2), Arc::clone(&e2)),
            of(c0, Arc::new(e3)),
        ]
    })
}

/// What a client applies of responses: type → name → version.
type ClientView = std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, String>>;

/// Applies and ACKs every response in `queue`; like Envoy, a load assignment no longer
/// subscribed to (the response crossed the unsubscription) is ignored.
fn take_all(
    state: &mut DeltaState,
    queue: &mut Vec<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
    view: &mut ClientView,
    subscribed: &std::collections::BTreeSet<String>,
) {
    for r in queue.drain(..) {
        let t = CLIENT_TYPES.into_iter().find(|t| *t == r.type_url).unwrap();
        let held = view.entry(t).or_default();
        for res in r
            .resources
            .iter()
            .filter(|res| t == CLUSTER || subscribed.contains(&res.name))
        {
            held.insert(res.name.clone(), res.version.clone());
        }
        for name in &r.removed_resources {
            held.remove(name);
        }
        state.on_request(&DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        });
    }
}
