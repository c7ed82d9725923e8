//! L7 chain recompile + resource rebuild benchmark (prints figures; asserts nothing).
//!
//! One proxy with 10 upstreams; each upstream's service has a service-router with 20
//! routes, a service-splitter over three subsets and a service-resolver with those three
//! subsets (and failover). One service's router changes: its chain is compiled again and the
//! proxy's resources rebuilt. Printed: the compile time of one chain, the rebuild time of
//! the proxy's resources, their sum (the CPU one affected proxy costs per change), and the
//! bytes a delta stream receives for the change (the resources whose version changed).
//!
//! Run: `cargo xtask bench proxycfg` (or `xds`). Scale with `ITERS=` (2000).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use structs::{CompiledDiscoveryChain, ConfigEntry};

use test_support::figures::{env_usize, percentile};
use xds::versioned::VersionedResources;

const UPSTREAMS: usize = 10;
const ROUTES: usize = 20;

fn svc(i: usize) -> String {
    format!("svc-{i}")
}

/// The routing entries of every upstream service; `variant` changes svc-0's router.
fn entries(variant: usize) -> Vec<ConfigEntry> {
    let mut out = Vec::new();
    for i in 0..UPSTREAMS {
        let name = svc(i);
        out.push(json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}));
        out.push(
            json!({"Kind": "service-resolver", "Name": name, "DefaultSubset": "v1", "ConnectTimeout": "2s",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"},
                        "v3": {"Filter": "Service.Meta.version == v3 and \"canary\" in Service.Tags"}},
            "Failover": {"v1": {"ServiceSubset": "v2"}}}),
        );
        out.push(json!({"Kind": "service-splitter", "Name": name, "Splits": [
            {"Weight": 50, "ServiceSubset": "v1"}, {"Weight": 30, "ServiceSubset": "v2"},
            {"Weight": 20, "ServiceSubset": "v3", "RequestHeaders": {"Set": {"x-canary": "1"}}}]}));
        let routes: Vec<_> = (0..ROUTES)
            .map(|r| {
                let prefix = if i == 0 {
                    format!("/r{r}-{variant}")
                } else {
                    format!("/r{r}")
                };
                let subset = ["v1", "v2", "v3"][r % 3];
                json!({"Match": {"HTTP": {"PathPrefix": prefix, "Header": [{"Name": "x-user", "Regex": "^u[0-9]+$"}],
                                          "Methods": ["GET", "POST"]}},
                       "Destination": {"ServiceSubset": subset, "NumRetries": 2,
                                       "RetryOnStatusCodes": [503], "RequestTimeout": "3s",
                                       "ResponseHeaders": {"Add": {"x-route": format!("{r}")}}}})
            })
            .collect();
        out.push(json!({"Kind": "service-router", "Name": name, "Routes": routes}));
    }
    out.into_iter().map(|v| ConfigEntry::from_json(v).unwrap()).collect()
}

/// The entries by kind, as the data sources hold them.
struct Lists(discovery_chain::fixture::EntrySet);

impl Lists {
    fn new(all: &[ConfigEntry]) -> Self {
        Lists(
            all.iter()
                .fold(Default::default(), |set: discovery_chain::fixture::EntrySet, e| {
                    set.with(serde_json::to_value(e).unwrap())
                }),
        )
    }

    fn compile(&self, service: &str, trust_domain: &str) -> CompiledDiscoveryChain {
        self.0.compile_with(service, trust_domain, None, None).unwrap()
    }
}

/// The proxy's snapshot with every upstream's chain compiled from `all`, and instances for
/// every target.
fn snapshot_with(base: &ConfigSnapshot, all: &Lists, trust_domain: &str) -> ConfigSnapshot {
    let mut snap = base.clone();
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        let up = Arc::make_mut(up);
        let chain = all.compile(&id.name, trust_domain);
        for target in chain.targets.keys() {
            up.endpoints.insert(
                target.clone(),
                Arc::new(vec![
                    instance(&id.name, "10.0.0.1", 21000),
                    instance(&id.name, "10.0.0.2", 21000),
                ]),
            );
        }
        up.chain = Some(Arc::new(chain));
    }
    snap
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let iters = env_usize("ITERS", 2000);
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: (0..UPSTREAMS)
            .map(|i| (&*Box::leak(svc(i).into_boxed_str()), 9000 + i as u16, "http"))
            .collect(),
        intentions: vec![],
        instances: vec![],
    };
    let base = snapshot(&ca, &scenario);
    let trust_domain = base.roots.as_ref().unwrap().trust_domain.clone();
    let before = Lists::new(&entries(0));
    let after = Lists::new(&entries(1));
    let shared = xds::resources::SharedEncodings::default();
    let first = Arc::new(snapshot_with(&base, &before, &trust_domain));
    let previous = VersionedResources::build_after(&first, Some(&shared), None).unwrap();

    // One chain compiled (the changed service's), as its data source does once per change.
    let mut compile_times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        std::hint::black_box(after.compile("svc-0", &trust_domain));
        compile_times.push(t0.elapsed());
    }
    // The proxy's resources rebuilt with the new chain of svc-0 (what each affected proxy's
    // stream does: the other upstreams' resources are reused).
    let second = {
        let mut snap = (*first).clone();
        let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
            unreachable!("a sidecar snapshot")
        };
        for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
            if id.name == "svc-0" {
                Arc::make_mut(up).chain = Some(Arc::new(after.compile("svc-0", &trust_domain)));
            }
        }
        Arc::new(snap)
    };
    let mut rebuild_times = Vec::with_capacity(iters);
    let mut rebuilt = None;
    for _ in 0..iters {
        let t0 = Instant::now();
        let r = VersionedResources::build_after(&second, Some(&shared), Some(&previous)).unwrap();
        rebuild_times.push(t0.elapsed());
        rebuilt = Some(r);
    }
    // For comparison: every resource of the proxy built from scratch.
    let mut full_times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        std::hint::black_box(VersionedResources::build(&second, Some(&shared)).unwrap());
        full_times.push(t0.elapsed());
    }
    let rebuilt = rebuilt.unwrap();
    // What a delta stream receives: every resource whose version changed.
    let mut changed = 0usize;
    let mut bytes = 0usize;
    for type_url in xds::resources::TYPES {
        for (name, v) in rebuilt.of(type_url) {
            if previous.get(type_url, name).is_none_or(|p| p.version != v.version) {
                changed += 1;
                bytes += v.resource.value.len() + name.len() + v.version.len();
            }
        }
    }
    let total_resources: usize = xds::resources::TYPES.iter().map(|t| rebuilt.of(t).count()).sum();
    compile_times.sort();
    rebuild_times.sort();
    full_times.sort();
    let compile_p50 = percentile(&compile_times, 0.5);
    let rebuild_p50 = percentile(&rebuild_times, 0.5);
    println!(
        "L7 chain recompile + resource rebuild ({UPSTREAMS} upstreams, each: router with {ROUTES} routes, splitter over 3 subsets, resolver with 3 subsets + failover; {iters} iterations)"
    );
    println!(
        "  one chain compiled: p50 {}  p99 {}",
        us(compile_p50),
        us(percentile(&compile_times, 0.99))
    );
    println!(
        "  the proxy's resources rebuilt ({total_resources} resources): p50 {}  p99 {}",
        us(rebuild_p50),
        us(percentile(&rebuild_times, 0.99))
    );
    println!(
        "  (the same proxy's resources all built from scratch: p50 {})",
        us(percentile(&full_times, 0.5))
    );
    println!(
        "  CPU per change for one affected proxy (compile + rebuild, p50): {}   [target <= 200 µs]",
        us(compile_p50 + rebuild_p50)
    );
    println!("  sent to an affected delta stream per change: {changed} resources, {bytes} bytes");
}
