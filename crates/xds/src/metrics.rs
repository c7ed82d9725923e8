//! xDS counters for the server's metrics endpoint: open streams, responses and NACKs per
//! type, and a histogram of the time from a snapshot change to the proxy's ACK.

use crate::resources::TYPES;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const BUCKETS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/// Live xDS counters.
#[derive(Debug, Default)]
pub struct XdsMetrics {
    streams: AtomicI64,
    responses: [AtomicU64; TYPES.len()],
    nacks: [AtomicU64; TYPES.len()],
    ack_buckets: [AtomicU64; 11],
    ack_sum_micros: AtomicU64,
    ack_count: AtomicU64,
}

fn type_index(type_url: &str) -> Option<usize> {
    TYPES.iter().position(|t| *t == type_url)
}

fn short(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

impl XdsMetrics {
    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Relaxed);
    }
    pub(crate) fn stream_closed(&self) {
        self.streams.fetch_sub(1, Relaxed);
    }
    pub(crate) fn response(&self, type_url: &str) {
        if let Some(i) = type_index(type_url) {
            self.responses[i].fetch_add(1, Relaxed);
        }
    }
    pub(crate) fn nack(&self, type_url: &str) {
        if let Some(i) = type_index(type_url) {
            self.nacks[i].fetch_add(1, Relaxed);
        }
    }
    pub(crate) fn acked_after(&self, d: Duration) {
        let ms = d.as_millis() as u64;
        let bucket = BUCKETS_MS.iter().position(|b| ms <= *b).unwrap_or(BUCKETS_MS.len());
        self.ack_buckets[bucket].fetch_add(1, Relaxed);
        self.ack_sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
        self.ack_count.fetch_add(1, Relaxed);
    }

    /// Streams open now.
    pub fn open_streams(&self) -> i64 {
        self.streams.load(Relaxed)
    }

    /// NACKs received for a type.
    pub fn nacks(&self, type_url: &str) -> u64 {
        type_index(type_url).map_or(0, |i| self.nacks[i].load(Relaxed))
    }

    /// Responses sent for a type.
    pub fn responses(&self, type_url: &str) -> u64 {
        type_index(type_url).map_or(0, |i| self.responses[i].load(Relaxed))
    }

    /// Prometheus text.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP meshd_xds_streams Open ADS streams.\n# TYPE meshd_xds_streams gauge\n");
        out.push_str(&format!("meshd_xds_streams {}\n", self.open_streams()));
        out.push_str(
            "# HELP meshd_xds_responses_total xDS responses sent, by type.\n# TYPE meshd_xds_responses_total counter\n",
        );
        for (i, t) in TYPES.iter().enumerate() {
            out.push_str(&format!(
                "meshd_xds_responses_total{{type=\"{}\"}} {}\n",
                short(t),
                self.responses[i].load(Relaxed)
            ));
        }
        out.push_str("# HELP meshd_xds_nacks_total xDS responses rejected by proxies, by type.\n# TYPE meshd_xds_nacks_total counter\n");
        for (i, t) in TYPES.iter().enumerate() {
            out.push_str(&format!(
                "meshd_xds_nacks_total{{type=\"{}\"}} {}\n",
                short(t),
                self.nacks[i].load(Relaxed)
            ));
        }
        out.push_str("# HELP meshd_xds_snapshot_to_ack_seconds Time from a snapshot change to the proxy's ACK.\n");
        out.push_str("# TYPE meshd_xds_snapshot_to_ack_seconds histogram\n");
        let mut cumulative = 0;
        for (i, le) in BUCKETS_MS.iter().enumerate() {
            cumulative += self.ack_buckets[i].load(Relaxed);
            out.push_str(&format!(
                "meshd_xds_snapshot_to_ack_seconds_bucket{{le=\"{}\"}} {cumulative}\n",
                *le as f64 / 1000.0
            ));
        }
        cumulative += self.ack_buckets[BUCKETS_MS.len()].load(Relaxed);
        out.push_str(&format!(
            "meshd_xds_snapshot_to_ack_seconds_bucket{{le=\"+Inf\"}} {cumulative}\n"
        ));
        out.push_str(&format!(
            "meshd_xds_snapshot_to_ack_seconds_sum {}\n",
            self.ack_sum_micros.load(Relaxed) as f64 / 1e6
        ));
        out.push_str(&format!(
            "meshd_xds_snapshot_to_ack_seconds_count {}\n",
            self.ack_count.load(Relaxed)
        ));
    }
}
