//! What changes between two builds of a proxy's resources (a dry run's answer): each
//! listener, route, cluster and load assignment added, removed or changed, and for a changed
//! one the fields that differ, as paths into Envoy's JSON of it with the value before and
//! after. Secrets are never compared nor shown (the leaf's carries its private key).

use super::set::{CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources};
use envoy_types::pb::google::protobuf::Any;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// One resource's change.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceDiff {
    /// `listener`, `route`, `cluster` or `endpoints`.
    #[serde(rename = "Type")]
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// `added`, `removed` or `changed`.
    pub change: &'static str,
    /// For a changed resource, the fields that differ (at most the cap given).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldDiff>,
    /// Fields that differ past the cap.
    #[serde(skip_serializing_if = "is_zero")]
    pub more_fields: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One field that differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct FieldDiff {
    /// Where, in Envoy's JSON of the resource: `virtualHosts[0].routes[0].route.weightedClusters.clusters[1].weight`.
    pub path: String,
    /// The value before (absent: the field was not set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// The value after (absent: the field is no longer set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

const KINDS: [(&str, &str); 4] = [
    (LISTENER, "listener"),
    (ROUTE, "route"),
    (CLUSTER, "cluster"),
    (ENDPOINT, "endpoints"),
];

/// Every resource of `resources` but secrets, by type and name (shared encodings included).
fn encoded<'a>(resources: &'a Resources, type_url: &'static str) -> BTreeMap<&'a str, &'a Any> {
    let mut out: BTreeMap<&'a str, &'a Any> = BTreeMap::new();
    if let Some(by_name) = resources.by_type.get(type_url) {
        out.extend(by_name.iter().map(|(n, a)| (n.as_str(), a)));
    }
    if let Some(by_name) = resources.shared.get(type_url) {
        out.extend(by_name.iter().map(|(n, v)| (n.as_str(), &v.resource)));
    }
    out
}

/// The changes from `before` to `after`, listeners first, at most `max_fields` fields each.
pub fn diff(before: &Resources, after: &Resources, max_fields: usize) -> Vec<ResourceDiff> {
    let mut out = Vec::new();
    for (type_url, kind) in KINDS {
        let (b, a) = (encoded(before, type_url), encoded(after, type_url));
        let names: std::collections::BTreeSet<&str> = b.keys().chain(a.keys()).copied().collect();
        for name in names {
            let entry = |change, fields: Vec<FieldDiff>, more_fields| ResourceDiff {
                kind,
                name: name.to_owned(),
                change,
                fields,
                more_fields,
            };
            match (b.get(name), a.get(name)) {
                (Some(_), None) => out.push(entry("removed", Vec::new(), 0)),
                (None, Some(_)) => out.push(entry("added", Vec::new(), 0)),
                (Some(x), Some(y)) if x.value != y.value => {
                    let mut fields = Vec::new();
                    match (json(x), json(y)) {
                        (Some(x), Some(y)) => fields_of(&x, &y, String::new(), &mut fields),
                        _ => fields.push(FieldDiff {
                            path: "(undecodable)".into(),
                            before: None,
                            after: None,
                        }),
                    }
                    // A map encodes in any order: equal JSON is the same resource.
                    if fields.is_empty() {
                        continue;
                    }
                    let more = fields.len().saturating_sub(max_fields);
                    fields.truncate(max_fields);
                    out.push(entry("changed", fields, more));
                }
                _ => {}
            }
        }
    }
    out
}

fn json(any: &Any) -> Option<Value> {
    envoy_json::to_json(&any.type_url, &any.value).ok()
}

/// Appends the paths under `path` where `a` and `b` differ.
fn fields_of(a: &Value, b: &Value, path: String, out: &mut Vec<FieldDiff>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (x.get(key), y.get(key)) {
                    (Some(v), Some(w)) => fields_of(v, w, sub, out),
                    (v, w) => out.push(FieldDiff {
                        path: sub,
                        before: v.cloned(),
                        after: w.cloned(),
                    }),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                fields_of(v, w, format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(FieldDiff {
            path,
            before: Some(a.clone()),
            after: Some(b.clone()),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_named_by_their_path() {
        let a = json!({"name": "r", "virtualHosts": [{"routes": [{"route": {"weightedClusters": {"clusters": [
            {"name": "v1", "weight": 50}, {"name": "v2", "weight": 50}]}}}]}]});
        let b = json!({"name": "r", "virtualHosts": [{"routes": [{"route": {"weightedClusters": {"clusters": [
            {"name": "v1", "weight": 10}, {"name": "v2", "weight": 90}]}}}], "extra": true}]});
        let mut out = Vec::new();
        fields_of(&a, &b, String::new(), &mut out);
        let paths: Vec<&str> = out.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "virtualHosts[0].extra",
                "virtualHosts[0].routes[0].route.weightedClusters.clusters[0].weight",
                "virtualHosts[0].routes[0].route.weightedClusters.clusters[1].weight",
            ]
        );
        assert_eq!(out[1].before, Some(json!(50)));
        assert_eq!(out[1].after, Some(json!(10)));
        assert_eq!(out[0].before, None);
    }
}
