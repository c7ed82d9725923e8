//! An explicit cap on request header size for the HTTP APIs: a request whose headers (names,
//! values and the request line's target) exceed [`MAX_HEADER_BYTES`] is answered `431 Request
//! Header Fields Too Large` without reaching a handler. hyper's own read buffer (about
//! 400 KiB per connection) stays the hard bound below it; this is the documented limit.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Largest request headers accepted, bytes (Envoy's default limit is 60 KiB).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The size of `req`'s headers as counted against the cap.
fn header_bytes<B>(req: &axum::http::Request<B>) -> usize {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    target
        + req
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
}

/// The 431 for a request past the cap; `None` lets it go on. [`crate::http_serve::serve`]
/// checks every request with it before the router (a check there costs no layer).
pub fn refusal<B>(req: &axum::http::Request<B>) -> Option<Response> {
    let size = header_bytes(req);
    if size <= MAX_HEADER_BYTES {
        return None;
    }
    let mut resp = (
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        format!("request headers are {size} bytes: the limit is {MAX_HEADER_BYTES}\n"),
    )
        .into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(resp)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::middleware::Next;
    use axum::routing::get;
    use tower::ServiceExt;

    /// The same check as a middleware: 431 past the cap, else the request goes on.
    async fn cap(req: Request, next: Next) -> Response {
        match refusal(&req) {
            Some(refused) => refused,
            None => next.run(req).await,
        }
    }

    #[tokio::test]
    async fn headers_past_the_cap_get_431_and_never_reach_the_handler() {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn(cap));
        let small = Request::get("/").header("x-a", "b").body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(small).await.unwrap().status(), StatusCode::OK);
        let big = "v".repeat(MAX_HEADER_BYTES);
        let req = Request::get("/").header("x-big", big).body(Body::empty()).unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        // Many headers count together.
        let mut req = Request::get("/");
        for i in 0..100 {
            req = req.header(format!("x-h{i}"), "v".repeat(700));
        }
        let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
}
