//! A mergeable cardinality sketch for statsd sets: exact while small, HyperLogLog after that.
//!
//! [`HyperLogLog`] counts distinct members by their 64-bit hash, `xxh3_64(member)` ([`hash`]).
//! Up to [`EXACT_LIMIT`] distinct hashes it keeps them in a sorted `Vec`, and its estimate is
//! exact (barring 64-bit hash collisions). Past that it switches to HyperLogLog: 2^14 one-byte
//! registers (16 KiB, precision [`DEFAULT_PRECISION`]), estimated with Otmar Ertl's improved
//! estimator ("New cardinality estimation algorithms for HyperLogLog sketches", 2017), which needs
//! no empirical bias correction and keeps a relative standard error of about
//! `1.04 / sqrt(2^14)` = 0.81 % ([`STANDARD_ERROR`]) from a few hundred members up.
//!
//! Merging is a union: the merge of sketches of several sets has exactly the registers (or
//! hashes) of the sketch of their union, whatever the order.
//!
//! The hash is part of the wire contract: XXH3-64 with seed 0 gives the same value for the same
//! bytes on every host and in every process, so sets built by different collectors merge. Changing
//! it would make sets of different versions unmergeable.
//!
//! ```
//! use tessera_core::hll::{HyperLogLog, STANDARD_ERROR};
//!
//! let mut users = HyperLogLog::new();
//! users.insert(b"alice");
//! users.insert(b"bob");
//! users.insert(b"alice");
//! assert!(users.is_exact());
//! assert_eq!(users.estimate(), 2.0);
//!
//! let mut many = HyperLogLog::new();
//! for id in 0..100_000u32 {
//!     many.insert(&id.to_le_bytes());
//! }
//! many.merge(&users);
//! assert!(!many.is_exact());
//! assert!((many.estimate() / 100_002.0 - 1.0).abs() < 3.0 * STANDARD_ERROR);
//!
//! let decoded = HyperLogLog::from_proto(&many.to_proto()).unwrap();
//! assert_eq!(decoded, many);
//! ```

use std::fmt;
use std::mem::size_of;

use thiserror::Error;

/// The HyperLogLog precision `p`: `2^p` registers. The only one this module reads or writes.
pub const DEFAULT_PRECISION: u8 = 14;

/// The number of registers, `2^DEFAULT_PRECISION`.
pub const REGISTER_COUNT: usize = 1 << DEFAULT_PRECISION;

/// The largest register value: the rank of the first 1 bit in the `64 - p` hash bits left after
/// the register index, or `64 - p + 1` when they are all 0.
pub const MAX_REGISTER_VALUE: u8 = 64 - DEFAULT_PRECISION + 1;

/// The most distinct hashes kept in exact mode; one more and the sketch goes dense.
pub const EXACT_LIMIT: usize = 512;

/// The relative standard error of a dense estimate, `1.04 / sqrt(2^14)` (about 0.81 %).
pub const STANDARD_ERROR: f64 = 1.04 / 128.0;

/// `1 / (2 ln 2)`, the limit of HyperLogLog's `alpha_m` for many registers.
const ALPHA_INFINITY: f64 = 0.721_347_520_444_481_7;

/// The hash a member is counted by: `xxh3_64(member)`, stable across hosts and processes.
#[inline]
pub fn hash(member: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(member)
}

/// Why a [`tessera_proto::Set`] was rejected by [`HyperLogLog::from_proto`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HllError {
    /// The precision is not [`DEFAULT_PRECISION`].
    #[error("unsupported set precision {precision}, expected {DEFAULT_PRECISION}")]
    WrongPrecision {
        /// The precision received.
        precision: u32,
    },
    /// The registers are present but not [`REGISTER_COUNT`] of them.
    #[error("wrong number of set registers: {len}, expected {REGISTER_COUNT}")]
    WrongRegisterLength {
        /// The number of registers received.
        len: usize,
    },
    /// A register holds more than [`MAX_REGISTER_VALUE`].
    #[error("invalid set register {index} value {value}, at most {MAX_REGISTER_VALUE}")]
    InvalidRegister {
        /// The register's index.
        index: usize,
        /// Its value.
        value: u8,
    },
    /// More than [`EXACT_LIMIT`] distinct exact hashes.
    #[error("too many exact hashes in set: {len}, at most {EXACT_LIMIT}")]
    TooManyExactHashes {
        /// The number of distinct hashes received.
        len: usize,
    },
    /// Both exact hashes and registers are present.
    #[error("set has both {exact} exact hashes and {registers} registers")]
    BothModes {
        /// The number of exact hashes received.
        exact: usize,
        /// The number of registers received.
        registers: usize,
    },
}

/// A mergeable distinct-count sketch; see the [module docs](self).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HyperLogLog {
    /// Sorted, distinct member hashes while exact; empty once dense.
    exact: Vec<u64>,
    /// [`REGISTER_COUNT`] registers once dense; empty while exact.
    registers: Vec<u8>,
}

impl fmt::Debug for HyperLogLog {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("HyperLogLog")
            .field("exact", &self.is_exact())
            .field("estimate", &self.estimate())
            .finish()
    }
}

impl HyperLogLog {
    /// An empty sketch in exact mode; it allocates nothing until the first insert.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `member`, by its [`hash`].
    #[inline]
    pub fn insert(&mut self, member: &[u8]) {
        self.insert_hash(hash(member));
    }

    /// Counts a member by its hash, which must be [`hash`]`(member)` for sketches to merge.
    #[inline]
    pub fn insert_hash(&mut self, hash: u64) {
        if !self.registers.is_empty() {
            update_register(&mut self.registers, hash);
            return;
        }
        if let Err(position) = self.exact.binary_search(&hash) {
            self.exact.insert(position, hash);
            if self.exact.len() > EXACT_LIMIT {
                self.densify();
            }
        }
    }

    /// Adds the members of `other`: the result is the sketch of the union. Two exact sketches stay
    /// exact while the union has at most [`EXACT_LIMIT`] hashes; otherwise the result is dense.
    pub fn merge(&mut self, other: &HyperLogLog) {
        if !other.registers.is_empty() {
            if self.registers.is_empty() {
                self.densify();
            }
            for (register, &value) in self.registers.iter_mut().zip(&other.registers) {
                *register = (*register).max(value);
            }
            return;
        }
        if !self.registers.is_empty() {
            for &hash in &other.exact {
                update_register(&mut self.registers, hash);
            }
            return;
        }
        merge_sorted_distinct(&mut self.exact, &other.exact);
        if self.exact.len() > EXACT_LIMIT {
            self.densify();
        }
    }

    /// The number of distinct members: exact in exact mode, else within about
    /// [`STANDARD_ERROR`] (relative, one standard deviation).
    pub fn estimate(&self) -> f64 {
        if self.registers.is_empty() { self.exact.len() as f64 } else { estimate_registers(&self.registers) }
    }

    /// Whether the sketch still holds the member hashes themselves.
    pub fn is_exact(&self) -> bool {
        self.registers.is_empty()
    }

    /// Empties the sketch back to exact mode, keeping its memory for reuse.
    pub fn clear(&mut self) {
        self.exact.clear();
        self.registers.clear();
    }

    /// The heap memory the sketch holds, in bytes.
    pub fn heap_bytes(&self) -> usize {
        self.exact.capacity() * size_of::<u64>() + self.registers.capacity()
    }

    /// The wire form: the sorted hashes in exact mode, else the registers.
    pub fn to_proto(&self) -> tessera_proto::Set {
        tessera_proto::Set {
            precision: u32::from(DEFAULT_PRECISION),
            exact_hashes: self.exact.clone(),
            registers: self.registers.clone(),
        }
    }

    /// Reads the wire form, rejecting another precision, a register array of the wrong length or
    /// with values above [`MAX_REGISTER_VALUE`], more than [`EXACT_LIMIT`] distinct hashes, and
    /// hashes and registers together. Exact hashes need not be sorted or distinct.
    pub fn from_proto(proto: &tessera_proto::Set) -> Result<HyperLogLog, HllError> {
        if proto.precision != u32::from(DEFAULT_PRECISION) {
            return Err(HllError::WrongPrecision { precision: proto.precision });
        }
        if !proto.registers.is_empty() {
            if !proto.exact_hashes.is_empty() {
                return Err(HllError::BothModes { exact: proto.exact_hashes.len(), registers: proto.registers.len() });
            }
            if proto.registers.len() != REGISTER_COUNT {
                return Err(HllError::WrongRegisterLength { len: proto.registers.len() });
            }
            if let Some(index) = proto.registers.iter().position(|&value| value > MAX_REGISTER_VALUE) {
                return Err(HllError::InvalidRegister { index, value: proto.registers[index] });
            }
            return Ok(HyperLogLog { exact: Vec::new(), registers: proto.registers.clone() });
        }
        let mut exact = proto.exact_hashes.clone();
        if !exact.is_sorted_by(|a, b| a < b) {
            exact.sort_unstable();
            exact.dedup();
        }
        if exact.len() > EXACT_LIMIT {
            return Err(HllError::TooManyExactHashes { len: exact.len() });
        }
        Ok(HyperLogLog { exact, registers: Vec::new() })
    }

    /// Switches to registers, reusing their memory if the sketch had gone dense before a clear.
    fn densify(&mut self) {
        self.registers.clear();
        self.registers.resize(REGISTER_COUNT, 0);
        for &hash in &self.exact {
            update_register(&mut self.registers, hash);
        }
        self.exact.clear();
    }
}

/// The top `p` bits of the hash pick the register; it keeps the largest rank (position of the
/// first 1 bit, from 1) seen in the remaining `64 - p` bits.
#[inline]
fn update_register(registers: &mut [u8], hash: u64) {
    let index = (hash >> (64 - DEFAULT_PRECISION)) as usize;
    // The sentinel bit caps the rank at 64 - p + 1 when the remaining bits are all 0.
    let rank = ((hash << DEFAULT_PRECISION) | (1 << (DEFAULT_PRECISION - 1))).leading_zeros() as u8 + 1;
    let register = &mut registers[index];
    *register = (*register).max(rank);
}

/// Merges the sorted, distinct `other` into the sorted, distinct `into`, in place from the back.
fn merge_sorted_distinct(into: &mut Vec<u64>, other: &[u64]) {
    let (mut left, mut right) = (into.len(), other.len());
    into.resize(left + right, 0);
    let mut write = into.len();
    while right > 0 {
        write -= 1;
        if left > 0 && into[left - 1] > other[right - 1] {
            into[write] = into[left - 1];
            left -= 1;
        } else {
            into[write] = other[right - 1];
            right -= 1;
        }
    }
    into.dedup();
}

/// Ertl's improved raw estimator (algorithm 6 of the paper), with `q = 64 - p`:
/// `alpha_inf m^2 / (m sigma(C_0 / m) + sum_{k=1..q} C_k 2^-k + m tau(1 - C_{q+1} / m) 2^-q)`
/// where `C_k` is the number of registers holding `k`.
fn estimate_registers(registers: &[u8]) -> f64 {
    let mut histogram = [0u32; 256];
    for &value in registers {
        histogram[usize::from(value)] += 1;
    }
    let m = registers.len() as f64;
    let q = usize::from(MAX_REGISTER_VALUE) - 1;
    let mut z = m * tau(1.0 - f64::from(histogram[q + 1]) / m);
    for k in (1..=q).rev() {
        z = 0.5 * (z + f64::from(histogram[k]));
    }
    z += m * sigma(f64::from(histogram[0]) / m);
    ALPHA_INFINITY * m * m / z
}

/// `sigma(x) = x + sum_{k>=1} x^(2^k) 2^(k-1)`; infinite at 1 (all registers empty).
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if z == previous {
            return z;
        }
    }
}

/// `tau(x) = (1 - x - sum_{k>=1} (1 - x^(2^-k))^2 2^-k) / 3`; 0 at 0 and 1.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == previous {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            reject(&dense, |p| p.exact_hashes.push(1)),
            HllError::BothModes { exact: 1, registers: REGISTER_COUNT }
        );
        assert_eq!(
            reject(&exact, |p| p.exact_hashes = (0..=EXACT_LIMIT as u64).rev().collect()),
            HllError::TooManyExactHashes { len: EXACT_LIMIT + 1 }
        );
        assert_eq!(
            reject(&dense, |p| p.registers[3] = 200).to_string(),
            "invalid set register 3 value 200, at most 51"
        );
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
}
