//! Private directories: what meshd keeps on disk (write-ahead logs holding the CA's key and
//! every token's secret, persisted registrations, pid and bootstrap files) is readable by
//! its owner only. A directory is `0700`; every file in it `0600` (no bit for group or
//! others). A directory found wider, from an older meshd or a hand-made `mkdir`, is
//! tightened, and the caller says so once.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What [`private_dir`] had to tighten.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tightened {
    /// The directory's mode before, when it let group or others in.
    pub dir_mode: Option<u32>,
    /// Files and subdirectories below it whose mode let group or others in.
    pub entries: Vec<PathBuf>,
}

impl Tightened {
    /// Whether anything was changed.
    pub fn any(&self) -> bool {
        self.dir_mode.is_some() || !self.entries.is_empty()
    }
}

/// Makes `dir` a private directory: created `0700` (with any missing parent) when absent;
/// when present, its mode and those of everything below it lose every group and other bit,
/// said in one warning.
/// Fails with a plain "is not a directory" when `dir` is something else, and when another
/// user owns it: its owner could widen it again at will (a directory made in advance, in
/// `/tmp` say, to read what meshd writes there).
pub fn private_dir(dir: &Path) -> io::Result<Tightened> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if !meta.is_dir() && !fs::metadata(dir).is_ok_and(|m| m.is_dir()) => {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        Err(e) => return Err(e),
    }
    let meta = fs::metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user (uid {me}): its owner could let others read it",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    let mut tightened = Tightened::default();
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode & 0o700))?;
        tightened.dir_mode = Some(mode);
    }
    tighten_below(dir, &mut tightened.entries)?;
    if tightened.any() {
        tracing::warn!(
            dir = %dir.display(),
            mode = ?tightened.dir_mode.map(|m| format!("{m:o}")),
            files = tightened.entries.len(),
            "a private directory let other users in: tightened to 0700, its files to 0600"
        );
    }
    Ok(tightened)
}

/// Takes group and other bits off everything below `dir` (links are left alone: their
/// targets are not ours to change).
fn tighten_below(dir: &Path, changed: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            fs::set_permissions(entry.path(), fs::Permissions::from_mode(mode & 0o700))?;
            changed.push(entry.path());
        }
        if meta.is_dir() {
            tighten_below(&entry.path(), changed)?;
        }
    }
    Ok(())
}

/// Opens `path` with `options`, creating it `0600` when absent.
pub fn open_private(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    options.mode(0o600).open(path)
}

/// Opens `path` for appending, created `0600` when absent. Refused when `path` is a symbolic
/// link (another user could point it at a file of ours) or a file another user owns (who
/// could read what is appended); a file of ours that lets group or others in is tightened to
/// `0600` first.
pub fn open_private_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link: it must be a file of this user's",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    let meta = file.metadata()?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user (uid {me}): its owner could read what is written to it",
                path.display(),
                meta.uid()
            ),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_directory_and_its_parents_are_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a").join("data");
        assert!(!private_dir(&dir).unwrap().any());
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
    }

    #[test]
    fn a_wide_directory_and_what_it_holds_are_tightened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        fs::create_dir_all(dir.join("services")).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.join("services"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.join("wal-1.log"), b"secret").unwrap();
        fs::set_permissions(dir.join("wal-1.log"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(dir.join("services").join("web.json"), b"{}").unwrap();
        fs::set_permissions(dir.join("services").join("web.json"), fs::Permissions::from_mode(0o604)).unwrap();

        let t = private_dir(&dir).unwrap();
        assert_eq!(t.dir_mode, Some(0o755));
        assert_eq!(t.entries.len(), 3, "{t:?}");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("services")), 0o700);
        assert_eq!(mode(&dir.join("wal-1.log")), 0o600);
        assert_eq!(mode(&dir.join("services").join("web.json")), 0o600);
        // A second look finds nothing to do.
        assert!(!private_dir(&dir).unwrap().any());
    }

    #[test]
    fn a_file_in_the_way_is_not_a_directory() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("data");
        fs::write(&file, b"").unwrap();
        let e = private_dir(&file).unwrap_err();
        assert_eq!(e.to_string(), format!("{} is not a directory", file.display()));
    }

    #[test]
    fn a_directory_another_user_owns_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        fs::create_dir(&dir).unwrap();
        let me = rustix::process::geteuid().as_raw();
        // Only root may give a directory away; elsewhere the refusal is not reachable here.
        if me == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            let e = private_dir(&dir).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        }
        std::os::unix::fs::chown(&dir, Some(me), None).unwrap();
        private_dir(&dir).unwrap();
    }

    #[test]
    fn open_private_creates_files_for_the_owner_only() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("LOCK");
        open_private(&p, OpenOptions::new().create(true).append(true)).unwrap();
        assert_eq!(mode(&p), 0o600);
    }
}

#[cfg(test)]
mod append_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_append_file_is_ours_and_private_and_never_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        drop(open_private_append(&path).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private_append(&path).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600,
            "tightened"
        );
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = open_private_append(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }
}
