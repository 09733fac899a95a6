//! A DDSketch-style quantile sketch whose buckets are Prometheus native-histogram buckets.
//!
//! [`Sketch`] holds weighted counts in exponential buckets. At schema `s` (from [`MIN_SCHEMA`]
//! to [`MAX_SCHEMA`]), bucket `i` holds the magnitudes in `(base^(i-1), base^i]` with
//! `base = 2^(2^-s)`, that is `i = ceil(log2(|v|) * 2^s)`: the buckets of a Prometheus native
//! histogram of the same schema, so a sketch can be written to Prometheus as it is. The bounds are
//! the very floats client_golang uses, so even a value exactly on a bound lands in the same bucket
//! as in a Go-instrumented program; powers of two are exact (1.0 is bucket 0, 2.0 is bucket `2^s`).
//! Positive and negative values have a store each; magnitudes up to [`ZERO_THRESHOLD`] count in the
//! zero bucket.
//! Counts are `f64` weights: a statsd sample taken at rate 0.1 is inserted with weight 10.
//!
//! # Error bound
//!
//! [`Sketch::quantile`] reports a value of bucket `i` as `2 * base^i / (base + 1)`, the point with
//! the same relative distance to both bucket bounds. The answer is therefore within a relative
//! error of `alpha = (base - 1) / (base + 1)` ([`relative_error`]) of the true value at the same
//! rank: about 1.083 % at [`DEFAULT_SCHEMA`] 5, 0.135 % at schema 8, 33.3 % at schema 0. Values in
//! the zero bucket are reported as 0.
//!
//! # Memory and collapsing
//!
//! Each store is a dense `Vec<f64>` that covers a window of consecutive bucket indices and grows at
//! either end on demand, so that once the window covers the data an insert allocates nothing. A
//! store spans at most [`MAX_BUCKETS`] buckets: beyond that, like DDSketch's collapsing-lowest
//! store, the buckets of the smallest magnitudes are folded into the lowest kept one. Only those
//! smallest-magnitude values (for positive data, the lowest quantiles) then lose the error bound.
//! At schema 5, 4096 buckets span magnitudes over a ratio of 2^128, so this is rare; at schema 8
//! they span 2^16.
//!
//! # Merging
//!
//! [`Sketch::merge`] adds bucket counts; sketches of different schemas merge at the coarser one
//! (each step down in schema maps bucket `i` to `ceil(i / 2)`). Merging partial sketches gives the
//! sketch of all their data, bucket for bucket (exactly so while the weights are integers below
//! 2^53 and no partial collapsed at a finer schema than the result).
//!
//! # Example
//!
//! ```
//! use tessera_core::sketch::{Sketch, relative_error};
//!
//! let mut sketch = Sketch::new();
//! for millis in 1..=1000 {
//!     sketch.insert(millis as f64, 1.0);
//! }
//! sketch.insert(5000.0, 10.0); // a sample taken at rate 0.1
//! assert_eq!(sketch.count(), 1010.0);
//!
//! // The true median (rank 0.5 * (1010 - 1), counting from 0) is 505.
//! let median = sketch.quantile(0.5).unwrap();
//! assert!((median - 505.0).abs() <= 505.0 * relative_error(sketch.schema()));
//!
//! // Partial sketches merge, and travel as `tessera_proto::Sketch`.
//! let mut total = Sketch::new();
//! total.merge(&sketch);
//! total.merge(&Sketch::from_proto(&sketch.to_proto()).unwrap());
//! assert_eq!(total.count(), 2020.0);
//! ```

use std::mem::size_of;

use thiserror::Error;

/// The schema of [`Sketch::new`]: 32 buckets per power of two, a relative error of 1.083 %.
pub const DEFAULT_SCHEMA: i32 = 5;

/// The coarsest schema Prometheus native histograms allow: one bucket per 2^16.
pub const MIN_SCHEMA: i32 = -4;

/// The finest schema Prometheus native histograms allow: 256 buckets per power of two.
pub const MAX_SCHEMA: i32 = 8;

/// The most buckets one store (positive or negative) spans; see the module docs on collapsing.
pub const MAX_BUCKETS: usize = 4096;

/// Values with a magnitude up to this, 2^-32 (about 2.3e-10), count in the zero bucket.
///
/// It is a bucket bound at every schema, so it can be written to Prometheus as the native
/// histogram's `zero_threshold`.
pub const ZERO_THRESHOLD: f64 = 1.0 / 4_294_967_296.0;

/// The relative error bound `(base - 1) / (base + 1)`, `base = 2^(2^-schema)`, of the quantiles
/// of a sketch at `schema`.
///
/// ```
/// let alpha = tessera_core::sketch::relative_error(5);
/// assert!((alpha - 0.010_830).abs() < 1e-6);
/// ```
pub fn relative_error(schema: i32) -> f64 {
    let base = f64::from(-schema).exp2().exp2();
    (base - 1.0) / (base + 1.0)
}

/// The relative width `base - 1` of a bucket at `schema`: a value anywhere in the bucket of
/// the true value (as Prometheus' `histogram_quantile` interpolates within the bucket its rank
/// falls in) is within this of it, relative to the true value. About 2.19 % at schema 5, twice
/// [`relative_error`] and a little more, since the sketch answers with the bucket's midpoint.
///
/// ```
/// let width = tessera_core::sketch::bucket_relative_width(5);
/// assert!((width - 0.021_897).abs() < 1e-6);
/// ```
pub fn bucket_relative_width(schema: i32) -> f64 {
    f64::from(-schema).exp2().exp2() - 1.0
}

/// Why a [`tessera_proto::Sketch`] was rejected by [`Sketch::from_proto`].
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SketchError {
    /// The schema is outside `MIN_SCHEMA..=MAX_SCHEMA`.
    #[error("invalid sketch schema {schema}, expected {MIN_SCHEMA}..={MAX_SCHEMA}")]
    InvalidSchema {
        /// The schema received.
        schema: i32,
    },
    /// A store holds more than [`MAX_BUCKETS`] buckets.
    #[error("too many {store} buckets in sketch: {len}, at most {MAX_BUCKETS}")]
    TooManyBuckets {
        /// `"positive"` or `"negative"`.
        store: &'static str,
        /// The number of buckets received.
        len: usize,
    },
    /// A count is negative, NaN or infinite.
    #[error("invalid {store} bucket count `{count}` in sketch")]
    InvalidCount {
        /// `"zero"`, `"positive"` or `"negative"`.
        store: &'static str,
        /// The count received.
        count: f64,
    },
    /// The buckets' indices overflow, or reach past the magnitudes a store can hold at the schema
    /// (above [`ZERO_THRESHOLD`] and up to `f64::MAX`).
    #[error("{store} bucket indices {first}..={last} out of range {min}..={max} for sketch schema {schema}")]
    IndexOutOfRange {
        /// `"positive"` or `"negative"`.
        store: &'static str,
        /// The index of the first bucket received (the offset).
        first: i64,
        /// The index of the last bucket received.
        last: i64,
        /// The lowest index allowed at the schema.
        min: i32,
        /// The highest index allowed at the schema.
        max: i32,
        /// The sketch's schema.
        schema: i32,
    },
}

/// What [`Sketch::threshold`] reads: the statistics of the lowest (or highest) values up
/// to a weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// The weight taken: the weight asked for, or all of the sketch's if it holds less.
    pub weight: f64,
    /// Weighted sum of the values taken.
    pub sum: f64,
    /// Weighted sum of their squares.
    pub sum_squares: f64,
    /// The last value taken: the highest of the lowest values (statsd's `upper_<pct>`), or
    /// the lowest of the highest (`lower_top<pct>`).
    pub boundary: f64,
}

/// A mergeable quantile sketch with Prometheus native-histogram buckets; see the
/// [module docs](self).
#[derive(Debug)]
pub struct Sketch {
    schema: i32,
    zero_count: f64,
    positive: Store,
    negative: Store,
}

impl Default for Sketch {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for Sketch {
    fn clone(&self) -> Self {
        Sketch {
            schema: self.schema,
            zero_count: self.zero_count,
            positive: self.positive.clone(),
            negative: self.negative.clone(),
        }
    }

    /// Copies `source` into the memory this sketch already holds (no allocation once it is big
    /// enough), so a pool of sketches can be reused.
    fn clone_from(&mut self, source: &Self) {
        self.schema = source.schema;
        self.zero_count = source.zero_count;
        self.positive.counts.clone_from(&source.positive.counts);
        self.positive.offset = source.positive.offset;
        self.negative.counts.clone_from(&source.negative.counts);
        self.negative.offset = source.negative.offset;
    }
}

/// Two sketches are equal when they have the same schema and the same non-zero buckets, whatever
/// memory they hold.
impl PartialEq for Sketch {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
            && self.zero_count == other.zero_count
            && self.positive_buckets().eq(other.positive_buckets())
            && self.negative_buckets().eq(other.negative_buckets())
    }
}

impl Sketch {
    /// An empty sketch at [`DEFAULT_SCHEMA`]; it allocates nothing until the first insert.
    pub fn new() -> Self {
        Self::with_schema(DEFAULT_SCHEMA)
    }

    /// An empty sketch at `schema`, clamped into `MIN_SCHEMA..=MAX_SCHEMA`; see
    /// [`Sketch::try_with_schema`] to reject a bad schema instead.
    pub fn with_schema(schema: i32) -> Self {
        Sketch {
            schema: schema.clamp(MIN_SCHEMA, MAX_SCHEMA),
            zero_count: 0.0,
            positive: Store::default(),
            negative: Store::default(),
        }
    }

    /// An empty sketch at `schema`, or an error when `schema` is outside `MIN_SCHEMA..=MAX_SCHEMA`.
    pub fn try_with_schema(schema: i32) -> Result<Self, SketchError> {
        if !(MIN_SCHEMA..=MAX_SCHEMA).contains(&schema) {
            return Err(SketchError::InvalidSchema { schema });
        }
        Ok(Self::with_schema(schema))
    }

    /// The schema: `2^schema` buckets per power of two.
    pub fn schema(&self) -> i32 {
        self.schema
    }

    /// Adds `value` with `weight` (1 / sample rate).
    ///
    /// NaN and infinite values, and weights that are not positive and finite, are ignored: the
    /// parser rejects them before they get here.
    #[inline]
    pub fn insert(&mut self, value: f64, weight: f64) {
        if !(value.is_finite() && weight > 0.0 && weight < f64::INFINITY) {
            return;
        }
        let magnitude = value.abs();
        if magnitude <= ZERO_THRESHOLD {
            self.zero_count += weight;
            return;
        }
        let index = bucket_index(magnitude, self.schema);
        if value > 0.0 {
            self.positive.add(index, weight);
        } else {
            self.negative.add(index, weight);
        }
    }

    /// Adds the counts of `other` to this sketch.
    ///
    /// When the schemas differ the result has the coarser one: this sketch is downscaled first if
    /// `other` is coarser, `other`'s buckets are mapped on the fly if it is finer.
    pub fn merge(&mut self, other: &Sketch) {
        if other.schema < self.schema {
            self.downscale(other.schema);
        }
        let steps = (other.schema - self.schema) as u32;
        self.zero_count += other.zero_count;
        self.positive.merge_from(&other.positive, steps);
        self.negative.merge_from(&other.negative, steps);
    }

    /// Lowers the schema to `schema` (clamped to [`MIN_SCHEMA`]), merging neighbouring buckets:
    /// each step down maps bucket `i` to `ceil(i / 2)`. Does nothing if `schema` is not coarser.
    pub fn downscale(&mut self, schema: i32) {
        let schema = schema.max(MIN_SCHEMA);
        if schema >= self.schema {
            return;
        }
        let steps = (self.schema - schema) as u32;
        self.positive.downscale(steps);
        self.negative.downscale(steps);
        self.schema = schema;
    }

    /// The total weight inserted. Sums the buckets, so it costs one pass over them.
    pub fn count(&self) -> f64 {
        // Same order as `quantile` walks, so that the walk ends exactly at this total.
        let negative: f64 = self.negative.counts.iter().rev().sum();
        let zero = negative + self.zero_count;
        self.positive.counts.iter().fold(zero, |total, count| total + count)
    }

    /// Whether nothing has been inserted since creation or the last [`Sketch::clear`].
    pub fn is_empty(&self) -> bool {
        self.zero_count == 0.0 && self.positive.is_empty() && self.negative.is_empty()
    }

    /// The weight of the zero bucket: values with a magnitude up to [`ZERO_THRESHOLD`].
    pub fn zero_count(&self) -> f64 {
        self.zero_count
    }

    /// The value at quantile `q` (from 0 to 1), within [`relative_error`] of the true one.
    ///
    /// The **nearest rank**: the smallest value with at least `q * count` of the weight at or
    /// below it (the `ceil(q·n)`-th value of `n`, counting from 1), read from the first bucket
    /// whose cumulative weight reaches it, walking from the most negative values through zero
    /// to the largest. It is what etsy statsd's `upper_<pct>` and the textbook definition give,
    /// and never falls below a sample that `q` puts it at: the p99 of 10, 12, 20 and 30 is 30
    /// (DDSketch's own rank, `q·(n−1)` rounded down, would give 20). `q = 0` gives the
    /// smallest value. `None` when the sketch is empty or `q` is not in `[0, 1]`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if !(0.0..=1.0).contains(&q) || self.is_empty() {
            return None;
        }
        // A hair below `q * count`, so that a product that rounding lifts just above a whole
        // count (0.7 × 10 = 7.000000000000001) still means that count.
        let wanted = q * self.count() * (1.0 - 1e-12);
        let rank = if wanted > 0.0 { wanted } else { f64::MIN_POSITIVE };
        let mut cumulative = 0.0;
        let mut last_value = None;
        for (value, weight) in self.ascending() {
            cumulative += weight;
            if cumulative >= rank {
                return Some(value);
            }
            last_value = Some(value);
        }
        // Only reached if rounding left the rank at or past the total: answer with the largest.
        last_value
    }

    /// The statistics of the values carrying the lowest `weight` of the sketch's weight
    /// (statsd's positive percent thresholds: `count_90`, `upper_90`, `sum_90`,
    /// `sum_squares_90` are those of the lowest 90 % of the values), or of the highest
    /// `weight` with `from_top` (statsd's negative thresholds: `lower_top10`, …). `None` when
    /// the sketch is empty or `weight` is not a positive number.
    ///
    /// Walks the buckets in value order, taking each bucket's weight until `weight` is
    /// reached (part of the last one). Each value is read as its bucket's value, so within
    /// [`relative_error`] `α` of itself: `boundary` (the last value taken) and, for values
    /// of one sign, `sum` and `mean` are within `α` of the exact statistics of the same
    /// values, `sum_squares` within `2α + α²`. Values in the zero bucket read as 0.
    pub fn threshold(&self, weight: f64, from_top: bool) -> Option<Threshold> {
        if weight.is_nan() || weight <= 0.0 || self.is_empty() {
            return None;
        }
        let mut threshold = Threshold { weight: 0.0, sum: 0.0, sum_squares: 0.0, boundary: 0.0 };
        let mut buckets = self.ascending();
        while let Some((value, bucket_weight)) = if from_top { buckets.next_back() } else { buckets.next() } {
            let taken = bucket_weight.min(weight - threshold.weight);
            threshold.weight += taken;
            threshold.sum += taken * value;
            threshold.sum_squares += taken * value * value;
            threshold.boundary = value;
            // Done once the weight is reached (a hair below it counts, as in `quantile`).
            if threshold.weight >= weight * (1.0 - 1e-12) {
                break;
            }
        }
        Some(threshold)
    }

    /// The non-empty buckets as `(value, weight)` in value order: the most negative first,
    /// then zero, then the positive ones.
    fn ascending(&self) -> impl DoubleEndedIterator<Item = (f64, f64)> + '_ {
        let negative = self
            .negative
            .counts
            .iter()
            .enumerate()
            .rev()
            .map(|(position, &weight)| (-self.bucket_value(self.negative.offset + position as i32), weight));
        let zero = std::iter::once((0.0, self.zero_count));
        let positive = self
            .positive
            .counts
            .iter()
            .enumerate()
            .map(|(position, &weight)| (self.bucket_value(self.positive.offset + position as i32), weight));
        negative.chain(zero).chain(positive).filter(|&(_, weight)| weight > 0.0)
    }

    /// Empties the sketch, keeping its memory (and its stores' windows) for reuse.
    pub fn clear(&mut self) {
        self.zero_count = 0.0;
        self.positive.counts.fill(0.0);
        self.negative.counts.fill(0.0);
    }

    /// Empties the sketch and sets its schema (clamped into `MIN_SCHEMA..=MAX_SCHEMA`),
    /// keeping its memory for reuse.
    pub fn clear_with_schema(&mut self, schema: i32) {
        self.clear();
        self.schema = schema.clamp(MIN_SCHEMA, MAX_SCHEMA);
    }

    /// The non-zero buckets of positive values as `(index, weight)`, by increasing index.
    pub fn positive_buckets(&self) -> impl Iterator<Item = (i32, f64)> + '_ {
        self.positive.buckets()
    }

    /// The non-zero buckets of negative values as `(index, weight)`, by increasing index of the
    /// magnitude (so from the values closest to zero to the most negative).
    pub fn negative_buckets(&self) -> impl Iterator<Item = (i32, f64)> + '_ {
        self.negative.buckets()
    }

    /// The number of non-zero buckets, positive and negative (the zero bucket not counted).
    pub fn bucket_count(&self) -> usize {
        self.positive_buckets().count() + self.negative_buckets().count()
    }

    /// The heap memory the sketch holds, in bytes.
    pub fn heap_bytes(&self) -> usize {
        (self.positive.counts.capacity() + self.negative.counts.capacity()) * size_of::<f64>()
    }

    /// The wire form, with each store trimmed to its non-zero buckets.
    pub fn to_proto(&self) -> tessera_proto::Sketch {
        let (positive_offset, positive_counts) = self.positive.trimmed();
        let (negative_offset, negative_counts) = self.negative.trimmed();
        tessera_proto::Sketch {
            schema: self.schema,
            zero_count: self.zero_count,
            positive_offset,
            positive_counts,
            negative_offset,
            negative_counts,
        }
    }

    /// Reads the wire form, rejecting a bad schema, a store of more than [`MAX_BUCKETS`] buckets,
    /// negative or non-finite counts, and bucket indices that overflow or are out of range.
    pub fn from_proto(proto: &tessera_proto::Sketch) -> Result<Sketch, SketchError> {
        let schema = proto.schema;
        if !(MIN_SCHEMA..=MAX_SCHEMA).contains(&schema) {
            return Err(SketchError::InvalidSchema { schema });
        }
        if !is_valid_count(proto.zero_count) {
            return Err(SketchError::InvalidCount { store: "zero", count: proto.zero_count });
        }
        Ok(Sketch {
            schema,
            zero_count: proto.zero_count,
            positive: Store::from_proto("positive", schema, proto.positive_offset, &proto.positive_counts)?,
            negative: Store::from_proto("negative", schema, proto.negative_offset, &proto.negative_counts)?,
        })
    }

    /// The value reported for bucket `index`: `2 * base^index / (base + 1)`.
    fn bucket_value(&self, index: i32) -> f64 {
        let base = f64::from(-self.schema).exp2().exp2();
        // Written with base^(index - 2^schema) = base^index / 2 so that the top bucket stays finite.
        let exponent = f64::from(index) * f64::from(-self.schema).exp2() - 1.0;
        exponent.exp2() * (4.0 / (base + 1.0))
    }
}

fn is_valid_count(count: f64) -> bool {
    (0.0..f64::INFINITY).contains(&count)
}

/// The lowest and highest bucket index a store can hold at `schema`: from just above
/// [`ZERO_THRESHOLD`] (2^-32) to `f64::MAX` (just below 2^1024).
fn index_range(schema: i32) -> (i32, i32) {
    let (zero_index, max_index) =
        if schema >= 0 { (-32 << schema, 1024 << schema) } else { (-(32 >> -schema), 1024 >> -schema) };
    (zero_index + 1, max_index)
}

/// Maps a bucket index `steps` schemas down: `ceil(index / 2^steps)`, also for negative indices
/// (an arithmetic shift rounds toward minus infinity).
#[inline]
fn downscale_index(index: i32, steps: u32) -> i32 {
    (index + (1 << steps) - 1) >> steps
}

/// The bucket index of `magnitude` (finite, above [`ZERO_THRESHOLD`]) at `schema`.
///
/// Computed at [`MAX_SCHEMA`] and downscaled: since the bounds of every schema are a subset of
/// those of schema 8, this is exact, and a sketch built at schema `s` equals one built at schema 8
/// and downscaled to `s`.
#[inline]
fn bucket_index(magnitude: f64, schema: i32) -> i32 {
    downscale_index(index_at_max_schema(magnitude), (MAX_SCHEMA - schema) as u32)
}

const MANTISSA_BITS: u32 = 52;
const MANTISSA_MASK: u64 = (1 << MANTISSA_BITS) - 1;
const EXPONENT_BIAS: i32 = 1023;
/// The bits of 1.0: OR-ed with a mantissa they give the significand in `[1, 2)`.
const ONE_BITS: u64 = 0x3ff << MANTISSA_BITS;
/// The significand range `[1, 2)` is cut into 2^SEGMENT_BITS equal segments for the lookup.
const SEGMENT_BITS: u32 = MAX_SCHEMA as u32 + 1;
const SUB_BUCKETS: usize = 1 << MAX_SCHEMA;

/// `ceil(log2(magnitude) * 256)` for a normal, positive `magnitude`, exact at the bucket bounds.
///
/// With `magnitude = m * 2^e`, `m` in `[1, 2)`, the index is `256 e + k` where `k` is the first
/// sub-bucket with `m <= BOUNDS[k]`. The segment of `m` (its top 9 mantissa bits) gives the first
/// sub-bucket whose bound is at least the segment's start; since a segment (1/512 wide) is
/// narrower than any sub-bucket (at least 2^(1/256) - 1 > 1/370 wide), `k` is that one or the
/// next, and one comparison decides.
#[inline]
fn index_at_max_schema(magnitude: f64) -> i32 {
    let bits = magnitude.to_bits();
    let exponent = (bits >> MANTISSA_BITS) as i32 - EXPONENT_BIAS;
    let mantissa = bits & MANTISSA_MASK;
    let segment = (mantissa >> (MANTISSA_BITS - SEGMENT_BITS)) as usize;
    let sub_bucket = usize::from(SEGMENT_FIRST_SUB_BUCKET[segment]);
    // Branch-free: which side of the bound a value falls on is not predictable.
    let past_bound = f64::from_bits(mantissa | ONE_BITS) > BOUNDS[sub_bucket];
    (exponent << MAX_SCHEMA) + sub_bucket as i32 + i32::from(past_bound)
}

/// Bit patterns of `2^(2^-s)` for `s` in `1..=8`, as Go's `math.Exp2` computes them (the first
/// is one ulp below the correctly rounded square root of 2).
const BOUND_FACTOR_BITS: [u64; 8] = [
    0x3ff6_a09e_667f_3bcc,
    0x3ff3_06fe_0a31_b715,
    0x3ff1_72b8_3c7d_517b,
    0x3ff0_b558_6cf9_890f,
    0x3ff0_59b0_d315_8574,
    0x3ff0_2c9a_3e77_8061,
    0x3ff0_163d_a9fb_3335,
    0x3ff0_0b1a_fa5a_bcbf,
];

/// `BOUNDS[k]`, `k` in `0..=256`, is the upper bound `2^(k / 256)` of sub-bucket `k` of the
/// significand at schema 8; schema `s` uses every `2^(8 - s)`th one.
///
/// Computed as client_golang computes its `nativeHistogramBounds` (each schema keeps the bounds of
/// the one below and fills the gaps by multiplying with its factor), so values exactly on a bound
/// fall in the same bucket as in a Go-instrumented program. These differ from the correctly
/// rounded `2^(k/256)` by up to a few ulps, and are exact at powers of two.
static BOUNDS: [f64; SUB_BUCKETS + 1] = BOUNDS_TABLE;
static SEGMENT_FIRST_SUB_BUCKET: [u16; 1 << SEGMENT_BITS] = segment_first_sub_buckets(&BOUNDS_TABLE);

const BOUNDS_TABLE: [f64; SUB_BUCKETS + 1] = significand_bounds();

const fn significand_bounds() -> [f64; SUB_BUCKETS + 1] {
    // client_golang's bounds are for the fraction in [0.5, 1); doubling them is exact.
    let mut fraction = [0.0; SUB_BUCKETS];
    fraction[0] = 0.5;
    let mut schema = 1;
    while schema <= MAX_SCHEMA as usize {
        let factor = f64::from_bits(BOUND_FACTOR_BITS[schema - 1]);
        let stride = SUB_BUCKETS >> schema;
        let mut k = 1;
        while k < (1 << schema) {
            fraction[k * stride] = fraction[(k - 1) * stride] * factor;
            k += 2;
        }
        schema += 1;
    }
    let mut bounds = [2.0; SUB_BUCKETS + 1];
    let mut k = 0;
    while k < SUB_BUCKETS {
        bounds[k] = fraction[k] * 2.0;
        k += 1;
    }
    bounds
}

const fn segment_first_sub_buckets(bounds: &[f64; SUB_BUCKETS + 1]) -> [u16; 1 << SEGMENT_BITS] {
    let segments = 1 << SEGMENT_BITS;
    let mut table = [0; 1 << SEGMENT_BITS];
    let mut segment = 0;
    let mut sub_bucket = 0;
    while segment < segments {
        let start = 1.0 + segment as f64 / segments as f64;
        while bounds[sub_bucket] < start {
            sub_bucket += 1;
        }
        table[segment] = sub_bucket as u16;
        segment += 1;
    }
    table
}

/// The smallest number of buckets a store grows by, when there is room.
const MIN_GROWTH: i32 = 16;

/// The buckets of one sign: `counts[k]` is the weight of bucket `offset + k`.
///
/// The window `offset..offset + counts.len()` may hold zero-weight slack at either end, but never
/// spans more than [`MAX_BUCKETS`], so an insert inside it never needs to collapse. Collapsing is
/// decided from the non-zero buckets only, so the result does not depend on the insertion order.
#[derive(Clone, Debug, Default)]
struct Store {
    counts: Vec<f64>,
    offset: i32,
}

impl Store {
    #[inline]
    fn add(&mut self, index: i32, weight: f64) {
        // A negative difference becomes a huge position, outside the window.
        let position = index.wrapping_sub(self.offset) as u32 as usize;
        match self.counts.get_mut(position) {
            Some(count) => *count += weight,
            None => self.add_outside_window(index, weight),
        }
    }

    #[cold]
    #[inline(never)]
    fn add_outside_window(&mut self, index: i32, weight: f64) {
        self.cover(index, index);
        // After `cover`, an index below the window is one that collapses into its lowest bucket.
        let position = index.max(self.offset) - self.offset;
        self.counts[position as usize] += weight;
    }

    fn is_empty(&self) -> bool {
        self.counts.iter().all(|&count| count == 0.0)
    }

    fn buckets(&self) -> impl Iterator<Item = (i32, f64)> + '_ {
        let offset = self.offset;
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, count)| **count != 0.0)
            .map(move |(position, &count)| (offset + position as i32, count))
    }

    /// The lowest and highest index of the non-zero buckets.
    fn nonzero_range(&self) -> Option<(i32, i32)> {
        let first = self.counts.iter().position(|&count| count != 0.0)?;
        let last = self.counts.iter().rposition(|&count| count != 0.0)?;
        Some((self.offset + first as i32, self.offset + last as i32))
    }

    /// The offset and counts from the first to the last non-zero bucket.
    fn trimmed(&self) -> (i32, Vec<f64>) {
        match self.nonzero_range() {
            None => (0, Vec::new()),
            Some((first, last)) => {
                let positions = (first - self.offset) as usize..=(last - self.offset) as usize;
                (first, self.counts[positions].to_vec())
            }
        }
    }

    /// Moves the window so that it covers the non-zero buckets and `low..=high`, with some slack on
    /// the side(s) it grows. When all of that would span more than [`MAX_BUCKETS`], the window
    /// becomes the top `MAX_BUCKETS` of it and the held buckets below are folded into its lowest;
    /// the caller folds what it adds below the window likewise.
    fn cover(&mut self, low: i32, high: i32) {
        let (held_low, held_high) = self.nonzero_range().unwrap_or((low, high));
        let (low, high) = (low.min(held_low), high.max(held_high));
        let max_span = MAX_BUCKETS as i32;
        let floor = low.max(high - (max_span - 1));

        let mut collapsed = 0.0;
        if floor > held_low {
            let below_floor = ((floor - self.offset) as usize).min(self.counts.len());
            for count in &mut self.counts[..below_floor] {
                collapsed += *count;
                *count = 0.0;
            }
        }

        let span = high - floor + 1;
        let slack = (span / 2).max(MIN_GROWTH).min(max_span - span);
        let window_end = self.offset + self.counts.len() as i32;
        let grows_down = self.counts.is_empty() || floor < self.offset;
        let grows_up = self.counts.is_empty() || high >= window_end;
        let (slack_below, slack_above) = match (grows_down, grows_up) {
            (true, true) => (slack / 2, slack - slack / 2),
            (true, false) => (slack, 0),
            _ => (0, slack),
        };
        self.move_window(floor - slack_below, high + slack_above);
        if collapsed > 0.0 {
            self.counts[(floor - self.offset) as usize] += collapsed;
        }
    }

    /// Re-lays the counts out over the window `low..=high`, which must hold every non-zero bucket.
    /// Reuses the allocation when it is large enough.
    fn move_window(&mut self, low: i32, high: i32) {
        let new_len = (high - low + 1) as usize;
        match self.nonzero_range() {
            None => {
                self.counts.clear();
                self.counts.resize(new_len, 0.0);
            }
            Some((first, last)) => {
                let source = (first - self.offset) as usize..(last - self.offset) as usize + 1;
                let destination = (first - low) as usize;
                let moved = source.len();
                if new_len > self.counts.len() {
                    self.counts.resize(new_len, 0.0);
                }
                self.counts.copy_within(source, destination);
                self.counts[..destination].fill(0.0);
                self.counts[destination + moved..].fill(0.0);
                self.counts.truncate(new_len);
            }
        }
        self.offset = low;
    }

    /// Adds the buckets of `other`, which is `steps` schemas finer than this store.
    fn merge_from(&mut self, other: &Store, steps: u32) {
        let Some((first, last)) = other.nonzero_range() else {
            return;
        };
        let (low, high) = (downscale_index(first, steps), downscale_index(last, steps));
        if low < self.offset || high >= self.offset + self.counts.len() as i32 {
            self.cover(low, high);
        }
        for (position, &count) in other.counts.iter().enumerate() {
            if count == 0.0 {
                continue;
            }
            let index = downscale_index(other.offset + position as i32, steps).max(self.offset);
            self.counts[(index - self.offset) as usize] += count;
        }
    }

    /// Lowers the schema by `steps`, in place: bucket `i` goes to `ceil(i / 2^steps)`.
    fn downscale(&mut self, steps: u32) {
        if steps == 0 {
            return;
        }
        let new_offset = downscale_index(self.offset, steps);
        if self.counts.is_empty() {
            self.offset = new_offset;
            return;
        }
        // A bucket never moves to a higher position, so one ascending pass is enough.
        for position in 0..self.counts.len() {
            let count = std::mem::take(&mut self.counts[position]);
            let target = downscale_index(self.offset + position as i32, steps) - new_offset;
            self.counts[target as usize] += count;
        }
        let last = self.offset + self.counts.len() as i32 - 1;
        self.counts.truncate((downscale_index(last, steps) - new_offset + 1) as usize);
        self.offset = new_offset;
    }

    fn from_proto(store: &'static str, schema: i32, offset: i32, counts: &[f64]) -> Result<Store, SketchError> {
        if counts.len() > MAX_BUCKETS {
            return Err(SketchError::TooManyBuckets { store, len: counts.len() });
        }
        if let Some(&count) = counts.iter().find(|&&count| !is_valid_count(count)) {
            return Err(SketchError::InvalidCount { store, count });
        }
        if counts.is_empty() {
            return Ok(Store::default());
        }
        let (min, max) = index_range(schema);
        let first = i64::from(offset);
        let last = first + counts.len() as i64 - 1;
        if first < i64::from(min) || last > i64::from(max) {
            return Err(SketchError::IndexOutOfRange { store, first, last, min, max, schema });
        }
        Ok(Store { counts: counts.to_vec(), offset })
    }
}

#[cfg(test)]
mod tests;
