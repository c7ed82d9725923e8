//! `GET /v1/agent/version`: the build a node runs, in Consul's shape (`HumanVersion`, `SHA`,
//! `BuildDate`, `FIPS`), for either mode. Like Consul's, it needs no token.

use serde_json::json;

/// meshd's version (the workspace's), as `HumanVersion`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The route.
pub fn router() -> axum::Router {
    axum::Router::new().route(
        "/v1/agent/version",
        axum::routing::get(|params: http_kit::Params| async move {
            let body = json!({"HumanVersion": VERSION, "SHA": "", "BuildDate": "", "FIPS": ""});
            let text = if params.pretty() {
                serde_json::to_string_pretty(&body)
            } else {
                serde_json::to_string(&body)
            }
            .unwrap_or_default();
            ([(axum::http::header::CONTENT_TYPE, "application/json")], text)
        }),
    )
}
