//! The API's own metrics: request counters, blocking queries, and the catalog gauges read at
//! scrape time, for the server to register in its prometheus-client [`Registry`] (the node
//! serves them at `/v1/agent/metrics`).

use catalog::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Requests served, by status class.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: ByClass,
    blocking: Gauge,
    audit_failures: Counter,
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

    /// Counts an audit record that could not be kept (the catalog refused it, or the audit
    /// file could not be written).
    pub(crate) fn audit_failed(&self) {
        self.audit_failures.inc();
    }

    /// Blocking queries waiting now.
    pub fn blocking_now(&self) -> i64 {
        self.blocking.get()
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
        registry.register(
            "meshd_audit_failures",
            "Audit records that could not be kept (in the catalog or the audit file)",
            self.audit_failures.clone(),
        );
    }
}

/// The catalog's gauges, read from the state at each scrape: register it as a collector
/// (`Registry::register_collector`) beside [`HttpMetrics`].
#[derive(Debug)]
pub struct CatalogMetrics {
    store: Store,
}

impl CatalogMetrics {
    /// The gauges of `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }
}

impl Collector for CatalogMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (index, nodes, instances, checks) = {
            let state = self.store.read();
            (
                state.index.0,
                state.nodes().count(),
                state.all_services().count(),
                state.all_checks().count(),
            )
        };
        let (leading, servers) = match self.store.cluster() {
            Some(c) => (*c.leading().borrow(), c.status().servers.len()),
            None => (true, 1),
        };
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let gauges: [(&str, &str, i64); 8] = [
            (
                "meshd_catalog_index",
                "Index of the last committed catalog write",
                i64::try_from(index).unwrap_or(i64::MAX),
            ),
            ("meshd_catalog_nodes", "Registered nodes", count(nodes)),
            (
                "meshd_catalog_service_instances",
                "Registered service instances",
                count(instances),
            ),
            ("meshd_catalog_checks", "Registered health checks", count(checks)),
            (
                "meshd_publisher_topics",
                "Event publisher topics with subscribers",
                count(self.store.subscribed_topics()),
            ),
            (
                "meshd_server_leader",
                "1 while this server leads the servers sharing its etcd (always 1 with the embedded store)",
                i64::from(leading),
            ),
            (
                "meshd_cluster_servers",
                "Servers registered in etcd (1 with the embedded store)",
                count(servers),
            ),
            (
                "meshd_etcd_reloads",
                "Full reloads of the catalog from etcd after the watch's next revision was compacted",
                i64::try_from(self.store.etcd_reloads()).unwrap_or(i64::MAX),
            ),
        ];
        for (name, help, value) in gauges {
            // A registry adds the final period to help texts; a collector writes its own.
            let metric = encoder.encode_descriptor(name, &format!("{help}."), None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)?;
        }
        Ok(())
    }
}
