//! catalog's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p catalog --test integration store::` runs one file's tests. The etcd storage's
//! tests are catalog-etcd's; the fuzzing properties stay a binary of their own (`cargo xtask
//! fuzz` runs it in release).

mod disk_full;
mod gateways;
mod jwt_refs;
mod peering;
mod snapshot;
mod store;
