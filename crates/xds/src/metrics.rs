//! xDS counters for the server's metrics endpoint: open streams, responses and NACKs per
//! type, and a histogram of the time from a snapshot change to the proxy's ACK.
//!
//! Exported through a prometheus-client [`Registry`]; updates stay single atomic adds with no
//! lock: per-type counters are created up front (no labelled `Family` lookup per response),
//! and the ACK histogram keeps atomic buckets rather than prometheus-client's `Histogram`,
//! whose `observe` takes a write lock that every stream's ACK would contend on.

use crate::resources::TYPES;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the ACK histogram's buckets, milliseconds (then +Inf).
const BUCKETS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/// Live xDS counters.
#[derive(Debug, Default)]
pub struct XdsMetrics {
    streams: Gauge,
    refused: Counter,
    denied: Counter,
    paced: Counter,
    shed: Counter,
    stuck: Counter,
    stuck_reset: Counter,
    build_failures: Counter,
    responses: PerType,
    nacks: PerType,
    ack: AckHistogram,
}

fn type_index(type_url: &str) -> Option<usize> {
    TYPES.iter().position(|t| *t == type_url)
}

fn short(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// One counter per xDS type, exported in `TYPES` order with a `type` label (the type's
/// short name).
#[derive(Debug, Default, Clone)]
struct PerType([Counter; TYPES.len()]);

impl PerType {
    fn inc(&self, type_url: &str) {
        if let Some(i) = type_index(type_url) {
            self.0[i].inc();
        }
    }

    fn get(&self, type_url: &str) -> u64 {
        type_index(type_url).map_or(0, |i| self.0[i].get())
    }
}

impl EncodeMetric for PerType {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (type_url, counter) in TYPES.iter().zip(&self.0) {
            let labels = [("type", short(type_url))];
            counter.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Lock-free histogram of snapshot-to-ACK times over [`BUCKETS_MS`].
#[derive(Debug, Default, Clone)]
struct AckHistogram(Arc<AckBuckets>);

#[derive(Debug, Default)]
struct AckBuckets {
    /// Per bucket (not cumulative); the last is +Inf.
    counts: [AtomicU64; BUCKETS_MS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl AckHistogram {
    fn observe(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        // `le` is inclusive and exact: 1.5 ms is above the 1 ms bucket.
        let bucket = BUCKETS_MS
            .iter()
            .position(|b| micros <= b * 1000)
            .unwrap_or(BUCKETS_MS.len());
        self.0.counts[bucket].fetch_add(1, Relaxed);
        self.0.sum_micros.fetch_add(micros, Relaxed);
        self.0.count.fetch_add(1, Relaxed);
    }
}

impl EncodeMetric for AckHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut buckets = [(f64::MAX, 0u64); BUCKETS_MS.len() + 1];
        for (i, (bound, count)) in buckets.iter_mut().enumerate() {
            // The encoder writes `le="+Inf"` for f64::MAX, which the last bucket keeps.
            if let Some(ms) = BUCKETS_MS.get(i) {
                *bound = *ms as f64 / 1000.0;
            }
            *count = self.0.counts[i].load(Relaxed);
        }
        let sum = self.0.sum_micros.load(Relaxed) as f64 / 1e6;
        let count = self.0.count.load(Relaxed);
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl XdsMetrics {
    pub(crate) fn stream_opened(&self) {
        self.streams.inc();
    }
    pub(crate) fn stream_closed(&self) {
        self.streams.dec();
    }
    pub(crate) fn stream_refused(&self) {
        self.refused.inc();
    }
    pub(crate) fn stream_denied(&self) {
        self.denied.inc();
    }
    /// Streams ended with PERMISSION_DENIED so far (the token may not serve the proxy).
    pub fn streams_denied(&self) -> u64 {
        self.denied.get()
    }
    pub(crate) fn stream_paced(&self) {
        self.paced.inc();
    }
    pub(crate) fn stream_stuck(&self) {
        self.stuck.inc();
    }
    pub(crate) fn stream_stuck_reset(&self) {
        self.stuck_reset.inc();
    }
    /// Streams flagged stuck so far (a response unanswered for 10 s).
    pub fn streams_stuck(&self) -> u64 {
        self.stuck.get()
    }
    /// Streams reset so far for a response unanswered for 30 s.
    pub fn streams_stuck_reset(&self) -> u64 {
        self.stuck_reset.get()
    }
    pub(crate) fn stream_shed(&self) {
        self.shed.inc();
    }
    /// Streams ended so far to move them to another server (balancing).
    pub fn streams_shed(&self) -> u64 {
        self.shed.get()
    }
    /// Streams refused at the limit so far.
    pub fn streams_refused(&self) -> u64 {
        self.refused.get()
    }
    /// Streams whose setup waited for the pace so far.
    pub fn streams_paced(&self) -> u64 {
        self.paced.get()
    }
    pub(crate) fn response(&self, type_url: &str) {
        self.responses.inc(type_url);
    }
    pub(crate) fn nack(&self, type_url: &str) {
        self.nacks.inc(type_url);
    }
    pub(crate) fn build_failed(&self, parts: u64) {
        self.build_failures.inc_by(parts);
    }

    /// Parts of proxies' configuration that could not be built (each new failure once).
    pub fn build_failures(&self) -> u64 {
        self.build_failures.get()
    }

    pub(crate) fn acked_after(&self, d: Duration) {
        self.ack.observe(d);
    }

    /// Streams open now.
    pub fn open_streams(&self) -> i64 {
        self.streams.get()
    }

    /// NACKs received for a type.
    pub fn nacks(&self, type_url: &str) -> u64 {
        self.nacks.get(type_url)
    }

    /// Responses sent for a type.
    pub fn responses(&self, type_url: &str) -> u64 {
        self.responses.get(type_url)
    }

    /// Registers the xDS metrics in `registry` (they share their values with `self`).
    /// Help texts have no final period: prometheus-client adds it. Counters are named
    /// without `_total`, which it adds too.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("meshd_xds_streams", "Open ADS streams", self.streams.clone());
        registry.register(
            "meshd_xds_streams_refused",
            "ADS streams refused with RESOURCE_EXHAUSTED at the stream limit",
            self.refused.clone(),
        );
        registry.register(
            "meshd_xds_streams_denied",
            "ADS streams ended with PERMISSION_DENIED: the token may not write the proxy's service",
            self.denied.clone(),
        );
        registry.register(
            "meshd_xds_streams_paced",
            "ADS streams whose setup waited for the setup rate",
            self.paced.clone(),
        );
        registry.register(
            "meshd_xds_streams_shed",
            "ADS streams ended with RESOURCE_EXHAUSTED to move them to a less loaded server (several servers)",
            self.shed.clone(),
        );
        registry.register(
            "meshd_xds_streams_stuck",
            "ADS streams flagged stuck: a response unanswered for 10 s",
            self.stuck.clone(),
        );
        registry.register(
            "meshd_xds_streams_stuck_reset",
            "ADS streams ended with UNAVAILABLE after a response went unanswered for 30 s",
            self.stuck_reset.clone(),
        );
        registry.register(
            "meshd_xds_responses",
            "xDS responses sent, by type",
            self.responses.clone(),
        );
        registry.register(
            "meshd_xds_build_failures",
            "Parts of a proxy's configuration (an upstream) that could not be built; the proxy keeps their last good resources",
            self.build_failures.clone(),
        );
        registry.register(
            "meshd_xds_nacks",
            "xDS responses rejected by proxies, by type",
            self.nacks.clone(),
        );
        registry.register(
            "meshd_xds_snapshot_to_ack_seconds",
            "Time from a snapshot change to the proxy's ACK",
            self.ack.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_keeps_names_labels_help_and_buckets() {
        let metrics = XdsMetrics::default();
        metrics.stream_opened();
        metrics.response(TYPES[0]);
        metrics.response(TYPES[0]);
        metrics.nack(TYPES[1]);
        metrics.acked_after(Duration::from_micros(1500));
        metrics.acked_after(Duration::from_secs(7));
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let t0 = short(TYPES[0]);
        let t1 = short(TYPES[1]);
        for line in [
            "# HELP meshd_xds_streams Open ADS streams.".to_owned(),
            "# TYPE meshd_xds_streams gauge".to_owned(),
            "meshd_xds_streams 1".to_owned(),
            "# HELP meshd_xds_responses xDS responses sent, by type.".to_owned(),
            "# TYPE meshd_xds_responses counter".to_owned(),
            format!("meshd_xds_responses_total{{type=\"{t0}\"}} 2"),
            format!("meshd_xds_responses_total{{type=\"{t1}\"}} 0"),
            format!("meshd_xds_nacks_total{{type=\"{t1}\"}} 1"),
            "# HELP meshd_xds_snapshot_to_ack_seconds Time from a snapshot change to the proxy's ACK.".to_owned(),
            "# TYPE meshd_xds_snapshot_to_ack_seconds histogram".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_bucket{le=\"0.001\"} 0".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_bucket{le=\"0.005\"} 1".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_bucket{le=\"5.0\"} 1".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_bucket{le=\"+Inf\"} 2".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_sum 7.0015".to_owned(),
            "meshd_xds_snapshot_to_ack_seconds_count 2".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
        }
        let buckets = text.lines().filter(|l| l.contains("_bucket{")).count();
        assert_eq!(buckets, BUCKETS_MS.len() + 1);
        assert_eq!(metrics.responses(TYPES[0]), 2);
        assert_eq!(metrics.nacks(TYPES[1]), 1);
    }
}
