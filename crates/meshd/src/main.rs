//! `meshd`: the command line run by [`meshd::run::main`]. Exit codes: 0 after a clean
//! shutdown, 1 when the mode fails, 2 for a bad command line.

use std::process::ExitCode;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    meshd::run::main(std::env::args())
}
