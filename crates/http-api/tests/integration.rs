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
