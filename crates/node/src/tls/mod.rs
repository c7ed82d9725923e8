//! TLS for a node's own APIs: the HTTPS API and xDS over TLS (flags checked into rustls
//! configurations, and the listener that refuses plaintext).

pub mod config;
pub mod listener;

pub use config::{ServerTls, TlsSettings, TlsSetupError};
pub use listener::{Certs, ServerNames, SplitIncoming, TlsIncoming};
