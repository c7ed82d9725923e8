//! The `meshd tls` commands, which make a CA and its certificates (the TLS listeners
//! themselves are the `node` library's).

pub mod certs;

#[cfg(all(test, any(feature = "server", feature = "agent")))]
mod tests;
