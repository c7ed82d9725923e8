use super::*;

#[test]
fn frames_stop_at_a_torn_or_corrupt_tail() {
    let mut buf = Vec::new();
    frame(b"one", &mut buf);
    frame(b"two", &mut buf);
    let whole = buf.len();
    frame(b"three", &mut buf);
    let (frames, valid) = read_frames(&buf[..buf.len() - 2]);
    assert_eq!(frames, vec![b"one".as_slice(), b"two".as_slice()]);
    assert_eq!(valid, whole);
    let mut corrupt = buf.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert_eq!(read_frames(&corrupt).0.len(), 2);
    assert_eq!(read_frames(&buf).0.len(), 3);
}

/// Writes batches of empty records (`sizes` records each) to a fresh data dir; returns
/// the dir and the byte offset where each record's frame starts in the one segment.
fn log_of(sizes: &[u64]) -> (tempfile::TempDir, Vec<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path()).unwrap();
    let mut next = 1;
    let mut starts = Vec::new();
    for &n in sizes {
        let batch: Vec<Record> = (next..next + n)
            .map(|i| Record {
                index: Index(i),
                changes: Vec::new(),
            })
            .collect();
        for _ in 0..n {
            starts.push(wal.segment.metadata().unwrap().len() as usize);
        }
        // Frames of one batch are contiguous: the offsets past the first follow from
        // the encoded lengths, found after the append.
        wal.append(&batch).unwrap();
        next += n;
    }
    drop(wal);
    let path = segment_path(dir.path(), Index(1));
    let bytes = fs::read(&path).unwrap();
    let mut pos = 0;
    for s in &mut starts {
        *s = pos;
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    (dir, starts)
}

fn flip(dir: &Path, at: usize) {
    let path = segment_path(dir, Index(1));
    let mut bytes = fs::read(&path).unwrap();
    bytes[at] ^= 0x55;
    fs::write(&path, bytes).unwrap();
}

#[test]
fn a_zero_header_is_not_a_frame() {
    let mut buf = Vec::new();
    frame(b"one", &mut buf);
    let whole = buf.len();
    buf.extend_from_slice(&[0; 64]);
    let (frames, valid) = read_frames(&buf);
    assert_eq!(frames.len(), 1);
    assert_eq!(valid, whole);
}

#[test]
fn damage_inside_the_last_batch_is_a_torn_write_and_is_cut_off() {
    // Batches [1, 2] [3] [4, 5]: record 4's frame is damaged, 5 (same batch) is intact.
    let (dir, starts) = log_of(&[2, 1, 2]);
    flip(dir.path(), starts[3] + 12);
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.index, Index(3));
    // The cut is durable: the log now ends after record 3.
    let len = fs::metadata(segment_path(dir.path(), Index(1))).unwrap().len();
    assert_eq!(len as usize, starts[3]);
}

#[test]
fn damage_before_a_later_batch_stops_the_open_naming_the_file() {
    // Batches [1, 2] [3] [4, 5]: record 2 is damaged, and batch [3] was written after
    // [1, 2] was acknowledged.
    let (dir, starts) = log_of(&[2, 1, 2]);
    flip(dir.path(), starts[1] + 12);
    let err = Wal::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("wal-00000000000000000001.log"), "{err}");
    assert!(err.contains(&format!("byte {}", starts[1])), "{err}");
    assert!(err.contains("record 3 of a later"), "{err}");
    // Nothing was cut.
    let (dir2, _) = log_of(&[2, 1, 2]);
    let whole = fs::metadata(segment_path(dir2.path(), Index(1))).unwrap().len();
    assert_eq!(fs::metadata(segment_path(dir.path(), Index(1))).unwrap().len(), whole);
}

#[test]
fn a_zero_filled_tail_is_cut_off() {
    let (dir, _) = log_of(&[1, 1]);
    let path = segment_path(dir.path(), Index(1));
    let mut bytes = fs::read(&path).unwrap();
    let whole = bytes.len();
    bytes.extend_from_slice(&[0; 4096]);
    fs::write(&path, bytes).unwrap();
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.index, Index(2));
    assert_eq!(fs::metadata(&path).unwrap().len() as usize, whole);
}

#[test]
fn records_of_logs_without_batches_are_read_and_treated_as_acknowledged() {
    // A log written before records named their batch: readable; damage followed by an
    // intact record cannot be shown torn, so it stops the open.
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), Index(1));
    let mut buf = Vec::new();
    for i in 1..=3 {
        frame(format!(r#"{{"index":{i},"changes":[]}}"#).as_bytes(), &mut buf);
    }
    fs::write(&path, &buf).unwrap();
    let (wal, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.index, Index(3));
    drop(wal);
    let second = 8 + r#"{"index":1,"changes":[]}"#.len();
    flip(dir.path(), second + 10);
    assert!(Wal::open(dir.path()).is_err());
}
