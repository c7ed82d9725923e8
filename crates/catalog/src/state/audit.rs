//! The audit log's table: records kept by `Seq`, at most the retention's number of them.

use super::{Change, State};
use crate::keys::IndexKey;
use imbl::OrdSet;
use std::sync::Arc;
use structs::Index;
use structs::audit::AuditRecord;

impl State {
    /// Applies a change of the audit table: a record is stamped with the index of the write
    /// that carries it.
    pub(super) fn apply_audit(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutAudit(record) => {
                let mut record = (**record).clone();
                record.index = index;
                if !record.accepted {
                    self.audit_refused.insert(record.seq);
                }
                self.audit.insert(record.seq, Arc::new(record));
                bumped.insert(IndexKey::Audit);
            }
            Change::DeleteAudit(seq) if self.audit.remove(seq).is_some() => {
                self.audit_refused.remove(seq);
                bumped.insert(IndexKey::Audit);
            }
            _ => {}
        }
    }

    /// The audit log, oldest first.
    pub fn audit_records(&self) -> impl DoubleEndedIterator<Item = &Arc<AuditRecord>> {
        self.audit.values()
    }

    /// The changes that add `record` to the audit log as its next record, dropping the
    /// oldest records of its class (accepted or refused) so that at most `retention` of
    /// that class stay (none is added with a retention of 0). Classes are bounded apart: a
    /// flood of refused requests, which any client can send, never pushes out the record
    /// of a write that happened.
    pub(crate) fn audit_changes(&self, mut record: AuditRecord, retention: usize) -> Vec<Change> {
        if retention == 0 {
            return Vec::new();
        }
        record.seq = self.audit.get_max().map_or(1, |(seq, _)| seq + 1);
        let refused = self.audit_refused.len();
        let in_class = if record.accepted {
            self.audit.len() - refused
        } else {
            refused
        };
        let excess = (in_class + 1).saturating_sub(retention);
        let mut out: Vec<Change> = if record.accepted {
            self.audit
                .keys()
                .filter(|seq| !self.audit_refused.contains(*seq))
                .take(excess)
                .map(|seq| Change::DeleteAudit(*seq))
                .collect()
        } else {
            self.audit_refused
                .iter()
                .take(excess)
                .map(|seq| Change::DeleteAudit(*seq))
                .collect()
        };
        out.push(Change::PutAudit(Box::new(record)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_never_pushes_out_an_accepted_write() {
        let mut state = State::default();
        let mut add = |accepted: bool| {
            let record = AuditRecord {
                accepted,
                ..AuditRecord::default()
            };
            let changes = state.audit_changes(record, 2);
            let index = state.index.next();
            state.apply(index, &changes);
        };
        for accepted in [true, true, false, false, false, false, false, true] {
            add(accepted);
        }
        let kept: Vec<(u64, bool)> = state.audit_records().map(|r| (r.seq, r.accepted)).collect();
        assert_eq!(kept, vec![(2, true), (6, false), (7, false), (8, true)]);
        assert_eq!(state.audit_refused.iter().copied().collect::<Vec<_>>(), vec![6, 7]);
    }
}
