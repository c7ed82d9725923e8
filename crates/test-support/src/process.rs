//! Starting the real `meshd` binary: a server on ephemeral ports, reporting where it listens.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A started `meshd server` (or agent) and the addresses it reported.
#[derive(Debug)]
pub struct ServerProcess {
    /// The process (the caller owns stopping it).
    pub child: Child,
    /// Its HTTP API, as `http://ADDR`.
    pub http: String,
    /// Its xDS address, `ADDR`.
    pub grpc: String,
    /// Its DNS address (UDP and TCP), `ADDR`.
    pub dns: String,
}

/// Starts `bin server` on `127.0.0.1:0` for its listeners (DNS too) with `args` added (`-dev` or a
/// `-data-dir`, a log level...), and waits for its ready lines. Lines printed before them (a
/// profiler wrapping the server) are skipped.
pub fn start_server<I, S>(bin: &Path, args: I) -> ServerProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    start(
        bin,
        [
            "server",
            "-http-addr",
            "127.0.0.1:0",
            "-grpc-addr",
            "127.0.0.1:0",
            "-dns-addr",
            "127.0.0.1:0",
        ],
        args,
        "meshd server",
        "meshd xds listening on ",
    )
}

/// Starts `bin server` with its HTTP API on `http` and xDS on `grpc` (fixed addresses, for a
/// server that restarts where it was), with `args` added; waits for its ready lines.
pub fn start_server_at<I, S>(bin: &Path, http: &str, grpc: &str, args: I) -> ServerProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    start(
        bin,
        [
            "server",
            "-http-addr",
            http,
            "-grpc-addr",
            grpc,
            "-dns-addr",
            "127.0.0.1:0",
        ],
        args,
        "meshd server",
        "meshd xds listening on ",
    )
}

/// Starts `bin agent` on `127.0.0.1:0` for both listeners with `args` added (`-retry-join`,
/// `-node`, `-dev`...), and waits for its ready lines.
pub fn start_agent<I, S>(bin: &Path, args: I) -> ServerProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    start_agent_at(bin, "127.0.0.1:0", "127.0.0.1:0", args)
}

/// Starts `bin agent` with its HTTP API on `http` and xDS on `grpc` (fixed addresses, for an
/// agent that restarts where it was), with `args` added; waits for its ready lines.
pub fn start_agent_at<I, S>(bin: &Path, http: &str, grpc: &str, args: I) -> ServerProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    start(
        bin,
        [
            "agent",
            "-http-addr",
            http,
            "-grpc-addr",
            grpc,
            "-dns-addr",
            "127.0.0.1:0",
        ],
        args,
        "meshd agent",
        "meshd agent xds listening on ",
    )
}

/// Starts `bin` with `head` then `args`; reads `<api> listening on `, `grpc_line` and `<api>
/// dns listening on ` (the TLS lines, which come before the DNS one, skipped).
fn start<I, S>(bin: &Path, head: [&str; 7], args: I, api: &str, grpc_line: &str) -> ServerProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mode = head[0];
    let mut child = Command::new(bin)
        .args(head)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting meshd {mode}: {e}"));
    let stdout = child.stdout.take().expect("the process's stdout");
    let http_line = format!("{api} listening on ");
    let mut lines = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .skip_while(|l| !l.starts_with(&http_line));
    let http = lines
        .next()
        .and_then(|l| l.strip_prefix(&http_line).map(str::to_owned))
        .unwrap_or_else(|| panic!("the {mode}'s HTTP ready line"));
    let grpc = lines
        .next()
        .and_then(|l| l.strip_prefix(grpc_line).map(str::to_owned))
        .unwrap_or_else(|| panic!("the {mode}'s xDS ready line"));
    let dns_line = format!("{api} dns listening on ");
    let dns = lines
        .find_map(|l| l.strip_prefix(&dns_line).map(str::to_owned))
        .unwrap_or_else(|| panic!("the {mode}'s DNS ready line"));
    ServerProcess { child, http, grpc, dns }
}

/// Starts `bin` with `args` and reads its ready lines: for each of `prefixes` in order, the
/// next line starting with it (other lines are skipped), without the prefix. For the lines
/// past the usual two (`meshd server ... -https-addr` prints its HTTPS line after them).
pub fn start_reading<I, S>(bin: &Path, args: I, prefixes: &[&str]) -> (Child, Vec<String>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("the process's stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let found = prefixes
        .iter()
        .map(|prefix| {
            lines
                .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
                .unwrap_or_else(|| panic!("no ready line {prefix:?} from {}", bin.display()))
        })
        .collect();
    (child, found)
}

/// The value of the sample `name` (with its labels, as printed) in a server's
/// `/v1/agent/metrics?format=prometheus` at `http` (`http://ADDR`); 0 when absent.
pub async fn metric(client: &reqwest::Client, http: &str, name: &str) -> f64 {
    let text = client
        .get(format!("{http}/v1/agent/metrics?format=prometheus"))
        .send()
        .await
        .expect("scraping the server's metrics")
        .text()
        .await
        .expect("reading the server's metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}
