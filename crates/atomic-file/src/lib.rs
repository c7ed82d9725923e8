//! Atomic, durable file replacement, for every file meshd must never leave half-written
//! (store snapshots, the daemon manager's snapshot and pid files, agent state), and the
//! private directories those files live in (`0700`, files `0600`: see [`private_dir`]).
//!
//! The sequence: write a hidden temporary file in the same directory (created with the
//! caller's mode), fsync it, rename it over the target, fsync the directory. After a crash
//! at any point the target holds the old content or the new. A failed write removes its
//! temporary file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

mod private;
pub use private::{Tightened, open_private, open_private_append, private_dir};

/// Replaces `path` with `bytes` atomically and durably; a new file gets permissions `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    // A temporary file left by a crash is removed, and the new one must be this call's own
    // (O_EXCL, which follows no symlink either): in a directory others may write, a file or link planted
    // at that name would otherwise receive the content with its owner's looser mode, or
    // redirect it elsewhere. If it cannot be removed (not ours), the write fails.
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// The id kept in the file at `path`: read when it exists (it must pass `valid`, else an
/// error naming the file: whoever knows the holder by that id must not see it change), else
/// made by `make` and written (`0600`) at once. A node's id across restarts.
pub fn kept_id(
    path: &Path,
    valid: impl Fn(&str) -> bool,
    make: impl FnOnce() -> io::Result<String>,
) -> io::Result<String> {
    match fs::read_to_string(path) {
        Ok(text) => {
            let id = text.trim();
            if !valid(id) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} does not hold a valid id", path.display()),
                ));
            }
            Ok(id.to_owned())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = make()?;
            write_atomic(path, id.as_bytes(), 0o600)?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// A file name for an id that may hold any character (a service id, a proxy id): letters,
/// digits, `-` and `_` stay, `.` stays unless it leads, anything else becomes `%XX`. Distinct
/// ids give distinct names, and no name leaves its directory or hides as a dot file.
pub fn file_name_for(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && !out.is_empty()) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Makes the entries of `dir` (a rename, a new or removed file) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_content_with_the_mode_asked_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("snapshot.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn a_temporary_file_planted_beforehand_neither_receives_the_content_nor_lends_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("backup.snap");
        // A stale (or planted) temporary file with a loose mode.
        let tmp = dir.path().join(".backup.snap.tmp");
        fs::write(&tmp, b"junk").unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666)).unwrap();
        write_atomic(&p, b"secret", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"secret");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        // A symlink planted at the temporary name: its target is left alone.
        let elsewhere = dir.path().join("elsewhere");
        fs::write(&elsewhere, b"untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &tmp).unwrap();
        write_atomic(&p, b"again", 0o600).unwrap();
        assert_eq!(fs::read(&elsewhere).unwrap(), b"untouched");
        assert_eq!(fs::read(&p).unwrap(), b"again");
        assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
    }

    #[test]
    fn file_names_for_ids_are_distinct_and_stay_in_their_directory() {
        assert_eq!(file_name_for("web-sidecar-proxy"), "web-sidecar-proxy");
        assert_eq!(file_name_for("service:web:1"), "service%3Aweb%3A1");
        assert_eq!(file_name_for("../etc/passwd"), "%2E.%2Fetc%2Fpasswd");
        assert_ne!(file_name_for("a:b"), file_name_for("a%3Ab"));
        assert_ne!(file_name_for("a/b"), file_name_for("a_b"));
    }

    #[test]
    fn a_failed_write_keeps_the_old_content_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state");
        write_atomic(&p, b"old", 0o600).unwrap();
        // Renaming a file over a non-empty directory fails.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), b"").unwrap();
        assert!(write_atomic(&blocked, b"new", 0o600).is_err());
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert!(!dir.path().join(".blocked.tmp").exists(), "temporary file removed");
    }
}
