//! proxycfg-sources' integration tests, in one test binary (one link of the crate and its
//! dependencies instead of one per file: CI time, issue #31). Each file is a module;
//! `cargo test -p proxycfg-sources --all-features --test integration local_source::` runs
//! one file's tests. The local source's tests need the `local` and `server` features.

mod catalog_source;
#[cfg(all(feature = "local", feature = "server"))]
mod local_source;
