//! The API's own metrics: request counters, blocking queries, and the catalog gauges read at
//! scrape time; registered in a prometheus-client [`Registry`] with what the server adds.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Requests served, by status class.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: ByClass,
    blocking: Gauge,
}

/// Request counters for 2xx (and everything below 400), 4xx and 5xx, exported in that order
/// with a `code` label. Created up front: counting a request is one atomic add, no lookup.
#[derive(Debug, Default, Clone)]
struct ByClass([Counter; 3]);

const CLASSES: [&str; 3] = ["2xx", "4xx", "5xx"];

impl EncodeMetric for ByClass {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (class, counter) in CLASSES.iter().zip(&self.0) {
            counter.encode(encoder.encode_family(&[("code", *class)])?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Counts one blocking query while it waits.
pub(crate) struct Waiting<'a>(&'a HttpMetrics);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.blocking.dec();
    }
}

impl HttpMetrics {
    pub(crate) fn record(&self, status: u16) {
        let class = match status {
            500.. => 2,
            400..=499 => 1,
            _ => 0,
        };
        self.requests.0[class].inc();
    }

    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.blocking.inc();
        Waiting(self)
    }

    /// Registers the counters in `registry`, sharing their values with `self`. Help texts
    /// have no final period and counters no `_total`: prometheus-client adds both.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshd_http_blocking_queries",
            "Blocking queries waiting now",
            self.blocking.clone(),
        );
        registry.register(
            "meshd_http_requests",
            "HTTP API requests served, by status class",
            self.requests.clone(),
        );
    }
}

/// The catalog's gauges: set from the state at each scrape, just before encoding.
#[derive(Debug, Default)]
pub(crate) struct CatalogGauges {
    pub(crate) index: Gauge<u64, AtomicU64>,
    pub(crate) nodes: Gauge,
    pub(crate) service_instances: Gauge,
    pub(crate) checks: Gauge,
    pub(crate) publisher_topics: Gauge,
    /// Several servers over etcd: 1 while this server leads.
    pub(crate) leader: Gauge,
    /// Several servers over etcd: full reloads after the watch's revision was compacted.
    pub(crate) etcd_reloads: Gauge<u64, AtomicU64>,
    /// Several servers over etcd: registered servers.
    pub(crate) servers: Gauge,
}

impl CatalogGauges {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshd_catalog_index",
            "Index of the last committed catalog write",
            self.index.clone(),
        );
        registry.register("meshd_catalog_nodes", "Registered nodes", self.nodes.clone());
        registry.register(
            "meshd_catalog_service_instances",
            "Registered service instances",
            self.service_instances.clone(),
        );
        registry.register("meshd_catalog_checks", "Registered health checks", self.checks.clone());
        registry.register(
            "meshd_publisher_topics",
            "Event publisher topics with subscribers",
            self.publisher_topics.clone(),
        );
        registry.register(
            "meshd_server_leader",
            "1 while this server leads the servers sharing its etcd (always 1 with the embedded store)",
            self.leader.clone(),
        );
        registry.register(
            "meshd_cluster_servers",
            "Servers registered in etcd (1 with the embedded store)",
            self.servers.clone(),
        );
        registry.register(
            "meshd_etcd_reloads",
            "Full reloads of the catalog from etcd after the watch's next revision was compacted",
            self.etcd_reloads.clone(),
        );
    }
}
