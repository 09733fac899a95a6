//! The shard function: `murmur3_32(canonical_id, seed 0) % num_shards`.
//!
//! This is the one place that maps a series to a shard; the collector, the
//! aggregator and the tools all call [`shard_of`]. MurmurHash3's x86 32-bit
//! variant is the function M3 uses, so a tessera placement and an M3
//! placement with the same number of shards agree on where a series lives.
//!
//! ```
//! use tessera_core::shard::{murmur3_32, shard_of};
//! assert_eq!(murmur3_32(b"", 0), 0);
//! assert_eq!(shard_of(b"api.hits|#env:prod", 1), 0);
//! ```

/// MurmurHash3 x86 32-bit of `data` with `seed`.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("chunks of 4 bytes"));
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, byte) in tail.iter().enumerate() {
            k |= u32::from(*byte) << (8 * i);
        }
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The shard that owns the series with canonical id `id`.
///
/// `num_shards` must be at least 1 (placements are validated so).
#[inline]
pub fn shard_of(id: &[u8], num_shards: u32) -> u32 {
    murmur3_32(id, 0) % num_shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference vectors of MurmurHash3_x86_32, as published with SMHasher and
    /// repeated by the Wikipedia article and most ports' test suites.
    #[test]
    fn matches_published_reference_vectors() {
        let cases: &[(&[u8], u32, u32)] = &[
            (b"", 0, 0),
            (b"", 1, 0x514e_28b7),
            (b"", 0xffff_ffff, 0x81f1_6f39),
            (&[0xff, 0xff, 0xff, 0xff], 0, 0x7629_3b50),
            (&[0x21, 0x43, 0x65, 0x87], 0, 0xf55b_516b),
            (&[0x21, 0x43, 0x65, 0x87], 0x5082_edee, 0x2362_f9de),
            (&[0x21, 0x43, 0x65], 0, 0x7e4a_8634),
            (&[0x21, 0x43], 0, 0xa0f7_b07a),
            (&[0x21], 0, 0x7266_1cf4),
            (&[0, 0, 0, 0], 0, 0x2362_f9de),
            (&[0, 0, 0], 0, 0x85f0_b427),
            (&[0, 0], 0, 0x30f4_c306),
            (&[0], 0, 0x514e_28b7),
            (b"Hello, world!", 1234, 0xfaf6_cdb3),
            (b"Hello, world!", 4321, 0xbf50_5788),
            (b"The quick brown fox jumps over the lazy dog", 0x9747_b28c, 0x2fa8_26cd),
            (b"aaaa", 0x9747_b28c, 0x5a97_808a),
            (b"abc", 0, 0xb3dd_93fa),
            (b"abcd", 0x9747_b28c, 0xf047_8627),
        ];
        for (input, seed, want) in cases {
            assert_eq!(murmur3_32(input, *seed), *want, "murmur3_32({input:?}, {seed:#x})");
        }
    }

    #[test]
    fn shards_are_in_range_and_spread() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let id = format!("series.{i}|#host:h{}", i % 7);
            let shard = shard_of(id.as_bytes(), 16);
            counts[shard as usize] += 1;
        }
        for (shard, count) in counts.iter().enumerate() {
            assert!((800..1200).contains(count), "shard {shard} got {count} of 16000");
        }
        assert_eq!(shard_of(b"x", 0), 0, "zero shards is treated as one");
    }
}
