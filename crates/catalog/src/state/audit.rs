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
                self.audit.insert(record.seq, Arc::new(record));
                bumped.insert(IndexKey::Audit);
            }
            Change::DeleteAudit(seq) if self.audit.remove(seq).is_some() => {
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
    /// oldest ones so that at most `retention` stay (none is added with a retention of 0).
    pub(crate) fn audit_changes(&self, mut record: AuditRecord, retention: usize) -> Vec<Change> {
        if retention == 0 {
            return Vec::new();
        }
        record.seq = self.audit.get_max().map_or(1, |(seq, _)| seq + 1);
        let excess = (self.audit.len() + 1).saturating_sub(retention);
        let mut out: Vec<Change> = self
            .audit
            .keys()
            .take(excess)
            .map(|seq| Change::DeleteAudit(*seq))
            .collect();
        out.push(Change::PutAudit(Box::new(record)));
        out
    }
}
