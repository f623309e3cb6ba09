//! The Prometheus text exposition of one [`MetricsSnapshot`], through `prometheus-client`'s
//! encoder (metric names in the README).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;

use super::{CounterSnapshot, MetricsSnapshot, TransportCounters, PREFIX};

/// One scrape's worth of metrics, encoded by `prometheus-client`.
#[derive(Debug)]
pub(super) struct Exposition {
    pub(super) snapshot: MetricsSnapshot,
    pub(super) histograms: Vec<(&'static str, Histogram, Histogram)>,
}

type Labels<'a> = Vec<(&'static str, &'a str)>;

fn counter_family<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (Labels<'a>, u64)>,
) -> Result<(), std::fmt::Error> {
    let name = format!("{PREFIX}{name}");
    let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_requests(&mut encoder)?;
        self.encode_connections(&mut encoder)?;
        self.encode_histograms(&mut encoder)
    }
}

impl Exposition {
    /// Bytes, requests and failures, per transport and per peer.
    fn encode_requests(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ts = &self.snapshot.transports;
        type Pick = fn(&CounterSnapshot) -> u64;
        let per_request: [(&str, &str, Pick); 3] = [
            ("bytes_read", "Bytes of completed reads", |c| c.bytes_read),
            ("bytes_written", "Bytes of completed writes", |c| {
                c.bytes_written
            }),
            ("requests", "Requests finished (completed or failed)", |c| {
                c.requests
            }),
        ];
        for (name, help, pick) in per_request {
            counter_family(
                encoder,
                name,
                &format!("{help}, per transport"),
                ts.iter()
                    .map(|t| (vec![("transport", t.protocol)], pick(&t.counters))),
            )?;
            counter_family(
                encoder,
                &format!("peer_{name}"),
                &format!("{help}, per peer segment"),
                self.snapshot
                    .peers
                    .iter()
                    .map(|(p, c)| (vec![("peer", p.as_str())], pick(c))),
            )?;
        }
        counter_family(
            encoder,
            "failures",
            "Failed requests by kind, per transport",
            ts.iter().flat_map(|t| {
                t.counters
                    .failures_by_kind()
                    .map(|(k, n)| (vec![("transport", t.protocol), ("kind", k)], n))
            }),
        )?;
        counter_family(
            encoder,
            "peer_failures",
            "Failed requests by kind, per peer segment",
            self.snapshot.peers.iter().flat_map(|(p, c)| {
                c.failures_by_kind()
                    .map(|(k, n)| (vec![("peer", p.as_str()), ("kind", k)], n))
            }),
        )?;
        Ok(())
    }

    /// What the transports count of their connections, per transport.
    fn encode_connections(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ts = &self.snapshot.transports;
        type PickConn = fn(&TransportCounters) -> u64;
        let per_conn: [(&str, &str, PickConn); 5] = [
            (
                "connects",
                "Connections opened to peers (RDMA: endpoints set up; IPC: peer GPU handles opened)",
                |c| c.connects,
            ),
            (
                "reconnects",
                "Connections opened again after one broke (RDMA: endpoint rebuilt after its queue pairs failed; IPC: none)",
                |c| c.reconnects,
            ),
            (
                "retries",
                "Slices sent again after their connection broke (RDMA: over another HCA pair; IPC: none)",
                |c| c.retries,
            ),
            (
                "served_bytes_read",
                "Bytes peers read from our registered memory through our threads (TCP only: one-sided RDMA and GPU IPC bypass them, so those count 0)",
                |c| c.served_bytes_read,
            ),
            (
                "served_bytes_written",
                "Bytes peers wrote into our registered memory through our threads (TCP only: one-sided RDMA and GPU IPC bypass them, so those count 0)",
                |c| c.served_bytes_written,
            ),
        ];
        for (name, help, pick) in per_conn {
            counter_family(
                encoder,
                name,
                &format!("{help}, per transport"),
                ts.iter()
                    .map(|t| (vec![("transport", t.protocol)], pick(&t.connections))),
            )?;
        }
        Ok(())
    }

    /// The request and batch latency histograms, per transport.
    fn encode_histograms(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, which) in [
            (
                "request_latency_seconds",
                "Request completion latency from submit, per transport",
                0,
            ),
            (
                "batch_latency_seconds",
                "Batch completion latency from submit, per transport",
                1,
            ),
        ] {
            let name = format!("{PREFIX}{name}");
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Histogram)?;
            for (protocol, request, batch) in &self.histograms {
                let h = if which == 0 { request } else { batch };
                h.encode(family.encode_family(&vec![("transport", *protocol)])?)?;
            }
        }
        Ok(())
    }
}
