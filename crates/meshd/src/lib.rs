//! The meshd binary's commands: the command line, and the client commands (`connect envoy`,
//! `connect grpc-bootstrap`, `connect gateway`, `acl`, `tls`). The modes themselves are
//! `server-mode` and `agent-mode` over the `node` library; this crate only parses flags and
//! calls them.

pub mod acl_cli;
pub mod cli;
pub mod config_cli;
pub mod connect;
pub mod connect_gateway;
pub mod grpc_bootstrap;
pub mod peering_cli;
pub mod redirect_cli;
pub mod run;
pub mod snapshot_cli;
pub mod tls;
pub mod troubleshoot_cli;
pub mod troubleshoot_compare;

pub use node::{host_name, init_logging, shutdown_signal};
