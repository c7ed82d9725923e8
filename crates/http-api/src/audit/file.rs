//! The audit file: one JSON line per record, appended and made durable (`fdatasync`) before
//! the request is answered, rotated by size (`audit.log` → `audit.log.1` → … up to `keep`
//! old files). Created `0600` (a missing directory `0700`), never opened through a symbolic
//! link nor when another user owns it: it holds no secret, but it does name every token
//! that wrote and every entry written.

use parking_lot::Mutex;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use structs::audit::AuditRecord;

/// An audit file and its rotation.
#[derive(Debug, Clone)]
pub struct AuditFile(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    open: Mutex<Open>,
}

#[derive(Debug)]
struct Open {
    file: File,
    size: u64,
}

fn open_append(path: &Path) -> io::Result<Open> {
    // Never through a link, never another user's file: the audit file names every token that
    // wrote and every entry written.
    let file = atomic_file::open_private_append(path)?;
    let size = file.metadata()?.len();
    Ok(Open { file, size })
}

impl AuditFile {
    /// Opens (or creates) the file at `path`, rotated once it would pass `max_bytes`
    /// (at least one record per file), keeping `keep` rotated files.
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            use std::os::unix::fs::DirBuilderExt as _;
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        let open = open_append(path)?;
        Ok(Self(Arc::new(Inner {
            path: path.to_owned(),
            max_bytes,
            keep,
            open: Mutex::new(open),
        })))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// Appends `record` as one line and makes it durable (on a blocking thread).
    pub async fn append(&self, record: AuditRecord) -> io::Result<()> {
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || inner.append(&record))
            .await
            .map_err(io::Error::other)?
    }
}

impl Inner {
    fn append(&self, record: &AuditRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut open = self.open.lock();
        if open.size > 0 && open.size + line.len() as u64 > self.max_bytes {
            self.rotate(&mut open)?;
        }
        open.file.write_all(&line)?;
        open.size += line.len() as u64;
        open.file.sync_data()
    }

    /// `path.{n-1}` → `path.{n}` for every kept file (the oldest dropped), `path` →
    /// `path.1`, and a new, empty `path`.
    fn rotate(&self, open: &mut Open) -> io::Result<()> {
        let numbered = |n: usize| {
            let mut p = self.path.clone().into_os_string();
            p.push(format!(".{n}"));
            PathBuf::from(p)
        };
        if self.keep == 0 {
            fs::remove_file(&self.path)?;
        } else {
            for n in (1..self.keep).rev() {
                match fs::rename(numbered(n), numbered(n + 1)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            fs::rename(&self.path, numbered(1))?;
        }
        *open = open_append(&self.path)?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn lines_are_appended_private_and_rotated_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("audit.log");
        let file = AuditFile::open(&path, 600, 2).unwrap();
        for seq in 1..=20 {
            let record = AuditRecord {
                seq,
                path: "/v1/config".into(),
                ..AuditRecord::default()
            };
            file.append(record).await.unwrap();
        }
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let read = |p: PathBuf| -> Vec<u64> {
            fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<AuditRecord>(l).unwrap().seq)
                .collect()
        };
        let (now, one, two) = (
            read(path.clone()),
            read(path.with_extension("log.1")),
            read(path.with_extension("log.2")),
        );
        assert!(fs::metadata(&path).unwrap().len() <= 600);
        assert!(
            !path.with_extension("log.3").exists(),
            "only two rotated files are kept"
        );
        // The newest records, in order, across the three files.
        let all: Vec<u64> = two.iter().chain(&one).chain(&now).copied().collect();
        assert_eq!(all, ((21 - all.len() as u64)..=20).collect::<Vec<_>>());
        assert_eq!(*now.last().unwrap(), 20);
    }
}
