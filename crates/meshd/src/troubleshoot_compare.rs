//! `meshd troubleshoot proxy`'s resource-by-resource comparison (`docs/troubleshoot.md`):
//! Envoy's config dump (`/config_dump?include_eds`) against what meshd's stream to that
//! Envoy holds (`Streams` of `GET /v1/internal/troubleshoot/proxy/:id`). A resource Envoy
//! acknowledged but does not run (a listener in error or still warming, a cluster warming or
//! gone), one Envoy runs that meshd no longer sends, and, on a delta stream (where Envoy
//! versions each resource as meshd does; load assignments it keeps without a version), one
//! Envoy runs at another version are problems;
//! the count of those that match is fine.

use serde_json::{Value, json};
use std::collections::BTreeMap;

fn finding(kind: &str, message: String) -> Value {
    json!({"Kind": kind, "Message": message})
}

/// What Envoy runs of one resource.
#[derive(Debug, Clone, PartialEq)]
enum Held {
    /// Active, at this version.
    Active(String),
    /// Not active yet (waiting for what it refers to).
    Warming,
    /// Refused, with Envoy's reason.
    Failed(String),
}

/// The short type name of a type URL (`Cluster`, `Listener`, ...).
fn short(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// What Envoy's config dump holds, by short type name then resource name: the dynamic
/// resources only (the bootstrap's static ones are not meshd's).
fn held(dump: &Value) -> BTreeMap<&'static str, BTreeMap<String, Held>> {
    let mut out: BTreeMap<&'static str, BTreeMap<String, Held>> = BTreeMap::new();
    let version = |v: &Value| v["version_info"].as_str().unwrap_or_default().to_owned();
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    for config in dump["configs"].as_array().into_iter().flatten() {
        let list = |key: &str| config[key].as_array().cloned().unwrap_or_default();
        let kind = config["@type"].as_str().unwrap_or_default();
        if kind.ends_with("ClustersConfigDump") {
            let m = out.entry("Cluster").or_default();
            for c in list("dynamic_active_clusters") {
                m.insert(str_of(&c["cluster"]["name"]), Held::Active(version(&c)));
            }
            for c in list("dynamic_warming_clusters") {
                m.entry(str_of(&c["cluster"]["name"])).or_insert(Held::Warming);
            }
        } else if kind.ends_with("ListenersConfigDump") {
            let m = out.entry("Listener").or_default();
            for l in list("dynamic_listeners") {
                let state = if l["active_state"].is_object() {
                    Held::Active(version(&l["active_state"]))
                } else if l["warming_state"].is_object() {
                    Held::Warming
                } else if l["error_state"].is_object() {
                    Held::Failed(str_of(&l["error_state"]["details"]))
                } else {
                    continue;
                };
                let name = str_of(&l["name"]);
                // A listener Envoy could not even name (its name is in the failed
                // configuration) is the rejection meshd reports.
                if !name.is_empty() {
                    m.insert(name, state);
                }
            }
        } else if kind.ends_with("RoutesConfigDump") && !kind.ends_with("ScopedRoutesConfigDump") {
            let m = out.entry("RouteConfiguration").or_default();
            for r in list("dynamic_route_configs") {
                m.insert(str_of(&r["route_config"]["name"]), Held::Active(version(&r)));
            }
        } else if kind.ends_with("EndpointsConfigDump") {
            let m = out.entry("ClusterLoadAssignment").or_default();
            for e in list("dynamic_endpoint_configs") {
                m.insert(str_of(&e["endpoint_config"]["cluster_name"]), Held::Active(version(&e)));
            }
        } else if kind.ends_with("SecretsConfigDump") {
            let m = out.entry("Secret").or_default();
            for s in list("dynamic_active_secrets") {
                m.insert(str_of(&s["name"]), Held::Active(version(&s)));
            }
            for s in list("dynamic_warming_secrets") {
                m.entry(str_of(&s["name"])).or_insert(Held::Warming);
            }
        }
    }
    out
}

/// Compares Envoy's config dump with meshd's newest stream to it (`streams`: the
/// troubleshoot answer's `Streams`), adding problems and what is fine.
pub fn compare(dump: &Value, streams: &Value, problems: &mut Vec<Value>, fine: &mut Vec<Value>) {
    let Some(stream) = streams.as_array().and_then(|s| s.last()) else {
        return;
    };
    let delta = stream["Protocol"] == "delta";
    let pending: Vec<&str> = stream["PendingTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(short))
        .collect();
    let envoy = held(dump);
    let mut sent: BTreeMap<&str, BTreeMap<&str, (&str, &str)>> = BTreeMap::new();
    for r in stream["Resources"].as_array().into_iter().flatten() {
        let (Some(t), Some(name)) = (r["TypeUrl"].as_str(), r["Name"].as_str()) else {
            continue;
        };
        sent.entry(short(t)).or_default().insert(
            name,
            (
                r["Version"].as_str().unwrap_or_default(),
                r["State"].as_str().unwrap_or_default(),
            ),
        );
    }
    let mut matching: BTreeMap<&str, usize> = BTreeMap::new();
    for (t, resources) in &sent {
        // A type Envoy's dump does not show (one this Envoy does not report) is not compared.
        let Some(theirs) = envoy.get(t) else { continue };
        for (name, (version, state)) in resources {
            // Rejected, unanswered or not yet sent: meshd's own findings say so.
            if *state != "SYNCED" {
                continue;
            }
            match theirs.get(*name) {
                // Envoy keeps no version for a load assignment: compared by name only.
                Some(Held::Active(v)) if !delta || v.is_empty() || v == version => {
                    *matching.entry(t).or_default() += 1;
                }
                Some(Held::Active(v)) => problems.push(finding(
                    "resource-version",
                    format!("Envoy runs {t} {name} at version {v}; meshd sent version {version} and Envoy acknowledged it"),
                )),
                Some(Held::Warming) => problems.push(finding(
                    "resource-warming",
                    format!("Envoy acknowledged {t} {name} but it is still warming (waiting for what it refers to: endpoints, routes, secrets)"),
                )),
                Some(Held::Failed(why)) => problems.push(finding(
                    "resource-failed",
                    format!("Envoy acknowledged {t} {name} but does not run it: {why}"),
                )),
                None => problems.push(finding(
                    "resource-missing",
                    format!("Envoy acknowledged {t} {name} but does not hold it"),
                )),
            }
        }
    }
    for (t, theirs) in &envoy {
        // Until Envoy answers a type's last response it may hold the set before it.
        if pending.contains(t) {
            continue;
        }
        let ours = sent.get(t);
        // A cluster meshd sends with its endpoints inline shows in Envoy's endpoint dump
        // too, though no load assignment of its own was sent.
        let inline =
            |name: &str| *t == "ClusterLoadAssignment" && sent.get("Cluster").is_some_and(|c| c.contains_key(name));
        for name in theirs.keys() {
            if ours.is_none_or(|o| !o.contains_key(name.as_str())) && !inline(name) {
                problems.push(finding(
                    "resource-extra",
                    format!("Envoy holds {t} {name}, which meshd does not send it (left from an earlier configuration or another server)"),
                ));
            }
        }
    }
    let total: usize = matching.values().sum();
    if total > 0 {
        let by_type: Vec<String> = matching.iter().map(|(t, n)| format!("{t}s {n}")).collect();
        fine.push(finding(
            "resources",
            format!(
                "{total} resources Envoy runs match what meshd sent ({})",
                by_type.join(", ")
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump() -> Value {
        json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump"},
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {"name": "local_agent"}}],
             "dynamic_active_clusters": [
                {"version_info": "v1", "cluster": {"name": "api"}},
                {"version_info": "v1", "cluster": {"name": "old"}}],
             "dynamic_warming_clusters": [{"version_info": "v2", "cluster": {"name": "db"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
             "dynamic_listeners": [
                {"name": "public", "active_state": {"version_info": "v1", "listener": {}}},
                {"name": "bad", "error_state": {"details": "malformed IP address: x"}},
                {"name": "", "error_state": {"details": "rejected before it had a name"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
             "dynamic_endpoint_configs": [
                {"version_info": "e9", "endpoint_config": {"cluster_name": "api"}},
                {"endpoint_config": {"cluster_name": "db"}}]}
        ]})
    }

    fn resource(t: &str, name: &str, version: &str, state: &str) -> Value {
        json!({"TypeUrl": format!("type.googleapis.com/envoy.config.x.v3.{t}"), "Name": name, "Version": version, "State": state})
    }

    fn streams(protocol: &str, pending: &[&str]) -> Value {
        json!([{"Protocol": protocol, "PendingTypes": pending.iter().map(|t| format!("type.googleapis.com/envoy.config.x.v3.{t}")).collect::<Vec<_>>(),
        "Resources": [
            resource("Cluster", "api", "v1", "SYNCED"),
            resource("Cluster", "db", "v2", "SYNCED"),
            resource("Cluster", "gone", "v1", "SYNCED"),
            resource("Listener", "public", "v1", "SYNCED"),
            resource("Listener", "bad", "v3", "SYNCED"),
            resource("ClusterLoadAssignment", "api", "e1", "SYNCED"),
            resource("RouteConfiguration", "api", "r1", "ERROR"),
        ]}])
    }

    fn kinds(problems: &[Value]) -> Vec<String> {
        problems
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p["Kind"].as_str().unwrap_or_default(),
                    p["Message"].as_str().unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn each_resource_envoy_runs_is_compared_with_what_meshd_sent() {
        let (mut problems, mut fine) = (Vec::new(), Vec::new());
        compare(&dump(), &streams("sotw", &[]), &mut problems, &mut fine);
        let got = kinds(&problems);
        assert_eq!(got.len(), 4, "{got:#?}");
        assert!(
            got[0].starts_with("resource-warming") && got[0].contains("Cluster db"),
            "{got:#?}"
        );
        assert!(
            got[1].starts_with("resource-missing") && got[1].contains("Cluster gone"),
            "{got:#?}"
        );
        assert!(
            got[2].starts_with("resource-failed") && got[2].contains("malformed IP address: x"),
            "{got:#?}"
        );
        assert!(
            got[3].starts_with("resource-extra") && got[3].contains("Cluster old"),
            "{got:#?}"
        );
        // SotW: Envoy versions a type, not a resource: the endpoints' versions differ and match.
        assert_eq!(
            kinds(&fine),
            [
                "resources 3 resources Envoy runs match what meshd sent (Clusters 1, ClusterLoadAssignments 1, Listeners 1)"
            ]
        );
    }

    #[test]
    fn a_delta_stream_compares_versions_and_a_pending_type_is_not_judged_extra() {
        let (mut problems, mut fine) = (Vec::new(), Vec::new());
        compare(&dump(), &streams("delta", &["Cluster"]), &mut problems, &mut fine);
        let got = kinds(&problems);
        assert!(
            got.iter()
                .any(|p| p.starts_with("resource-version") && p.contains("ClusterLoadAssignment api at version e9")),
            "{got:#?}"
        );
        assert!(!got.iter().any(|p| p.starts_with("resource-extra")), "{got:#?}");
    }

    #[test]
    fn no_stream_no_comparison() {
        let (mut problems, mut fine) = (Vec::new(), Vec::new());
        compare(&dump(), &json!([]), &mut problems, &mut fine);
        assert!(problems.is_empty() && fine.is_empty());
    }
}
