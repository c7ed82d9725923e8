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
mod connect_gateway_cli;
mod envoy_e2e;
mod gateway_e2e;
mod grpc_bootstrap_cli;
mod ha;
mod http_conventions;
mod l7_e2e;
mod managed_e2e;
mod server_process;
mod soak_short;
mod tls_e2e;
mod xds_failover;
mod xds_restart;
