//! The etcd cluster of `test_support::etcd` against the real etcd: it starts healthy, rides
//! out one member's crash with the other two, and takes the member back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use test_support::etcd::EtcdCluster;

#[test]
fn a_killed_member_leaves_a_healthy_quorum_and_rejoins_when_restarted() {
    let mut cluster = EtcdCluster::builder(3).arg("--max-txn-ops=256").start();
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert!(
        endpoints.iter().all(|e| e.starts_with("http://127.0.0.1:")),
        "{endpoints:?}"
    );
    assert_eq!(cluster.endpoints_arg(), endpoints.join(","));
    assert!((0..3).all(|i| cluster.is_running(i) && cluster.is_healthy(i)));

    cluster.kill(1);
    assert!(!cluster.is_running(1));
    assert!(!cluster.is_healthy(1), "a killed member does not answer");
    // Two of three are a quorum: they stay (or, if the leader was killed, become) healthy.
    cluster.wait_healthy(0);
    cluster.wait_healthy(2);

    cluster.restart(1);
    assert!(cluster.is_running(1) && cluster.is_healthy(1));
    assert_eq!(cluster.endpoints(), endpoints, "a restarted member keeps its address");
    assert!(
        cluster.data_dir(1).join("member").is_dir(),
        "the restarted member reused its data dir"
    );
}

#[test]
#[should_panic(expected = "exited; last lines of")]
fn a_member_that_cannot_start_fails_the_test_with_its_log() {
    let _cluster = EtcdCluster::builder(1).arg("--no-such-flag").start();
}
