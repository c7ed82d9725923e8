//! The HTTP clients of a method's fetches (key sets, the Kubernetes API).

use parking_lot::Mutex;
use std::collections::HashMap;

/// One client per CA a method names (none: the built-in roots), kept: a login reuses its
/// method's client, with its TLS settings and connections, rather than building one.
#[derive(Default)]
pub(crate) struct Clients(Mutex<HashMap<String, reqwest::Client>>);

impl Clients {
    /// The client that trusts `ca_pem` (when given) alone.
    pub(crate) fn get(&self, ca_pem: &str) -> Result<reqwest::Client, String> {
        if let Some(client) = self.0.lock().get(ca_pem) {
            return Ok(client.clone());
        }
        let client = http_client(ca_pem)?;
        self.0.lock().insert(ca_pem.to_owned(), client.clone());
        Ok(client)
    }
}

/// An HTTP client for a method's fetches: `ca_pem` (when given) as the only trusted root.
fn http_client(ca_pem: &str) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none());
    if !ca_pem.is_empty() {
        let certs =
            reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes()).map_err(|e| format!("the CA certificate: {e}"))?;
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| format!("an HTTP client: {e}"))
}
