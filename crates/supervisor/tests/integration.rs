//! supervisor's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p supervisor --test integration agent::` runs one file's tests.

mod common;

mod agent;
mod bootstrap;
mod daemon;
mod envoy_agent;
