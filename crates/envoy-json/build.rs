//! Compiles Envoy's API (.proto files shipped in the `envoy-types` crate's source, in Cargo's
//! registry) into a descriptor set with protoc (`PROTOC`, else the vendored one), so the
//! library can read Envoy JSON by Envoy's own field definitions. No file of it is kept in
//! this repository: it follows the envoy-types version the workspace uses.

// A build script reports what is missing by panicking with the reason.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The envoy-types source whose protos are compiled: `ENVOY_PROTO_DIR`, else the newest
/// `envoy-types-0.7.*` in Cargo's registry.
fn proto_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ENVOY_PROTO_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let mut found: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .expect("Cargo's registry sources")
        .flatten()
        .flat_map(|index| std::fs::read_dir(index.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("envoy-types-0.7."))
        })
        .map(|p| p.join("proto"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort_by_key(|p| {
        let name = p
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        name.rsplit('.')
            .next()
            .and_then(|patch| patch.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found
        .pop()
        .expect("envoy-types 0.7 sources in Cargo's registry (cargo fetch), or ENVOY_PROTO_DIR")
}

fn protos(dir: &Path, under: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("reading the proto tree").flatten() {
        let path = entry.path();
        if path.is_dir() {
            protos(&path, under, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path.strip_prefix(under).expect("under").display().to_string());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ENVOY_PROTO_DIR");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let root = proto_dir();
    let api = root.join("data-plane-api");
    let mut files = Vec::new();
    protos(&api.join("envoy"), &api, &mut files);
    files.sort();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("envoy.pb");
    let protoc = std::env::var_os("PROTOC")
        .map(PathBuf::from)
        .unwrap_or_else(|| protoc_bin_vendored::protoc_bin_path().expect("the vendored protoc"));
    let includes = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec/proto",
        "opentelemetry-proto",
        "client_model",
    ];
    let status = Command::new(&protoc)
        .current_dir(&root)
        .args(includes.iter().map(|i| format!("-I{i}")))
        .arg("--include_imports")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .args(&files)
        .status()
        .unwrap_or_else(|e| panic!("running protoc ({}): {e}", Path::new(&protoc).display()));
    assert!(
        status.success(),
        "protoc failed on Envoy's API protos in {}",
        root.display()
    );
}
