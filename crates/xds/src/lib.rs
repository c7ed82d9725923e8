//! xds
pub mod resources;
