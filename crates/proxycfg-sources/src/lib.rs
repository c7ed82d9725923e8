//! Config sources: what registers proxies with the proxycfg Manager.
//!
//! - [`CatalogSource`] (feature `server`, servers): proxies registered in the catalog, synced
//!   while an xDS stream asks for them, with proxy-defaults and service-defaults merged in.
//! - [`LocalSource`] (feature `local`, agents): every proxy in the agent's local state,
//!   registered for as long as it is there, with the same central config merged in through
//!   the agent cache. Local registrations take precedence over the catalog's.

#[cfg(feature = "server")]
mod catalog_source;
#[cfg(feature = "local")]
mod local_source;

#[cfg(feature = "server")]
pub use catalog_source::{CatalogSource, Lease};
#[cfg(feature = "local")]
pub use local_source::{LocalProxy, LocalServices, LocalSource};
