//! The functions' metrics in memory: a `metrics` recorder that keeps what a
//! use case emits as a function's collector would (the metric's labels as
//! dimensions after `function`, each sample at the world's clock), and the
//! [`MetricsReader`] that serves it back as CloudWatch answers
//! `GetMetricData`: per series (a metric under one set of dimensions), per
//! period, the sum, the sample count and the maximum.
//!
//! A test installs it for its thread (`metrics::set_default_local_recorder`,
//! with a current-thread runtime), runs a use case, then reads the figures
//! with `insight` on it: the names and dimensions a function emits are the
//! ones the operator's figures read.

use std::sync::{Arc, Mutex};

use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, SharedString, Unit};

use crate::clock::Clock;
use crate::ledger::PortError;
use crate::ports::{MetricPoint, MetricSeries, MetricWindow, MetricsReader};

/// One sample: a counter's increment, a gauge's value, a histogram's value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    dimensions: Vec<(String, String)>,
    at_ms: i64,
    value: f64,
}

struct Inner {
    clock: Arc<dyn Clock>,
    function: String,
    samples: Mutex<Vec<Sample>>,
}

/// The recorder of one function (`function` dimension) and the reader of
/// every sample it took.
#[derive(Clone)]
pub struct MemMetrics(Arc<Inner>);

impl MemMetrics {
    pub fn new(clock: Arc<dyn Clock>, function: &str) -> Self {
        Self(Arc::new(Inner { clock, function: function.to_owned(), samples: Mutex::new(Vec::new()) }))
    }

    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut dimensions = vec![("function".to_owned(), self.0.function.clone())];
        dimensions.extend(key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())));
        Arc::new(Handle { inner: self.0.clone(), name: key.name().to_owned(), dimensions })
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, Vec<Sample>> {
        self.0.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

struct Handle {
    inner: Arc<Inner>,
    name: String,
    dimensions: Vec<(String, String)>,
}

impl Handle {
    fn sample(&self, value: f64) {
        let s = Sample {
            name: self.name.clone(),
            dimensions: self.dimensions.clone(),
            at_ms: self.inner.clock.now_ms(),
            value,
        };
        self.inner.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(s);
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.sample(value as f64);
    }
    fn absolute(&self, value: u64) {
        self.sample(value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.sample(value);
    }
    fn decrement(&self, value: f64) {
        self.sample(-value);
    }
    fn set(&self, value: f64) {
        self.sample(value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.sample(value);
    }
}

impl metrics::Recorder for MemMetrics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

impl MetricsReader for MemMetrics {
    async fn read(&self, names: &[&str], window: &MetricWindow) -> Result<Vec<MetricSeries>, PortError> {
        // CloudWatch's periods: whole minutes, at least one.
        let period_ms = (window.period_s.max(60) / 60) * 60_000;
        let mut out: Vec<MetricSeries> = Vec::new();
        for s in self.samples().iter() {
            if !names.contains(&s.name.as_str()) || !(window.since_ms..window.until_ms).contains(&s.at_ms) {
                continue;
            }
            let at_ms = s.at_ms - (s.at_ms - window.since_ms).rem_euclid(period_ms);
            let series = match out.iter().position(|x| x.name == s.name && x.dimensions == s.dimensions) {
                Some(i) => &mut out[i],
                None => {
                    out.push(MetricSeries {
                        name: s.name.clone(),
                        dimensions: s.dimensions.clone(),
                        points: Vec::new(),
                    });
                    out.last_mut().unwrap_or_else(|| unreachable!("just pushed"))
                }
            };
            match series.points.iter_mut().find(|p| p.at_ms == at_ms) {
                Some(p) => {
                    p.sum += s.value;
                    p.count += 1.0;
                    p.max = p.max.max(s.value);
                }
                None => series.points.push(MetricPoint { at_ms, sum: s.value, count: 1.0, max: s.value }),
            }
        }
        for s in &mut out {
            s.points.sort_by_key(|p| p.at_ms);
        }
        Ok(out)
    }
}
