//! The snapshot archive (`GET`/`PUT /v1/snapshot`, `meshd snapshot save|restore|inspect`).
//!
//! An archive is a gzipped tar, like Consul's, holding three files:
//!
//! | file          | what                                                          |
//! |---------------|---------------------------------------------------------------|
//! | `meta.json`   | [`Meta`]: format version, index, datacenter, time, row counts |
//! | `state.json`  | the catalog's rows (the catalog crate reads and writes them)  |
//! | `SHA256SUMS`  | `sha256sum` lines for the two files above                     |
//!
//! [`unpack`] checks all of it before anyone uses the state: the gzip stream and the tar
//! are whole, exactly those three files are present once each, both sums match, the format
//! version is one this build reads, and nothing decompresses past a limit (a small archive
//! cannot make the server allocate gigabytes). A restore therefore either has a whole,
//! verified state or refuses with one of [`ArchiveError`]'s reasons, before anything is
//! changed.
//!
//! `sha256sum -c SHA256SUMS` in an unpacked archive checks it by hand.

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;

/// The archive format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// The largest archive a server restores (bytes, compressed); agents relay up to it too.
pub const MAX_ARCHIVE: usize = 1 << 30;

/// What an archive may decompress to at most, wherever it is read (its state and metadata).
pub const MAX_INFLATED: u64 = 4 << 30;

/// What `meta.json` says.
const FORMAT_NAME: &str = "meshd-snapshot";

const META: &str = "meta.json";
const STATE: &str = "state.json";
const SUMS: &str = "SHA256SUMS";

/// What an archive says about itself (`meta.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Meta {
    /// Always `meshd-snapshot`.
    pub format: String,
    /// The format version ([`FORMAT_VERSION`] when written by this build).
    pub version: u32,
    /// `<index>-<unix ms>`: tells two snapshots apart.
    #[serde(rename = "ID")]
    pub id: String,
    /// The catalog index the state was taken at.
    pub index: u64,
    /// The datacenter of the server that took it.
    pub datacenter: String,
    /// When it was taken (RFC 3339, UTC).
    pub created: String,
    /// The meshd version that took it.
    pub meshd_version: String,
    /// Bytes of `state.json`.
    pub size: u64,
    /// Rows per table (nodes, services, kv, ...).
    pub counts: BTreeMap<String, u64>,
}

impl Meta {
    /// The metadata of a state taken at `index`; `size` is filled in by [`pack`].
    pub fn new(
        index: u64,
        datacenter: &str,
        created_unix_ms: u128,
        created: String,
        counts: BTreeMap<String, u64>,
    ) -> Self {
        Self {
            format: FORMAT_NAME.to_owned(),
            version: FORMAT_VERSION,
            id: format!("{index}-{created_unix_ms}"),
            index,
            datacenter: datacenter.to_owned(),
            created,
            meshd_version: env!("CARGO_PKG_VERSION").to_owned(),
            size: 0,
            counts,
        }
    }
}

/// Why an archive cannot be read. Every reason names what is wrong; none is recoverable.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The gzip stream or the tar inside it is damaged or cut short.
    #[error("the snapshot archive is damaged or truncated: {0}")]
    Damaged(String),
    /// A file the archive must hold is not there.
    #[error("the snapshot archive has no {0}")]
    Missing(&'static str),
    /// A file the format does not have, or one of its files twice.
    #[error("the snapshot archive holds {0:?}, which a meshd snapshot never has (or has twice)")]
    Unexpected(String),
    /// A file's content does not match its sum.
    #[error("the snapshot archive's {0} does not match its SHA-256 sum: the archive is corrupt")]
    Checksum(&'static str),
    /// `SHA256SUMS` cannot be read.
    #[error("the snapshot archive's SHA256SUMS is malformed: {0}")]
    Sums(String),
    /// `meta.json` cannot be read.
    #[error("the snapshot archive's meta.json is malformed: {0}")]
    Meta(String),
    /// Not a meshd snapshot, or a newer format than this build reads.
    #[error("the snapshot archive is {found}, this meshd reads {FORMAT_NAME} versions up to {FORMAT_VERSION}")]
    Version {
        /// What the archive says it is.
        found: String,
    },
    /// It decompresses to more than the limit.
    #[error("the snapshot archive decompresses to more than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Writing the archive failed (only from [`pack`]).
    #[error("writing the snapshot archive: {0}")]
    Write(String),
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Packs `state` (the catalog's rows as JSON) with `meta` (whose `size` is set here).
pub fn pack(mut meta: Meta, state: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    let write_err = |e: std::io::Error| ArchiveError::Write(e.to_string());
    meta.size = state.len() as u64;
    let meta_json = serde_json::to_vec_pretty(&meta).map_err(|e| ArchiveError::Write(e.to_string()))?;
    let sums = format!("{}  {META}\n{}  {STATE}\n", sha256_hex(&meta_json), sha256_hex(state));
    let gz = GzEncoder::new(Vec::with_capacity(state.len() / 4 + 1024), Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, bytes) in [(META, &meta_json[..]), (STATE, state), (SUMS, sums.as_bytes())] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        // The archive holds private keys: whoever unpacks it gets files only they can read.
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes).map_err(write_err)?;
    }
    let gz = tar.into_inner().map_err(write_err)?;
    gz.finish().map_err(write_err)
}

/// A verified archive: its metadata and the catalog's rows (JSON).
#[derive(Debug)]
pub struct Unpacked {
    /// `meta.json`.
    pub meta: Meta,
    /// `state.json`.
    pub state: Vec<u8>,
}

/// Reads and verifies `archive` (see the module docs); nothing in it may decompress past
/// `limit` bytes in all.
pub fn unpack(archive: &[u8], limit: u64) -> Result<Unpacked, ArchiveError> {
    let damaged = |e: std::io::Error| ArchiveError::Damaged(e.to_string());
    let mut files: BTreeMap<&'static str, Vec<u8>> = BTreeMap::new();
    let mut tar = tar::Archive::new(GzDecoder::new(archive));
    let mut budget = limit;
    for entry in tar.entries().map_err(damaged)? {
        let entry = entry.map_err(damaged)?;
        let path = entry.path().map_err(damaged)?.to_string_lossy().into_owned();
        let name = [META, STATE, SUMS]
            .into_iter()
            .find(|n| *n == path)
            .filter(|n| !files.contains_key(n) && entry.header().entry_type().is_file())
            .ok_or_else(|| ArchiveError::Unexpected(path.clone()))?;
        let mut bytes = Vec::new();
        entry.take(budget + 1).read_to_end(&mut bytes).map_err(damaged)?;
        if bytes.len() as u64 > budget {
            return Err(ArchiveError::TooLarge { limit });
        }
        budget -= bytes.len() as u64;
        files.insert(name, bytes);
    }
    // A gzip stream cut short after the tar's last file: read to its end, so that its own
    // check (CRC and length) runs.
    let mut rest = tar.into_inner();
    std::io::copy(&mut (&mut rest).take(budget + 1), &mut std::io::sink()).map_err(damaged)?;
    let mut take = |name: &'static str| files.remove(name).ok_or(ArchiveError::Missing(name));
    let (meta_json, state, sums) = (take(META)?, take(STATE)?, take(SUMS)?);
    let sums = parse_sums(&sums)?;
    for (name, bytes) in [(META, &meta_json), (STATE, &state)] {
        if sums.get(name) != Some(&sha256_hex(bytes)) {
            return Err(ArchiveError::Checksum(name));
        }
    }
    // The version is read before the rest of the metadata, so that a newer format is named
    // as such rather than as a malformed file.
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Version {
        #[serde(default)]
        format: String,
        #[serde(default)]
        version: u32,
    }
    let version: Version = serde_json::from_slice(&meta_json).map_err(|e| ArchiveError::Meta(e.to_string()))?;
    if version.format != FORMAT_NAME || version.version == 0 || version.version > FORMAT_VERSION {
        return Err(ArchiveError::Version {
            found: format!("{:?} version {}", version.format, version.version),
        });
    }
    let meta: Meta = serde_json::from_slice(&meta_json).map_err(|e| ArchiveError::Meta(e.to_string()))?;
    if meta.size != state.len() as u64 {
        return Err(ArchiveError::Meta(format!(
            "Size is {} but state.json has {} bytes",
            meta.size,
            state.len()
        )));
    }
    Ok(Unpacked { meta, state })
}

/// `SHA256SUMS`: `<64 hex digits>  <name>` per line.
fn parse_sums(text: &[u8]) -> Result<BTreeMap<String, String>, ArchiveError> {
    let text = std::str::from_utf8(text).map_err(|_| ArchiveError::Sums("not UTF-8".into()))?;
    let mut sums = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (sum, name) = line
            .split_once("  ")
            .ok_or_else(|| ArchiveError::Sums(format!("line {line:?} is not `<sum>  <file>`")))?;
        if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ArchiveError::Sums(format!("{sum:?} is not a SHA-256 sum")));
        }
        sums.insert(name.to_owned(), sum.to_ascii_lowercase());
    }
    Ok(sums)
}

#[cfg(test)]
mod tests;
