//! Envoy's lifecycle as meshd runs it. For now: the bootstrap every Envoy starts from
//! ([`bootstrap::bootstrap_json`]); restart epochs, hot restart, back-off and drain arrive
//! with the supervisor issue.

pub mod bootstrap;
