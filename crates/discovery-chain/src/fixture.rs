//! Config entries for tests and benchmarks: decoded from JSON as the
//! HTTP API decodes them, kept as lists by kind as the data sources hold them.

use crate::{ChainError, CompileRequest, Entries, compile};
use std::sync::Arc;
use std::time::Duration;
use structs::config_entry::ProxyDefaults;
use structs::{CompiledDiscoveryChain, ConfigEntry, Protocol};

/// Config entries by kind.
#[derive(Debug, Clone, Default)]
pub struct EntrySet {
    /// The proxy-defaults entry.
    pub proxy: Option<ProxyDefaults>,
    /// service-defaults entries.
    pub defaults: Vec<Arc<ConfigEntry>>,
    /// service-resolver entries.
    pub resolvers: Vec<Arc<ConfigEntry>>,
    /// service-router entries.
    pub routers: Vec<Arc<ConfigEntry>>,
    /// service-splitter entries.
    pub splitters: Vec<Arc<ConfigEntry>>,
    /// service-intentions entries.
    pub intentions: Vec<Arc<ConfigEntry>>,
}

impl EntrySet {
    /// Adds an entry, decoded and checked as the HTTP API would (panics if either fails: a
    /// fixture that is not what the test meant).
    pub fn with(self, v: serde_json::Value) -> Self {
        let entry = ConfigEntry::from_json(v.clone()).unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = structs::Validate::validate(&entry) {
            panic!("{e}");
        }
        self.with_unchecked(v)
    }

    /// Adds an entry without its own checks (as if it bypassed the API).
    pub fn with_unchecked(mut self, v: serde_json::Value) -> Self {
        let entry = ConfigEntry::from_json(v).unwrap_or_else(|e| panic!("{e}"));
        let list = match &entry {
            ConfigEntry::ProxyDefaults(p) => {
                self.proxy = Some(p.clone());
                return self;
            }
            ConfigEntry::ServiceDefaults(_) => &mut self.defaults,
            ConfigEntry::ServiceResolver(_) => &mut self.resolvers,
            ConfigEntry::ServiceRouter(_) => &mut self.routers,
            ConfigEntry::ServiceSplitter(_) => &mut self.splitters,
            ConfigEntry::ServiceIntentions(_) => &mut self.intentions,
            ConfigEntry::Mesh(_)
            | ConfigEntry::IngressGateway(_)
            | ConfigEntry::TerminatingGateway(_)
            | ConfigEntry::JwtProvider(_)
            | ConfigEntry::ApiGateway(_)
            | ConfigEntry::HttpRoute(_)
            | ConfigEntry::TcpRoute(_)
            | ConfigEntry::InlineCertificate(_)
            | ConfigEntry::FileSystemCertificate(_)
            | ConfigEntry::ExportedServices(_) => {
                panic!("a {} entry is not a chain input", entry.kind())
            }
        };
        list.push(Arc::new(entry));
        self
    }

    /// Adds the service-defaults of `name` with `protocol`.
    pub fn protocol(self, name: &str, protocol: &str) -> Self {
        self.with(serde_json::json!({"Kind": "service-defaults", "Name": name, "Protocol": protocol}))
    }

    /// Adds the service-defaults of `name` with protocol http.
    pub fn http(self, name: &str) -> Self {
        self.protocol(name, "http")
    }

    /// The entries as the compiler reads them.
    pub fn entries(&self) -> Entries<'_> {
        Entries {
            proxy_defaults: self.proxy.as_ref(),
            service_defaults: &self.defaults,
            resolvers: &self.resolvers,
            routers: &self.routers,
            splitters: &self.splitters,
            intentions: &self.intentions,
        }
    }

    /// The chain of `service` in `dc1`, with optional overrides.
    pub fn compile_with(
        &self,
        service: &str,
        trust_domain: &str,
        override_protocol: Option<Protocol>,
        override_connect_timeout: Option<Duration>,
    ) -> Result<CompiledDiscoveryChain, ChainError> {
        compile(
            &CompileRequest {
                service,
                datacenter: "dc1",
                trust_domain,
                override_protocol,
                override_connect_timeout,
            },
            &self.entries(),
        )
    }
}
