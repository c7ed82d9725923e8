//! xds's integration tests, in one test binary (one link of the crate and its dependencies
//! instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p xds --test integration validate::` runs one file's tests. The fuzzing
//! properties stay a binary of their own (`cargo xtask fuzz` runs it in release).

mod common;

mod build_problems;
mod fuzz_protocol;
mod protocol;
mod sharing;
mod validate;

// The benchmarks' sources, compiled (and linted, in CI) with the tests: CI builds no
// benchmark binary (`cargo xtask bench` does), and a benchmark that no longer compiles or
// lints fails here. Their `main`s are not called.
// It loads the tests' `common` module again, as its own binary needs it.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../benches/gateway.rs"]
mod bench_gateway;
// It loads the tests' `common` module again, as its own binary needs it.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../benches/l7_rebuild.rs"]
mod bench_l7_rebuild;
