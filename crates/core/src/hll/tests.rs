use super::*;

fn sketch_of(members: impl IntoIterator<Item = u64>) -> HyperLogLog {
    let mut sketch = HyperLogLog::new();
    for member in members {
        sketch.insert(&member.to_le_bytes());
    }
    sketch
}

fn relative_error(sketch: &HyperLogLog, distinct: u64) -> f64 {
    sketch.estimate() / distinct as f64 - 1.0
}

#[test]
fn hash_is_xxh3_64_with_seed_0() {
    // Published XXH3-64 value of the empty input; pins the hash, which is part of the wire contract.
    assert_eq!(hash(b""), 0x2d06_8005_38d3_94c2);
    assert_eq!(hash(b"user-42"), xxhash_rust::xxh3::xxh3_64_with_seed(b"user-42", 0));
}

#[test]
fn small_sets_are_exact_and_count_duplicates_once() {
    let mut sketch = HyperLogLog::new();
    for round in 0..3 {
        for member in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            sketch.insert(member.as_bytes());
        }
        assert_eq!(sketch.estimate(), 10.0, "round {round}");
    }
    assert!(sketch.is_exact());
    assert!(HyperLogLog::new().is_exact());
    assert_eq!(HyperLogLog::new().estimate(), 0.0);
}

#[test]
fn dense_estimates_are_within_three_standard_errors() {
    let bound = 3.0 * STANDARD_ERROR;
    let mut sketch = HyperLogLog::new();
    let mut inserted = 0;
    for distinct in [600, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 300_000, 1_000_000] {
        sketch.extend_with(inserted..distinct);
        inserted = distinct;
        let error = relative_error(&sketch, distinct);
        println!("{distinct} distinct: relative error {:+.4} % (3 sigma = {:.2} %)", error * 100.0, bound * 100.0);
        assert!(error.abs() <= bound, "{distinct} distinct: relative error {error}");
    }
    // Other sets of 10 000.
    for start in 1..=5u64 {
        let sketch = sketch_of(start * 1_000_000..start * 1_000_000 + 10_000);
        let error = relative_error(&sketch, 10_000);
        println!("10000 distinct from {}: relative error {:+.4} %", start * 1_000_000, error * 100.0);
        assert!(error.abs() <= bound, "relative error {error}");
    }
}

impl HyperLogLog {
    fn extend_with(&mut self, members: std::ops::Range<u64>) {
        for member in members {
            self.insert(&member.to_le_bytes());
        }
    }
}

#[test]
fn merging_partial_sketches_equals_the_sketch_of_the_union() {
    // 100 overlapping partials: partial i holds members 1000 i .. 1000 i + 1500.
    let union = sketch_of(0..100_500);
    let mut merged = HyperLogLog::new();
    for i in 0..100u64 {
        merged.merge(&sketch_of(1000 * i..1000 * i + 1500));
    }
    assert_eq!(merged.registers, union.registers);
    assert_eq!(merged, union);
    // Small partials stay exact until the union passes the limit, then go dense.
    let mut merged = HyperLogLog::new();
    for i in 0..10u64 {
        merged.merge(&sketch_of(40 * i..40 * i + 60));
        assert!(merged.is_exact());
        assert_eq!(merged.estimate(), (40 * i + 60) as f64);
    }
    merged.merge(&sketch_of(300..600));
    assert!(!merged.is_exact());
    assert_eq!(merged, sketch_of(0..600));
    // Exact into dense, and dense into exact.
    let mut dense = sketch_of(0..5_000);
    dense.merge(&sketch_of(4_990..5_010));
    assert_eq!(dense, sketch_of(0..5_010));
    let mut exact = sketch_of(4_990..5_010);
    exact.merge(&sketch_of(0..5_000));
    assert_eq!(exact, sketch_of(0..5_010));
}

#[test]
fn goes_dense_past_the_exact_limit() {
    let mut sketch = sketch_of(0..EXACT_LIMIT as u64);
    assert!(sketch.is_exact());
    assert_eq!(sketch.estimate(), EXACT_LIMIT as f64);
    sketch.insert(&0u64.to_le_bytes());
    assert!(sketch.is_exact());
    sketch.insert(&(EXACT_LIMIT as u64).to_le_bytes());
    assert!(!sketch.is_exact());
    let error = relative_error(&sketch, EXACT_LIMIT as u64 + 1);
    println!("{} distinct, just dense: relative error {:+.4} %", EXACT_LIMIT + 1, error * 100.0);
    assert!(error.abs() < 0.02, "relative error {error}");
    assert_eq!(sketch.heap_bytes(), REGISTER_COUNT + sketch.exact.capacity() * 8);
    // The registers are those of the hashes, whatever the path.
    let mut registers = vec![0; REGISTER_COUNT];
    (0..=EXACT_LIMIT as u64).for_each(|member| update_register(&mut registers, hash(&member.to_le_bytes())));
    assert_eq!(sketch.registers, registers);
}

#[test]
fn registers_take_the_largest_rank() {
    let mut registers = vec![0; REGISTER_COUNT];
    update_register(&mut registers, 0); // register 0, all other bits 0: the largest rank
    assert_eq!(registers[0], MAX_REGISTER_VALUE);
    update_register(&mut registers, u64::MAX); // last register, first bit 1: rank 1
    assert_eq!(registers[REGISTER_COUNT - 1], 1);
    update_register(&mut registers, (5 << 50) | (1 << 47)); // register 5, rank 3
    update_register(&mut registers, (5 << 50) | (1 << 49)); // smaller rank, ignored
    assert_eq!(registers[5], 3);
}

#[test]
fn clear_keeps_memory() {
    let mut sketch = sketch_of(0..2_000);
    let bytes = sketch.heap_bytes();
    sketch.clear();
    assert!(sketch.is_exact());
    assert_eq!(sketch.estimate(), 0.0);
    assert_eq!(sketch.heap_bytes(), bytes);
    sketch.extend_with(0..2_000);
    assert_eq!(sketch.heap_bytes(), bytes);
    assert_eq!(sketch, sketch_of(0..2_000));
}

#[test]
fn proto_round_trip() {
    for sketch in [HyperLogLog::new(), sketch_of(0..100), sketch_of(0..10_000)] {
        let proto = sketch.to_proto();
        assert_eq!(proto.precision, 14);
        assert_eq!(proto.registers.len(), if sketch.is_exact() { 0 } else { REGISTER_COUNT });
        let decoded = HyperLogLog::from_proto(&proto).expect("valid set");
        assert_eq!(decoded, sketch);
        assert_eq!(decoded.estimate(), sketch.estimate());
    }
    // Unsorted, repeated exact hashes are accepted.
    let proto = tessera_proto::Set { precision: 14, exact_hashes: vec![3, 1, 2, 3, 1], registers: Vec::new() };
    let decoded = HyperLogLog::from_proto(&proto).expect("valid set");
    assert_eq!(decoded.exact, [1, 2, 3]);
    assert_eq!(decoded.estimate(), 3.0);
}

#[test]
fn from_proto_rejects_garbage() {
    let dense = sketch_of(0..10_000).to_proto();
    let exact = sketch_of(0..10).to_proto();
    let reject = |proto: &tessera_proto::Set, change: fn(&mut tessera_proto::Set)| {
        let mut proto = proto.clone();
        change(&mut proto);
        HyperLogLog::from_proto(&proto).expect_err("garbage accepted")
    };
    assert_eq!(reject(&dense, |p| p.precision = 12), HllError::WrongPrecision { precision: 12 });
    assert_eq!(reject(&exact, |p| p.precision = 0), HllError::WrongPrecision { precision: 0 });
    assert_eq!(reject(&dense, |p| p.registers.truncate(100)), HllError::WrongRegisterLength { len: 100 });
    assert_eq!(reject(&dense, |p| p.registers.push(0)), HllError::WrongRegisterLength { len: REGISTER_COUNT + 1 });
    assert_eq!(reject(&dense, |p| p.registers[77] = 52), HllError::InvalidRegister { index: 77, value: 52 });
    assert_eq!(reject(&dense, |p| p.exact_hashes.push(1)), HllError::BothModes { exact: 1, registers: REGISTER_COUNT });
    assert_eq!(
        reject(&exact, |p| p.exact_hashes = (0..=EXACT_LIMIT as u64).rev().collect()),
        HllError::TooManyExactHashes { len: EXACT_LIMIT + 1 }
    );
    assert_eq!(reject(&dense, |p| p.registers[3] = 200).to_string(), "invalid set register 3 value 200, at most 51");
    let mut at_limit = dense.clone();
    at_limit.registers[0] = MAX_REGISTER_VALUE;
    assert!(HyperLogLog::from_proto(&at_limit).is_ok());
}

#[test]
fn sigma_and_tau_edges() {
    assert_eq!(sigma(0.0), 0.0);
    assert_eq!(sigma(1.0), f64::INFINITY);
    assert_eq!(tau(0.0), 0.0);
    assert_eq!(tau(1.0), 0.0);
    // All registers empty: no members.
    assert_eq!(estimate_registers(&[0; REGISTER_COUNT]), 0.0);
}
