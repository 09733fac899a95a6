use super::*;

/// splitmix64: a small, seeded, good-enough generator for test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }

    fn lognormal(&mut self, mu: f64, sigma: f64) -> f64 {
        (mu + sigma * self.normal()).exp()
    }

    fn pareto(&mut self, scale: f64, shape: f64) -> f64 {
        scale / self.uniform().powf(1.0 / shape)
    }
}

const QUANTILES: [f64; 9] = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999];

fn sketch_of(schema: i32, values: &[f64]) -> Sketch {
    let mut sketch = Sketch::with_schema(schema);
    for &value in values {
        sketch.insert(value, 1.0);
    }
    sketch
}

/// The exact nearest-rank quantile of sorted values: the `ceil(q·n)`-th, counting from 1.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The largest relative error of the sketch's quantiles against the exact nearest-rank
/// ones; asserts it is within the bound.
fn check_quantiles(sketch: &Sketch, values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let bound = relative_error(sketch.schema()) + 1e-12;
    let mut worst: f64 = 0.0;
    for q in QUANTILES {
        let exact = nearest_rank(&sorted, q);
        let estimate = sketch.quantile(q).expect("sketch is not empty");
        if exact.abs() <= ZERO_THRESHOLD {
            assert_eq!(estimate, 0.0, "q {q}: exact {exact} is in the zero bucket");
            continue;
        }
        let error = ((estimate - exact) / exact).abs();
        assert!(error <= bound, "q {q}: estimate {estimate}, exact {exact}, error {error} > {bound}");
        worst = worst.max(error);
    }
    worst
}

fn lognormal_values(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.lognormal(-3.0, 1.5)).collect()
}

fn pareto_values(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.pareto(0.001, 1.1)).collect()
}

type Buckets = Vec<(i32, f64)>;

fn buckets(sketch: &Sketch) -> (Buckets, Buckets) {
    (sketch.positive_buckets().collect(), sketch.negative_buckets().collect())
}

#[test]
fn relative_error_matches_the_stated_bounds() {
    assert!((relative_error(5) - 0.010_830_0).abs() < 1e-7);
    assert!((relative_error(0) - 1.0 / 3.0).abs() < 1e-15);
    assert!((relative_error(8) - 0.001_353_8).abs() < 1e-7);
    for schema in MIN_SCHEMA..MAX_SCHEMA {
        assert!(relative_error(schema) > relative_error(schema + 1));
    }
}

#[test]
fn powers_of_two_are_upper_bucket_bounds_at_every_schema() {
    for schema in MIN_SCHEMA..=MAX_SCHEMA {
        for exponent in -31..=1023 {
            let value = f64::from(exponent).exp2();
            let expected = if schema >= 0 { exponent << schema } else { (exponent + (1 << -schema) - 1) >> -schema };
            assert_eq!(bucket_index(value, schema), expected, "2^{exponent} at schema {schema}");
            let above = f64::from_bits(value.to_bits() + 1);
            let expected_above = if schema >= 0 || exponent % (1 << -schema) == 0 { expected + 1 } else { expected };
            assert_eq!(bucket_index(above, schema), expected_above, "just above 2^{exponent}");
        }
    }
    assert_eq!(bucket_index(1.0, DEFAULT_SCHEMA), 0);
    assert_eq!(bucket_index(2.0, DEFAULT_SCHEMA), 32);
    assert_eq!(bucket_index(0.5, DEFAULT_SCHEMA), -32);
    assert_eq!(bucket_index(f64::MAX, MAX_SCHEMA), 1024 << MAX_SCHEMA);
    assert_eq!(bucket_index(f64::MAX, MIN_SCHEMA), 64);
    assert_eq!(bucket_index(f64::from_bits(ZERO_THRESHOLD.to_bits() + 1), MIN_SCHEMA), index_range(MIN_SCHEMA).0);
    assert_eq!(bucket_index(f64::from_bits(ZERO_THRESHOLD.to_bits() + 1), 5), index_range(5).0);
}

#[test]
fn bounds_are_client_golangs() {
    // Spot values of client_golang's `nativeHistogramBounds` (fractions in [0.5, 1)).
    let published = [
        (128, 0.707_106_781_186_547_5), // schema 1, one ulp below sqrt(0.5)
        (64, 0.594_603_557_501_360_5),  // schema 2
        (8, 0.510_948_574_327_058_3),   // schema 5
        (1, 0.501_355_637_525_101_3),   // schema 8
        (218, 0.902_227_083_903_311_5), // schema 8, 4 ulps below 2^(218/256 - 1)
        (255, 0.997_296_056_085_469_8), // schema 8
    ];
    for (k, fraction) in published {
        assert_eq!(BOUNDS[k], fraction * 2.0, "bound {k}");
    }
    for (k, bound) in BOUNDS.iter().enumerate() {
        let exact = (k as f64 / SUB_BUCKETS as f64).exp2();
        let ulps = (bound.to_bits() as i64 - exact.to_bits() as i64).abs();
        assert!(ulps <= 8, "bound {k} is {ulps} ulps from 2^({k}/256)");
    }
}

#[test]
fn index_agrees_with_bounds_and_log2() {
    let mut rng = Rng(7);
    for _ in 0..200_000 {
        let value = (rng.uniform() * 120.0 - 60.0).exp2();
        let index = index_at_max_schema(value);
        let (exponent, sub_bucket) = (index.div_euclid(256), index.rem_euclid(256) as usize);
        // Bucket `index` is (BOUNDS[k-1], BOUNDS[k]] * 2^exponent, k = sub_bucket (or 256 below).
        let upper = BOUNDS[sub_bucket] * f64::from(exponent).exp2();
        let lower = if sub_bucket == 0 {
            BOUNDS[SUB_BUCKETS - 1] * f64::from(exponent - 1).exp2()
        } else {
            BOUNDS[sub_bucket - 1] * f64::from(exponent).exp2()
        };
        assert!(lower < value && value <= upper, "{value} not in bucket {index} ({lower}, {upper}]");
        for schema in MIN_SCHEMA..=MAX_SCHEMA {
            let reference = (value.log2() * f64::from(schema).exp2()).ceil() as i32;
            let index = bucket_index(value, schema);
            if index != reference {
                // Only possible within a few ulps of a bound.
                let bound = (f64::from(index.min(reference)) / f64::from(schema).exp2()).exp2();
                assert!(((value - bound) / bound).abs() < 1e-14, "{value} at schema {schema}: {index}");
            }
        }
    }
}

#[test]
fn downscale_index_is_ceiling_division() {
    for index in -1000..=1000 {
        for steps in 0..=12u32 {
            let expected = (f64::from(index) / f64::from(1 << steps)).ceil() as i32;
            assert_eq!(downscale_index(index, steps), expected, "{index} by {steps}");
        }
    }
    assert_eq!(downscale_index(-1, 1), 0);
    assert_eq!(downscale_index(-2, 1), -1);
    assert_eq!(downscale_index(-3, 1), -1);
    assert_eq!(downscale_index(3, 1), 2);
}

#[test]
fn lognormal_quantiles_are_within_the_bound() {
    let values = lognormal_values(100_000, 1);
    for schema in [0, 3, DEFAULT_SCHEMA, MAX_SCHEMA] {
        let worst = check_quantiles(&sketch_of(schema, &values), &values);
        println!("lognormal, schema {schema}: worst relative error {worst:.5} (bound {:.5})", relative_error(schema));
    }
}

#[test]
fn pareto_quantiles_are_within_the_bound() {
    let values = pareto_values(100_000, 2);
    // Not schema 8: these values span more than 2^16, and the lowest quantiles collapse there.
    for schema in [0, 3, DEFAULT_SCHEMA, 7] {
        let worst = check_quantiles(&sketch_of(schema, &values), &values);
        println!("pareto, schema {schema}: worst relative error {worst:.5} (bound {:.5})", relative_error(schema));
    }
}

#[test]
fn negative_values_and_zeros_are_within_the_bound() {
    let mut rng = Rng(3);
    let values: Vec<f64> = (0..50_000)
        .map(|i| match i % 10 {
            0 => 0.0,
            1 => ZERO_THRESHOLD / 2.0,
            2..=5 => -rng.lognormal(2.0, 2.0),
            _ => rng.lognormal(1.0, 1.0),
        })
        .collect();
    let sketch = sketch_of(DEFAULT_SCHEMA, &values);
    assert_eq!(sketch.zero_count(), 10_000.0);
    assert_eq!(sketch.count(), 50_000.0);
    let worst = check_quantiles(&sketch, &values);
    println!("mixed signs: worst relative error {worst:.5}");
    assert_eq!(sketch.quantile(0.5), Some(0.0));
    assert!(sketch.quantile(0.0).expect("not empty") < -1000.0);
}

#[test]
fn merging_partial_sketches_equals_the_sketch_of_all_data() {
    let values = lognormal_values(100_000, 4);
    let whole = sketch_of(DEFAULT_SCHEMA, &values);
    let mut merged = Sketch::new();
    for chunk in values.chunks(1000) {
        merged.merge(&sketch_of(DEFAULT_SCHEMA, chunk));
    }
    assert_eq!(buckets(&merged), buckets(&whole));
    assert_eq!(merged, whole);
    assert_eq!(merged.to_proto(), whole.to_proto());
    check_quantiles(&merged, &values);
    // And in the other order, into a sketch that already has a window.
    let mut merged_backwards = sketch_of(DEFAULT_SCHEMA, &values[..10]);
    for chunk in values[10..].chunks(1000).rev() {
        merged_backwards.merge(&sketch_of(DEFAULT_SCHEMA, chunk));
    }
    assert_eq!(merged_backwards, whole);
}

#[test]
fn weights_count_as_sample_rates() {
    let values = lognormal_values(10_000, 5);
    let mut weighted = Sketch::new();
    let mut repeated = Sketch::new();
    for &value in &values {
        weighted.insert(value, 10.0);
        for _ in 0..10 {
            repeated.insert(value, 1.0);
        }
    }
    assert_eq!(weighted.count(), 100_000.0);
    assert_eq!(weighted, repeated);
    for q in QUANTILES {
        assert_eq!(weighted.quantile(q), repeated.quantile(q));
    }
    // Sampled and unsampled values mix by weight: 1 at 1.0 against 99 at 100.0.
    let mut mixed = Sketch::new();
    mixed.insert(1.0, 1.0);
    mixed.insert(100.0, 99.0);
    assert_eq!(mixed.count(), 100.0);
    assert!(mixed.quantile(0.0).expect("not empty") < 1.1);
    assert!(mixed.quantile(0.02).expect("not empty") > 99.0);
}

#[test]
fn bad_values_and_weights_are_ignored() {
    let mut sketch = Sketch::new();
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        sketch.insert(value, 1.0);
    }
    for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        sketch.insert(1.0, weight);
    }
    assert!(sketch.is_empty());
    assert_eq!(sketch.count(), 0.0);
    assert_eq!(sketch.quantile(0.5), None);
    assert_eq!(sketch.heap_bytes(), 0);
}

#[test]
fn small_samples_take_the_nearest_rank() {
    // A 10 s tile of four timings: the p99 is the largest (etsy statsd's `upper_99`), not the
    // third (DDSketch's rank `q·(n−1)` rounded down).
    let sketch = sketch_of(DEFAULT_SCHEMA, &[10.0, 12.0, 20.0, 30.0]);
    let bound = relative_error(DEFAULT_SCHEMA) + 1e-12;
    for (q, exact) in [(0.0, 10.0), (0.25, 10.0), (0.5, 12.0), (0.75, 20.0), (0.9, 30.0), (0.99, 30.0), (1.0, 30.0)] {
        let estimate = sketch.quantile(q).expect("not empty");
        assert!(((estimate - exact) / exact).abs() <= bound, "q {q}: {estimate} vs {exact}");
    }
    // A whole rank that rounding lifts a hair (0.7 × 10) still means that rank.
    let ten: Vec<f64> = (1..=10).map(f64::from).collect();
    let estimate = sketch_of(DEFAULT_SCHEMA, &ten).quantile(0.7).expect("not empty");
    assert!((estimate / 7.0 - 1.0).abs() <= bound, "{estimate}");
}

#[test]
fn quantile_edges() {
    let mut sketch = Sketch::new();
    sketch.insert(1.0, 1.0);
    let reported = sketch.quantile(0.5).expect("not empty");
    assert_eq!(reported, 2.0 / (1.0 + (1.0f64 / 32.0).exp2()));
    for q in [-0.1, 1.1, f64::NAN] {
        assert_eq!(sketch.quantile(q), None);
    }
    for i in 1..=100 {
        sketch.insert(f64::from(i) * 10.0, 1.0);
    }
    let bound = relative_error(DEFAULT_SCHEMA) + 1e-12;
    assert!((sketch.quantile(0.0).expect("not empty") - 1.0).abs() <= bound);
    assert!((sketch.quantile(1.0).expect("not empty") / 1000.0 - 1.0).abs() <= bound);
    // The top bucket's value stays finite.
    let mut huge = Sketch::with_schema(MIN_SCHEMA);
    huge.insert(f64::MAX, 1.0);
    assert!(huge.quantile(1.0).expect("not empty").is_finite());
}

#[test]
fn schemas_are_clamped_or_rejected() {
    assert_eq!(Sketch::with_schema(20).schema(), MAX_SCHEMA);
    assert_eq!(Sketch::with_schema(-20).schema(), MIN_SCHEMA);
    assert_eq!(Sketch::try_with_schema(9), Err(SketchError::InvalidSchema { schema: 9 }));
    assert_eq!(Sketch::try_with_schema(3).map(|sketch| sketch.schema()), Ok(3));
    assert_eq!(Sketch::default().schema(), DEFAULT_SCHEMA);
}

#[test]
fn merging_across_schemas_downscales_the_finer_sketch() {
    // Narrow enough that no store collapses at schema 8.
    let mut rng = Rng(6);
    let values: Vec<f64> = (0..20_000).map(|_| rng.lognormal(0.0, 0.7)).collect();
    let (first, second) = values.split_at(7_000);
    for (fine, coarse) in [(MAX_SCHEMA, DEFAULT_SCHEMA), (DEFAULT_SCHEMA, 0), (3, MIN_SCHEMA)] {
        // Built fine and downscaled equals built coarse, bucket for bucket.
        let mut downscaled = sketch_of(fine, &values);
        downscaled.downscale(coarse);
        assert_eq!(downscaled, sketch_of(coarse, &values));
        // Fine into coarse, and coarse into fine.
        let expected = sketch_of(coarse, &values);
        let mut coarse_first = sketch_of(coarse, first);
        coarse_first.merge(&sketch_of(fine, second));
        assert_eq!(coarse_first, expected);
        let mut fine_first = sketch_of(fine, first);
        fine_first.merge(&sketch_of(coarse, second));
        assert_eq!(fine_first, expected);
        check_quantiles(&fine_first, &values);
    }
    // Downscaling to a finer schema does nothing.
    let mut sketch = sketch_of(3, &values);
    sketch.downscale(5);
    assert_eq!(sketch, sketch_of(3, &values));
}

#[test]
fn wide_data_collapses_the_lowest_buckets_whatever_the_order() {
    // 24 powers of two at schema 8: 6144 buckets, more than MAX_BUCKETS.
    let mut rng = Rng(8);
    let values: Vec<f64> = (0..30_000).map(|_| (rng.uniform() * 24.0 - 12.0).exp2()).collect();
    let mut ascending = values.clone();
    ascending.sort_by(f64::total_cmp);
    let descending: Vec<f64> = ascending.iter().rev().copied().collect();
    let shuffled = sketch_of(MAX_SCHEMA, &values);
    assert_eq!(sketch_of(MAX_SCHEMA, &ascending), shuffled);
    assert_eq!(sketch_of(MAX_SCHEMA, &descending), shuffled);
    let (first, last) = (shuffled.positive_buckets().next(), shuffled.positive_buckets().last());
    let (first, last) = (first.expect("buckets").0, last.expect("buckets").0);
    assert_eq!(last - first + 1, MAX_BUCKETS as i32);
    assert_eq!(shuffled.count(), 30_000.0);
    assert!(shuffled.positive.counts.len() <= MAX_BUCKETS);
    // The top 16 powers of two (about 2/3 of the data) keep the bound.
    let mut sorted = ascending;
    let bound = relative_error(MAX_SCHEMA) + 1e-12;
    for q in [0.5, 0.75, 0.9, 0.99, 0.999] {
        let exact = nearest_rank(&sorted, q);
        let estimate = shuffled.quantile(q).expect("not empty");
        assert!(((estimate - exact) / exact).abs() <= bound, "q {q}: {estimate} vs {exact}");
    }
    // Merging collapsed partials gives the same sketch.
    let mut merged = Sketch::with_schema(MAX_SCHEMA);
    for chunk in values.chunks(3_000) {
        merged.merge(&sketch_of(MAX_SCHEMA, chunk));
    }
    assert_eq!(merged, shuffled);
    // Negative values collapse the same way.
    sorted.iter_mut().for_each(|value| *value = -*value);
    let negative = sketch_of(MAX_SCHEMA, &sorted);
    assert!(negative.negative_buckets().map(|(index, _)| index).eq(shuffled.positive_buckets().map(|b| b.0)));
}

#[test]
fn clear_keeps_memory_and_windows() {
    let values = lognormal_values(10_000, 9);
    let mut sketch = sketch_of(DEFAULT_SCHEMA, &values);
    let bytes = sketch.heap_bytes();
    assert!(bytes > 0);
    sketch.clear();
    assert!(sketch.is_empty());
    assert_eq!(sketch.quantile(0.5), None);
    assert_eq!(sketch.heap_bytes(), bytes);
    assert_eq!(sketch.to_proto(), Sketch::new().to_proto());
    for &value in &values {
        sketch.insert(value, 1.0);
    }
    assert_eq!(sketch.heap_bytes(), bytes);
    assert_eq!(sketch, sketch_of(DEFAULT_SCHEMA, &values));
}

#[test]
fn proto_round_trip() {
    let mut rng = Rng(10);
    let mut sketch = Sketch::with_schema(3);
    for _ in 0..10_000 {
        sketch.insert(rng.lognormal(0.0, 3.0) * if rng.uniform() < 0.3 { -1.0 } else { 1.0 }, 1.0 + rng.uniform());
    }
    sketch.insert(0.0, 4.0);
    let proto = sketch.to_proto();
    assert_eq!(proto.schema, 3);
    assert_eq!(proto.zero_count, 4.0);
    assert!(proto.positive_counts.first().is_some_and(|&count| count > 0.0));
    assert!(proto.negative_counts.last().is_some_and(|&count| count > 0.0));
    let decoded = Sketch::from_proto(&proto).expect("valid sketch");
    assert_eq!(decoded, sketch);
    assert_eq!(decoded.to_proto(), proto);
    assert_eq!(decoded.quantile(0.3), sketch.quantile(0.3));
    let empty = Sketch::from_proto(&tessera_proto::Sketch { schema: 5, ..Default::default() });
    assert_eq!(empty, Ok(Sketch::new()));
}

#[test]
fn from_proto_rejects_garbage() {
    let valid = tessera_proto::Sketch {
        schema: 5,
        zero_count: 1.0,
        positive_offset: -3,
        positive_counts: vec![1.0, 0.0, 2.0],
        negative_offset: 10,
        negative_counts: vec![5.0],
    };
    assert!(Sketch::from_proto(&valid).is_ok());
    let reject = |change: fn(&mut tessera_proto::Sketch)| {
        let mut proto = valid.clone();
        change(&mut proto);
        Sketch::from_proto(&proto).expect_err("garbage accepted")
    };
    assert_eq!(reject(|p| p.schema = 9), SketchError::InvalidSchema { schema: 9 });
    assert_eq!(reject(|p| p.schema = -5), SketchError::InvalidSchema { schema: -5 });
    assert!(matches!(reject(|p| p.zero_count = -1.0), SketchError::InvalidCount { store: "zero", .. }));
    assert!(matches!(reject(|p| p.zero_count = f64::NAN), SketchError::InvalidCount { store: "zero", .. }));
    assert!(matches!(reject(|p| p.positive_counts[1] = f64::NAN), SketchError::InvalidCount { .. }));
    assert!(matches!(reject(|p| p.negative_counts[0] = -2.0), SketchError::InvalidCount { store: "negative", .. }));
    assert!(matches!(reject(|p| p.positive_counts[2] = f64::INFINITY), SketchError::InvalidCount { .. }));
    assert_eq!(
        reject(|p| p.positive_counts = vec![1.0; MAX_BUCKETS + 1]),
        SketchError::TooManyBuckets { store: "positive", len: MAX_BUCKETS + 1 }
    );
    assert!(matches!(
        reject(|p| p.negative_offset = i32::MAX),
        SketchError::IndexOutOfRange { store: "negative", first: 2_147_483_647, last: 2_147_483_647, .. }
    ));
    let overflow = reject(|p| p.positive_offset = i32::MAX - 1);
    assert!(matches!(overflow, SketchError::IndexOutOfRange { last: 2_147_483_648, .. }));
    assert!(matches!(reject(|p| p.positive_offset = i32::MIN), SketchError::IndexOutOfRange { .. }));
    // Just inside and just outside the range at schema 5.
    let (min, max) = index_range(5);
    assert!(Sketch::from_proto(&tessera_proto::Sketch { positive_offset: min, ..valid.clone() }).is_ok());
    assert!(reject(|p| p.positive_offset = -(32 << 5)).to_string().contains("out of range"));
    let at_top = tessera_proto::Sketch { positive_offset: max - 2, ..valid.clone() };
    assert!(Sketch::from_proto(&at_top).is_ok());
    assert_eq!(reject(|p| p.schema = 12).to_string(), "invalid sketch schema 12, expected -4..=8",);
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            (-40.0..60.0f64, any::<bool>()).prop_map(|(exponent, negative)| {
                let magnitude = exponent.exp2();
                if negative { -magnitude } else { magnitude }
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn order_and_partition_do_not_matter(
            values in proptest::collection::vec(value(), 1..400),
            split in any::<prop::sample::Index>(),
            schema in MIN_SCHEMA..=MAX_SCHEMA,
        ) {
            let mut whole = Sketch::with_schema(schema);
            values.iter().for_each(|&value| whole.insert(value, 1.0));
            let mut reversed = Sketch::with_schema(schema);
            values.iter().rev().for_each(|&value| reversed.insert(value, 1.0));
            prop_assert_eq!(&reversed, &whole);

            let (first, second) = values.split_at(split.index(values.len()));
            let mut merged = Sketch::with_schema(schema);
            first.iter().for_each(|&value| merged.insert(value, 1.0));
            let mut other = Sketch::with_schema(schema);
            second.iter().for_each(|&value| other.insert(value, 1.0));
            merged.merge(&other);
            prop_assert_eq!(&merged, &whole);
            prop_assert_eq!(merged.count(), values.len() as f64);
            prop_assert!(whole.positive.counts.len() <= MAX_BUCKETS);
            prop_assert!(whole.negative.counts.len() <= MAX_BUCKETS);
            prop_assert_eq!(Sketch::from_proto(&whole.to_proto()), Ok(whole));
        }
    }
}

/// statsd's percent-threshold statistics of exact values: the lowest `n` of the sorted values
/// (the highest with `from_top`): (sum, sum of squares, boundary).
fn exact_threshold(sorted: &[f64], n: usize, from_top: bool) -> (f64, f64, f64) {
    let taken = if from_top { &sorted[sorted.len() - n..] } else { &sorted[..n] };
    let boundary = if from_top { taken[0] } else { taken[n - 1] };
    (taken.iter().sum(), taken.iter().map(|value| value * value).sum(), boundary)
}

#[test]
fn threshold_statistics_are_statsds_within_the_bound() {
    let values = lognormal_values(20_000, 11);
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let sketch = sketch_of(DEFAULT_SCHEMA, &values);
    let alpha = relative_error(DEFAULT_SCHEMA) + 1e-12;
    for pct in [50.0, 90.0, 99.0, 99.9] {
        for from_top in [false, true] {
            // statsd: numInThreshold = round(pct / 100 * count).
            let n = (pct / 100.0 * values.len() as f64).round() as usize;
            let threshold = sketch.threshold(n as f64, from_top).unwrap();
            let (sum, sum_squares, boundary) = exact_threshold(&sorted, n, from_top);
            assert_eq!(threshold.weight, n as f64);
            let error = |estimate: f64, exact: f64| ((estimate - exact) / exact).abs();
            assert!(error(threshold.sum, sum) <= alpha, "{pct} {from_top}: sum {} vs {sum}", threshold.sum);
            assert!(
                error(threshold.boundary, boundary) <= alpha,
                "{pct} {from_top}: {} vs {boundary}",
                threshold.boundary
            );
            let squares_error = error(threshold.sum_squares, sum_squares);
            assert!(squares_error <= 2.0 * alpha + alpha * alpha, "{pct} {from_top}: squares off by {squares_error}");
        }
    }
    // The upper boundary at a threshold is the quantile's nearest rank.
    assert_eq!(sketch.threshold(18_000.0, false).unwrap().boundary, sketch.quantile(0.9).unwrap());
}

#[test]
fn thresholds_cross_zero_and_signs_and_stop_at_what_the_sketch_holds() {
    let sketch = sketch_of(DEFAULT_SCHEMA, &[-4.0, 0.0, 2.0, 8.0]);
    // A power of two is its bucket's upper bound: read exactly α below it.
    let alpha = relative_error(DEFAULT_SCHEMA) + 1e-12;
    // The lowest two: -4 and 0.
    let lowest = sketch.threshold(2.0, false).unwrap();
    assert_eq!((lowest.weight, lowest.boundary), (2.0, 0.0));
    assert!((lowest.sum + 4.0).abs() <= 4.0 * alpha, "{lowest:?}");
    // The highest one: 8; more than the sketch holds takes all of it.
    let highest = sketch.threshold(1.0, true).unwrap();
    assert!((highest.boundary - 8.0).abs() <= 8.0 * alpha, "{highest:?}");
    assert_eq!(highest.weight, 1.0);
    assert_eq!(sketch.threshold(10.0, false).unwrap().weight, 4.0);
    // Part of a bucket: half of a weight-2 value.
    let mut weighted = Sketch::new();
    weighted.insert(3.0, 2.0);
    let half = weighted.threshold(1.0, false).unwrap();
    assert_eq!(half.weight, 1.0);
    assert_eq!(half.sum, half.boundary);
    // Nothing to read.
    assert_eq!(Sketch::new().threshold(1.0, false), None);
    assert_eq!(weighted.threshold(0.0, false), None);
    assert_eq!(weighted.threshold(f64::NAN, false), None);
}
