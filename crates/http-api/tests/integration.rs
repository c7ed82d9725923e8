//! http-api's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p http-api --test integration acl::` runs one file's tests. The fuzzing
//! properties stay a binary of their own (`cargo xtask fuzz` runs it in release).

mod acl;
mod api;
mod etcd_lag;
mod events;
mod fuzz_api;
mod gateways;
mod kv;
mod operator;
mod prepared;
mod snapshot;

// The benchmarks' sources, compiled (and linted, in CI) with the tests: CI builds no
// benchmark binary (`cargo xtask bench` does), and a benchmark that no longer compiles or
// lints fails here. Their `main`s are not called.
#[allow(dead_code)]
#[path = "../benches/acl.rs"]
mod bench_acl;

/// Asserts that nothing was written since `before` but the audit records of refused
/// requests: each write takes its own index, so every index after `before` must be one of
/// those records.
pub(crate) fn only_refusals_recorded_since(store: &catalog::Store, before: structs::Index, what: &str) {
    let state = store.read();
    let refusals: Vec<u64> = state
        .audit_records()
        .filter(|r| r.index > before)
        .inspect(|r| assert!(!r.accepted, "{what}: an accepted write was recorded: {r:?}"))
        .map(|r| r.index.0)
        .collect();
    let expected: Vec<u64> = (before.0 + 1..=state.index.0).collect();
    assert_eq!(
        refusals, expected,
        "{what}: every index since {before:?} is a refusal's record"
    );
}
