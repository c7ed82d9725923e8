//! A check's state.

use crate::proxy::string_enum;

string_enum! {
    /// A check's state. Ordered from best to worst.
    HealthStatus {
        /// Healthy.
        Passing = "passing",
        /// Degraded but serving.
        Warning = "warning",
        /// Failing (and the state of a check that has not run yet).
        #[default]
        Critical = "critical",
        /// Deliberately out of service.
        Maintenance = "maintenance",
    }
}

impl HealthStatus {
    /// True when an instance in this state may receive traffic under `only_passing`.
    pub fn admits(self, only_passing: bool) -> bool {
        match self {
            HealthStatus::Passing => true,
            HealthStatus::Warning => !only_passing,
            HealthStatus::Critical | HealthStatus::Maintenance => false,
        }
    }
}
