//! The dashboard at `/ui`: a read-only page over the HTTP API, its assets inside the binary
//! (no build step, no CDN). Servers and agents both serve it: on an agent, the pages that
//! read the catalog go through the agent's forwarding to its servers, and the proxies page
//! shows the agent's own xDS streams (its host's Envoys).
//!
//! The page reads the API with the token typed into its login field (kept in the tab's
//! `sessionStorage`, sent as `X-Consul-Token`), so ACLs apply to it as to any client; when
//! ACLs hid results (`X-Consul-Results-Filtered-By-ACLs`) it says so and asks for a token.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../ui/index.html");
const APP: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard's routes: `/ui` (and `/ui/`), `/ui/app.js`, `/ui/style.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
