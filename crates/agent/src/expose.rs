//! `Expose.Checks`: a sidecar that asks for it carries each HTTP check of its service through
//! a plain-HTTP listener of its own, so a check reaches an application that listens on the
//! loopback of its host (or inside a network namespace) only. For each `http://` check of the
//! service the agent adds an exposed path (`ParsedFromCheck`, reachable from this host and
//! the node's address only) on a port of [`EXPOSE_PORTS`] no other proxy of this agent uses,
//! and runs the check against the proxy's listener instead, as Consul does.

use crate::sidecar::NewCheck;
use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use structs::agent::CheckKind;
use structs::{ExposePath, NodeService, Problem, ValidationError};

/// The ports exposed checks listen on (Consul's `expose_min_port` to `expose_max_port`).
pub const EXPOSE_PORTS: RangeInclusive<u16> = 21500..=21755;

/// Routes the HTTP checks among `checks` (the service's) through `proxy`'s exposed paths,
/// when its `Expose.Checks` asks, with ports of `range` outside `taken` (other proxies'
/// listeners). Returns the checks it could not expose (HTTPS) with why, for the log.
pub fn expose_checks(
    proxy: &mut NodeService,
    checks: &mut [NewCheck],
    taken: &BTreeSet<u16>,
    range: &RangeInclusive<u16>,
) -> Result<Vec<(String, &'static str)>, ValidationError> {
    let mut skipped = Vec::new();
    if !proxy.proxy.expose.checks {
        return Ok(skipped);
    }
    let host = if proxy.address.is_empty() {
        "127.0.0.1".to_owned()
    } else {
        proxy.address.clone()
    };
    for check in checks.iter_mut() {
        let CheckKind::Http { url, .. } = &mut check.kind else {
            continue;
        };
        let Ok(mut parsed) = reqwest::Url::parse(url) else {
            continue;
        };
        if parsed.scheme() != "http" {
            skipped.push((
                check.check.check_id.clone(),
                "only http:// checks are exposed through the proxy",
            ));
            continue;
        }
        let local_port = parsed.port_or_known_default().unwrap_or(80);
        let path = parsed.path().to_owned();
        let listener_port = port_for(proxy, &path, local_port, taken, range)?;
        // The runner reaches the check through the proxy; what was registered is kept.
        if parsed.set_host(Some(&host)).is_err() || parsed.set_port(Some(listener_port)).is_err() {
            continue;
        }
        *url = parsed.to_string();
        // Consul's check shows the port it is exposed on.
        check.check.exposed_port = listener_port;
    }
    Ok(skipped)
}

/// The listener port of `path` on `local_port`: the one it has already, else the lowest of
/// `range` that neither this proxy nor `taken` uses (the path is added).
fn port_for(
    proxy: &mut NodeService,
    path: &str,
    local_port: u16,
    taken: &BTreeSet<u16>,
    range: &RangeInclusive<u16>,
) -> Result<u16, ValidationError> {
    let paths = &mut proxy.proxy.expose.paths;
    if let Some(p) = paths.iter().find(|p| p.path == path && p.local_path_port == local_port) {
        return Ok(p.listener_port);
    }
    let used: BTreeSet<u16> = paths.iter().map(|p| p.listener_port).collect();
    let port = range
        .clone()
        .find(|p| !used.contains(p) && !taken.contains(p) && *p != proxy.port)
        .ok_or_else(|| {
            ValidationError::new(
                "Connect.SidecarService.Proxy.Expose.Checks",
                Problem::Invalid(format!(
                    "no free port left in {}-{} for the checks' exposed paths",
                    range.start(),
                    range.end()
                )),
            )
        })?;
    paths.push(ExposePath {
        listener_port: port,
        path: path.to_owned(),
        local_path_port: local_port,
        protocol: "http".into(),
        parsed_from_check: true,
    });
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use structs::agent::CheckType;

    fn checks(service: &NodeService, urls: &[&str]) -> Vec<NewCheck> {
        let defs: Vec<CheckType> = urls
            .iter()
            .map(|u| serde_json::from_value(serde_json::json!({"Name": u, "HTTP": u, "Interval": "10s"})).unwrap())
            .collect();
        crate::sidecar::build_checks(service, defs.iter().map(|d| (String::new(), d)).collect()).unwrap()
    }

    fn url(c: &NewCheck) -> &str {
        match &c.kind {
            CheckKind::Http { url, .. } => url,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn http_checks_run_through_exposed_paths_on_free_ports() {
        let web = NodeService {
            id: "web".into(),
            service: "web".into(),
            port: 8080,
            ..Default::default()
        };
        let mut proxy = NodeService {
            id: "web-sidecar-proxy".into(),
            port: 21000,
            ..Default::default()
        };
        proxy.proxy.expose.checks = true;
        let mut cs = checks(
            &web,
            &[
                "http://127.0.0.1:8080/health?full=1",
                "https://127.0.0.1:8443/tls",
                "http://localhost:9102/metrics",
            ],
        );
        let taken: BTreeSet<u16> = [21500].into();
        let skipped = expose_checks(&mut proxy, &mut cs, &taken, &EXPOSE_PORTS).unwrap();
        assert_eq!(skipped.len(), 1, "https is not exposed: {skipped:?}");
        assert_eq!(url(&cs[0]), "http://127.0.0.1:21501/health?full=1");
        assert_eq!(url(&cs[1]), "https://127.0.0.1:8443/tls");
        assert_eq!(url(&cs[2]), "http://127.0.0.1:21502/metrics");
        let paths: Vec<(u16, &str, u16, bool)> = proxy
            .proxy
            .expose
            .paths
            .iter()
            .map(|p| (p.listener_port, p.path.as_str(), p.local_path_port, p.parsed_from_check))
            .collect();
        assert_eq!(paths, [(21501, "/health", 8080, true), (21502, "/metrics", 9102, true)]);
        // Registering again keeps the ports.
        let mut again = checks(&web, &["http://127.0.0.1:8080/health?full=1"]);
        expose_checks(&mut proxy, &mut again, &taken, &EXPOSE_PORTS).unwrap();
        assert_eq!(url(&again[0]), "http://127.0.0.1:21501/health?full=1");
        assert_eq!(proxy.proxy.expose.paths.len(), 2);
        // Without Expose.Checks nothing changes.
        proxy.proxy.expose.checks = false;
        let mut untouched = checks(&web, &["http://127.0.0.1:8080/other"]);
        expose_checks(&mut proxy, &mut untouched, &taken, &EXPOSE_PORTS).unwrap();
        assert_eq!(url(&untouched[0]), "http://127.0.0.1:8080/other");
    }
}
