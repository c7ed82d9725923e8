//! Prepared queries (`/v1/query`), as Consul's API shapes them: a named, stored service
//! lookup with filters, executed by id or name.

use crate::{CheckServiceNode, HealthStatus, Index};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Failover to other datacenters (only the empty policy: meshd has one datacenter until
/// federation exists).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Failover {
    /// Try the N nearest datacenters.
    #[serde(rename = "NearestN")]
    pub nearest_n: u32,
    /// Try these datacenters in order.
    pub datacenters: Vec<String>,
}

/// Connect options of a query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryConnect {
    /// Return the connect-capable instances (sidecars, native) instead.
    pub enabled: bool,
}

/// What a query looks up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceQuery {
    /// The service name.
    pub service: String,
    /// Failover (must be empty here).
    pub failover: Failover,
    /// Only instances whose checks all pass (otherwise warning passes too; critical never).
    pub only_passing: bool,
    /// Checks left out of the health filter.
    #[serde(rename = "IgnoreCheckIDs")]
    pub ignore_check_ids: Vec<String>,
    /// Sort by distance to a node (`_agent`: the one asked); no coordinates here, so kept
    /// and not used for ordering.
    pub near: String,
    /// Tags every instance must have (`!tag`: must not have).
    pub tags: Vec<String>,
    /// Node metadata every instance's node must have.
    pub node_meta: BTreeMap<String, String>,
    /// Service metadata every instance must have.
    pub service_meta: BTreeMap<String, String>,
    /// Connect options.
    pub connect: QueryConnect,
}

/// DNS options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryDns {
    /// The TTL answers carry.
    #[serde(rename = "TTL")]
    pub ttl: String,
}

/// A template: the query answers every name it matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryTemplate {
    /// `name_prefix_match` (the only type Consul has).
    #[serde(rename = "Type")]
    pub kind: String,
    /// A regular expression on the name asked for, whose groups `${match(N)}` names.
    pub regexp: String,
    /// Drop tags that interpolate to "".
    pub remove_empty_tags: bool,
}

/// A stored prepared query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PreparedQuery {
    /// Its id (a UUID).
    #[serde(rename = "ID")]
    pub id: String,
    /// Its name ("" for none; a template's is the prefix it matches).
    pub name: String,
    /// A session whose end deletes the query.
    pub session: String,
    /// The token it runs with ("" for the caller's).
    pub token: String,
    /// What it looks up.
    pub service: ServiceQuery,
    /// DNS options.
    #[serde(rename = "DNS")]
    pub dns: QueryDns,
    /// Template options.
    pub template: QueryTemplate,
    /// The write that created it.
    pub create_index: Index,
    /// The write that changed it last.
    pub modify_index: Index,
}

impl PreparedQuery {
    /// Checks what meshd can honour, naming the field that it cannot.
    pub fn validate(&self) -> Result<(), crate::ValidationError> {
        use crate::{Problem, ValidationError};
        let bad = |field: &str, why: &str| Err(ValidationError::new(field, Problem::Invalid(why.into())));
        if self.service.service.is_empty() {
            return Err(ValidationError::new("Service.Service", Problem::Required("")));
        }
        if self.service.failover != Failover::default() {
            return bad(
                "Service.Failover",
                "failover to other datacenters needs federation, which this cluster does not have",
            );
        }
        match self.template.kind.as_str() {
            "" if self.template.regexp.is_empty() => {}
            "" => return bad("Template.Type", "required with Template.Regexp"),
            "name_prefix_match" => {
                if let Err(e) = regex::Regex::new(&self.template.regexp) {
                    return bad("Template.Regexp", &format!("not a regular expression: {e}"));
                }
            }
            _ => return bad("Template.Type", "the only template type is name_prefix_match"),
        }
        Ok(())
    }

    /// Whether this is a template.
    pub fn is_template(&self) -> bool {
        !self.template.kind.is_empty()
    }

    /// The query as run for `asked` (a template's name fields and tags interpolated with
    /// `${name.full}`, `${name.prefix}`, `${name.suffix}` and `${match(N)}`).
    pub fn render(&self, asked: &str) -> PreparedQuery {
        if !self.is_template() {
            return self.clone();
        }
        let groups: Vec<String> = regex::Regex::new(&self.template.regexp)
            .ok()
            .and_then(|re| {
                re.captures(asked).map(|c| {
                    c.iter()
                        .map(|m| m.map_or(String::new(), |m| m.as_str().to_owned()))
                        .collect()
                })
            })
            .unwrap_or_default();
        let suffix = asked.strip_prefix(self.name.as_str()).unwrap_or_default();
        let fill = |text: &str| {
            let mut out = text
                .replace("${name.full}", asked)
                .replace("${name.prefix}", &self.name)
                .replace("${name.suffix}", suffix);
            for (i, g) in groups.iter().enumerate() {
                out = out.replace(&format!("${{match({i})}}"), g);
            }
            // Groups that did not match (or do not exist) interpolate to "".
            regex::Regex::new(r"\$\{match\(\d+\)\}").map_or(out.clone(), |re| re.replace_all(&out, "").into_owned())
        };
        let mut rendered = self.clone();
        rendered.service.service = fill(&self.service.service);
        rendered.service.tags = self.service.tags.iter().map(|t| fill(t)).collect();
        if self.template.remove_empty_tags {
            rendered.service.tags.retain(|t| !t.is_empty() && t != "!");
        }
        rendered
    }

    /// Whether an instance passes the query's filters.
    pub fn admits(&self, csn: &CheckServiceNode) -> bool {
        let q = &self.service;
        let healthy = csn
            .checks
            .iter()
            .filter(|c| !q.ignore_check_ids.contains(&c.check_id))
            .all(|c| match c.status {
                HealthStatus::Passing => true,
                HealthStatus::Warning => !q.only_passing,
                _ => false,
            });
        let tags = q.tags.iter().all(|t| match t.strip_prefix('!') {
            Some(not) => !csn.service.tags.iter().any(|have| have.eq_ignore_ascii_case(not)),
            None => csn.service.tags.iter().any(|have| have.eq_ignore_ascii_case(t)),
        });
        let node_meta = q.node_meta.iter().all(|(k, v)| csn.node.meta.get(k) == Some(v));
        let service_meta = q.service_meta.iter().all(|(k, v)| csn.service.meta.get(k) == Some(v));
        healthy && tags && node_meta && service_meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_interpolate_the_name_asked_for() {
        let q: PreparedQuery = serde_json::from_value(serde_json::json!({
            "Name": "geo-",
            "Template": {"Type": "name_prefix_match", "Regexp": "^geo-([a-z]+)-([a-z]+)$"},
            "Service": {"Service": "${match(1)}", "Tags": ["${match(2)}", "${match(3)}", "!old"]},
        }))
        .unwrap();
        q.validate().unwrap();
        let r = q.render("geo-web-eu");
        assert_eq!(r.service.service, "web");
        assert_eq!(r.service.tags, ["eu", "", "!old"]);
        let plain: PreparedQuery = serde_json::from_value(serde_json::json!({
            "Name": "api-", "Template": {"Type": "name_prefix_match"},
            "Service": {"Service": "${name.suffix}"},
        }))
        .unwrap();
        assert_eq!(plain.render("api-db").service.service, "db");
        let e = serde_json::from_value::<PreparedQuery>(serde_json::json!({
            "Service": {"Service": "web", "Failover": {"Datacenters": ["dc2"]}}}))
        .unwrap()
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "Service.Failover");
    }
}
