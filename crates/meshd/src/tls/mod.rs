//! TLS for meshd's own APIs: the HTTPS API and xDS over TLS (flags checked into rustls
//! configurations, and the listener that refuses plaintext), and the `meshd tls` commands
//! that make a CA and its certificates.

pub mod certs;
#[cfg(any(feature = "server", feature = "agent"))]
pub mod config;
#[cfg(any(feature = "server", feature = "agent"))]
pub mod listener;

#[cfg(any(feature = "server", feature = "agent"))]
pub use config::{ServerTls, TlsSettings, TlsSetupError};
#[cfg(any(feature = "server", feature = "agent"))]
pub use listener::TlsIncoming;

#[cfg(all(test, any(feature = "server", feature = "agent")))]
mod tests;
