//! The proxy lifecycle as meshd runs it:
//!
//! - [`bootstrap`]: the Envoy bootstrap every proxy starts from;
//! - [`agent`]: one logical proxy kept at its desired config through restart epochs (hot
//!   restart), with a retry budget, exponential back-off, abort-all on crashes and drain;
//! - [`envoy`]: Envoy as the agent's proxy (base id, epochs, admin, shared-memory cleanup);
//! - [`daemon`]: managed proxy daemons with pid/log files and a snapshot for re-adoption;
//! - [`node`]: service node strings, address resolution, private IPs;
//! - [`process`]: spawning tied children, process identity, pidfd watching, atomic files.
//!
//! See `docs/supervisor.md` for the state machines and the files on disk.

pub mod agent;
pub mod bootstrap;
pub mod daemon;
pub mod envoy;
pub mod node;
pub mod process;
