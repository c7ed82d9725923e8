//! The HTTP clients of HTTP checks: with or without certificate verification, and for checks
//! registered through the API ("confined") following redirects only within the first URL's
//! scheme, host and port, so a redirect cannot lead a check where it may not point
//! ([`crate::check_targets`]).

use std::net::SocketAddr;

/// Most redirects a check follows (reqwest's default).
const MAX_REDIRECTS: usize = 10;

/// Follows redirects within the first URL's origin; stops (the 3xx is the answer) elsewhere.
fn same_origin() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt.previous().first().is_some_and(|first| {
            first.scheme() == attempt.url().scheme()
                && first.host_str() == attempt.url().host_str()
                && first.port_or_known_default() == attempt.url().port_or_known_default()
        });
        if same && attempt.previous().len() < MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// A check client; `resolve` pins a name to an address (`TLSServerName`).
pub(super) fn build(
    skip_verify: bool,
    confined: bool,
    resolve: Option<(&str, SocketAddr)>,
) -> reqwest::Result<reqwest::Client> {
    // Health checks open a fresh connection each time, as a client would.
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .user_agent("meshd health check")
        .danger_accept_invalid_certs(skip_verify);
    if confined {
        builder = builder.redirect(same_origin());
    }
    if let Some((name, addr)) = resolve {
        builder = builder.resolve(name, addr);
    }
    builder.build()
}

/// The four shared clients.
pub(super) struct Clients {
    by_kind: [reqwest::Client; 4],
}

impl Clients {
    pub(super) fn new() -> Self {
        let client = |skip_verify, confined| build(skip_verify, confined, None).unwrap_or_default();
        Self {
            by_kind: [
                client(false, false),
                client(true, false),
                client(false, true),
                client(true, true),
            ],
        }
    }

    /// The client for a check's TLS setting and confinement.
    pub(super) fn pick(&self, skip_verify: bool, confined: bool) -> reqwest::Client {
        self.by_kind[usize::from(skip_verify) + 2 * usize::from(confined)].clone()
    }
}
