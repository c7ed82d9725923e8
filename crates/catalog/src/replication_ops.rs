//! Planning of replication writes: a secondary datacenter's copy of what the primary holds
//! (config entries, intentions among them; ACL policies, roles and global tokens) made equal
//! to the primary's in one write. Only what differs is written, so a round that changed
//! nothing writes nothing and wakes no one.

use crate::plan::Plan;
use crate::state::{Change, State};
use std::collections::{BTreeMap, BTreeSet};
use structs::acl::{AclPolicy, AclReplica, AclRole, AclToken};
use structs::{ConfigEntry, ConfigEntryKind, Index};

/// The config entries made `entries`: each differing one written, each missing one deleted.
pub(crate) fn plan_config(state: &State, entries: &[ConfigEntry]) -> Plan {
    let wanted: BTreeMap<(ConfigEntryKind, &str), &ConfigEntry> =
        entries.iter().map(|e| ((e.kind(), e.name()), e)).collect();
    let mut changes = Vec::new();
    for kind in ConfigEntryKind::ALL {
        for have in state.config_entries(kind) {
            if !wanted.contains_key(&(kind, have.name())) {
                changes.push(Change::DeleteConfig(kind, have.name().to_owned()));
            }
        }
    }
    for (&(kind, name), entry) in &wanted {
        let same = state
            .config_entry(kind, name)
            .is_some_and(|have| crate::plan::same_entry(&have, entry));
        if !same {
            changes.push(Change::PutConfig((*entry).clone()));
        }
    }
    Plan::write(changes)
}

/// The ACL system made the primary's `replica`: policies and roles as it has them, its
/// global tokens, this datacenter's local tokens kept.
pub(crate) fn plan_acl(state: &State, replica: &AclReplica) -> Plan {
    let mut changes = Vec::new();
    // Removals (and rows whose name changes) first: a name moving from one row to another
    // within the write must find its old row gone before the new one takes it.
    let policies = Rows::diff(state.acl_policies().map(|p| &**p), &replica.policies, |p| {
        (&p.id, &p.name)
    });
    let roles = Rows::diff(state.acl_roles().map(|r| &**r), &replica.roles, |r| (&r.id, &r.name));
    let tokens = Rows::diff(
        state.acl_tokens().map(|t| &**t).filter(|t| !t.local),
        &replica.tokens,
        |t| (&t.accessor_id, &t.secret_id),
    );
    changes.extend(policies.delete.into_iter().map(Change::DeleteAclPolicy));
    changes.extend(roles.delete.into_iter().map(Change::DeleteAclRole));
    changes.extend(tokens.delete.into_iter().map(Change::DeleteAclToken));
    changes.extend(policies.put.into_iter().map(Change::PutAclPolicy));
    changes.extend(roles.put.into_iter().map(Change::PutAclRole));
    changes.extend(tokens.put.into_iter().map(Change::PutAclToken));
    Plan::write(changes)
}

/// What replication changes in one table.
struct Rows<T> {
    /// Ids to delete: gone from the primary, or whose unique second key changed.
    delete: BTreeSet<String>,
    /// Rows to write.
    put: Vec<T>,
}

/// A row's indexes, which differ between datacenters and are not compared.
trait Indexed: Clone + PartialEq {
    fn set_indexes(&mut self, create: Index, modify: Index);
    fn indexes(&self) -> (Index, Index);
}

macro_rules! indexed {
    ($($t:ty),*) => {$(
        impl Indexed for $t {
            fn set_indexes(&mut self, create: Index, modify: Index) {
                (self.create_index, self.modify_index) = (create, modify);
            }
            fn indexes(&self) -> (Index, Index) {
                (self.create_index, self.modify_index)
            }
        }
    )*};
}
indexed!(AclPolicy, AclRole, AclToken);

impl<T: Indexed> Rows<T> {
    /// `have` made `want`; `keys` gives a row's id and its other unique key (a name, a
    /// secret).
    fn diff<'a>(have: impl Iterator<Item = &'a T>, want: &[T], keys: impl Fn(&T) -> (&String, &String)) -> Self
    where
        T: 'a,
    {
        let have: BTreeMap<&String, &T> = have.map(|row| (keys(row).0, row)).collect();
        let wanted: BTreeSet<&String> = want.iter().map(|row| keys(row).0).collect();
        let mut delete: BTreeSet<String> = have
            .keys()
            .filter(|id| !wanted.contains(*id))
            .map(|id| (*id).clone())
            .collect();
        let mut put = Vec::new();
        for row in want {
            let (id, second) = keys(row);
            match have.get(id) {
                Some(old) if keys(old).1 != second => {
                    delete.insert(id.clone());
                    put.push(row.clone());
                }
                Some(old) => {
                    let mut row = row.clone();
                    let (create, modify) = old.indexes();
                    row.set_indexes(create, modify);
                    if row != **old {
                        put.push(row);
                    }
                }
                None => put.push(row.clone()),
            }
        }
        Rows { delete, put }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(id: &str, name: &str, rules: &str) -> AclPolicy {
        AclPolicy {
            id: id.into(),
            name: name.into(),
            rules: rules.into(),
            ..AclPolicy::default()
        }
    }

    #[test]
    fn a_name_moving_between_rows_deletes_the_renamed_row_first() {
        let have = [policy("a", "x", ""), policy("b", "y", "")];
        let want = [policy("a", "z", ""), policy("b", "x", ""), policy("c", "w", "")];
        let rows = Rows::diff(have.iter(), &want, |p| (&p.id, &p.name));
        assert_eq!(rows.delete, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        assert_eq!(rows.put.len(), 3);
    }

    #[test]
    fn equal_rows_with_other_indexes_are_not_written() {
        let mut kept = policy("a", "x", "r");
        kept.modify_index = Index(7);
        let rows = Rows::diff([kept].iter(), &[policy("a", "x", "r")], |p| (&p.id, &p.name));
        assert!(rows.delete.is_empty() && rows.put.is_empty());
        let rows = Rows::diff(
            [policy("a", "x", "r"), policy("gone", "g", "")].iter(),
            &[policy("a", "x", "changed")],
            |p| (&p.id, &p.name),
        );
        assert_eq!(rows.delete, BTreeSet::from(["gone".to_owned()]));
        assert_eq!(rows.put[0].rules, "changed");
    }
}
