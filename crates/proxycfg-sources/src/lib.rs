//! Config sources: what registers proxies with the proxycfg Manager.
//!
//! - [`CatalogSource`] (servers): proxies registered in the catalog, synced while an xDS
//!   stream asks for them, with proxy-defaults and service-defaults merged in.
//!
//! The agent's local source arrives with agent mode.

#[cfg(feature = "server")]
mod catalog_source;

#[cfg(feature = "server")]
pub use catalog_source::{CatalogSource, Lease};
