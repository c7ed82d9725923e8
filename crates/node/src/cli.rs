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

/// DNS flags of `meshd server` and `meshd agent`, after Consul's (`ports.dns`, `domain`,
/// `alt_domain`, `recursors`, `dns_config`).
#[derive(Debug, Clone, Args)]
pub struct DnsArgs {
    /// Address of the DNS interface, UDP and TCP (`off`: none).
    #[arg(long = "dns-addr", value_name = "ADDR", default_value = "127.0.0.1:8600")]
    pub dns_addr: Listen,
    /// The domain DNS answers.
    #[arg(long = "domain", value_name = "DOMAIN", default_value = "consul", value_parser = dns::Config::domain_from)]
    pub domain: String,
    /// A second domain answered alike.
    #[arg(long = "alt-domain", value_name = "DOMAIN", value_parser = dns::Config::domain_from)]
    pub alt_domain: Option<String>,
    /// A DNS server (HOST:PORT, or HOST for port 53) that answers names outside the domain;
    /// repeat for several, asked in order. None: such names are refused.
    #[arg(long = "recursor", value_name = "ADDR", value_parser = recursor)]
    pub recursors: Vec<SocketAddr>,
    /// TTL of node answers (`10s`, `1m`; 0 by default, as Consul's).
    #[arg(long = "dns-node-ttl", value_name = "DURATION", default_value = "0s", value_parser = ttl)]
    pub node_ttl: u32,
    /// TTL of service answers.
    #[arg(long = "dns-service-ttl", value_name = "DURATION", default_value = "0s", value_parser = ttl)]
    pub service_ttl: u32,
    /// Records at most in a UDP answer; more set the TC bit (the client asks again over TCP).
    #[arg(long = "dns-udp-answer-limit", value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub udp_answer_limit: u16,
    /// Answer only instances whose checks all pass (by default, warning ones too).
    #[arg(long = "dns-only-passing")]
    pub only_passing: bool,
}

impl DnsArgs {
    /// The DNS interface's settings, in `datacenter`.
    pub fn config(&self, datacenter: &str) -> dns::Config {
        let mut config = dns::Config::new(datacenter);
        config.domain.clone_from(&self.domain);
        config.alt_domain.clone_from(&self.alt_domain);
        config.node_ttl = self.node_ttl;
        config.service_ttl = self.service_ttl;
        config.udp_answer_limit = usize::from(self.udp_answer_limit);
        config.only_passing = self.only_passing;
        config.recursors.clone_from(&self.recursors);
        config
    }
}

fn recursor(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an address (IP or IP:PORT)"))
}

fn ttl(s: &str) -> Result<u32, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration: {e}"))?;
    u32::try_from(d.as_secs()).map_err(|_| format!("{s:?} is too long for a TTL"))
}
