//! proxycfg's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p proxycfg --test integration gateways::` runs one file's tests.

mod common;

mod gateways;
mod manager;
mod state;

// The benchmarks' sources, compiled (and linted, in CI) with the tests: CI builds no
// benchmark binary (`cargo xtask bench` does), and a benchmark that no longer compiles or
// lints fails here. Their `main`s are not called.
#[allow(dead_code)]
#[path = "../benches/propagation.rs"]
mod bench_propagation;
