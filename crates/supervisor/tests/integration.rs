//! supervisor's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p supervisor --test integration agent::` runs one file's tests.

mod common;

mod agent;
mod bootstrap;
mod daemon;
mod envoy_agent;

// The benchmarks' sources, compiled (and linted, in CI) with the tests: CI builds no
// benchmark binary (`cargo xtask bench` does), and a benchmark that no longer compiles or
// lints fails here. Their `main`s are not called.
// It loads the tests' `common` module again, as its own binary needs it.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../benches/hot_restart.rs"]
mod bench_hot_restart;
