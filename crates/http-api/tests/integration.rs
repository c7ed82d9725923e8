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
