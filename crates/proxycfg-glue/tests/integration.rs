//! proxycfg-glue's integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p proxycfg-glue --all-features --test integration server_sources::` runs one
//! file's tests. The agent-cache sources' tests need the `cache` and `server` features.

#[cfg(all(feature = "cache", feature = "server"))]
mod cache_sources;
#[cfg(all(feature = "cache", feature = "server"))]
mod gateway_sources;
mod prepared_sources;
mod server_sources;
