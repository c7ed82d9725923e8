use super::*;

fn meta() -> Meta {
    Meta::new(
        42,
        "dc1",
        1_700_000_000_000,
        "2023-11-14T22:13:20Z".into(),
        BTreeMap::from([("kv".to_owned(), 3)]),
    )
}

/// A tar.gz of exactly `files`, as given (no sums computed).
fn raw(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        tar.append_data(&mut header, name, *bytes).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// The three files of a packed archive.
fn files_of(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut tar = tar::Archive::new(GzDecoder::new(archive));
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        out.insert(name, bytes);
    }
    out
}

fn repack(files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let list: Vec<(&str, &[u8])> = files.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    raw(&list)
}

#[test]
fn an_archive_reads_back_as_written_with_its_size_and_private_modes() {
    let state = br#"{"index":42,"kv":[]}"#;
    let archive = pack(meta(), state).unwrap();
    let back = unpack(&archive, 1 << 20).unwrap();
    assert_eq!(back.state, state);
    assert_eq!(back.meta.size, state.len() as u64);
    assert_eq!(back.meta.index, 42);
    assert_eq!(back.meta.id, "42-1700000000000");
    assert_eq!(back.meta.counts["kv"], 3);
    let mut tar = tar::Archive::new(GzDecoder::new(&archive[..]));
    for e in tar.entries().unwrap() {
        assert_eq!(e.unwrap().header().mode().unwrap(), 0o600);
    }
}

#[test]
fn a_changed_byte_in_the_state_is_caught_by_its_sum() {
    let archive = pack(meta(), br#"{"index":42}"#).unwrap();
    let mut files = files_of(&archive);
    files.get_mut("state.json").unwrap()[3] ^= 1;
    let e = unpack(&repack(&files), 1 << 20).unwrap_err();
    assert!(matches!(e, ArchiveError::Checksum("state.json")), "{e}");
    assert!(
        e.to_string().contains("state.json does not match its SHA-256 sum"),
        "{e}"
    );
}

#[test]
fn a_truncated_or_foreign_archive_is_refused_as_damaged() {
    let archive = pack(meta(), &vec![b'x'; 100_000]).unwrap();
    for cut in [archive.len() - 4, archive.len() / 2, 10] {
        let e = unpack(&archive[..cut], 1 << 20).unwrap_err();
        assert!(
            matches!(e, ArchiveError::Damaged(_) | ArchiveError::Missing(_)),
            "cut at {cut}: {e}"
        );
    }
    let e = unpack(b"this is not a snapshot", 1 << 20).unwrap_err();
    assert!(matches!(e, ArchiveError::Damaged(_)), "{e}");
}

#[test]
fn missing_extra_and_doubled_files_are_named() {
    let archive = pack(meta(), b"{}").unwrap();
    let files = files_of(&archive);
    let mut without = files.clone();
    without.remove("SHA256SUMS");
    assert!(matches!(
        unpack(&repack(&without), 1 << 20),
        Err(ArchiveError::Missing("SHA256SUMS"))
    ));
    let mut extra = files.clone();
    extra.insert("etc/passwd".into(), b"x".to_vec());
    let e = unpack(&repack(&extra), 1 << 20).unwrap_err();
    assert!(matches!(&e, ArchiveError::Unexpected(p) if p == "etc/passwd"), "{e}");
    let doubled = raw(&[
        ("meta.json", &files["meta.json"]),
        ("state.json", &files["state.json"]),
        ("state.json", b"{}"),
        ("SHA256SUMS", &files["SHA256SUMS"]),
    ]);
    assert!(matches!(unpack(&doubled, 1 << 20), Err(ArchiveError::Unexpected(_))));
}

#[test]
fn a_newer_or_foreign_format_is_named_not_misread() {
    let mut m = meta();
    m.version = FORMAT_VERSION + 1;
    let e = unpack(&pack(m, b"{}").unwrap(), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("version 2"), "{e}");
    let mut m = meta();
    m.format = "consul".into();
    assert!(matches!(
        unpack(&pack(m, b"{}").unwrap(), 1 << 20),
        Err(ArchiveError::Version { .. })
    ));
}

#[test]
fn an_archive_that_inflates_past_the_limit_is_refused() {
    let state = vec![b' '; 10 << 20];
    let archive = pack(meta(), &state).unwrap();
    assert!(archive.len() < 100_000, "{}", archive.len());
    let e = unpack(&archive, 1 << 20).unwrap_err();
    assert!(matches!(e, ArchiveError::TooLarge { limit } if limit == 1 << 20), "{e}");
}

#[test]
fn malformed_sums_are_refused() {
    let archive = pack(meta(), b"{}").unwrap();
    let mut files = files_of(&archive);
    files.insert("SHA256SUMS".into(), b"nonsense\n".to_vec());
    assert!(matches!(unpack(&repack(&files), 1 << 20), Err(ArchiveError::Sums(_))));
}
