//! The functions' metrics in CloudWatch ([`MetricsReader`]): one
//! `ListMetrics` pass over the namespace finds the series (a metric under one
//! set of dimensions), then `GetMetricData` reads each series' sum, sample
//! count and maximum per period, up to 500 queries a request. The cost grows
//! with the number of series (providers × endpoints × outcomes), never with
//! traffic.
//!
//! [`emf_data`] and [`CloudWatchMetrics::put_emf`] turn one EMF log line into
//! `PutMetricData`: what CloudWatch Logs does with the functions' EMF in AWS,
//! done by the local stack's bridge so the same reader works against the
//! emulator.

use aws_sdk_cloudwatch::Client;
use aws_sdk_cloudwatch::types::{Dimension, Metric, MetricDataQuery, MetricDatum, MetricStat, StatisticSet};
use aws_smithy_types::DateTime;

use crate::adapters::port_error;
use crate::ledger::PortError;
use crate::ports::{MetricPoint, MetricSeries, MetricWindow, MetricsReader};

/// Queries per `GetMetricData` request (CloudWatch's limit).
const QUERIES_PER_REQUEST: usize = 500;
/// Series read at most per call: a bound on the cost of one answer.
pub const MAX_SERIES: usize = 300;

#[derive(Clone)]
pub struct CloudWatchMetrics {
    client: Client,
    namespace: String,
}

impl CloudWatchMetrics {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self { client, namespace: namespace.into() }
    }

    /// The functions' namespace: `HOOKLEDGER_METRICS_NAMESPACE`, default `Hookledger`.
    pub fn from_config(aws: &aws_config::SdkConfig, namespace: Option<String>) -> Self {
        Self::new(Client::new(aws), namespace.unwrap_or_else(|| "Hookledger".into()))
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Every series of the namespace whose metric is one of `names`.
    async fn series(&self, names: &[&str]) -> Result<Vec<MetricSeries>, PortError> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_metrics()
                .namespace(&self.namespace)
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| port_error("cloudwatch", &e))?;
            for m in page.metrics.unwrap_or_default() {
                let name = m.metric_name.unwrap_or_default();
                if !names.contains(&name.as_str()) || out.len() >= MAX_SERIES {
                    continue;
                }
                // In the order listed: CloudWatch matches dimensions in any
                // order, and the emulator only in the order they were put.
                let dimensions: Vec<(String, String)> = m
                    .dimensions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|d| (d.name.unwrap_or_default(), d.value.unwrap_or_default()))
                    .collect();
                let sorted = |d: &[(String, String)]| {
                    let mut d = d.to_vec();
                    d.sort();
                    d
                };
                let seen =
                    out.iter().any(|s: &MetricSeries| s.name == name && sorted(&s.dimensions) == sorted(&dimensions));
                if !seen {
                    out.push(MetricSeries { name, dimensions, points: Vec::new() });
                }
            }
            match page.next_token {
                Some(t) if !t.is_empty() && out.len() < MAX_SERIES => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    /// Forwards one EMF log line to CloudWatch as `PutMetricData`; returns
    /// the number of data points sent (0 for a line that is not EMF).
    pub async fn put_emf(&self, line: &str) -> Result<usize, PortError> {
        let Some((namespace, data)) = emf_data(line) else { return Ok(0) };
        let n = data.len();
        for chunk in data.chunks(1000) {
            self.client
                .put_metric_data()
                .namespace(&namespace)
                .set_metric_data(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| port_error("cloudwatch", &e))?;
        }
        Ok(n)
    }
}

const STATS: [&str; 3] = ["Sum", "SampleCount", "Maximum"];

fn stat_query(id: String, series: &MetricSeries, namespace: &str, stat: &str, period_s: i64) -> MetricDataQuery {
    let dims: Vec<Dimension> =
        series.dimensions.iter().map(|(n, v)| Dimension::builder().name(n).value(v).build()).collect();
    let metric = Metric::builder().namespace(namespace).metric_name(&series.name).set_dimensions(Some(dims)).build();
    MetricDataQuery::builder()
        .id(id)
        .metric_stat(MetricStat::builder().metric(metric).period(period_s as i32).stat(stat).build())
        .return_data(true)
        .build()
}

impl MetricsReader for CloudWatchMetrics {
    async fn read(&self, names: &[&str], window: &MetricWindow) -> Result<Vec<MetricSeries>, PortError> {
        let mut series = self.series(names).await?;
        let period_s = (window.period_s.max(60) / 60) * 60;
        // (series index, stat index) of every query, in order.
        let queries: Vec<(usize, usize)> =
            (0..series.len()).flat_map(|i| (0..STATS.len()).map(move |s| (i, s))).collect();
        for chunk in queries.chunks(QUERIES_PER_REQUEST) {
            let built: Vec<MetricDataQuery> = chunk
                .iter()
                .map(|&(i, s)| stat_query(format!("q{i}_{s}"), &series[i], &self.namespace, STATS[s], period_s))
                .collect();
            let mut token = None;
            loop {
                let page = self
                    .client
                    .get_metric_data()
                    .set_metric_data_queries(Some(built.clone()))
                    .start_time(DateTime::from_millis(window.since_ms))
                    .end_time(DateTime::from_millis(window.until_ms))
                    .set_next_token(token.take())
                    .send()
                    .await
                    .map_err(|e| port_error("cloudwatch", &e))?;
                for r in page.metric_data_results.unwrap_or_default() {
                    let Some((i, s)) = r.id.as_deref().and_then(parse_id) else { continue };
                    let Some(target) = series.get_mut(i) else { continue };
                    let times = r.timestamps.unwrap_or_default();
                    let values = r.values.unwrap_or_default();
                    for (t, v) in times.iter().zip(values) {
                        let at_ms = t.to_millis().unwrap_or(0);
                        let point = match target.points.iter_mut().find(|p| p.at_ms == at_ms) {
                            Some(p) => p,
                            None => {
                                target.points.push(MetricPoint { at_ms, ..MetricPoint::default() });
                                target.points.last_mut().unwrap_or_else(|| unreachable!("just pushed"))
                            }
                        };
                        match s {
                            0 => point.sum += v,
                            1 => point.count += v,
                            _ => point.max = point.max.max(v),
                        }
                    }
                }
                match page.next_token {
                    Some(t) if !t.is_empty() => token = Some(t),
                    _ => break,
                }
            }
        }
        for s in &mut series {
            s.points.sort_by_key(|p| p.at_ms);
        }
        series.retain(|s| !s.points.is_empty());
        Ok(series)
    }
}

fn parse_id(id: &str) -> Option<(usize, usize)> {
    let (i, s) = id.strip_prefix('q')?.split_once('_')?;
    Some((i.parse().ok()?, s.parse().ok()?))
}

/// The namespace and data points of one EMF document (CloudWatch's embedded
/// metric format: `_aws.CloudWatchMetrics[].{Namespace, Dimensions,
/// Metrics}`, values at the top level, one number or a list). A list becomes
/// one statistic set (count, sum, min, max). `None`: not EMF.
pub fn emf_data(line: &str) -> Option<(String, Vec<MetricDatum>)> {
    let doc: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let aws = doc.get("_aws")?;
    let at_ms = aws.get("Timestamp")?.as_i64()?;
    let mut namespace = None;
    let mut data = Vec::new();
    for directive in aws.get("CloudWatchMetrics")?.as_array()? {
        let ns = directive.get("Namespace")?.as_str()?.to_owned();
        let dimension_sets: Vec<Vec<&str>> = directive
            .get("Dimensions")
            .and_then(|d| d.as_array())
            .map(|sets| {
                sets.iter()
                    .map(|set| set.as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect())
                    .collect()
            })
            .unwrap_or_else(|| vec![Vec::new()]);
        for metric in directive.get("Metrics")?.as_array()? {
            let Some(name) = metric.get("Name").and_then(|n| n.as_str()) else { continue };
            let values: Vec<f64> = match doc.get(name) {
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(serde_json::Value::as_f64).collect(),
                Some(v) => v.as_f64().into_iter().collect(),
                None => continue,
            };
            if values.is_empty() {
                continue;
            }
            let stats = StatisticSet::builder()
                .sample_count(values.len() as f64)
                .sum(values.iter().sum())
                .minimum(values.iter().copied().fold(f64::INFINITY, f64::min))
                .maximum(values.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                .build();
            let unit = metric.get("Unit").and_then(|u| u.as_str()).map(aws_sdk_cloudwatch::types::StandardUnit::from);
            for set in &dimension_sets {
                let dims: Vec<Dimension> = set
                    .iter()
                    .filter_map(|d| {
                        doc.get(*d).and_then(|v| v.as_str()).map(|v| Dimension::builder().name(*d).value(v).build())
                    })
                    .collect();
                data.push(
                    MetricDatum::builder()
                        .metric_name(name)
                        .set_dimensions(Some(dims))
                        .statistic_values(stats.clone())
                        .set_unit(unit.clone())
                        .timestamp(DateTime::from_millis(at_ms))
                        .build(),
                );
            }
        }
        namespace = Some(ns);
    }
    Some((namespace?, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emf_line_becomes_one_datum_per_metric_with_its_dimensions_and_statistics() {
        let line = r#"{"_aws":{"Timestamp":1700000000000,"CloudWatchMetrics":[{"Namespace":"Hookledger",
            "Dimensions":[["function","provider"]],"Metrics":[{"Name":"received"},{"Name":"intake_duration","Unit":"Milliseconds"}]}]},
            "function":"intake","provider":"stripe","received":2,"intake_duration":[3.0,9.0,6.0]}"#
            .replace('\n', "");
        let (ns, data) = emf_data(&line).unwrap();
        assert_eq!(ns, "Hookledger");
        assert_eq!(data.len(), 2);
        let received = &data[0];
        assert_eq!(received.metric_name(), Some("received"));
        let dims: Vec<(&str, &str)> =
            received.dimensions().iter().map(|d| (d.name().unwrap(), d.value().unwrap())).collect();
        assert_eq!(dims, [("function", "intake"), ("provider", "stripe")]);
        assert_eq!(received.statistic_values().unwrap().sum(), Some(2.0));
        let duration = data[1].statistic_values().unwrap();
        assert_eq!(
            (duration.sample_count(), duration.sum(), duration.minimum(), duration.maximum()),
            (Some(3.0), Some(18.0), Some(3.0), Some(9.0))
        );
        assert_eq!(data[1].timestamp().unwrap().to_millis().unwrap(), 1_700_000_000_000);
    }

    #[test]
    fn lines_that_are_not_emf_give_nothing() {
        for line in ["", "not json", r#"{"level":"INFO","message":"hello"}"#, r#"{"_aws":{}}"#, "[1,2]"] {
            assert!(emf_data(line).is_none(), "{line}");
        }
        assert_eq!(parse_id("q12_2"), Some((12, 2)));
        assert_eq!(parse_id("x1_2"), None);
    }
}
