//! The order in which a sender visits its series: `--order`.
//!
//! A sender owning the `n` series `first..first + n` sends its lines in
//! passes of `n` lines and cycles of `values_per_series` passes. Line `k`
//! (counted from the sender's start) is in pass `q = k / n` and carries its
//! series' value for pass `q % values_per_series`; which series it carries
//! depends on the order:
//!
//! | order | series of line `k` | lines of each series after `L` lines |
//! |---|---|---|
//! | sequential | `first + k % n` | `L / n`, one more for the first `L % n` series |
//! | random | `first + P[q % values_per_series](k % n)` | `L / n`, one more for the `L % n` series the last pass visited |
//! | zipf | `first + r - 1`, rank `r` drawn from a Zipf distribution over `1..=n` | counted by replaying the draws |
//!
//! Sequential order is insertion order: a receiver that keeps its series in
//! arrival order (a dense table, an insertion-ordered map) reads its slots
//! front to back in every pass, as it filled them, which real traffic never
//! lets it do. Random order sends each whole pass's lines as sequential
//! order does, only in another order (a pass cut short reaches other
//! series, as many); zipf order changes how many lines each series gets too,
//! as real traffic has a few hot series and a long cold tail.
//!
//! **Random** needs no table, so a million series cost nothing: `P[p]` is a
//! bijection of the `b`-bit numbers (`2^b` the least power of two at or
//! above `n`) restricted to `0..n` by cycle walking, that is applied again
//! while the result is `n` or more (less than two steps on average, as
//! `2^b < 2n`). The bijection is [`PERMUTATION_ROUNDS`] rounds of: xor with a
//! key, multiply by an odd number modulo `2^b`, `x ^= x >> ceil(b / 2)`. Each
//! step can be undone, so [`SenderOrder::tallies`] finds which series the
//! last, partial pass reached by running it backwards. The keys come from the
//! seed, the sender's first series and the pass within the cycle: each of
//! the `values_per_series` passes of a cycle has an order of its own, and the
//! cycle repeats exactly, so it can still be formatted once.
//!
//! **Zipf** draws ranks by rejection-inversion (Hörmann and Derflinger 1996,
//! as Apache Commons' `RejectionInversionZipfSampler` and rand_distr's `Zipf`
//! do): no table, a few logarithms per line, any exponent above 0. Its
//! uniforms are hashes of the seed, the sender's first series and the line's
//! place in the cycle, so the cycle repeats and [`SenderOrder::tallies`]
//! counts what each series got by replaying at most one cycle of draws.
//!
//! ```ignore
//! let order = SenderOrder::new(Order::Random, 1, &(0..1000), 4);
//! let (series, pass) = order.line(1234);
//! let tallies = order.tallies(1500);
//! assert_eq!(tallies.get(series).lines, 2);
//! ```

use std::ops::Range;

use super::workload::mix64;

/// Rounds of the random order's bijection.
pub const PERMUTATION_ROUNDS: usize = 3;

/// `--order` as written: which series each line of a sender carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OrderName {
    /// Every pass in insertion order: series 0, 1, 2, ...
    Sequential,
    /// Every pass visits every series once, in a seeded permutation.
    Random,
    /// Each line's series drawn from a Zipf distribution (`--zipf-exponent`).
    Zipf,
}

/// The order of every sender's lines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Order {
    /// Series `first + k % n` for line `k`.
    Sequential,
    /// A seeded permutation of the series for each pass of a cycle.
    Random,
    /// Series drawn with probability proportional to `1 / rank^exponent`.
    Zipf {
        /// The exponent, above 0.
        exponent: f64,
    },
}

/// What a sender sent of one series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Its lines.
    pub lines: u64,
    /// The pass (in `0..values_per_series`) of its last line.
    pub last_pass: u32,
    /// The distinct passes among its lines (as many set members).
    pub passes: u32,
}

/// One sender's order: the series and pass of each of its lines.
#[derive(Debug, Clone)]
pub struct SenderOrder {
    first: u64,
    series_here: u64,
    values_per_series: u32,
    plan: Plan,
}

#[derive(Debug, Clone)]
enum Plan {
    Sequential,
    Random { bits: u32, key: u64 },
    Zipf { sampler: Zipf, key: u64 },
}

impl SenderOrder {
    /// The order of the sender owning `series` (not empty).
    pub fn new(order: Order, seed: u64, series: &Range<u64>, values_per_series: u32) -> SenderOrder {
        let series_here = series.end - series.start;
        assert!(series_here > 0, "a sender owns at least one series");
        let key = mix64(seed ^ mix64(series.start ^ 0x6f72_6465_725f_6b65));
        let plan = match order {
            Order::Sequential => Plan::Sequential,
            Order::Random => Plan::Random { bits: u64::BITS - (series_here - 1).leading_zeros(), key },
            Order::Zipf { exponent } => Plan::Zipf { sampler: Zipf::new(series_here, exponent), key },
        };
        SenderOrder { first: series.start, series_here, values_per_series: values_per_series.max(1), plan }
    }

    /// The series and pass (in `0..values_per_series`) of line `line`.
    pub fn line(&self, line: u64) -> (u64, u32) {
        let pass_number = line / self.series_here;
        let pass = (pass_number % u64::from(self.values_per_series)) as u32;
        let position = line % self.series_here;
        let offset = match &self.plan {
            Plan::Sequential => position,
            Plan::Random { bits, key } => Permutation::new(*bits, *key, pass).apply(position, self.series_here),
            Plan::Zipf { sampler, key } => {
                let place_in_cycle = line % self.cycle_lines();
                let mut draw = mix64(key ^ place_in_cycle.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let rank = sampler.sample(|| {
                    draw = mix64(draw);
                    (draw >> 11) as f64 / (1u64 << 53) as f64
                });
                rank - 1
            }
        };
        (self.first + offset, pass)
    }

    /// Lines in one cycle: `values_per_series` passes of every series.
    pub fn cycle_lines(&self) -> u64 {
        self.series_here * u64::from(self.values_per_series)
    }

    /// What each series got once the sender sent `lines_sent` lines.
    pub fn tallies(&self, lines_sent: u64) -> Tallies {
        match &self.plan {
            Plan::Sequential | Plan::Random { .. } => {
                let (rounds, extra) = (lines_sent / self.series_here, lines_sent % self.series_here);
                // Pass `rounds` is the one cut short, if one was.
                let cut_pass = (rounds % u64::from(self.values_per_series)) as u32;
                let unvisit = match &self.plan {
                    Plan::Random { bits, key } => Some(Permutation::new(*bits, *key, cut_pass)),
                    _ => None,
                };
                Tallies::Passes {
                    first: self.first,
                    series_here: self.series_here,
                    values_per_series: self.values_per_series,
                    rounds,
                    extra,
                    unvisit,
                }
            }
            Plan::Zipf { .. } => Tallies::Counted { first: self.first, tallies: self.replay(lines_sent) },
        }
    }

    /// Replays the sender's draws to count what each series got: the lines
    /// up to `lines_sent % cycle`, then the rest of the first cycle, whose
    /// tallies stand for every whole cycle sent.
    fn replay(&self, lines_sent: u64) -> Vec<Tally> {
        let cycle = self.cycle_lines();
        let slots = usize::try_from(self.series_here).expect("series fit in memory");
        let mut tallies = vec![Tally::default(); slots];
        if lines_sent < cycle {
            self.count_lines(0..lines_sent, &mut tallies);
            return tallies;
        }
        let remainder = lines_sent % cycle;
        self.count_lines(0..remainder, &mut tallies);
        let partial_cycle = tallies.clone();
        self.count_lines(remainder..cycle, &mut tallies);
        let whole_cycles = lines_sent / cycle;
        for (tally, partial) in tallies.iter_mut().zip(partial_cycle) {
            // The cycle's tally covers every (series, pass) sent, so its
            // distinct passes stand; the last line came from the partial
            // cycle when it reached the series.
            tally.lines = tally.lines * whole_cycles + partial.lines;
            if partial.lines > 0 {
                tally.last_pass = partial.last_pass;
            }
        }
        tallies
    }

    /// Adds lines `lines` (within one cycle, so their passes only grow) to
    /// `tallies`.
    fn count_lines(&self, lines: Range<u64>, tallies: &mut [Tally]) {
        for line in lines {
            let (series, pass) = self.line(line);
            let tally = &mut tallies[(series - self.first) as usize];
            if tally.lines == 0 || tally.last_pass != pass {
                tally.passes += 1;
            }
            tally.last_pass = pass;
            tally.lines += 1;
        }
    }
}

/// What each series of one sender got ([`SenderOrder::tallies`]).
#[derive(Debug)]
pub enum Tallies {
    /// Whole passes, then part of one (sequential and random orders).
    Passes {
        /// The sender's first series.
        first: u64,
        /// Its series.
        series_here: u64,
        /// Passes in a cycle.
        values_per_series: u32,
        /// Whole passes sent.
        rounds: u64,
        /// Lines of the pass cut short.
        extra: u64,
        /// The random order of the pass cut short, to find a series' place in it.
        unvisit: Option<Permutation>,
    },
    /// Counted line by line (zipf order), by series offset.
    Counted {
        /// The sender's first series.
        first: u64,
        /// One per series.
        tallies: Vec<Tally>,
    },
}

impl Tallies {
    /// What `series` (one of the sender's) got.
    pub fn get(&self, series: u64) -> Tally {
        match self {
            Tallies::Passes { first, series_here, values_per_series, rounds, extra, unvisit } => {
                let offset = series - first;
                let place = match unvisit {
                    Some(permutation) => permutation.invert(offset, *series_here),
                    None => offset,
                };
                let lines = rounds + u64::from(place < *extra);
                let values = u64::from(*values_per_series);
                Tally { lines, last_pass: (lines.saturating_sub(1) % values) as u32, passes: lines.min(values) as u32 }
            }
            Tallies::Counted { first, tallies } => tallies[(series - first) as usize],
        }
    }
}

/// A bijection of `0..2^bits` (see the module doc), restricted to `0..n`
/// by cycle walking.
#[derive(Debug, Clone, Copy)]
pub struct Permutation {
    mask: u64,
    shift: u32,
    keys: [u64; PERMUTATION_ROUNDS],
    multipliers: [u64; PERMUTATION_ROUNDS],
}

impl Permutation {
    /// The permutation of pass `pass` (within the cycle) of `2^bits` places.
    pub fn new(bits: u32, key: u64, pass: u32) -> Permutation {
        let mask = if bits == 0 { 0 } else { u64::MAX >> (u64::BITS - bits) };
        let pass_key = mix64(key ^ mix64(u64::from(pass)));
        let mut permutation = Permutation {
            mask,
            shift: bits.div_ceil(2),
            keys: [0; PERMUTATION_ROUNDS],
            multipliers: [0; PERMUTATION_ROUNDS],
        };
        for round in 0..PERMUTATION_ROUNDS {
            let round_key = mix64(pass_key.wrapping_add(round as u64));
            permutation.keys[round] = round_key & mask;
            permutation.multipliers[round] = mix64(round_key) | 1;
        }
        permutation
    }

    /// The place `position` (below `n`, `n <= 2^bits`) is sent to, below `n`.
    pub fn apply(&self, position: u64, n: u64) -> u64 {
        let mut place = self.forward(position);
        while place >= n {
            place = self.forward(place);
        }
        place
    }

    /// The position (below `n`) that [`Permutation::apply`] sends to `place`.
    pub fn invert(&self, place: u64, n: u64) -> u64 {
        let mut position = self.backward(place);
        while position >= n {
            position = self.backward(position);
        }
        position
    }

    fn forward(&self, mut value: u64) -> u64 {
        for round in 0..PERMUTATION_ROUNDS {
            value ^= self.keys[round];
            value = value.wrapping_mul(self.multipliers[round]) & self.mask;
            value ^= value >> self.shift;
        }
        value
    }

    fn backward(&self, mut value: u64) -> u64 {
        for round in (0..PERMUTATION_ROUNDS).rev() {
            // `2 * shift >= bits`, so the xorshift is its own inverse.
            value ^= value >> self.shift;
            value = value.wrapping_mul(inverse_mod_2_64(self.multipliers[round])) & self.mask;
            value ^= self.keys[round];
        }
        value
    }
}

/// The inverse of odd `multiplier` modulo 2^64, by Newton's iteration (each
/// step doubles the correct low bits; odd numbers are their own inverse
/// modulo 8).
fn inverse_mod_2_64(multiplier: u64) -> u64 {
    let mut inverse = multiplier;
    for _ in 0..5 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(multiplier.wrapping_mul(inverse)));
    }
    inverse
}

/// Zipf ranks `1..=n`, `P(r)` proportional to `1 / r^exponent`, by
/// rejection-inversion: a uniform draw is mapped through the inverse of the
/// integral `H` of the hat function `h(x) = x^-exponent`, rounded to a rank,
/// and accepted unless it falls in the part of the hat above the rank's
/// probability. `H(x) = (x^(1 - exponent) - 1) / (1 - exponent)` (`ln x`
/// at exponent 1) is well defined for every exponent above 0.
#[derive(Debug, Clone, Copy)]
pub struct Zipf {
    ranks: f64,
    exponent: f64,
    /// `H(1.5) - 1`: the lower end of the uniform range.
    integral_below_one: f64,
    /// `H(n + 0.5)`: its upper end.
    integral_to_n: f64,
    /// `2 - H⁻¹(H(2.5) - h(2))`: below this distance to the rank a draw is
    /// accepted without computing `H` again.
    squeeze: f64,
}

impl Zipf {
    /// The distribution over `1..=ranks` (at least 1) with `exponent` (above 0).
    pub fn new(ranks: u64, exponent: f64) -> Zipf {
        let mut zipf =
            Zipf { ranks: ranks as f64, exponent, integral_below_one: 0.0, integral_to_n: 0.0, squeeze: 0.0 };
        zipf.integral_below_one = zipf.integral(1.5) - 1.0;
        zipf.integral_to_n = zipf.integral(zipf.ranks + 0.5);
        zipf.squeeze = 2.0 - zipf.integral_inverse(zipf.integral(2.5) - zipf.hat(2.0));
        zipf
    }

    /// A rank, from the uniforms in `[0, 1)` that `uniform` returns (more
    /// than one when a draw is rejected).
    pub fn sample(&self, mut uniform: impl FnMut() -> f64) -> u64 {
        loop {
            let u = self.integral_to_n + uniform() * (self.integral_below_one - self.integral_to_n);
            let x = self.integral_inverse(u);
            let rank = (x + 0.5).floor().clamp(1.0, self.ranks);
            if rank - x <= self.squeeze || u >= self.integral(rank + 0.5) - self.hat(rank) {
                return rank as u64;
            }
        }
    }

    /// `h(x) = x^-exponent`.
    fn hat(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    /// `H(x)`, the integral of `h` from 1.
    fn integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.exponent) * log_x) * log_x
    }

    /// `H⁻¹(x)`.
    fn integral_inverse(&self, x: f64) -> f64 {
        // Rounding can take it just below -1.
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, by its Taylor series near 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.ln_1p() / x } else { 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)) }
}

/// `(e^x - 1) / x`, by its Taylor series near 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.exp_m1() / x } else { 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x)) }
}
