//! HTTP request counters, exported with the catalog's gauges.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Requests served, by status class.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    ok: AtomicU64,
    client_error: AtomicU64,
    server_error: AtomicU64,
    blocking: AtomicI64,
}

/// Counts one blocking query while it waits.
pub(crate) struct Waiting<'a>(&'a HttpMetrics);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.blocking.fetch_sub(1, Relaxed);
    }
}

impl HttpMetrics {
    pub(crate) fn record(&self, status: u16) {
        match status {
            500.. => &self.server_error,
            400..=499 => &self.client_error,
            _ => &self.ok,
        }
        .fetch_add(1, Relaxed);
    }

    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.blocking.fetch_add(1, Relaxed);
        Waiting(self)
    }

    /// Prometheus text for the counters.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP meshd_http_blocking_queries Blocking queries waiting now.\n");
        out.push_str("# TYPE meshd_http_blocking_queries gauge\n");
        out.push_str(&format!(
            "meshd_http_blocking_queries {}\n",
            self.blocking.load(Relaxed)
        ));
        out.push_str("# HELP meshd_http_requests_total HTTP API requests served, by status class.\n");
        out.push_str("# TYPE meshd_http_requests_total counter\n");
        for (class, v) in [
            ("2xx", &self.ok),
            ("4xx", &self.client_error),
            ("5xx", &self.server_error),
        ] {
            out.push_str(&format!(
                "meshd_http_requests_total{{code=\"{class}\"}} {}\n",
                v.load(Relaxed)
            ));
        }
    }
}
