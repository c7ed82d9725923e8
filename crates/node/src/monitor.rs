//! `GET /v1/agent/monitor` (`agent:read` on the node, as Consul's): the node's log lines as
//! they are written, streamed until the client goes away or the node shuts down.
//!
//! `?loglevel=` (`info` by default; `error`, `warn`, `info`, `debug`) picks the lines, below
//! the node's own `-log-level` too: the stream is fed by its own tracing layer, not by what
//! goes to stderr. `trace` is refused (those call sites stay compiled out of the check: no
//! cost on the hot paths). `?logjson` streams JSON lines with Consul's keys (`@level`,
//! `@message`, `@module`, `@timestamp`). A reader too slow for the log loses lines, and one
//! line says how many. The layer formats nothing while no one watches.

use crate::authz::Caller;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

/// Lines a reader may fall behind by before it loses some.
const BACKLOG: usize = 1024;

/// One log line.
#[derive(Debug, Clone)]
struct Line {
    level: Level,
    target: String,
    message: String,
    at: std::time::SystemTime,
}

/// The feed: lines to every watcher, and the most verbose level any watcher wants.
struct Feed {
    lines: broadcast::Sender<Arc<Line>>,
    /// 0: no watcher; 1 error .. 4 debug.
    wanted: AtomicU8,
    watchers: parking_lot::Mutex<Vec<(u64, u8)>>,
    next_id: std::sync::atomic::AtomicU64,
}

fn feed() -> &'static Feed {
    static FEED: OnceLock<Feed> = OnceLock::new();
    FEED.get_or_init(|| Feed {
        lines: broadcast::channel(BACKLOG).0,
        wanted: AtomicU8::new(0),
        watchers: parking_lot::Mutex::new(Vec::new()),
        next_id: std::sync::atomic::AtomicU64::new(0),
    })
}

fn rank(level: Level) -> u8 {
    match level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

impl Feed {
    fn recompute(&self, watchers: &[(u64, u8)]) {
        let max = watchers.iter().map(|(_, r)| *r).max().unwrap_or(0);
        self.wanted.store(max, Ordering::Relaxed);
    }
}

/// A watcher's registration; dropping it lowers the level the layer formats.
struct Watch {
    id: u64,
}

impl Watch {
    fn new(rank: u8) -> Self {
        let f = feed();
        let id = f.next_id.fetch_add(1, Ordering::Relaxed);
        let mut w = f.watchers.lock();
        w.push((id, rank));
        f.recompute(&w);
        Watch { id }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let f = feed();
        let mut w = f.watchers.lock();
        w.retain(|(id, _)| *id != self.id);
        f.recompute(&w);
    }
}

/// The tracing layer feeding the monitor; [`crate::init_logging`] installs it with
/// [`filter`].
pub struct MonitorLayer;

/// The layer's own filter: the events some watcher wants, at most `debug`.
pub fn filter() -> tracing_subscriber::filter::FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool> {
    tracing_subscriber::filter::FilterFn::new(|meta: &tracing::Metadata<'_>| {
        meta.is_event() && rank(*meta.level()) <= feed().wanted.load(Ordering::Relaxed)
    })
    .with_max_level_hint(tracing_subscriber::filter::LevelFilter::DEBUG)
}

#[derive(Default)]
struct Fields(String, String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.1, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.1, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for MonitorLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let f = feed();
        if f.lines.receiver_count() == 0 {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields.0.push_str(&fields.1);
        let meta = event.metadata();
        let _ = f.lines.send(Arc::new(Line {
            level: *meta.level(),
            target: meta.target().to_owned(),
            message: fields.0,
            at: std::time::SystemTime::now(),
        }));
    }
}

fn format(line: &Line, json: bool) -> String {
    let at = humantime::format_rfc3339_millis(line.at).to_string();
    if json {
        let v = serde_json::json!({
            "@level": line.level.as_str().to_ascii_lowercase(),
            "@message": line.message,
            "@module": line.target,
            "@timestamp": at,
        });
        return format!("{v}\n");
    }
    format!("{at} [{}] {}: {}\n", line.level, line.target, line.message)
}

/// The route, for node `node`; open streams end when `stop` is cancelled.
pub fn router(node: String, stop: CancellationToken) -> axum::Router {
    axum::Router::new().route(
        "/v1/agent/monitor",
        axum::routing::get(move |caller: Caller, params: http_kit::Params| {
            let (node, stop) = (node.clone(), stop.clone());
            async move {
                if let Err(refused) = caller.need(caller.0.authz.agent_read(&node), "agent:read", &node) {
                    return refused.into_response();
                }
                let level = match params.get("loglevel").unwrap_or("info").to_ascii_lowercase().as_str() {
                    "" | "info" => Level::INFO,
                    "error" | "err" => Level::ERROR,
                    "warn" | "warning" => Level::WARN,
                    "debug" => Level::DEBUG,
                    other => {
                        return (
                            StatusCode::BAD_REQUEST,
                            format!("loglevel: {other:?} is not supported: use error, warn, info or debug\n"),
                        )
                            .into_response();
                    }
                };
                let json = match params.bool("logjson") {
                    Ok(json) => json,
                    Err(e) => return (StatusCode::BAD_REQUEST, format!("{}\n", e.0)).into_response(),
                };
                stream(level, json, stop)
            }
        }),
    )
}

fn stream(level: Level, json: bool, stop: CancellationToken) -> Response {
    let watch = Watch::new(rank(level));
    let rx = feed().lines.subscribe();
    let body = futures_util::stream::unfold((rx, watch, stop), move |(mut rx, watch, stop)| async move {
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return None,
                next = rx.recv() => next,
            };
            let text = match next {
                Ok(line) if rank(line.level) <= rank(level) => format(&line, json),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => format(
                    &Line {
                        level: Level::WARN,
                        target: "monitor".into(),
                        message: format!("{n} log lines dropped: this reader is slower than the log"),
                        at: std::time::SystemTime::now(),
                    },
                    json,
                ),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((Ok::<_, std::convert::Infallible>(text), (rx, watch, stop)));
        }
    });
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;
    use tower::ServiceExt as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    async fn get(app: &impl crate::http_serve::App, uri: &str, token: Option<&str>) -> Response {
        let mut req = axum::http::Request::get(uri);
        if let Some(t) = token {
            req = req.header("x-consul-token", t);
        }
        app.clone()
            .oneshot(req.body(Body::empty()).unwrap_or_default())
            .await
            .unwrap_or_else(|e| match e {})
    }

    #[tokio::test]
    async fn a_watcher_gets_the_lines_of_its_level_until_the_node_stops() {
        let subscriber = tracing_subscriber::registry().with(MonitorLayer.with_filter(filter()));
        let _default = tracing::subscriber::set_default(subscriber);
        let stop = CancellationToken::new();
        let app = crate::authz::with_tokens(
            router("n1".into(), stop.clone()),
            Arc::new(crate::test_tokens::ReaderTokens),
        );

        assert_eq!(
            get(&app, "/v1/agent/monitor", None).await.status(),
            StatusCode::FORBIDDEN
        );
        let refused = get(&app, "/v1/agent/monitor?loglevel=trace", Some("reader")).await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);

        let resp = get(&app, "/v1/agent/monitor?loglevel=debug", Some("reader")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut lines = resp.into_body().into_data_stream();
        assert_eq!(feed().wanted.load(Ordering::Relaxed), rank(Level::DEBUG));
        tracing::debug!(target: "meshd::test", k = 1, "hello");
        let first = lines.next().await.and_then(Result::ok).unwrap_or_default();
        let first = String::from_utf8_lossy(&first).into_owned();
        assert!(first.ends_with(" [DEBUG] meshd::test: hello k=1\n"), "{first:?}");

        // JSON, at info: a debug line is left out.
        let resp = get(&app, "/v1/agent/monitor?logjson", Some("reader")).await;
        let mut json_lines = resp.into_body().into_data_stream();
        tracing::debug!(target: "meshd::test", "not for info");
        tracing::warn!(target: "meshd::test", "careful");
        let line = json_lines.next().await.and_then(Result::ok).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
        assert_eq!(
            (v["@level"].as_str(), v["@message"].as_str()),
            (Some("warn"), Some("careful"))
        );
        assert_eq!(v["@module"], "meshd::test");

        // Shutting down ends both streams; with no watcher left, nothing is formatted.
        stop.cancel();
        while lines.next().await.is_some() {}
        while json_lines.next().await.is_some() {}
        drop((lines, json_lines));
        assert_eq!(feed().wanted.load(Ordering::Relaxed), 0);
    }
}
