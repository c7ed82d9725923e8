//! The write-time check that intentions only require JWT providers that exist: an
//! intention naming a missing provider could never be satisfied (every request it governs
//! would be refused), and a provider still required by intentions cannot be deleted.

use crate::state::State;
use structs::{ConfigEntry, ConfigEntryKind, Problem, ValidationError};

/// Refuses a write (`Some(entry)`) or delete (`None`) of `kind`/`name` that would leave an
/// intention requiring a `jwt-provider` that does not exist. The error names the entry and
/// field of the intention.
pub(crate) fn check_jwt_refs(
    state: &State,
    kind: ConfigEntryKind,
    name: &str,
    entry: Option<&ConfigEntry>,
) -> Result<(), ValidationError> {
    match (kind, entry) {
        (ConfigEntryKind::ServiceIntentions, Some(ConfigEntry::ServiceIntentions(si))) => {
            for (field, provider) in si.jwt_provider_refs() {
                if state.config_entry(ConfigEntryKind::JwtProvider, &provider).is_none() {
                    return Err(ValidationError::new(
                        format!("service-intentions {:?} {field}", si.name),
                        Problem::Invalid(format!("no jwt-provider named {provider:?} exists: write it first")),
                    ));
                }
            }
            Ok(())
        }
        (ConfigEntryKind::JwtProvider, None) => {
            for entry in state.config_entries(ConfigEntryKind::ServiceIntentions) {
                let ConfigEntry::ServiceIntentions(si) = entry.as_ref() else {
                    continue;
                };
                if let Some((field, _)) = si.jwt_provider_refs().into_iter().find(|(_, p)| p == name) {
                    return Err(ValidationError::new(
                        format!("service-intentions {:?} {field}", si.name),
                        Problem::Invalid(format!(
                            "requires jwt-provider {name:?}: remove the requirement before deleting the provider"
                        )),
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
