//! The HTTP client of a method's fetches (key sets, the Kubernetes API).

/// An HTTP client for a method's fetches: `ca_pem` (when given) as the only trusted root.
pub(crate) fn http_client(ca_pem: &str) -> Result<reqwest::Client, String> {
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
