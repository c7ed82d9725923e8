//! agent's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p agent --test integration acl_table::` runs one file's tests.
//! The fuzzing properties stay a binary of their own (`cargo xtask fuzz` runs it in release).

mod support;

mod acl_table;
mod check_headers;
mod check_targets;
mod fuzz_agent;
mod http;
