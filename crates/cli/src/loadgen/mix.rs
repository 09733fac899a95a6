//! The type mix: how the series divide between metric types.
//!
//! `--mix counter=70,gauge=10,timer=10,set=5,distribution=5` gives each type
//! a weight; [`Mix::assign`] turns the weights into exactly one type per
//! series, interleaved so that any run of consecutive series (and so each
//! sender's share) holds the types in about the same proportions.
//!
//! ```ignore
//! let mix: Mix = "counter=3,gauge=1".parse()?;
//! assert_eq!(mix.assign(4), [Counter, Counter, Gauge, Counter]);
//! ```

use std::fmt;
use std::str::FromStr;

use tessera_core::parse::MetricKind;

/// Why a `--mix` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    /// Nothing but separators.
    #[error("empty mix: expected `type=weight,...`, e.g. `counter=70,gauge=30`")]
    Empty,
    /// An entry without `=`.
    #[error("mix entry `{entry}` is not `type=weight`")]
    MissingWeight {
        /// The entry as written.
        entry: String,
    },
    /// A type name this generator does not know.
    #[error(
        "unknown metric type `{name}` in mix (expected counter, gauge, timer, histogram, distribution or set, \
         or their codes c, g, ms, h, d, s)"
    )]
    UnknownType {
        /// The name as written.
        name: String,
    },
    /// A weight that is not a non-negative integer.
    #[error("invalid weight `{weight}` for `{name}` in mix (expected a whole number from 0 to 4294967295)")]
    BadWeight {
        /// The type name as written.
        name: String,
        /// The weight as written.
        weight: String,
        /// Why it does not parse.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The same type twice.
    #[error("metric type `{name}` appears twice in mix")]
    Duplicate {
        /// The type's name.
        name: &'static str,
    },
    /// Every weight is zero.
    #[error("every weight in mix is zero")]
    AllZero,
}

/// Relative weights of the metric types, by [`MetricKind::ALL`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    weights: [u32; MetricKind::ALL.len()],
}

impl Default for Mix {
    /// `counter=70,gauge=10,timer=10,set=5,distribution=5`.
    fn default() -> Self {
        "counter=70,gauge=10,timer=10,set=5,distribution=5".parse().expect("the default mix parses")
    }
}

impl FromStr for Mix {
    type Err = MixError;

    fn from_str(text: &str) -> Result<Mix, MixError> {
        let mut weights = [None; MetricKind::ALL.len()];
        for entry in text.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
            let Some((name, weight)) = entry.split_once('=') else {
                return Err(MixError::MissingWeight { entry: entry.to_owned() });
            };
            let (name, weight) = (name.trim(), weight.trim());
            let kind = kind_from_name(name).ok_or_else(|| MixError::UnknownType { name: name.to_owned() })?;
            let weight = weight.parse::<u32>().map_err(|source| MixError::BadWeight {
                name: name.to_owned(),
                weight: weight.to_owned(),
                source,
            })?;
            let slot = &mut weights[kind_index(kind)];
            if slot.is_some() {
                return Err(MixError::Duplicate { name: kind.as_str() });
            }
            *slot = Some(weight);
        }
        if weights.iter().all(Option::is_none) {
            return Err(MixError::Empty);
        }
        let weights = weights.map(|weight| weight.unwrap_or(0));
        if weights.iter().all(|weight| *weight == 0) {
            return Err(MixError::AllZero);
        }
        Ok(Mix { weights })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (kind, weight) in MetricKind::ALL.into_iter().zip(self.weights) {
            if weight > 0 {
                write!(f, "{}{}={weight}", if first { "" } else { "," }, kind.as_str())?;
                first = false;
            }
        }
        Ok(())
    }
}

impl Mix {
    /// How many of `series` series each type gets, by [`MetricKind::ALL`]
    /// order: proportional to the weights, rounded by largest remainder so
    /// that the counts add up to `series` exactly.
    pub fn series_counts(&self, series: u64) -> [u64; MetricKind::ALL.len()] {
        let total_weight: u128 = self.weights.iter().map(|weight| u128::from(*weight)).sum();
        let mut counts = [0u64; MetricKind::ALL.len()];
        let mut remainders = [0u128; MetricKind::ALL.len()];
        for (index, weight) in self.weights.iter().enumerate() {
            let exact = u128::from(series) * u128::from(*weight);
            counts[index] = u64::try_from(exact / total_weight).expect("at most `series`");
            remainders[index] = exact % total_weight;
        }
        let mut missing = series - counts.iter().sum::<u64>();
        while missing > 0 {
            // Largest remainder first; ties go to the earlier type.
            let (index, _) = remainders
                .iter()
                .enumerate()
                .max_by(|(a_index, a), (b_index, b)| a.cmp(b).then(b_index.cmp(a_index)))
                .expect("six types");
            counts[index] += 1;
            remainders[index] = 0;
            missing -= 1;
        }
        counts
    }

    /// The type of each of `series` series: [`Mix::series_counts`] of each,
    /// interleaved by smooth weighted round robin (the type furthest behind
    /// its share goes next), so that the order is fixed and well mixed.
    pub fn assign(&self, series: u64) -> Vec<MetricKind> {
        let counts = self.series_counts(series);
        let total = i128::from(series);
        let mut current = [0i128; MetricKind::ALL.len()];
        let mut kinds = Vec::with_capacity(usize::try_from(series).expect("series fit in memory"));
        for _ in 0..series {
            for (index, count) in counts.iter().enumerate() {
                current[index] += i128::from(*count);
            }
            let (chosen, _) = current
                .iter()
                .enumerate()
                .max_by(|(a_index, a), (b_index, b)| a.cmp(b).then(b_index.cmp(a_index)))
                .expect("six types");
            current[chosen] -= total;
            kinds.push(MetricKind::ALL[chosen]);
        }
        kinds
    }
}

/// The position of `kind` in [`MetricKind::ALL`].
pub fn kind_index(kind: MetricKind) -> usize {
    MetricKind::ALL.iter().position(|candidate| *candidate == kind).expect("ALL holds every kind")
}

fn kind_from_name(name: &str) -> Option<MetricKind> {
    MetricKind::ALL.into_iter().find(|kind| kind.as_str().eq_ignore_ascii_case(name) || kind.code() == name)
}

#[cfg(test)]
mod tests {
    use MetricKind::*;

    use super::*;

    #[test]
    fn parses_names_codes_and_spaces() {
        let mix: Mix = " counter=70, g=10 ,timer=10,set=5,d=5,".parse().unwrap();
        assert_eq!(mix.weights, [70, 10, 10, 0, 5, 5]);
        assert_eq!(mix, Mix::default());
        assert_eq!(mix.to_string(), "counter=70,gauge=10,timer=10,distribution=5,set=5");
        assert_eq!("histogram=1".parse::<Mix>().unwrap().weights, [0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn errors_name_the_offending_entry() {
        let cases = [
            ("", "empty mix: expected `type=weight,...`, e.g. `counter=70,gauge=30`"),
            (" , ", "empty mix: expected `type=weight,...`, e.g. `counter=70,gauge=30`"),
            ("counter", "mix entry `counter` is not `type=weight`"),
            (
                "counter=1,meter=2",
                "unknown metric type `meter` in mix (expected counter, gauge, timer, histogram, distribution or set, or their codes c, g, ms, h, d, s)",
            ),
            ("counter=x", "invalid weight `x` for `counter` in mix (expected a whole number from 0 to 4294967295)"),
            ("counter=-1", "invalid weight `-1` for `counter` in mix (expected a whole number from 0 to 4294967295)"),
            ("counter=1,c=2", "metric type `counter` appears twice in mix"),
            ("counter=0,gauge=0", "every weight in mix is zero"),
        ];
        for (text, message) in cases {
            let error = text.parse::<Mix>().unwrap_err();
            assert_eq!(error.to_string(), message, "mix `{text}`");
        }
    }

    #[test]
    fn series_counts_add_up_by_largest_remainder() {
        let mix = Mix::default();
        assert_eq!(mix.series_counts(10_000), [7000, 1000, 1000, 0, 500, 500]);
        assert_eq!(mix.series_counts(7), [5, 1, 1, 0, 0, 0]);
        assert_eq!(mix.series_counts(1), [1, 0, 0, 0, 0, 0]);
        for series in 0..300 {
            assert_eq!(mix.series_counts(series).iter().sum::<u64>(), series);
        }
        let thirds: Mix = "counter=1,gauge=1,set=1".parse().unwrap();
        assert_eq!(thirds.series_counts(5), [2, 2, 0, 0, 0, 1]);
    }

    #[test]
    fn assignment_is_exact_and_interleaved() {
        let mix: Mix = "counter=3,gauge=1".parse().unwrap();
        assert_eq!(mix.assign(4), [Counter, Counter, Gauge, Counter]);
        let mix = Mix::default();
        let kinds = mix.assign(1000);
        for (kind, count) in MetricKind::ALL.into_iter().zip(mix.series_counts(1000)) {
            assert_eq!(kinds.iter().filter(|k| **k == kind).count() as u64, count);
        }
        // Every window of 100 consecutive series is within one of the mix.
        for window in kinds.windows(100) {
            let counters = window.iter().filter(|k| **k == Counter).count();
            assert!((69..=71).contains(&counters), "{counters} counters in a window");
        }
    }
}
