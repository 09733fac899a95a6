//! The keys that shape how statsd_exporter exports an observer (timer,
//! histogram, distribution), and what tessera does with each.
//!
//! tessera keeps every timer, histogram and distribution as a mergeable
//! DDSketch, written as a Prometheus native histogram or a summary as the
//! ingester's target says. **`observer_type: histogram`** (in a mapping or in
//! `defaults`) makes the series a classic histogram as well: its values are
//! counted exactly into the fixed `buckets` (or `histogram_options.buckets`,
//! else those of `defaults`, else Prometheus' default buckets) at the
//! collector, and the ingester writes `_bucket{le=…}`, `_sum` and `_count`.
//! A summary's quantile objectives and windows have no equivalent: the
//! quantiles come from the sketch. Every key is checked the way
//! statsd_exporter checks it (valid values, no setting in two places, no
//! summary options on a histogram), and each one without an effect is
//! reported as a note. `ttl` is reported the same way: tessera expires idle
//! series by the aggregator's own rule.

use std::sync::Arc;

use tessera_core::aggregate::check_bounds;

use super::config::{GoDuration, HistogramOptions, Quantile, SummaryOptions};
use super::{Loader, MappingError};

/// A classic histogram's bucket bounds, shared by every series of a mapping.
pub(super) type Bounds = Arc<[f64]>;

/// `observer_type` (or the deprecated `timer_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ObserverType {
    /// `histogram`.
    Histogram,
    /// `summary`.
    Summary,
}

/// The observer keys of `defaults` or of one mapping.
pub(super) struct ObserverSettings<'a> {
    pub observer_type: Option<&'a str>,
    pub timer_type: Option<&'a str>,
    pub buckets: Option<&'a [f64]>,
    pub quantiles: Option<&'a [Quantile]>,
    pub histogram_options: Option<&'a HistogramOptions>,
    pub summary_options: Option<&'a SummaryOptions>,
    pub ttl: Option<&'a GoDuration>,
}

const SKETCH: &str = "tessera keeps every timer, histogram and distribution as a DDSketch \
                      and writes it as a Prometheus native histogram";

impl Loader {
    /// Checks and notes the observer keys of mapping `mapping` (`None`:
    /// `defaults`); returns the `observer_type` they set, if any, and the bucket
    /// bounds they set, if any.
    pub(super) fn observer_settings(
        &mut self,
        mapping: Option<usize>,
        settings: ObserverSettings<'_>,
    ) -> Result<(Option<ObserverType>, Option<Bounds>), MappingError> {
        let mut observer_type = None;
        for (key, value) in [("observer_type", settings.observer_type), ("timer_type", settings.timer_type)] {
            let Some(value) = value else {
                continue;
            };
            let parsed = match value {
                "" => None,
                "histogram" => Some(ObserverType::Histogram),
                "summary" => Some(ObserverType::Summary),
                other => {
                    return Err(self.invalid(mapping, key, format!("`{other}` is not `histogram` or `summary`")));
                }
            };
            // statsd_exporter: `timer_type` only counts when `observer_type`
            // is not set.
            if observer_type.is_none() {
                observer_type = parsed;
            }
            let deprecated =
                if key == "timer_type" { " (`timer_type` is the deprecated name of `observer_type`)" } else { "" };
            let message = match parsed {
                // Classic buckets are written, as statsd_exporter writes them.
                Some(ObserverType::Histogram) if deprecated.is_empty() => continue,
                Some(ObserverType::Histogram) => format!("`{value}`{deprecated}"),
                Some(ObserverType::Summary) => format!(
                    "`{value}`{deprecated}: {SKETCH}, not a summary; quantiles come from \
                     histogram_quantile() in PromQL"
                ),
                // Empty means the default, in statsd_exporter and here.
                None => continue,
            };
            self.note(mapping, key, &message);
        }
        let nested_buckets = settings.histogram_options.and_then(|options| options.buckets.as_ref());
        let nested_quantiles = settings.summary_options.and_then(|options| options.quantiles.as_ref());
        if mapping.is_some() && settings.buckets.is_some() && nested_buckets.is_some() {
            return Err(self.invalid(
                mapping,
                "buckets",
                "cannot be set both here and in `histogram_options`".to_owned(),
            ));
        }
        if mapping.is_some() && settings.quantiles.is_some() && nested_quantiles.is_some() {
            return Err(self.invalid(
                mapping,
                "quantiles",
                "cannot be set both here and in `summary_options`".to_owned(),
            ));
        }
        let mut bounds = None;
        if let Some(buckets) = settings.buckets {
            bounds = self.bucket_bounds(mapping, "buckets", buckets)?;
        }
        if let Some(quantiles) = settings.quantiles {
            self.note_quantiles(mapping, "quantiles", quantiles)?;
        }
        if let Some(options) = settings.histogram_options
            && let Some(nested) = self.histogram_options(mapping, options)?
        {
            bounds = Some(nested);
        }
        if let Some(options) = settings.summary_options {
            self.summary_options(mapping, options)?;
        }
        if let Some(ttl) = settings.ttl {
            let ttl = ttl.check().map_err(|message| self.invalid(mapping, "ttl", message))?;
            self.note(
                mapping,
                "ttl",
                &format!(
                    "`{ttl}`: tessera expires an idle series after the aggregator's configured \
                     number of empty tiles; a ttl per mapping is not used"
                ),
            );
        }
        Ok((observer_type, bounds))
    }

    /// Checks bucket bounds: finite and strictly increasing (Prometheus' client refuses
    /// others), a last `+Inf` allowed and left out (it is always there). None set (an
    /// empty list) means the defaults, as in statsd_exporter.
    fn bucket_bounds(
        &mut self,
        mapping: Option<usize>,
        key: &str,
        buckets: &[f64],
    ) -> Result<Option<Arc<[f64]>>, MappingError> {
        let bounds = match buckets.split_last() {
            Some((last, rest)) if *last == f64::INFINITY => rest,
            _ => buckets,
        };
        if bounds.is_empty() {
            return Ok(None);
        }
        check_bounds(bounds).map_err(|error| self.invalid(mapping, key, error.to_string()))?;
        Ok(Some(bounds.into()))
    }

    fn note_quantiles(
        &mut self,
        mapping: Option<usize>,
        key: &str,
        quantiles: &[Quantile],
    ) -> Result<(), MappingError> {
        if let Some(bad) = quantiles
            .iter()
            .find(|objective| !(0.0..=1.0).contains(&objective.quantile) || !(0.0..=1.0).contains(&objective.error))
        {
            return Err(self.invalid(
                mapping,
                key,
                format!("quantile {} with error {} is not in 0..=1", bad.quantile, bad.error),
            ));
        }
        self.note(
            mapping,
            key,
            &format!(
                "{} quantile objectives: tessera writes no summaries; any quantile comes from \
                 histogram_quantile() over the native histogram",
                quantiles.len()
            ),
        );
        Ok(())
    }

    fn histogram_options(
        &mut self,
        mapping: Option<usize>,
        options: &HistogramOptions,
    ) -> Result<Option<Arc<[f64]>>, MappingError> {
        let bounds = match &options.buckets {
            Some(buckets) => self.bucket_bounds(mapping, "histogram_options", buckets)?,
            None => None,
        };
        if options.native_histogram_bucket_factor.is_some() || options.native_histogram_max_buckets.is_some() {
            self.note(
                mapping,
                "histogram_options",
                "native_histogram_bucket_factor / native_histogram_max_buckets: tessera's \
                 native histograms have the sketch's fixed resolution; these are not used",
            );
        }
        Ok(bounds)
    }

    fn summary_options(&mut self, mapping: Option<usize>, options: &SummaryOptions) -> Result<(), MappingError> {
        if let Some(quantiles) = &options.quantiles {
            self.note_quantiles(mapping, "summary_options", quantiles)?;
        }
        if let Some(max_age) = &options.max_age {
            max_age.check().map_err(|message| self.invalid(mapping, "summary_options", message))?;
        }
        if options.max_age.is_some() || options.age_buckets.is_some() || options.buf_cap.is_some() {
            self.note(
                mapping,
                "summary_options",
                "max_age / age_buckets / buf_cap: tessera writes no summaries; its sketches \
                 cover each tile (10 s, 1 m) and merge exactly; these are not used",
            );
        }
        Ok(())
    }
}
