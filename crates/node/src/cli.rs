//! The flags both modes share: a listener that may be `off`, and the TLS listeners.

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A listener's address, or `off` for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(Self(None));
        }
        s.parse()
            .map(|a| Self(Some(a)))
            .map_err(|_| format!("{s:?} is not an address (HOST:PORT) or off"))
    }
}

/// TLS flags of `meshd server` and `meshd agent`, after Consul's: the HTTPS API and xDS
/// over TLS serve one certificate; the CA verifies clients when asked to.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// Address of the HTTPS API, serving what the HTTP API serves (off unless set).
    #[arg(long = "https-addr", value_name = "ADDR")]
    pub https_addr: Option<SocketAddr>,
    /// Address of xDS over TLS (off unless set).
    #[arg(long = "grpc-tls-addr", value_name = "ADDR")]
    pub grpc_tls_addr: Option<SocketAddr>,
    /// The certificate (PEM, leaf first) the TLS listeners present.
    #[arg(long = "tls-cert-file", value_name = "PATH")]
    pub cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long = "tls-key-file", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// The CA (PEM) that verifies client certificates (-tls-verify-incoming) and, on an
    /// agent, the servers it joins over `https://`.
    #[arg(long = "tls-ca-file", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// Require a client certificate signed by -tls-ca-file on the TLS listeners.
    #[arg(long = "tls-verify-incoming")]
    pub verify_incoming: bool,
}
