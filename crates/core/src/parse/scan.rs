//! Byte scans of the parser's hot path, eight bytes at a time (SWAR: one
//! `u64` holds eight bytes of the line, and a few integer operations mark
//! the bytes looked for).
//!
//! Each scan marks bytes in the high bit of their lane. Only the lowest mark
//! of a word is exact: a borrow or a carry out of a marked lane can mark a
//! lane above it falsely. Every scan therefore uses the lowest mark only, or
//! asks whether any byte before an exact mark is marked (a false mark needs
//! a true one below it).
//!
//! A name is **unusual** when it holds a byte that tags written in the name
//! start with (`,` InfluxDB, `#` Librato, `[` SignalFx, and `]`, which alone
//! is a SignalFx tag error) or a non-ASCII byte. The test is cheap and wide:
//! it marks every byte below `-` (control bytes, space, `!"#$%&'()*+,`),
//! `[ \ ] { | }` and non-ASCII bytes. A name without them is read as it is,
//! with no further look; the other bytes caught are rare in names and cost
//! only that look.

use super::find_short;

/// Where a metric name ends.
pub(super) enum NameEnd {
    /// At the `:` at `at`; `unusual` when a byte before it is unusual
    /// (see the module docs): non-ASCII, or maybe the start of name tags.
    Colon { at: usize, unusual: bool },
    /// A `|` came before any `:`.
    Pipe,
    /// Neither byte occurs.
    None,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in the lowest byte of `word` that is zero (bytes above the
/// first zero byte may also be marked; only the lowest mark is exact).
#[inline(always)]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// Marks the unusual bytes of `word` (see the module docs) and its `:`
/// bytes; the lowest mark is exact.
#[inline(always)]
fn colon_or_unusual(word: u64) -> u64 {
    // `:` is a zero byte once xored with it (the `!x` of `zero_bytes` is left
    // out: a lane whose high bit it would clear is a non-ASCII byte, marked
    // below anyway).
    let colons = (word ^ (ONES * u64::from(b':'))).wrapping_sub(ONES);
    // Below `-` (0x2D), subtracting it borrows into the lane's high bit; a
    // non-ASCII byte has its own high bit.
    let below_dash_or_non_ascii = word.wrapping_sub(ONES * 0x2D) | word;
    // With bit 0x20 set, `[ \ ]` and `{ | }` are both 0x7B..=0x7D: adding 5
    // reaches the high bit from 0x7B up, adding 2 from 0x7E up.
    let folded = word | (ONES * 0x20);
    let brackets_and_braces = folded.wrapping_add(ONES * 0x05) & !folded.wrapping_add(ONES * 0x02);
    (colons | below_dash_or_non_ascii | brackets_and_braces) & HIGHS
}

/// [`colon_or_unusual`] for one byte.
#[inline(always)]
fn is_unusual(byte: u8) -> bool {
    !(b'-'..0x80).contains(&byte) || matches!(byte | 0x20, b'{'..=b'}')
}

/// The eight bytes of `chunk` as one word, the first in the lowest lane.
#[inline(always)]
fn word_of(chunk: &[u8]) -> u64 {
    u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"))
}

/// The first byte of `bytes` that is `:` or unusual (which takes in `|` and
/// `\n`), and where it is; eight bytes at a time.
#[inline(always)]
fn first_colon_or_unusual(bytes: &[u8]) -> Option<(usize, u8)> {
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = word_of(chunk);
        let marks = colon_or_unusual(word);
        if marks != 0 {
            let shift = marks.trailing_zeros() & !7;
            return Some((offset + (shift / 8) as usize, (word >> shift) as u8));
        }
        offset += 8;
    }
    let rest = chunks.remainder();
    if rest.is_empty() {
        return None;
    }
    if bytes.len() < 8 {
        let at = rest.iter().position(|&byte| byte == b':' || is_unusual(byte))?;
        return Some((offset + at, rest[at]));
    }
    // The last eight bytes, shifted so that the ones not scanned yet fill the
    // low lanes; the zero lanes shifted in above them are unusual, so the
    // lowest mark is at or before the first of them.
    let word = word_of(&bytes[bytes.len() - 8..]) >> (8 * (8 - rest.len()));
    let shift = colon_or_unusual(word).trailing_zeros() & !7;
    let lane = (shift / 8) as usize;
    (lane < rest.len()).then(|| (offset + lane, (word >> shift) as u8))
}

/// Finds the first `:` or `|` of a line, and whether an unusual byte comes
/// before it.
#[inline]
pub(super) fn scan_name(line: &[u8]) -> NameEnd {
    match first_colon_or_unusual(line) {
        None => NameEnd::None,
        Some((at, b':')) => NameEnd::Colon { at, unusual: false },
        Some((_, b'|')) => NameEnd::Pipe,
        Some((unusual_at, _)) => {
            // Rare: a non-ASCII name, or one that may hold tags.
            let rest = &line[unusual_at + 1..];
            match memchr::memchr2(b':', b'|', rest) {
                Some(at) if rest[at] == b':' => NameEnd::Colon { at: unusual_at + 1 + at, unusual: true },
                Some(_) => NameEnd::Pipe,
                None => NameEnd::None,
            }
        }
    }
}

/// Position of the first `:` of `bytes` if no unusual byte (which takes in
/// `|` and `\n`) comes before it.
#[inline(always)]
pub(super) fn scan_simple_name(bytes: &[u8]) -> Option<usize> {
    match first_colon_or_unusual(bytes) {
        Some((at, b':')) => Some(at),
        _ => None,
    }
}

/// Position of the first `\n`, eight bytes at a time: statsd lines are
/// short, so this beats `memchr`'s set-up for every line.
#[inline]
pub(super) fn find_newline(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        let marks = zero_bytes(word ^ (ONES * u64::from(b'\n')));
        if marks != 0 {
            return Some(offset + (marks.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    find_short(chunks.remainder(), b'\n').map(|at| offset + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusual_bytes_are_exactly_the_documented_ones() {
        for byte in 0..=u8::MAX {
            let expected = matches!(byte, 0x00..=0x2c | 0x80..=0xff | b'[' | b'\\' | b']' | b'{' | b'|' | b'}');
            assert_eq!(is_unusual(byte), expected, "{byte:#04x}");
            // Alone in a word of ordinary bytes, at every lane.
            for lane in 0..8 {
                let mut word = [b'a'; 8];
                word[lane] = byte;
                let marks = colon_or_unusual(u64::from_le_bytes(word));
                let lowest = (marks != 0).then(|| (marks.trailing_zeros() / 8) as usize);
                assert_eq!(lowest, (expected || byte == b':').then_some(lane), "{byte:#04x} at {lane}");
            }
        }
    }

    #[test]
    fn the_lowest_unusual_mark_is_exact_whatever_follows() {
        for first in 0..=u8::MAX {
            for second in [0x00, 0x2c, 0x2d, 0x5b, 0x7f, 0x80, 0xfb, 0xff] {
                let mut word = [b'a'; 8];
                word[2] = first;
                word[3] = second;
                let marks = colon_or_unusual(u64::from_le_bytes(word));
                let want = [first, second].iter().position(|byte| is_unusual(*byte) || *byte == b':').map(|at| at + 2);
                let lowest = (marks != 0).then(|| (marks.trailing_zeros() / 8) as usize);
                assert_eq!(lowest, want, "{first:#04x} {second:#04x}");
            }
        }
    }

    #[test]
    fn the_word_scan_agrees_with_a_plain_search_on_mixed_bytes() {
        // Ordinary name bytes, with now and then a `:` or an unusual byte.
        let pool =
            b"abcdefghijklmnopqrstuvwxyz.-_0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ:,#[]|{}\\\n \x00\x7f\x80\xc3\xff";
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let len = (state >> 58) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|at| {
                    let pick = (state >> (at % 50)) as usize ^ at.wrapping_mul(31);
                    if pick.is_multiple_of(7) { pool[pick % pool.len()] } else { pool[pick % 36] }
                })
                .collect();
            let want = bytes.iter().position(|byte| *byte == b':' || is_unusual(*byte)).map(|at| (at, bytes[at]));
            assert_eq!(first_colon_or_unusual(&bytes), want, "{bytes:?}");
        }
    }

    #[test]
    fn the_name_scanner_agrees_with_a_plain_search_at_every_offset() {
        for len in 0usize..40 {
            for at in 0..len {
                for separator in [b':', b'|'] {
                    for unusual_byte in [None, Some(0xc3), Some(b','), Some(b'#'), Some(b'['), Some(b']')] {
                        for position in [0, at / 2, at.saturating_sub(1), at + 1] {
                            let mut line = vec![b'a'; len];
                            line[at] = separator;
                            let placed = match unusual_byte {
                                Some(byte) if position != at && position < len => {
                                    line[position] = byte;
                                    Some(position)
                                }
                                _ => None,
                            };
                            let unusual_before = placed.is_some_and(|position| position < at);
                            match (separator, scan_name(&line)) {
                                (b':', NameEnd::Colon { at: found, unusual }) => {
                                    assert_eq!(found, at, "{line:?}");
                                    assert_eq!(unusual, unusual_before, "{line:?}");
                                }
                                (b'|', NameEnd::Pipe) => {}
                                _ => panic!("wrong end for {line:?}"),
                            }
                            let simple = scan_simple_name(&line);
                            let want = (separator == b':' && !unusual_before).then_some(at);
                            assert_eq!(simple, want, "{line:?}");
                        }
                    }
                }
            }
            assert!(matches!(scan_name(&vec![b'x'; len]), NameEnd::None));
        }
    }

    #[test]
    fn the_newline_finder_agrees_with_a_plain_search() {
        for len in 0..40 {
            let mut bytes = vec![b'x'; len];
            assert_eq!(find_newline(&bytes), None);
            for at in (0..len).rev() {
                bytes[at] = b'\n';
                assert_eq!(find_newline(&bytes), Some(at), "len {len}");
            }
        }
    }
}
