//! Encoding one metric family (counter or gauge) from label sets and values, as every
//! subsystem's metrics do.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Unit,
};

/// Counter family: `name` (+ unit) + `_total`, one sample per label set.
pub(super) fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Result<(), fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        } else {
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        }
    }
    Ok(())
}

/// Gauge family, one sample per label set.
pub(super) fn gauges<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
) -> Result<(), fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_gauge(&v)?;
        } else {
            family.encode_family(&labels)?.encode_gauge(&v)?;
        }
    }
    Ok(())
}
