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
//! **`observer_type: summary`** makes it a summary with the quantiles of
//! `quantiles` (or `summary_options.quantiles`, else those of `defaults`, else
//! statsd_exporter's 0.5, 0.9 and 0.99), read from the sketch per tile: the
//! objectives' `error` and the summary windows have no equivalent. Every key is checked the way
//! statsd_exporter checks it (valid values, no setting in two places, no
//! summary options on a histogram), and each one without an effect is
//! reported as a note. `ttl` is reported the same way: tessera expires idle
//! series by the aggregator's own rule.

use std::sync::Arc;

use tessera_core::aggregate::check_bounds;

use super::config::{GoDuration, HistogramOptions, Quantile, SummaryOptions};
use super::{Loader, MappingError};

/// A classic histogram's bucket bounds, or a summary's quantiles, shared by every series
/// of a mapping.
pub(super) type Bounds = Arc<[f64]>;

/// What the observer keys of `defaults` or of one mapping set.
pub(super) struct ObserverChoice {
    /// `observer_type` (or `timer_type`).
    pub observer_type: Option<ObserverType>,
    /// `buckets` or `histogram_options.buckets`.
    pub bounds: Option<Bounds>,
    /// The quantiles of `quantiles` or `summary_options.quantiles`.
    pub quantiles: Option<Bounds>,
}

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

const SKETCH: &str = "tessera keeps every timer, histogram and distribution as a DDSketch";

impl Loader {
    /// Checks and notes the observer keys of mapping `mapping` (`None`:
    /// `defaults`); returns what they set.
    pub(super) fn observer_settings(
        &mut self,
        mapping: Option<usize>,
        settings: ObserverSettings<'_>,
    ) -> Result<ObserverChoice, MappingError> {
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
                // Classic buckets and summaries are written, as statsd_exporter writes them.
                Some(_) if deprecated.is_empty() => continue,
                Some(_) => format!("`{value}`{deprecated}"),
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
        let mut quantiles = None;
        if let Some(objectives) = settings.quantiles {
            quantiles = self.quantile_values(mapping, "quantiles", objectives)?;
        }
        if let Some(options) = settings.histogram_options
            && let Some(nested) = self.histogram_options(mapping, options)?
        {
            bounds = Some(nested);
        }
        if let Some(options) = settings.summary_options
            && let Some(nested) = self.summary_options(mapping, options)?
        {
            quantiles = Some(nested);
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
        Ok(ObserverChoice { observer_type, bounds, quantiles })
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

    /// Checks quantile objectives and returns their quantiles; none set (an empty list)
    /// means the defaults, as in statsd_exporter.
    fn quantile_values(
        &mut self,
        mapping: Option<usize>,
        key: &str,
        quantiles: &[Quantile],
    ) -> Result<Option<Bounds>, MappingError> {
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
        if quantiles.is_empty() {
            return Ok(None);
        }
        self.note(
            mapping,
            key,
            &format!(
                "{} quantile objectives: their `error` is not used; {SKETCH}, and the quantiles \
                 are read from it within its relative error",
                quantiles.len()
            ),
        );
        Ok(Some(quantiles.iter().map(|objective| objective.quantile).collect()))
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

    fn summary_options(
        &mut self,
        mapping: Option<usize>,
        options: &SummaryOptions,
    ) -> Result<Option<Bounds>, MappingError> {
        let quantiles = match &options.quantiles {
            Some(objectives) => self.quantile_values(mapping, "summary_options", objectives)?,
            None => None,
        };
        if let Some(max_age) = &options.max_age {
            max_age.check().map_err(|message| self.invalid(mapping, "summary_options", message))?;
        }
        if options.max_age.is_some() || options.age_buckets.is_some() || options.buf_cap.is_some() {
            self.note(
                mapping,
                "summary_options",
                "max_age / age_buckets / buf_cap: tessera's quantiles are per tile (10 s, 1 m), \
                 read from sketches that merge exactly, not over a sliding window; these are not used",
            );
        }
        Ok(quantiles)
    }
}
