//! Health filtering: subsets, only-passing and the warning rule.

use super::*;
use structs::{HealthCheck, NodeService};

fn instance(id: &str, version: &str, status: HealthStatus) -> CheckServiceNode {
    CheckServiceNode {
        service: NodeService {
            id: id.into(),
            service: "api-sidecar-proxy".into(),
            meta: [("version".to_owned(), version.to_owned())].into_iter().collect(),
            ..Default::default()
        },
        checks: vec![HealthCheck {
            status,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn ids(nodes: &[CheckServiceNode]) -> Vec<&str> {
    nodes.iter().map(|n| n.service.id.as_str()).collect()
}

#[test]
fn subsets_select_by_filter_and_only_passing_decides_about_warning() {
    let all = vec![
        instance("a", "v1", HealthStatus::Passing),
        instance("b", "v1", HealthStatus::Warning),
        instance("c", "v1", HealthStatus::Critical),
        instance("d", "v2", HealthStatus::Passing),
        instance("e", "v1", HealthStatus::Maintenance),
    ];
    let mut req = HealthRequest {
        datacenter: "dc1".into(),
        service: "api".into(),
        connect: true,
        passing_only: false,
        healthy_only: true,
        filter: "Service.Meta.version == v1".into(),
        kind: None,
        token: None,
    };
    let filter = subset_filter(&req).unwrap();
    // Warning instances get traffic, critical and maintenance ones never (Consul's rule).
    assert_eq!(ids(&filter_health(&all, &req, &filter)), ["a", "b"]);
    // OnlyPassing: warning is out too.
    req.passing_only = true;
    assert_eq!(ids(&filter_health(&all, &req, &filter)), ["a"]);
    // A filter that does not parse is an error, not "everything".
    req.filter = "Service.Nope == 1".into();
    assert!(subset_filter(&req).is_err());
}

#[test]
fn a_terminating_gateway_standing_for_the_service_keeps_its_place_in_a_subset() {
    let mut gateway = instance("tgw", "", HealthStatus::Passing);
    gateway.service.kind = structs::ServiceKind::TerminatingGateway;
    let all = vec![
        instance("a", "v1", HealthStatus::Passing),
        gateway,
        instance("d", "v2", HealthStatus::Passing),
    ];
    let mut req = HealthRequest {
        datacenter: "dc1".into(),
        service: "ext".into(),
        connect: true,
        passing_only: false,
        healthy_only: true,
        filter: "Service.Meta.version == v2".into(),
        kind: None,
        token: None,
    };
    let filter = subset_filter(&req).unwrap();
    // The gateway applies the subset's filter itself, per SNI.
    assert_eq!(ids(&filter_health(&all, &req, &filter)), ["tgw", "d"]);
    // Not for a query of the instances themselves.
    req.connect = false;
    assert_eq!(ids(&filter_health(&all, &req, &filter)), ["d"]);
}
