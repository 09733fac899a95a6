//! Fixed buckets of a classic Prometheus histogram, counted exactly beside the sketch.
//!
//! A statsd_exporter mapping with `observer_type: histogram` and `buckets` asks for
//! `_bucket{le="…"}` series whose counts are exact, as statsd_exporter's are. A sketch
//! cannot give them (a value within the sketch's relative error of a bound may fall on
//! either side), so the series counts each value into its bucket as it is folded in at
//! the collector, and the counts add up exactly at every merge after.
//!
//! Counts are kept per bucket (not cumulative) and weighted like the rest of a
//! distribution (`1 / sample_rate` per value): the last one is the overflow bucket
//! (`le="+Inf"`). The ingester makes them cumulative over `le` and over time.

use std::sync::Arc;

/// The bounds and per-bucket weights of one series' classic histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedBuckets {
    bounds: Arc<[f64]>,
    /// One per bound, then the overflow bucket.
    counts: Vec<f64>,
}

/// Why bucket bounds are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BucketsError {
    /// A bound is NaN or infinite (`+Inf` is implied).
    #[error("a bucket bound is not finite")]
    NonFiniteBound,
    /// The bounds do not strictly increase.
    #[error("bucket bounds do not strictly increase")]
    Unordered,
    /// No bounds, or too many.
    #[error("a histogram has 1 to {} bucket bounds", MAX_BUCKETS)]
    Count,
    /// The counts do not match the bounds (one per bound and the overflow), or one is
    /// negative or not finite.
    #[error("bucket counts do not match their bounds")]
    Counts,
}

/// Most bounds one histogram may have (statsd_exporter sets none; Prometheus client
/// libraries' defaults have 11).
pub const MAX_BUCKETS: usize = 256;

/// Checks bounds as a mapping file gives them, sorted as statsd_exporter's client library
/// sorts them (it refuses unsorted ones; so does this).
pub fn check_bounds(bounds: &[f64]) -> Result<(), BucketsError> {
    if bounds.is_empty() || bounds.len() > MAX_BUCKETS {
        return Err(BucketsError::Count);
    }
    if bounds.iter().any(|bound| !bound.is_finite()) {
        return Err(BucketsError::NonFiniteBound);
    }
    if bounds.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err(BucketsError::Unordered);
    }
    Ok(())
}

impl FixedBuckets {
    /// Empty buckets with `bounds` (checked with [`check_bounds`] by whoever made them).
    pub fn new(bounds: Arc<[f64]>) -> FixedBuckets {
        let counts = vec![0.0; bounds.len() + 1];
        FixedBuckets { bounds, counts }
    }

    /// Buckets from the wire: `counts` has one entry per bound and the overflow.
    pub fn from_parts(bounds: &[f64], counts: &[f64]) -> Result<FixedBuckets, BucketsError> {
        check_bounds(bounds)?;
        if counts.len() != bounds.len() + 1 || counts.iter().any(|count| !count.is_finite() || *count < 0.0) {
            return Err(BucketsError::Counts);
        }
        Ok(FixedBuckets { bounds: bounds.into(), counts: counts.to_vec() })
    }

    /// The upper bounds (`+Inf` is implied after the last).
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    /// The weight per bucket, not cumulative; the last is the overflow.
    pub fn counts(&self) -> &[f64] {
        &self.counts
    }

    /// Counts `value` with `weight` in the first bucket whose bound is at least `value`
    /// (Prometheus' `le`), or in the overflow.
    #[inline]
    pub fn insert(&mut self, value: f64, weight: f64) {
        let index = self.bounds.partition_point(|bound| *bound < value);
        self.counts[index] += weight;
    }

    /// Adds `other`'s counts; false (and nothing added) when its bounds differ.
    pub fn merge(&mut self, other: &FixedBuckets) -> bool {
        if !Arc::ptr_eq(&self.bounds, &other.bounds) && self.bounds != other.bounds {
            return false;
        }
        for (count, more) in self.counts.iter_mut().zip(&other.counts) {
            *count += more;
        }
        true
    }

    /// Zeroes the counts, keeping the bounds.
    pub fn clear(&mut self) {
        self.counts.fill(0.0);
    }

    /// Bytes held on the heap by the counts (the bounds are shared).
    pub fn heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Aggregate, Distribution, Observer};
    use crate::parse::MetricKind;
    use crate::table::{ObserverSource, Table, TableOptions};

    /// Gives `[0.1, 1]` to timers named `lat`.
    struct LatBuckets;

    impl ObserverSource for LatBuckets {
        fn observer(&self, kind: MetricKind, name: &[u8]) -> Option<Observer> {
            (kind == MetricKind::Timer && name == b"lat").then(|| Observer::Histogram(Arc::from([0.1, 1.0])))
        }
    }

    /// A reader's table counts buckets for the series its source names, the partials keep
    /// them through the wire and a merging table with no source, and the counts add up.
    #[test]
    fn buckets_are_counted_at_insert_and_survive_the_wire_and_merges() {
        let mut reader = Table::new(TableOptions::default()).with_observer_source(Arc::new(LatBuckets));
        reader.fold_datagram(
            b"lat:50|ms\nlat:100|ms\nlat:700|ms|@0.5\nlat:3000|ms\nother:5|ms",
            Default::default(),
            0,
            |_| {},
        );
        let mut partials = Vec::new();
        reader.cut(|kind, id, aggregate| partials.push((kind, id.to_vec(), aggregate.to_proto())));
        let mut merged = Table::new(TableOptions::default());
        for _ in 0..2 {
            for (kind, id, wire) in &partials {
                merged.merge(*kind, id, &Aggregate::from_proto(wire).unwrap()).unwrap();
            }
        }
        let mut out = Vec::new();
        merged.cut(|_, id, aggregate| {
            let Aggregate::Distribution(distribution) = aggregate else { panic!("a distribution") };
            out.push((id.to_vec(), distribution.buckets.as_ref().map(|buckets| buckets.counts().to_vec())));
        });
        out.sort_by(|a, b| a.0.cmp(&b.0));
        // 50 ms and 100 ms are <= 0.1 s (on the bound counts), 700 ms twice (@0.5), 3 s over.
        assert_eq!(out, [(b"lat".to_vec(), Some(vec![4.0, 4.0, 2.0])), (b"other".to_vec(), None)]);
    }

    /// A mapping's summary quantiles travel with the partials and survive merges.
    #[test]
    fn summary_quantiles_survive_the_wire_and_merges() {
        let mut partial = Distribution::for_observer(Observer::Summary(Arc::from([0.5, 0.99])));
        partial.insert(1.0, 1.0);
        let wire = Aggregate::Distribution(Box::new(partial)).to_proto();
        let Aggregate::Distribution(decoded) = Aggregate::from_proto(&wire).unwrap() else { panic!() };
        let mut merged = Distribution::default();
        merged.merge(&decoded);
        merged.merge(&Distribution::default());
        assert_eq!(merged.quantiles.as_deref(), Some(&[0.5, 0.99][..]));
        let mut bad = wire.clone();
        if let Some(crate::aggregate::proto::aggregate::Value::Distribution(distribution)) = &mut bad.value {
            distribution.quantiles = vec![1.5];
        }
        assert!(Aggregate::from_proto(&bad).is_err(), "a quantile outside 0..=1 is refused");
    }

    #[test]
    fn partials_that_disagree_on_buckets_merge_without_them() {
        let bounds: Arc<[f64]> = Arc::from([1.0]);
        let mut with = Distribution::with_buckets(bounds.clone());
        with.insert(0.5, 1.0);
        let mut without = Distribution::default();
        without.insert(0.5, 1.0);
        let mut empty_first = Distribution::default();
        assert!(!empty_first.merge(&with));
        assert!(empty_first.buckets.is_some(), "an empty side takes the other's buckets");
        let mut mixed = with.clone();
        assert!(mixed.merge(&without), "the merge says it dropped the buckets");
        assert!(mixed.buckets.is_none());
        assert_eq!(mixed.count, 2.0, "count and sketch stay whole");
        let mut mixed = without.clone();
        assert!(mixed.merge(&with));
        assert!(mixed.buckets.is_none());
        let mut other_bounds = Distribution::with_buckets(Arc::from([2.0]));
        other_bounds.insert(0.5, 1.0);
        let mut mixed = with.clone();
        assert!(mixed.merge(&other_bounds));
        assert!(mixed.buckets.is_none());
        let mut agreeing = with.clone();
        assert!(!agreeing.merge(&with));
        let mut kept = with.clone();
        assert!(!kept.merge(&Distribution::default()));
        assert_eq!(kept.buckets.unwrap().counts(), [1.0, 0.0], "an empty partial changes nothing");
    }

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_as_le_says() {
        let mut buckets = FixedBuckets::new(Arc::from([0.1, 0.5, 1.0]));
        for value in [0.05, 0.1, 0.1000001, 0.5, 1.0, 7.0, -3.0] {
            buckets.insert(value, 1.0);
        }
        buckets.insert(0.3, 10.0);
        assert_eq!(buckets.counts(), [3.0, 12.0, 1.0, 1.0]);
    }

    #[test]
    fn merges_add_only_with_the_same_bounds() {
        let mut one = FixedBuckets::new(Arc::from([1.0, 2.0]));
        one.insert(1.5, 1.0);
        let mut other = FixedBuckets::new(Arc::from([1.0, 2.0]));
        other.insert(0.5, 2.0);
        assert!(one.merge(&other));
        assert_eq!(one.counts(), [2.0, 1.0, 0.0]);
        let different = FixedBuckets::new(Arc::from([1.0, 3.0]));
        assert!(!one.merge(&different));
        assert_eq!(one.counts(), [2.0, 1.0, 0.0], "nothing added");
    }

    #[test]
    fn bad_bounds_and_counts_are_refused() {
        assert_eq!(check_bounds(&[]), Err(BucketsError::Count));
        assert_eq!(check_bounds(&[1.0, f64::NAN]), Err(BucketsError::NonFiniteBound));
        assert_eq!(check_bounds(&[1.0, f64::INFINITY]), Err(BucketsError::NonFiniteBound));
        assert_eq!(check_bounds(&[2.0, 1.0]), Err(BucketsError::Unordered));
        assert_eq!(check_bounds(&[1.0, 1.0]), Err(BucketsError::Unordered));
        assert_eq!(FixedBuckets::from_parts(&[1.0], &[1.0]), Err(BucketsError::Counts));
        assert_eq!(FixedBuckets::from_parts(&[1.0], &[1.0, -1.0]), Err(BucketsError::Counts));
        assert!(FixedBuckets::from_parts(&[1.0], &[1.0, 0.5]).is_ok());
    }
}
