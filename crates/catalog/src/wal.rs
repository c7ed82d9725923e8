//! Durability: an append-only log of committed writes plus periodic snapshots.
//!
//! Layout of the data dir: `LOCK` (held while a store has it open), `wal-<first index>.log`
//! segments and `snapshot-<index>.json`. Each log record is one frame: length (u32 LE),
//! CRC-32 of the payload (u32 LE), payload (JSON of the record). A batch of records is
//! written with one `write` and made durable with one `fdatasync` before any of its writes
//! is acknowledged. Snapshots are written to a temporary file, synced, renamed into place and
//! the directory synced, so a snapshot is either whole or absent.
//!
//! Every record also names the first index of the batch it was written in. Opening replays
//! the newest readable snapshot, then every record after its index. A torn or corrupt frame
//! in the newest segment is cut off, with what follows it, only when it can be a crash
//! mid-write: nothing intact of a later batch follows it (a later batch is written only
//! after this one was synced and acknowledged). Damage anywhere else (an older segment, or
//! before a later batch) stops the open with an error naming the file and the byte rather
//! than silently losing acknowledged writes; so does an unreadable snapshot, unless an older
//! one and the log still reach its index (the error names the file). A zero-filled tail (a
//! file extended by a crash before its data reached the disk) is a torn write like any
//! other: no frame is ever empty.

use crate::error::StoreError;
use crate::state::{Change, PersistedState, State};
use serde::{Deserialize, Serialize};
use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Write},
    path::{Path, PathBuf},
};
use structs::Index;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |error| StoreError::Io { what, error }
}

/// One committed write.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) index: Index,
    pub(crate) changes: Vec<Change>,
}

/// A record as it is written: with the first index of its batch.
#[derive(Serialize)]
struct RecordOut<'a> {
    index: Index,
    changes: &'a [Change],
    batch: Index,
}

/// A record as it is read. `batch` is absent in logs written before it existed.
#[derive(Deserialize)]
struct RecordIn {
    index: Index,
    changes: Vec<Change>,
    #[serde(default)]
    batch: Option<Index>,
}

/// How every encoded record starts (`RecordOut` and earlier logs alike): what the search for
/// intact records after a damaged frame looks for.
const RECORD_START: &[u8] = b"{\"index\":";

fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Reads frames; returns the payloads and the offset after the last whole, valid frame.
fn read_frames(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while bytes.len() - pos >= 8 {
        let len = u32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]]) as usize;
        let crc = u32::from_le_bytes([bytes[pos + 4], bytes[pos + 5], bytes[pos + 6], bytes[pos + 7]]);
        // No frame is empty: a zero header is a zero-filled tail, not a record.
        let Some(payload) = bytes.get(pos + 8..pos + 8 + len).filter(|_| len > 0) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        out.push(payload);
        pos += 8 + len;
    }
    (out, pos)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    atomic_file::sync_dir(dir).map_err(io_err(format!("syncing directory {}", dir.display())))
}

fn numbered(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(format!("listing {}", dir.display())))? {
        let entry = entry.map_err(io_err(format!("listing {}", dir.display())))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(suffix))
            .and_then(|n| n.parse().ok())
        {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn segment_path(dir: &Path, first: Index) -> PathBuf {
    dir.join(format!("wal-{:020}.log", first.0))
}

fn snapshot_path(dir: &Path, index: Index) -> PathBuf {
    dir.join(format!("snapshot-{:020}.json", index.0))
}

/// A snapshot that could not be read: its index, its file, and why.
type Unreadable = (u64, PathBuf, String);

/// The newest readable snapshot of `dir` (or an empty state), and the newer snapshots that
/// could not be read, with why. Skipping one is safe only when the log still holds every
/// write it had; [`Wal::open`] checks that.
fn load_snapshot(dir: &Path) -> Result<(State, Vec<Unreadable>), StoreError> {
    let mut unreadable = Vec::new();
    for (index, path) in numbered(dir, "snapshot-", ".json")?.into_iter().rev() {
        let bytes = fs::read(&path).map_err(io_err(format!("reading {}", path.display())))?;
        let (frames, _) = read_frames(&bytes);
        let parsed = match frames.first() {
            None => Err("no complete frame".to_owned()),
            Some(p) => serde_json::from_slice::<PersistedState>(p).map_err(|e| e.to_string()),
        };
        match parsed {
            Ok(p) => return Ok((State::from_persisted(p), unreadable)),
            Err(why) => {
                tracing::warn!(path = %path.display(), %why, "unreadable snapshot: trying an older one with the log");
                unreadable.push((index, path, why));
            }
        }
    }
    Ok((State::default(), unreadable))
}

fn decode(path: &Path, payload: &[u8]) -> Result<RecordIn, StoreError> {
    serde_json::from_slice(payload).map_err(|source| StoreError::Undecodable {
        path: path.to_owned(),
        source,
    })
}

/// The intact records that follow damage: every whole, valid frame found at or after byte 1
/// of `bytes` (byte 0 starts the damaged frame) whose payload decodes as a record.
fn records_after_damage(bytes: &[u8]) -> Vec<RecordIn> {
    let mut out = Vec::new();
    let mut pos = 1;
    while pos + 8 + RECORD_START.len() <= bytes.len() {
        if bytes[pos + 8..].starts_with(RECORD_START) {
            let (frames, used) = read_frames(&bytes[pos..]);
            if used > 0 {
                out.extend(frames.into_iter().filter_map(|p| serde_json::from_slice(p).ok()));
                pos += used;
                continue;
            }
        }
        pos += 1;
    }
    out
}

/// Applies the records of one log segment (whose first record is `first`) that `state` does
/// not have yet; returns how many. Damage in the last segment that can be a torn write (see
/// the module's docs) is cut off; any other damage, or a gap in the indexes, is corruption.
fn replay_segment(path: &Path, first: u64, last: bool, state: &mut State) -> Result<u64, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_err(format!("reading {}", path.display())))?;
    let (frames, valid) = read_frames(&bytes);
    let records = frames
        .into_iter()
        .map(|p| decode(path, p))
        .collect::<Result<Vec<_>, _>>()?;
    if valid < bytes.len() {
        if !last {
            return Err(StoreError::Corrupt(format!(
                "{} is damaged at byte {valid}",
                path.display()
            )));
        }
        // The damaged frame held this record. It was never acknowledged if nothing intact
        // of a later batch follows: a later batch is written only after this one was synced.
        let damaged = records.last().map_or(Index(first), |r| r.index.next());
        let later = records_after_damage(&bytes[valid..])
            .into_iter()
            .find(|r| r.batch.is_none_or(|b| b > damaged));
        if let Some(r) = later {
            return Err(StoreError::Corrupt(format!(
                "{} is damaged at byte {valid} (record {damaged}), and record {} of a later, \
                 acknowledged batch follows intact: cutting the log there would lose acknowledged writes",
                path.display(),
                r.index
            )));
        }
        tracing::warn!(path = %path.display(), at = valid, dropped = bytes.len() - valid, "cutting off a torn write at the end of the log");
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err("opening log to truncate"))?;
        f.set_len(valid as u64)
            .and_then(|()| f.sync_all())
            .map_err(io_err("truncating torn log tail"))?;
    }
    let mut replayed = 0;
    for record in records {
        if record.index <= state.index {
            continue;
        }
        if record.index != state.index.next() {
            return Err(StoreError::Corrupt(format!(
                "{}: record {} follows {}: writes are missing",
                path.display(),
                record.index,
                state.index
            )));
        }
        state.apply(record.index, &record.changes);
        replayed += 1;
    }
    Ok(replayed)
}

/// The open log of a data dir.
pub(crate) struct Wal {
    dir: PathBuf,
    segment: File,
    _lock: File,
    pub(crate) records_since_snapshot: u64,
    /// See [`Wal::is_clean`].
    clean: bool,
}

impl Wal {
    /// Opens (or creates) a data dir and returns the log and the state it holds.
    pub(crate) fn open(dir: &Path) -> Result<(Wal, State), StoreError> {
        // The log holds the CA's private key and every token's secret: owner only.
        atomic_file::private_dir(dir).map_err(io_err("making it private (0700)"))?;
        let lock = atomic_file::open_private(
            &dir.join("LOCK"),
            OpenOptions::new().create(true).truncate(false).write(true),
        )
        .map_err(io_err("opening LOCK"))?;
        lock.try_lock().map_err(|_| StoreError::Locked(dir.to_owned()))?;

        let (mut state, unreadable) = load_snapshot(dir)?;
        let segments = numbered(dir, "wal-", ".log")?;
        // An unreadable snapshot was skipped: the log must continue from what was loaded and
        // reach at least as far as that snapshot did, else writes it held are gone. Never
        // start with less.
        let lost = |reached: Index| {
            unreadable.first().map(|(index, path, why)| {
                StoreError::Corrupt(format!(
                    "snapshot {} cannot be read ({why}), and the older snapshots and the log reach \
                     only index {reached} of its {index}: starting would lose acknowledged writes",
                    path.display()
                ))
            })
        };
        if segments.first().is_some_and(|(first, _)| *first > state.index.0 + 1)
            && let Some(e) = lost(state.index)
        {
            return Err(e);
        }
        let mut replayed = 0u64;
        for (i, (first, path)) in segments.iter().enumerate() {
            replayed += replay_segment(path, *first, i + 1 == segments.len(), &mut state)?;
        }
        if unreadable.first().is_some_and(|(index, _, _)| state.index.0 < *index)
            && let Some(e) = lost(state.index)
        {
            return Err(e);
        }

        let path = match segments.last() {
            Some((_, path)) => path.clone(),
            None => segment_path(dir, state.index.next()),
        };
        let segment = atomic_file::open_private(&path, OpenOptions::new().create(true).append(true))
            .map_err(io_err(format!("opening {}", path.display())))?;
        sync_dir(dir)?;
        tracing::info!(dir = %dir.display(), index = %state.index, replayed, "data dir opened");
        Ok((
            Wal {
                dir: dir.to_owned(),
                segment,
                _lock: lock,
                records_since_snapshot: replayed,
                clean: true,
            },
            state,
        ))
    }

    /// Appends records and makes them durable.
    pub(crate) fn append(&mut self, records: &[Record]) -> Result<(), StoreError> {
        let mut buf = Vec::with_capacity(records.len() * 512);
        let batch = records.first().map_or(Index(0), |r| r.index);
        for r in records {
            let out = RecordOut {
                index: r.index,
                changes: &r.changes,
                batch,
            };
            let payload = serde_json::to_vec(&out).map_err(|source| StoreError::Encode {
                what: "a log record",
                source,
            })?;
            frame(&payload, &mut buf);
        }
        let start = self
            .segment
            .metadata()
            .map_err(io_err("reading the length of the log"))?
            .len();
        let written = self
            .segment
            .write_all(&buf)
            .map_err(io_err("appending to the log"))
            .and_then(|()| self.segment.sync_data().map_err(io_err("syncing the log")));
        if let Err(e) = written {
            // Nothing of a failed append may stay (a disk that filled up mid-record leaves a
            // torn one): cut the segment back, so that once there is room again the log
            // continues cleanly. If even that fails, the log's state is unknown.
            self.clean = self
                .segment
                .set_len(start)
                .and_then(|()| self.segment.sync_data())
                .is_ok();
            return Err(e);
        }
        self.records_since_snapshot += records.len() as u64;
        Ok(())
    }

    /// False once an append failed and its bytes could not be removed: the log may end in a
    /// torn record, and no more records may follow it.
    pub(crate) fn is_clean(&self) -> bool {
        self.clean
    }

    /// Starts a new segment whose first record will be `next`; later records go there.
    pub(crate) fn rotate(&mut self, next: Index) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, next);
        self.segment = atomic_file::open_private(&path, OpenOptions::new().create(true).append(true))
            .map_err(io_err(format!("opening {}", path.display())))?;
        sync_dir(&self.dir)?;
        self.records_since_snapshot = 0;
        Ok(())
    }

    /// The data dir.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Writes a snapshot of `state` durably, then removes the snapshots and log segments it
/// makes unnecessary. Runs off the write path.
pub(crate) fn write_snapshot(dir: &Path, state: &State) -> Result<(), StoreError> {
    let persisted = state.to_persisted();
    let payload = serde_json::to_vec(&persisted).map_err(|source| StoreError::Encode {
        what: "a snapshot",
        source,
    })?;
    let mut buf = Vec::with_capacity(payload.len() + 8);
    frame(&payload, &mut buf);
    let final_path = snapshot_path(dir, state.index);
    atomic_file::write_atomic(&final_path, &buf, 0o600)
        .map_err(io_err(format!("writing snapshot {}", final_path.display())))?;

    for (index, path) in numbered(dir, "snapshot-", ".json")? {
        if index < state.index.0 {
            let _ = fs::remove_file(path);
        }
    }
    // A segment can go once the next one starts at or before the snapshot's index + 1.
    let segments = numbered(dir, "wal-", ".log")?;
    for pair in segments.windows(2) {
        if pair[1].0 <= state.index.0 + 1 {
            let _ = fs::remove_file(&pair[0].1);
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests;
