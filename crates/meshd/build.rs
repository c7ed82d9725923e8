//! Release builds of the `meshd` binary lay out its code in the order of
//! `link/order.txt`: the functions an agent, a server and `connect envoy` run, grouped, so
//! each process maps the few megabytes of code it uses rather than most of the binary (the
//! kernel maps code in 64 KiB runs around each page touched). `cargo xtask link-order`
//! rewrites the file; names it lists that no longer exist are skipped, functions it does
//! not list follow in the linker's own order.

use std::path::Path;

fn main() {
    let order = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("link/order.txt");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=MESHD_LINK_ORDER");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    // The option is lld's, the default linker of the pinned toolchain on this target only.
    let lld_target = std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu");
    let wanted = std::env::var("MESHD_LINK_ORDER").map_or(true, |v| v != "0");
    if release && lld_target && wanted && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
