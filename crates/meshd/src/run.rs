//! What `meshd` does with its command line: parse it, start logging, run the chosen mode.
//! Exit codes: 0 after a clean shutdown, 1 when the mode fails, 2 for a bad command line.
//! Here rather than in `main.rs`, so a build of the library alone compiles every mode's
//! wiring (CI builds each mode alone that way, beside the tests that run the binary).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::cli::{Cli, Command, normalize_args};
use clap::Parser;
use std::process::ExitCode;

/// Runs the command `args` names (the program name first) to its end: the exit code to
/// leave with.
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let cli = match Cli::try_parse_from(normalize_args(args)) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let reason = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("meshd: {reason}");
            return ExitCode::from(2);
        }
    };
    if matches!(cli.command, Command::Connect(crate::cli::ConnectCommand::Envoy(_))) || is_daemon(&cli.command) {
        // What a long-running meshd and the processes it starts create (Envoy's admin
        // address file, logs, sockets) is the owner's only, as are the files it writes with
        // a mode of its own.
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    }
    if is_daemon(&cli.command) {
        raise_open_files();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("meshd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            #[cfg(feature = "server")]
            Command::Server(args) => {
                crate::init_logging(&args.log_level, args.log_json);
                server_mode::run(*args, crate::shutdown_signal(), |bound| {
                    ready_lines(bound, "meshd server", "meshd xds");
                })
                .await
                .map_err(anyhow::Error::from)
            }
            #[cfg(feature = "agent")]
            Command::Agent(args) => agent_mode::run(*args, crate::shutdown_signal(), |bound| {
                ready_lines(bound, "meshd agent", "meshd agent xds");
            })
            .await
            .map_err(anyhow::Error::from),
            Command::Connect(crate::cli::ConnectCommand::Envoy(args)) => {
                if !args.bootstrap {
                    crate::init_logging(&args.log_level, false);
                }
                crate::connect::run(*args, crate::shutdown_signal()).await
            }
            Command::Connect(crate::cli::ConnectCommand::RedirectTraffic(args)) => {
                crate::redirect_cli::run(*args).await
            }
            Command::Connect(crate::cli::ConnectCommand::GrpcBootstrap(args)) => {
                if args.watch {
                    crate::init_logging(&args.log_level, false);
                }
                crate::grpc_bootstrap::run(*args, crate::shutdown_signal()).await
            }
            Command::Tls(command) => crate::tls::certs::run(command),
            Command::Acl(command) => crate::acl_cli::run(command).await,
            Command::Snapshot(command) => crate::snapshot_cli::run(command).await,
            Command::Config(command) => crate::config_cli::run(command).await,
            Command::Troubleshoot(command) => crate::troubleshoot_cli::run(command).await,
            Command::Peering(command) => crate::peering_cli::run(command).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meshd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The ready lines a node prints for scripts, one per listener: `<api> listening on
/// http://ADDR`, `<xds> listening on ADDR`, their TLS twins, and `<api> dns listening on
/// ADDR` (UDP and TCP). Nobody reading them is not an error.
#[cfg(any(feature = "server", feature = "agent"))]
fn ready_lines(bound: &node::Bound, api: &str, xds: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Some(addr) = bound.http_addr {
        let _ = writeln!(out, "{api} listening on http://{addr}");
    }
    if let Some(addr) = bound.grpc_addr {
        let _ = writeln!(out, "{xds} listening on {addr}");
    }
    if let Some(addr) = bound.https_addr {
        let _ = writeln!(out, "{api} listening on https://{addr}");
    }
    if let Some(addr) = bound.grpc_tls_addr {
        let _ = writeln!(out, "{xds}-tls listening on {addr}");
    }
    if let Some(addr) = bound.dns_addr {
        let _ = writeln!(out, "{api} dns listening on {addr}");
    }
    let _ = out.flush();
}

/// Whether `command` runs a server or an agent.
/// Raises the open-files limit to its hard limit, as Go programs (Consul among them) do at
/// start: every proxy stream, blocking query and agent connection is a file, and the usual
/// soft limit of 1,024 is reached long before the hard one. Beyond the hard limit is the
/// operator's setting (`ulimit -n`, `LimitNOFILE=`; README "Sizing").
fn raise_open_files() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_some() && now.current != now.maximum {
        // Failing leaves the soft limit as it was; nothing else depends on it.
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: now.maximum,
                maximum: now.maximum,
            },
        );
    }
}

fn is_daemon(command: &Command) -> bool {
    match command {
        #[cfg(feature = "server")]
        Command::Server(_) => true,
        #[cfg(feature = "agent")]
        Command::Agent(_) => true,
        _ => false,
    }
}
