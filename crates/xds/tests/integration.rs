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
