//! The servers a client talks to (`-retry-join`): one keep-alive HTTP client, the server
//! that answered last tried first, the next one tried when a connection cannot be made
//! (refused, or not made within 2 s). A server that was reached but whose exchange then
//! failed (it died mid-request, or it accepts connections but no longer answers, so the
//! request timed out) is not sent the request again, but the next request starts with the
//! next server: every RPC, blocking query and heartbeat goes through here, so all of them
//! move together.
//!
//! An agent's client ([`Servers::multiplexed`]) speaks HTTP/2 to meshd servers: all its
//! requests, its parked blocking queries included, share one connection per server (as
//! Consul's agents multiplex their RPCs), where HTTP/1.1 needs a connection, with its
//! buffers on both sides, per request in flight. Other clients speak HTTP/1.1, which any
//! Consul-compatible API answers.

use crate::ApiError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use structs::Token;

/// The servers and a shared client (see the module docs).
#[derive(Debug)]
pub struct Servers {
    bases: Vec<String>,
    /// Whether each server answered the last request sent to it (true until tried).
    answered: Vec<AtomicBool>,
    current: AtomicUsize,
    client: reqwest::Client,
    /// The token of requests sent without one named (the agent token), if any.
    token: parking_lot::RwLock<Option<Token>>,
}

/// `host:port` or a URL, as a base URL without a trailing slash.
pub fn base_url(addr: &str) -> String {
    let addr = addr.trim_end_matches('/');
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// The CA given to verify the servers' HTTPS cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot verify the servers' HTTPS with this CA: {0}")]
pub struct ServersCaError(String);

fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
}

/// HTTP/2 only (prior knowledge on `http://`, ALPN `h2` on `https://`), with pings that
/// find a dead server within [`H2_PING_INTERVAL`] + [`H2_PING_TIMEOUT`] even while every
/// request on the connection is a parked blocking query.
fn multiplexed_builder() -> reqwest::ClientBuilder {
    client_builder()
        .http2_prior_knowledge()
        // Room for many answers at once (a cache refreshing hundreds of watches after one
        // change), each whole: answers cut into small frames by a small window are what h2's
        // flood protection takes for an attack, and it closes the connection.
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .http2_keep_alive_interval(H2_PING_INTERVAL)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
}

/// What one answer may send before the client reads it.
const H2_STREAM_WINDOW: u32 = 1 << 20;
/// What all the answers on one connection may send before the client reads them.
const H2_CONNECTION_WINDOW: u32 = 8 << 20;
/// How often a multiplexed client pings each server connection.
const H2_PING_INTERVAL: Duration = Duration::from_secs(15);
/// How long a ping may go unanswered before the connection (and every request on it) fails.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

impl Servers {
    /// Clients for `addrs` (`host:port`, `http://host:port` or `https://host:port`; HTTPS
    /// verified with the public roots).
    pub fn new(addrs: &[String]) -> Self {
        Self::with_client(addrs, client_builder().build().unwrap_or_default())
    }

    /// Clients for `addrs` whose HTTPS is verified with the CA certificates of `ca_pem` (PEM)
    /// only, host names included: no other root is trusted, and there is no way to skip the
    /// verification.
    pub fn with_ca(addrs: &[String], ca_pem: &[u8]) -> Result<Self, ServersCaError> {
        Self::verified(client_builder(), addrs, ca_pem)
    }

    /// Clients for meshd servers at `addrs` over HTTP/2, one connection per server for all
    /// requests (see the module docs); HTTPS verified with `ca_pem` only when given (as
    /// [`Servers::with_ca`]), else with the public roots.
    pub fn multiplexed(addrs: &[String], ca_pem: Option<&[u8]>) -> Result<Self, ServersCaError> {
        Self::multiplexed_as(addrs, ca_pem, None)
    }

    /// As [`Servers::multiplexed`], presenting the client certificate of `identity_pem` (its
    /// certificate chain and private key, PEM) to servers that verify their clients.
    pub fn multiplexed_as(
        addrs: &[String],
        ca_pem: Option<&[u8]>,
        identity_pem: Option<&[u8]>,
    ) -> Result<Self, ServersCaError> {
        let mut builder = multiplexed_builder();
        if let Some(pem) = identity_pem {
            let identity = reqwest::Identity::from_pem(pem).map_err(|e| ServersCaError(chain(&e)))?;
            builder = builder.use_rustls_tls().identity(identity);
        }
        match ca_pem {
            Some(pem) => Self::verified(builder, addrs, pem),
            None => {
                let client = builder.build().map_err(|e| ServersCaError(chain(&e)))?;
                Ok(Self::with_client(addrs, client))
            }
        }
    }

    fn verified(builder: reqwest::ClientBuilder, addrs: &[String], ca_pem: &[u8]) -> Result<Self, ServersCaError> {
        let certs = reqwest::Certificate::from_pem_bundle(ca_pem).map_err(|e| ServersCaError(chain(&e)))?;
        if certs.is_empty() {
            return Err(ServersCaError("no PEM certificate in it".into()));
        }
        let builder = certs
            .into_iter()
            .fold(builder.use_rustls_tls().tls_built_in_root_certs(false), |b, cert| {
                b.add_root_certificate(cert)
            });
        let client = builder.build().map_err(|e| ServersCaError(chain(&e)))?;
        Ok(Self::with_client(addrs, client))
    }

    fn with_client(addrs: &[String], client: reqwest::Client) -> Self {
        Self {
            answered: addrs.iter().map(|_| AtomicBool::new(true)).collect(),
            bases: addrs.iter().map(|a| base_url(a)).collect(),
            current: AtomicUsize::new(0),
            client,
            token: parking_lot::RwLock::new(None),
        }
    }

    /// Sets the token of requests sent without one named (the agent's token; none: such
    /// requests carry no token).
    pub fn set_token(&self, token: Option<Token>) {
        *self.token.write() = token;
    }

    /// The token of requests sent without one named (see [`Servers::set_token`]).
    pub fn token(&self) -> Option<Token> {
        self.token.read().clone()
    }

    /// The base URLs, in configuration order.
    pub fn addresses(&self) -> &[String] {
        &self.bases
    }

    /// Whether server `i` (in configuration order) answered the last request sent to it.
    pub fn answered(&self, i: usize) -> bool {
        self.answered.get(i).is_some_and(|a| a.load(Ordering::Relaxed))
    }

    /// The server tried first (the last one that answered).
    pub fn current(&self) -> Option<&str> {
        self.bases
            .get(self.current.load(Ordering::Relaxed) % self.bases.len().max(1))
            .map(String::as_str)
    }

    /// Sends a request built by `build` (given a server's base URL) to the current server,
    /// failing over to the next ones while connections cannot be made. A request that reached
    /// a server is never sent twice; when its exchange fails, the next request starts with
    /// the next server. It carries the client's own token ([`Servers::set_token`]).
    pub async fn send(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ApiError> {
        self.send_as(self.token().as_ref(), build).await
    }

    /// As [`Servers::send`], with `token` (none: no token header).
    pub async fn send_as(
        &self,
        token: Option<&Token>,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ApiError> {
        let build = |c: &reqwest::Client, base: &str| {
            let req = build(c, base);
            match token {
                Some(token) => req.header(structs::wire::TOKEN_HEADER, token.secret()),
                None => req,
            }
        };
        if self.bases.is_empty() {
            return Err(ApiError::NoServers);
        }
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for step in 0..self.bases.len() {
            let i = (start + step) % self.bases.len();
            let sent = build(&self.client, &self.bases[i]).send().await;
            self.answered[i].store(sent.as_ref().is_ok(), Ordering::Relaxed);
            match sent {
                Ok(resp) => {
                    if step > 0 {
                        self.current.store(i, Ordering::Relaxed);
                    }
                    return Ok(resp);
                }
                Err(e) if e.is_connect() => last = format!("{}: {}", self.bases[i], chain(&e)),
                Err(e) => {
                    // The request may have taken effect there, so it is not sent again; but a
                    // server that died or hangs would fail the next one too. Unless another
                    // request already moved on meanwhile, the next one starts further on.
                    let _ = self.current.compare_exchange(
                        start,
                        (i + 1) % self.bases.len(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    return Err(ApiError::Unreachable {
                        tried: step + 1,
                        last: format!("{}: {}", self.bases[i], chain(&e)),
                    });
                }
            }
        }
        Err(ApiError::Unreachable {
            tried: self.bases.len(),
            last,
        })
    }

    /// `PUT path` with a JSON body and the client's own token; any 2xx is success.
    pub async fn put_json<T: Serialize + ?Sized>(&self, path: &str, body: &T) -> Result<(), ApiError> {
        self.put_json_as(self.token().as_ref(), path, body).await
    }

    /// As [`Servers::put_json`], with `token` (none: no token).
    pub async fn put_json_as<T: Serialize + ?Sized>(
        &self,
        token: Option<&Token>,
        path: &str,
        body: &T,
    ) -> Result<(), ApiError> {
        self.call_as(token, reqwest::Method::PUT, path, Some(body))
            .await
            .map(|_| ())
    }

    /// `GET path` with the client's own token, decoded.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.get_json_as(self.token().as_ref(), path).await
    }

    /// As [`Servers::get_json`], with `token` (none: no token).
    pub async fn get_json_as<T: DeserializeOwned>(&self, token: Option<&Token>, path: &str) -> Result<T, ApiError> {
        decode(&self.get_as(token, path).await?.body)
    }
}

/// The answer to a blocking query: the body (`None` for a 404, which some endpoints answer for
/// "does not exist" with an index to block on) and the servers' `X-Consul-Index`.
#[derive(Debug, Clone)]
pub struct Blocked {
    /// The body; `None` when the server answered 404.
    pub body: Option<bytes::Bytes>,
    /// The index the answer was read at (0 when the server sent none).
    pub index: u64,
    /// `X-Consul-Results-Filtered-By-ACLs: true`: the token could not see all of it.
    pub filtered: bool,
}

impl Servers {
    /// A blocking `GET path` (which may carry its own query): answers once the servers' index
    /// for it passes `min_index`, or after `wait`. A 404 is an answer (`body: None`); any other
    /// error status is an error. It carries the client's own token.
    pub async fn get_blocking(&self, path: &str, min_index: u64, wait: Duration) -> Result<Blocked, ApiError> {
        self.get_blocking_as(self.token().as_ref(), path, min_index, wait).await
    }

    /// As [`Servers::get_blocking`], with `token` (none: no token).
    pub async fn get_blocking_as(
        &self,
        token: Option<&Token>,
        path: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<Blocked, ApiError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let wait_s = wait.as_secs().max(1);
        // The server adds up to wait/16 of jitter; the timeout leaves room for it.
        let timeout = wait + wait / 8 + Duration::from_secs(10);
        let resp = self
            .send_as(token, |c, base| {
                c.get(format!("{base}{path}{sep}index={min_index}&wait={wait_s}s"))
                    .timeout(timeout)
            })
            .await?;
        let index = consul_index(resp.headers());
        let filtered = resp
            .headers()
            .get(structs::wire::FILTERED_HEADER)
            .is_some_and(|v| v == "true");
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Blocked {
                body: None,
                index,
                filtered,
            });
        }
        let body = check_status(resp).await?;
        Ok(Blocked {
            body: Some(body),
            index,
            filtered,
        })
    }

    /// `PUT path` with a JSON body and the client's own token, the answer decoded.
    pub async fn put_json_answer<T: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<R, ApiError> {
        self.put_json_answer_as(self.token().as_ref(), path, body).await
    }

    /// As [`Servers::put_json_answer`], with `token` (none: no token).
    pub async fn put_json_answer_as<T: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        token: Option<&Token>,
        path: &str,
        body: &T,
    ) -> Result<R, ApiError> {
        decode(&self.call_as(token, reqwest::Method::PUT, path, Some(body)).await?)
    }
}

/// A plain `GET`'s answer: the body, the index it was read at, and whether ACLs filtered it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The body.
    pub body: bytes::Bytes,
    /// `X-Consul-Index` (0 when the server sent none).
    pub index: u64,
    /// `X-Consul-Results-Filtered-By-ACLs: true`: the token could not see all of it.
    pub filtered: bool,
}

impl Servers {
    /// `GET path` with `token` (none: no token), its headers read.
    pub async fn get_as(&self, token: Option<&Token>, path: &str) -> Result<Answer, ApiError> {
        let resp = self
            .send_as(token, |c, base| {
                c.get(format!("{base}{path}")).timeout(Duration::from_secs(30))
            })
            .await?;
        let headers = resp.headers();
        let index = consul_index(headers);
        let filtered = headers.get(structs::wire::FILTERED_HEADER).is_some_and(|v| v == "true");
        let body = check_status(resp).await?;
        Ok(Answer { body, index, filtered })
    }

    /// `method path` with `token` (none: no token), with a JSON body when given; the
    /// answer's body on success.
    pub async fn call_as<T: Serialize + ?Sized>(
        &self,
        token: Option<&Token>,
        method: reqwest::Method,
        path: &str,
        body: Option<&T>,
    ) -> Result<bytes::Bytes, ApiError> {
        let bytes = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| ApiError::Decode(e.to_string()))?;
        let resp = self
            .send_as(token, |c, base| {
                let req = c
                    .request(method.clone(), format!("{base}{path}"))
                    .timeout(Duration::from_secs(30));
                match &bytes {
                    Some(b) => req.header("Content-Type", "application/json").body(b.clone()),
                    None => req,
                }
            })
            .await?;
        check_status(resp).await
    }
}

/// `X-Consul-Index` (0 when the server sent none).
fn consul_index(headers: &reqwest::header::HeaderMap) -> u64 {
    headers
        .get(structs::wire::INDEX_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// An answer's JSON body, in any key casing.
fn decode<R: DeserializeOwned>(body: &[u8]) -> Result<R, ApiError> {
    structs::json::from_slice(body).map_err(|e| ApiError::Decode(e.to_string()))
}

async fn check_status(resp: reqwest::Response) -> Result<bytes::Bytes, ApiError> {
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| ApiError::Unreachable {
        tried: 1,
        last: chain(&e),
    })?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(ApiError::from_status(
            status.as_u16(),
            String::from_utf8_lossy(&body).trim().chars().take(300).collect(),
        ))
    }
}

/// An error with its causes, on one line (a cause already quoted by its parent is skipped).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = cause.source();
    }
    out
}

#[cfg(test)]
mod tests;
