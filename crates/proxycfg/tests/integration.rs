//! proxycfg's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p proxycfg --test integration gateways::` runs one file's tests.

mod common;

mod gateways;
mod manager;
mod state;
