//! A proxy's upstreams across two snapshots.

use itertools::EitherOrBoth;
use proxycfg::UpstreamSnapshot;
use std::cmp::Ordering;
use std::sync::Arc;
use structs::UpstreamId;

/// An upstream of a snapshot: its id and snapshot, as its map holds them.
pub(super) type UpstreamEntry<'a> = (&'a Arc<UpstreamId>, &'a Arc<UpstreamSnapshot>);

/// The upstreams of two snapshots of a proxy side by side, in id order: only in the old
/// one, only in the new one, or in both. Ids are compared by address first (an id in both
/// is mostly the very same `Arc`).
pub(super) fn side_by_side<'a, 'b>(
    old: &'a Upstreams,
    new: &'b Upstreams,
) -> impl Iterator<Item = EitherOrBoth<UpstreamEntry<'a>, UpstreamEntry<'b>>> {
    itertools::merge_join_by(old.iter(), new.iter(), |(o, _), (n, _)| {
        if Arc::ptr_eq(o, n) {
            Ordering::Equal
        } else {
            (***o).cmp(&***n)
        }
    })
}

/// A proxy's upstreams by id.
type Upstreams = std::collections::BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>;
