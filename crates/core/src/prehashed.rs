//! A hasher for map keys that are hashes already (a 128-bit series hash, a 64-bit
//! fingerprint): the key is its own hash, with nothing computed again.
//!
//! ```
//! use std::collections::HashMap;
//! use tessera_core::prehashed::BuildPrehashed;
//!
//! let mut totals: HashMap<u128, f64, BuildPrehashed> = HashMap::default();
//! totals.insert(0x1234_5678_9abc_def0_1234_5678_9abc_def0, 1.0);
//! assert_eq!(totals.len(), 1);
//! ```

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`Prehashed`] hashers.
pub type BuildPrehashed = BuildHasherDefault<Prehashed>;

/// Passes a `u64` or `u128` key through as its hash (the low 64 bits); other input is
/// folded in byte by byte.
#[derive(Debug, Default, Clone, Copy)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }
}
