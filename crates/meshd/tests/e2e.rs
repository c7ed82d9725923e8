//! meshd's end-to-end tests, in one test binary: one link of the meshd library and its
//! dependencies instead of one per file (CI time, issue #31). Each file is a module;
//! `mesh` and `agents` are the shared setups. `cargo test -p meshd --test e2e MODULE::`
//! runs one file's tests.

mod agents;
mod mesh;

mod acl_cli;
mod acl_e2e;
mod agent_acl;
mod agent_e2e;
mod agent_failover;
mod agent_ports;
mod api_gateway_e2e;
mod audit;
mod connect_gateway_cli;
mod envoy_e2e;
mod federation;
mod gateway_e2e;
mod grpc_bootstrap_cli;
mod ha;
mod http_conventions;
mod l7_e2e;
mod managed_e2e;
mod peering_e2e;
mod server_process;
mod soak_short;
mod tls_e2e;
mod troubleshoot_e2e;
mod xds_failover;
mod xds_restart;

// The benchmarks' sources, compiled (and linted, in CI) with the tests: CI builds no
// benchmark binary (`cargo xtask bench` does), and a benchmark that no longer compiles or
// lints fails here. Their `main`s are not called.
#[allow(dead_code)]
#[path = "../benches/agent.rs"]
mod bench_agent;
#[allow(dead_code)]
#[path = "../benches/agent_cache.rs"]
mod bench_agent_cache;
#[allow(dead_code)]
#[path = "../benches/api_gateway.rs"]
mod bench_api_gateway;
#[allow(dead_code)]
#[path = "../benches/chaos.rs"]
mod bench_chaos;
#[allow(dead_code)]
#[path = "../benches/dns.rs"]
mod bench_dns;
#[allow(dead_code)]
#[path = "../benches/federation.rs"]
mod bench_federation;
#[allow(dead_code)]
#[path = "../benches/ha.rs"]
mod bench_ha;
#[allow(dead_code)]
#[path = "../benches/kv.rs"]
mod bench_kv;
#[allow(dead_code)]
#[path = "../benches/managed.rs"]
mod bench_managed;
#[allow(dead_code)]
#[path = "../benches/memory.rs"]
mod bench_memory;
#[allow(dead_code)]
#[path = "../benches/nack.rs"]
mod bench_nack;
#[allow(dead_code)]
#[path = "../benches/peering.rs"]
mod bench_peering;
#[allow(dead_code)]
#[path = "../benches/server.rs"]
mod bench_server;
#[allow(dead_code)]
#[path = "../benches/soak.rs"]
mod bench_soak;
#[allow(dead_code)]
#[path = "../benches/storm.rs"]
mod bench_storm;
#[allow(dead_code)]
#[path = "../benches/xds.rs"]
mod bench_xds;
