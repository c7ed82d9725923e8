//! How a server calls the servers of other datacenters (federation, replication): its
//! client and token, the answers it decodes, the retry schedule, the forwarding mark.

use backoff_schedule::Schedule;
use std::time::Duration;
use structs::Token;

/// Marks a request forwarded to another datacenter (its value: the datacenter it came
/// from): it is served where it lands, never forwarded again.
pub(crate) const FORWARDED_DC: &str = "x-meshd-forwarded-dc";

/// Retries toward the primary: at once, then 1 s doubling to 30 s.
pub(crate) const RETRY: Schedule = Schedule {
    immediate: 1,
    first: Duration::from_secs(1),
    max: Duration::from_secs(30),
};

/// How long one blocking query on the primary's list waits.
pub(crate) const FOLLOW_WAIT: Duration = Duration::from_secs(300);

/// How this server calls the servers of other datacenters: its client, and the token it
/// presents (`-acl-replication-token-file`).
#[derive(Clone)]
pub(crate) struct Peer {
    pub(crate) client: reqwest::Client,
    pub(crate) token: Option<Token>,
}

/// A successful answer of another datacenter's server.
pub(crate) struct Answered<T> {
    pub(crate) value: T,
    /// Its `X-Consul-Index` (0 when it has none).
    pub(crate) index: u64,
    headers: reqwest::header::HeaderMap,
}

impl<T> Answered<T> {
    /// A header's value as a number.
    pub(crate) fn number(&self, header: &str) -> Option<u64> {
        self.headers.get(header)?.to_str().ok()?.parse().ok()
    }
}

impl Peer {
    /// The base URL of a server of another datacenter as the federation states name it
    /// (`host:port`: plain HTTP; `https://host:port`).
    pub(crate) fn base(server: &str) -> String {
        api_client::base_url(server)
    }

    /// The client for other datacenters' servers: HTTPS verified with `ca_pem` only when
    /// given (`-tls-ca-file`), else with the public roots; with the server's own
    /// certificate as its client identity when given (for servers verifying clients).
    pub(crate) fn client(ca_pem: Option<&[u8]>, identity_pem: Option<&[u8]>) -> Result<reqwest::Client, String> {
        let mut builder = reqwest::Client::builder().use_rustls_tls();
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("-tls-ca-file: {e}"))?;
            builder = certs
                .into_iter()
                .fold(builder.tls_built_in_root_certs(false), |b, c| b.add_root_certificate(c));
        }
        if let Some(pem) = identity_pem {
            let identity = reqwest::Identity::from_pem(pem)
                .map_err(|e| format!("-tls-cert-file and -tls-key-file as a client identity: {e}"))?;
            builder = builder.identity(identity);
        }
        builder
            .build()
            .map_err(|e| format!("the client for other datacenters: {e}"))
    }

    pub(crate) fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let req = self.client.request(method, url);
        match &self.token {
            Some(t) => req.header(structs::wire::TOKEN_HEADER, t.secret()),
            None => req,
        }
    }

    /// Sends `req` (to `server`) and decodes a successful answer, with its
    /// `X-Consul-Index` and headers; a failure or a refusal is an error naming `what` was asked.
    pub(crate) async fn call<T: serde::de::DeserializeOwned>(
        server: &str,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<Answered<T>, String> {
        let resp = req.send().await.map_err(|e| format!("{what} ({server}): {e}"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(format!("{what}: {server} refused: {status}: {}", body.trim()));
        }
        let headers = resp.headers().clone();
        let value = resp.json().await.map_err(|e| format!("{what} ({server}): {e}"))?;
        let mut answered = Answered {
            value,
            index: 0,
            headers,
        };
        answered.index = answered.number("x-consul-index").unwrap_or(0);
        Ok(answered)
    }

    /// A GET of `path` at `server`; with `after`, a blocking query past that index.
    pub(crate) fn get(&self, server: &str, path: &str, after: Option<u64>) -> reqwest::RequestBuilder {
        let url = match after {
            Some(i) => format!("{}{path}?index={i}&wait={}s", Self::base(server), FOLLOW_WAIT.as_secs()),
            None => format!("{}{path}", Self::base(server)),
        };
        self.request(reqwest::Method::GET, url)
            .timeout(FOLLOW_WAIT + Duration::from_secs(30))
    }
}
