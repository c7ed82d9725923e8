//! `meshd troubleshoot proxy` (`docs/troubleshoot.md`), meshd's half: what the proxy config
//! engine and the xDS server know of one proxy — its watches failing, the parts of its
//! configuration that cannot be built, each resource type's last response and whether Envoy
//! acknowledged it, rejected it (with Envoy's own error) or has not answered for too long —
//! judged into problems (what is wrong, first) and what is fine. The command adds Envoy's
//! half from its admin interface.

use serde::Serialize;
use xds::status::StreamStatus;

/// A response Envoy has not answered for this long makes its proxy stale.
pub const STALE_AFTER_SECONDS: f64 = 5.0;

/// One finding, in one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Finding {
    /// `rejected`, `stale`, `no-stream`, `data`, `build`, `synced`, ...
    pub kind: &'static str,
    /// What, for people.
    pub message: String,
}

/// meshd's findings on a proxy, problems first.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Findings {
    /// What is wrong.
    pub problems: Vec<Finding>,
    /// What is fine.
    pub fine: Vec<Finding>,
}

fn short_type(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// Judges the engine's view of a proxy (`errors`: its watches failing; `build`: parts that
/// cannot be built) and the xDS streams it has open here.
pub fn judge(
    proxy: &str,
    errors: &std::collections::BTreeMap<String, String>,
    build: &std::collections::BTreeMap<String, String>,
    streams: &[StreamStatus],
) -> Findings {
    let mut out = Findings::default();
    let mut problem = |kind, message: String| out.problems.push(Finding { kind, message });
    for (watch, error) in errors {
        problem("data", format!("meshd cannot get {watch}: {error}"));
    }
    for (part, why) in build {
        problem(
            "build",
            format!("meshd cannot build {part} (its last good resources stay): {why}"),
        );
    }
    if streams.is_empty() {
        problem(
            "no-stream",
            format!(
                "{proxy} has no xDS stream open on this meshd: Envoy is not running, not connected, or connected elsewhere"
            ),
        );
    }
    for stream in streams {
        for t in &stream.types {
            let name = short_type(&t.type_url);
            let nacked_last = match (&t.last_nack, &t.last_acked) {
                (Some(n), Some(a)) => n.at >= a.at,
                (Some(_), None) => true,
                _ => false,
            };
            if let (true, Some(nack)) = (nacked_last, &t.last_nack) {
                problem(
                    "rejected",
                    format!("Envoy rejected its {name}s (at {}): {}", nack.at, nack.error.trim()),
                );
            }
            match t.oldest_pending_seconds {
                Some(waited) if waited >= STALE_AFTER_SECONDS => problem(
                    "stale",
                    format!(
                        "Envoy has not answered the {name}s sent {waited:.0} s ago (version {}): it is stale — paused, cut off from meshd, or overloaded",
                        t.last_sent.as_ref().map_or("?", |s| s.version.as_str())
                    ),
                ),
                _ if !nacked_last => {
                    if let Some(acked) = &t.last_acked {
                        out.fine.push(Finding {
                            kind: "synced",
                            message: format!("{name}s: Envoy acknowledged version {} at {}", acked.version, acked.at),
                        });
                    }
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xds::status::{Acked, Nack, SentResponse, TypeStatus};

    fn stream(types: Vec<TypeStatus>) -> StreamStatus {
        StreamStatus {
            node: "web-sidecar-proxy".into(),
            protocol: "delta",
            server: "s".into(),
            opened_at: "t".into(),
            snapshot_age_seconds: None,
            stuck: false,
            types,
            build_problems: Default::default(),
            transparent: false,
            implicit_upstreams: Vec::new(),
        }
    }

    fn type_status(url: &str) -> TypeStatus {
        TypeStatus {
            type_url: url.into(),
            last_sent: Some(SentResponse {
                nonce: "2".into(),
                version: "v2".into(),
                at: "2026-11-28T10:00:02Z".into(),
            }),
            last_acked: Some(Acked {
                nonce: "1".into(),
                version: "v1".into(),
                at: "2026-11-28T10:00:01Z".into(),
            }),
            last_nack: None,
            pending: 0,
            oldest_pending_seconds: None,
            resources: Default::default(),
        }
    }

    #[test]
    fn a_rejection_and_a_stale_type_come_first_named_by_type() {
        let mut listeners = type_status("type.googleapis.com/envoy.config.listener.v3.Listener");
        listeners.last_nack = Some(Nack {
            nonce: "2".into(),
            error: "malformed IP address: not-an-ip\n".into(),
            at: "2026-11-28T10:00:02Z".into(),
        });
        let mut clusters = type_status("type.googleapis.com/envoy.config.cluster.v3.Cluster");
        clusters.pending = 1;
        clusters.oldest_pending_seconds = Some(12.0);
        let routes = type_status("type.googleapis.com/envoy.config.route.v3.RouteConfiguration");
        let f = judge(
            "web-sidecar-proxy",
            &Default::default(),
            &Default::default(),
            &[stream(vec![listeners, clusters, routes])],
        );
        let kinds: Vec<&str> = f.problems.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, ["rejected", "stale"]);
        assert!(f.problems[0].message.contains("Listeners") && f.problems[0].message.ends_with("not-an-ip"));
        assert!(f.problems[1].message.contains("Clusters") && f.problems[1].message.contains("12 s"));
        assert_eq!(f.fine.len(), 1, "{f:?}");
        assert!(judge("x", &Default::default(), &Default::default(), &[]).problems[0].kind == "no-stream");
    }
}
