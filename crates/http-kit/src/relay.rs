//! Relaying a request to another node and its answer back: what a follower does with a write
//! for its leader and an agent with a request it does not answer itself. One set of rules:
//! the method, path and query go unchanged; headers go both ways except those that belong to
//! one connection (hop-by-hop) or that the relaying node sets itself (`host`,
//! `content-length`); the body is read whole first, bounded (a 413 naming the limit).

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};

/// Whether `name` belongs to one connection and is never relayed.
pub fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// The end-to-end headers of `headers`: without the hop-by-hop ones, nor those its
/// `Connection` header names (they belong to that connection too, RFC 9110 7.6.1).
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(axum::http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !hop_by_hop(name) && !named.iter().any(|n| n == name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// A request read whole, ready to relay (to one peer or, on failure, to the next) or to
/// serve here after all.
#[derive(Debug)]
pub struct Outgoing {
    /// The request line and headers as received.
    pub parts: Parts,
    /// The body.
    pub body: Bytes,
}

impl Outgoing {
    /// Reads `req`; a body over `max_body` bytes is answered with a 413 naming the limit.
    pub async fn read(req: Request, max_body: usize) -> Result<Self, Response> {
        let (parts, body) = req.into_parts();
        match axum::body::to_bytes(body, max_body).await {
            Ok(body) => Ok(Self { parts, body }),
            Err(_) => Err((StatusCode::PAYLOAD_TOO_LARGE, crate::too_large(max_body)).into_response()),
        }
    }

    /// The path and query string, as received.
    pub fn path_and_query(&self) -> &str {
        self.parts
            .uri
            .path_and_query()
            .map_or_else(|| self.parts.uri.path(), |p| p.as_str())
    }

    /// The request to `base` (`scheme://host:port`) on `client`: same method, path and query,
    /// the end-to-end headers, the body.
    pub fn to(&self, client: &reqwest::Client, base: &str) -> reqwest::RequestBuilder {
        client
            .request(self.parts.method.clone(), format!("{base}{}", self.path_and_query()))
            .headers(end_to_end(&self.parts.headers))
            .body(self.body.clone())
    }

    /// The request again, to serve here.
    pub fn into_request(self) -> Request {
        Request::from_parts(self.parts, Body::from(self.body))
    }
}

/// The peer's answer `resp`, relayed: its status, its end-to-end headers and its body (read
/// whole; an error when the peer's answer breaks off).
pub async fn answer(resp: reqwest::Response) -> Result<Response, reqwest::Error> {
    let status = resp.status();
    let headers = end_to_end(resp.headers());
    let body = resp.bytes().await?;
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[tokio::test]
    async fn a_request_is_read_whole_and_bounded() {
        let req = Request::put("/v1/kv/a?cas=1")
            .header("x-consul-token", "t")
            .header("connection", "close, x-hop")
            .header("x-hop", "only to the next hop")
            .body(Body::from("0123456789"))
            .unwrap();
        let out = Outgoing::read(req, 10).await.unwrap();
        assert_eq!(out.path_and_query(), "/v1/kv/a?cas=1");
        assert_eq!(&out.body[..], b"0123456789");
        let built = out.to(&reqwest::Client::new(), "http://127.0.0.1:1").build().unwrap();
        assert_eq!(built.url().as_str(), "http://127.0.0.1:1/v1/kv/a?cas=1");
        assert_eq!(built.method(), "PUT");
        assert_eq!(
            built.headers().get("x-consul-token"),
            Some(&HeaderValue::from_static("t"))
        );
        assert!(built.headers().get("connection").is_none());
        assert!(built.headers().get("x-hop").is_none(), "named by Connection");

        let req = Request::put("/v1/kv/a").body(Body::from("0123456789!")).unwrap();
        let refused = Outgoing::read(req, 10).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let body = axum::body::to_bytes(refused.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"request body larger than this API's limit of 10 bytes\n");
    }
}
