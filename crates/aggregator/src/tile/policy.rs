//! Storage policies: `resolution:retention` pairs such as `10s:2d`.
//!
//! A policy's resolution is the length of its tiles; tiles are aligned on
//! the unix epoch, so the tile holding time `t` starts at
//! `floor(t / resolution) * resolution`. The retention is carried to the
//! ingester with every tile batch (as the policy's name) and is not used by
//! the aggregator itself.
//!
//! Durations are a whole number followed by a unit: `ms`, `s`, `m`, `h` or
//! `d`. A policy prints in its shortest exact form, so `60s:48h` prints as
//! `1m:2d`.
//!
//! ```
//! use tessera_aggregator::StoragePolicy;
//!
//! let policy: StoragePolicy = "10s:2d".parse().unwrap();
//! assert_eq!(policy.resolution_ms(), 10_000);
//! assert_eq!(policy.tile_start_ms(1_700_000_012_345), 1_700_000_010_000);
//! assert_eq!(StoragePolicy::parse("60s:48h").unwrap().to_string(), "1m:2d");
//! assert!(StoragePolicy::parse("10s").is_err());
//! ```

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

/// The default policy: 10 s tiles kept 2 days. One resolution, for one store: 1 min tiles
/// for a long-retention store are a second policy (`1m:40d`), added where an ingester has
/// a target for them.
pub const DEFAULT_POLICIES: [&str; 1] = ["10s:2d"];

/// Units a duration may be written in, largest first, with their length in milliseconds.
const UNITS: [(&str, i64); 5] = [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// One storage policy: tile length and retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct StoragePolicy {
    resolution_ms: i64,
    retention_ms: i64,
}

/// Why a storage policy is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not of the form `resolution:retention`.
    #[error("storage policy `{text}` is not `resolution:retention` (e.g. `10s:2d`)")]
    Syntax {
        /// The text given.
        text: String,
    },
    /// A duration is not a positive whole number with a unit.
    #[error("invalid duration `{text}`: use a positive whole number and a unit (ms, s, m, h, d)")]
    Duration {
        /// The duration text.
        text: String,
    },
    /// The retention is shorter than one tile.
    #[error("storage policy `{policy}` keeps less than one tile")]
    RetentionShorterThanResolution {
        /// The policy.
        policy: String,
    },
}

impl StoragePolicy {
    /// A policy of `resolution_ms` tiles kept `retention_ms`.
    pub fn new(resolution_ms: i64, retention_ms: i64) -> Result<StoragePolicy, PolicyError> {
        if resolution_ms <= 0 || retention_ms <= 0 {
            return Err(PolicyError::Duration { text: format!("{resolution_ms}ms:{retention_ms}ms") });
        }
        let policy = StoragePolicy { resolution_ms, retention_ms };
        if retention_ms < resolution_ms {
            return Err(PolicyError::RetentionShorterThanResolution { policy: policy.to_string() });
        }
        Ok(policy)
    }

    /// Parses `resolution:retention`.
    pub fn parse(text: &str) -> Result<StoragePolicy, PolicyError> {
        let Some((resolution, retention)) = text.trim().split_once(':') else {
            return Err(PolicyError::Syntax { text: text.to_owned() });
        };
        StoragePolicy::new(parse_duration_ms(resolution)?, parse_duration_ms(retention)?)
    }

    /// Tile length, milliseconds.
    pub fn resolution_ms(&self) -> i64 {
        self.resolution_ms
    }

    /// How long storage keeps the tiles, milliseconds.
    pub fn retention_ms(&self) -> i64 {
        self.retention_ms
    }

    /// Start of the epoch-aligned tile holding `time_ms`.
    #[inline]
    pub fn tile_start_ms(&self, time_ms: i64) -> i64 {
        time_ms.div_euclid(self.resolution_ms) * self.resolution_ms
    }
}

impl fmt::Display for StoragePolicy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", format_duration_ms(self.resolution_ms), format_duration_ms(self.retention_ms))
    }
}

impl FromStr for StoragePolicy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        StoragePolicy::parse(text)
    }
}

impl TryFrom<String> for StoragePolicy {
    type Error = PolicyError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        StoragePolicy::parse(&text)
    }
}

/// Parses `<whole number><unit>` into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<i64, PolicyError> {
    let text = text.trim();
    let invalid = || PolicyError::Duration { text: text.to_owned() };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let number: i64 = number.parse().map_err(|_| invalid())?;
    let (_, unit_ms) = UNITS.iter().find(|(name, _)| *name == unit).ok_or_else(invalid)?;
    let ms = number.checked_mul(*unit_ms).ok_or_else(invalid)?;
    if ms <= 0 {
        return Err(invalid());
    }
    Ok(ms)
}

/// Formats milliseconds in the largest unit that divides them exactly.
pub fn format_duration_ms(ms: i64) -> String {
    for (name, unit_ms) in UNITS {
        if ms != 0 && ms % unit_ms == 0 {
            return format!("{}{name}", ms / unit_ms);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_in_shortest_exact_units() {
        for (text, resolution_ms, retention_ms, printed) in [
            ("10s:2d", 10_000, 172_800_000, "10s:2d"),
            ("1m:40d", 60_000, 3_456_000_000, "1m:40d"),
            (" 500ms:1h ", 500, 3_600_000, "500ms:1h"),
            ("60s:48h", 60_000, 172_800_000, "1m:2d"),
            ("1500ms:90s", 1_500, 90_000, "1500ms:90s"),
        ] {
            let policy = StoragePolicy::parse(text).unwrap();
            assert_eq!((policy.resolution_ms(), policy.retention_ms()), (resolution_ms, retention_ms), "{text}");
            assert_eq!(policy.to_string(), printed);
        }
    }

    #[test]
    fn rejects_bad_policies_with_a_reason() {
        for (text, fragment) in [
            ("10s", "not `resolution:retention`"),
            ("10:2d", "invalid duration `10`"),
            ("0s:2d", "invalid duration `0s`"),
            ("-1s:2d", "invalid duration `-1s`"),
            ("10x:2d", "invalid duration `10x`"),
            ("1.5s:2d", "invalid duration `1.5s`"),
            ("1m:30s", "keeps less than one tile"),
            ("99999999999999d:1d", "invalid duration"),
        ] {
            let err = StoragePolicy::parse(text).unwrap_err();
            assert!(err.to_string().contains(fragment), "{text}: {err}");
        }
    }

    #[test]
    fn tiles_are_epoch_aligned_for_negative_times_too() {
        let policy = StoragePolicy::parse("10s:1d").unwrap();
        assert_eq!(policy.tile_start_ms(0), 0);
        assert_eq!(policy.tile_start_ms(9_999), 0);
        assert_eq!(policy.tile_start_ms(10_000), 10_000);
        assert_eq!(policy.tile_start_ms(-1), -10_000);
    }

    #[test]
    fn deserializes_from_toml_strings() {
        #[derive(Deserialize)]
        struct Holder {
            policies: Vec<StoragePolicy>,
        }
        let holder: Holder = toml::from_str("policies = [\"10s:2d\", \"1m:40d\"]").unwrap();
        assert_eq!(holder.policies[1].resolution_ms(), 60_000);
        let err = toml::from_str::<Holder>("policies = [\"10s\"]").err().unwrap();
        assert!(err.to_string().contains("resolution:retention"), "{err}");
    }
}
