//! Tiling: 1 s partials merged into epoch-aligned tiles, one set of tiles
//! per storage policy, closed `buffer_past` after their end.
//!
//! # Model
//!
//! Each policy tiles **independently from the partials**: a partial of the
//! window starting at `w` is merged into the tile starting at
//! `floor(w / resolution) * resolution` of every policy. This is the
//! simplest exact choice: no tile is derived from another, so a 1 min tile
//! never depends on whether its 10 s tiles were complete, and the sum of a
//! policy's tiles equals the sum of the partials accepted while its tiles were open
//! (a window too late for a 10 s tile still counts in its 1 min tile: *Admission*).
//!
//! Every series gets a number from the tiler's [`series::Registry`]
//! when first seen: its id is hashed and compared there, once per partial
//! (or never, for a partial that came by a connection dictionary's
//! reference, `intake/dictionary.rs`). A policy keeps `R` tables indexed by
//! series number (see [`tables_per_policy`]); the tile with index
//! `i = start / resolution` lives in table `i mod R`. `R` is the most tiles
//! that can be open at once: from the oldest tile not yet closed
//! (`now - buffer_past`) to the newest a partial may reach
//! (`now + buffer_future`). Tables are reused from tile to tile, so merging
//! into a known series allocates nothing. A series idle for
//! `expire_after_empty_tiles` tiles of every policy is forgotten and its
//! number reused.
//!
//! # Admission
//!
//! [`Tiler::accept`] first closes every tile that is due at `now`, then
//! checks the batch as a whole:
//!
//! - a window that crosses a tile boundary is refused ([`Refusal::Misaligned`]);
//! - a window ending after `now + buffer_future` is refused ([`Refusal::TooEarly`]);
//! - a window whose tile of the coarsest policy is already closed is refused
//!   ([`Refusal::TooLate`]): every finer tile of it has closed too;
//! - a window whose tile of **some** policy is closed goes whole into the tiles of the
//!   others, still open ([`Admitted::late`]): the finest policy closes first, so a window
//!   too late for its 10 s tile still counts in its 1 min tile. A coarser tile holds at
//!   least what its finer tiles hold; it holds more when a window came too late for one of
//!   them. (Refusing such a window whole, as tessera did first, left the 1 min tile short
//!   of it on this replica alone: two replicas' incomplete copies could each lack a window
//!   the other held, and the one written lost it. RELIABILITY.md, fix 22.)
//!
//! Gauges are resolved when a tile is cut: a gauge that only received
//! `+N`/`-N` deltas is added to the value the series had at the end of its
//! previous tile ([`Gauge::resolve`](tessera_core::aggregate::Gauge::resolve)).
//!
//! ```
//! use tessera_aggregator::{WindowPartials, Partial, Tiler, TilerSettings, Via};
//! use tessera_core::{aggregate::Aggregate, parse::MetricKind};
//!
//! let settings = TilerSettings::new(vec!["10s:2d".parse().unwrap()]);
//! let mut tiler = Tiler::new(settings, 1_000_000);
//! let batch = WindowPartials {
//!     window_start_ms: 1_000_000,
//!     window_ms: 1_000,
//!     connection: 0,
//!     partials: vec![Partial { via: Via::Id, kind: MetricKind::Counter, id: b"hits".to_vec(), aggregate: Aggregate::Counter(3.0) }],
//! };
//! let mut closed = Vec::new();
//! tiler.accept(&batch, 1_001_200, &mut |tile| closed.push(tile)).unwrap();
//! tiler.close_due(1_012_000, &mut |tile| closed.push(tile));
//! let tile = closed.iter().find(|tile| !tile.values.is_empty()).unwrap();
//! assert_eq!(tile.tile_end_ms, 1_010_000);
//! assert_eq!(tile.values.len(), 1);
//! ```

use std::collections::HashMap;
use std::time::Duration;

use tessera_proto as proto;

use super::policy::StoragePolicy;
use crate::intake::{Partial, Via};
use policy_tiles::PolicyTiles;
use series::{Prepared, Registry, RegistryFull, SeriesNumber};
use tessera_proto::AckReason;

/// A dictionary slot bound to no series.
const UNBOUND: SeriesNumber = SeriesNumber::MAX;

/// Partials named by id whose registry lookups are started together ([`Tiler::apply`]):
/// at a million series each lookup misses the cache twice, and a group's misses overlap.
const RESOLVE_GROUP: usize = 16;

/// A dictionary slot defined for a series the series cap refused: its refs
/// count as `series_limit` drops, like the series' partials by id.
const CAPPED: SeriesNumber = SeriesNumber::MAX - 1;

/// The partials of one window from one sender.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WindowPartials {
    /// The connection it came on, whose dictionary its [`Via`] slots index.
    pub connection: u64,
    /// Window start, unix milliseconds.
    pub window_start_ms: i64,
    /// Window length, milliseconds.
    pub window_ms: i64,
    /// Every series' partial.
    pub partials: Vec<Partial>,
}

/// Settings of a [`Tiler`].
#[derive(Debug, Clone, PartialEq)]
pub struct TilerSettings {
    /// The storage policies, each tiled independently.
    pub policies: Vec<StoragePolicy>,
    /// A tile closes this long after its end when nothing else says when
    /// ([`Tiler::close_due`]).
    pub buffer_past_ms: i64,
    /// The longest a tile may stay open after its end (the watermark
    /// closes it sooner, [`Watermarks`](crate::Watermarks)); sizes the tables kept.
    pub max_buffer_past_ms: i64,
    /// Windows ending more than this after now are refused.
    pub buffer_future_ms: i64,
    /// Series are forgotten after about this many tiles without data.
    pub expire_after_empty_tiles: Option<u32>,
    /// Most series per table.
    pub max_series_per_policy: Option<usize>,
}

impl TilerSettings {
    /// `policies` with 2 s buffers (no watermark slack), expiry after 30
    /// empty tiles, no series cap.
    pub fn new(policies: Vec<StoragePolicy>) -> TilerSettings {
        TilerSettings {
            policies,
            buffer_past_ms: 2_000,
            max_buffer_past_ms: 2_000,
            buffer_future_ms: 2_000,
            expire_after_empty_tiles: Some(30),
            max_series_per_policy: None,
        }
    }
}

/// Why a batch was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The window is empty or crosses a tile boundary.
    #[error("window of {window_ms} ms at {window_start_ms} does not fit in one tile of policy `{policy}`")]
    Misaligned {
        /// Window start.
        window_start_ms: i64,
        /// Window length.
        window_ms: i64,
        /// The policy whose tile boundary it crosses.
        policy: String,
    },
    /// The window ends too far in the future.
    #[error("window ending at {window_end_ms} is more than {buffer_future_ms} ms ahead of now ({now_ms})")]
    TooEarly {
        /// Window end.
        window_end_ms: i64,
        /// The allowance.
        buffer_future_ms: i64,
        /// The tiler's clock.
        now_ms: i64,
    },
    /// The window's tile of the coarsest policy is already closed (and so are its others).
    #[error("window at {window_start_ms} is too late: its `{policy}` tile ending at {tile_end_ms} is closed")]
    TooLate {
        /// Window start.
        window_start_ms: i64,
        /// The coarsest policy, whose tile is closed.
        policy: String,
        /// End of that tile.
        tile_end_ms: i64,
    },
}

impl Refusal {
    /// The ack reason and metrics label.
    pub fn reason(&self) -> AckReason {
        match self {
            Refusal::Misaligned { .. } => AckReason::Malformed,
            Refusal::TooEarly { .. } => AckReason::TooEarly,
            Refusal::TooLate { .. } => AckReason::TooLate,
        }
    }
}

/// What merging one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Partials in the batch.
    pub partials: u64,
    /// Series first seen.
    pub new_series: u64,
    /// Partials of new series refused because the series cap was reached
    /// (by id, or by a ref defined while the cap was reached).
    pub series_limit: u64,
    /// Gauge merges whose order was ambiguous (counted once per policy).
    pub gauge_order_ambiguous: u64,
    /// Distribution merges that dropped fixed buckets (counted once per policy).
    pub buckets_dropped: u64,
    /// Partials of new series refused near the memory limit.
    pub memory_limit: u64,
    /// Partials naming a dictionary slot this thread never saw defined
    /// (dropped; the decoder refuses unknown refs, so this means a sender
    /// that broke the dictionary's rules in a way it could not see).
    pub unknown_refs: u64,
}

/// A tile that closed, cut into wire values.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosedTile {
    /// Index of the policy in [`TilerSettings::policies`].
    pub policy_index: usize,
    /// The policy.
    pub policy: StoragePolicy,
    /// Tile start, unix milliseconds.
    pub tile_start_ms: i64,
    /// Tile end, unix milliseconds (what tile batches are stamped with).
    pub tile_end_ms: i64,
    /// One value per series that received data in the tile; empty when the
    /// tile got none (it is reported for its expiry count only).
    pub values: Vec<proto::SeriesValue>,
    /// Series forgotten when this tile closed.
    pub expired: usize,
    /// Series held after the close.
    pub series_held: usize,
    /// Time the cut took.
    pub cut_duration: Duration,
    /// Closed before every collector seen around it confirmed its end
    /// ([`Watermarks::confirms`](super::Watermarks::confirms)): this copy may lack
    /// partials; it is flushed marked incomplete.
    pub unconfirmed: bool,
}

/// How many tables (open tiles) `policy` needs with these buffers:
/// `ceil((buffer_past + buffer_future) / resolution) + 1`, at least 2.
pub fn tables_per_policy(policy: &StoragePolicy, buffer_past_ms: i64, buffer_future_ms: i64) -> usize {
    let span = buffer_past_ms.max(0).saturating_add(buffer_future_ms.max(0));
    let tiles = span.div_euclid(policy.resolution_ms()) + i64::from(span % policy.resolution_ms() != 0);
    usize::try_from(tiles.saturating_add(1).max(2)).unwrap_or(usize::MAX)
}

/// The tiles of every storage policy; see the module docs (`tile/tiler.rs`).
pub struct Tiler {
    policies: Vec<PolicyTiles>,
    registry: Registry,
    /// Each connection's dictionary slots: slot → series number.
    dictionaries: HashMap<u64, Vec<SeriesNumber>>,
    buffer_past_ms: i64,
    buffer_future_ms: i64,
    /// Table index per policy for the batch being merged (`None`: its tile has closed).
    slots: Vec<Option<usize>>,
}

impl Tiler {
    /// A tiler whose first open tile is the one still open at `now_ms`.
    pub fn new(settings: TilerSettings, now_ms: i64) -> Tiler {
        let policies = settings.policies.iter().map(|policy| PolicyTiles::new(*policy, &settings, now_ms)).collect();
        Tiler {
            policies,
            registry: Registry::new(settings.max_series_per_policy),
            dictionaries: HashMap::new(),
            buffer_past_ms: settings.buffer_past_ms.max(0),
            buffer_future_ms: settings.buffer_future_ms.max(0),
            slots: Vec::with_capacity(settings.policies.len()),
        }
    }

    /// Refuses new series while `budget` sheds (the aggregator near its memory limit,
    /// counted as [`Applied::memory_limit`]); the series it holds go on.
    pub fn with_budget(mut self, budget: std::sync::Arc<tessera_core::budget::MemoryBudget>) -> Tiler {
        self.registry.set_budget(budget);
        self
    }

    /// Number of policies.
    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    /// Series held for policy `index` (every policy holds the same series).
    pub fn series_held(&self, index: usize) -> usize {
        if index < self.policies.len() { self.registry.len() } else { 0 }
    }

    /// Tables kept by policy `index`.
    pub fn tables_of(&self, index: usize) -> usize {
        self.policies.get(index).map_or(0, |policy| policy.tables.len())
    }

    /// End of the oldest open tile (of any policy), unix milliseconds.
    pub fn next_tile_end_ms(&self) -> i64 {
        self.policies
            .iter()
            .map(|policy| policy.closed_through_ms.saturating_add(policy.resolution_ms))
            .min()
            .unwrap_or(i64::MAX)
    }

    /// When the next tile is due to close on the clock alone (end +
    /// `buffer_past`), unix milliseconds.
    pub fn next_close_ms(&self) -> i64 {
        self.next_tile_end_ms().saturating_add(self.buffer_past_ms)
    }

    /// Closes every tile due at `now_ms` (end + `buffer_past` reached), in
    /// order per policy, handing each to `emit`.
    pub fn close_due(&mut self, now_ms: i64, emit: &mut dyn FnMut(ClosedTile)) {
        self.close_through(now_ms.saturating_sub(self.buffer_past_ms), emit);
    }

    /// Closes every tile ending at or before `horizon_ms`, in order per
    /// policy, handing each to `emit`. Closing only moves forward: an
    /// older horizon closes nothing.
    pub fn close_through(&mut self, horizon_ms: i64, emit: &mut dyn FnMut(ClosedTile)) {
        let mut closed = Vec::new();
        for (index, policy) in self.policies.iter_mut().enumerate() {
            let target = policy.policy.tile_start_ms(horizon_ms);
            policy.close_until(target, index, &self.registry, &mut |tile| closed.push(tile));
        }
        self.emit_expiring(closed, emit);
    }

    /// Forgets the series idle for long enough in every policy, counts them
    /// in the last of `closed`, and hands `closed` on.
    fn emit_expiring(&mut self, mut closed: Vec<ClosedTile>, emit: &mut dyn FnMut(ClosedTile)) {
        let idle_before = self
            .policies
            .iter()
            .map(PolicyTiles::idle_before_ms)
            .try_fold(i64::MAX, |least, policy| policy.map(|idle_before| least.min(idle_before)));
        if let (Some(idle_before), Some(last)) = (idle_before, closed.last_mut()) {
            let policies = &mut self.policies;
            last.expired = self.registry.expire(idle_before, |number| {
                for policy in policies.iter_mut() {
                    policy.free(number);
                }
            });
            let held = self.registry.len();
            for tile in &mut closed {
                tile.series_held = held;
            }
        }
        for tile in closed {
            emit(tile);
        }
    }

    /// Closes every open tile now, due or not (shutdown: flush what is held).
    pub fn close_all(&mut self, emit: &mut dyn FnMut(ClosedTile)) {
        for (index, policy) in self.policies.iter_mut().enumerate() {
            let mut open: Vec<(i64, usize)> =
                policy.open.iter().enumerate().filter_map(|(slot, start)| start.map(|start| (start, slot))).collect();
            open.sort_unstable();
            for (start, slot) in open {
                policy.close_tile(slot, start, index, &self.registry, emit);
                policy.closed_through_ms = policy.closed_through_ms.max(start.saturating_add(policy.resolution_ms));
            }
        }
    }

    /// Closes what is due at `now_ms`, then merges the whole batch into every tile of its
    /// window still open, or refuses it as a whole.
    pub fn accept(
        &mut self,
        batch: &WindowPartials,
        now_ms: i64,
        emit: &mut dyn FnMut(ClosedTile),
    ) -> Result<Applied, Refusal> {
        self.close_due(now_ms, emit);
        self.check(batch.window_start_ms, batch.window_ms, now_ms)?;
        Ok(self.apply(batch, emit))
    }

    /// Merges a batch that was admitted elsewhere, closing nothing that is
    /// due: a merge thread's tiler, told when to close by the admission
    /// thread (`tile/merge.rs`), which checked the batch against the same
    /// tiles. A policy whose tile of the window has closed takes none of it (its
    /// tile is never opened again).
    pub fn apply(&mut self, batch: &WindowPartials, emit: &mut dyn FnMut(ClosedTile)) -> Applied {
        self.slots.clear();
        for (index, policy) in self.policies.iter_mut().enumerate() {
            let start = policy.policy.tile_start_ms(batch.window_start_ms);
            let open = !policy.closed_for(start);
            self.slots.push(open.then(|| policy.open_tile(start, index, &self.registry, emit)));
        }
        let mut applied = Applied { partials: batch.partials.len() as u64, ..Applied::default() };
        let (dictionaries, registry) = (&mut self.dictionaries, &mut self.registry);
        // The connection's slots, taken out on the first partial that uses them.
        let mut dictionary: Option<Vec<SeriesNumber>> = None;
        // Series named by id are resolved in groups whose misses overlap (hash and
        // prefetch each index entry, then read each and prefetch the entry it names).
        let mut prepared: [Option<Prepared>; RESOLVE_GROUP] = [None; RESOLVE_GROUP];
        for (at, partial) in batch.partials.iter().enumerate() {
            if at % RESOLVE_GROUP == 0 {
                let group = &batch.partials[at..batch.partials.len().min(at + RESOLVE_GROUP)];
                for (ahead, next) in prepared.iter_mut().zip(group) {
                    *ahead = match next.via {
                        Via::Ref { .. } => None,
                        Via::Id | Via::Define { .. } => Some(registry.prepare(next.kind, &next.id)),
                    };
                }
                for ahead in prepared[..group.len()].iter_mut().flatten() {
                    registry.guess(ahead);
                }
            }
            let number = match partial.via {
                Via::Ref { slot } => {
                    let slots =
                        dictionary.get_or_insert_with(|| dictionaries.remove(&batch.connection).unwrap_or_default());
                    match slots.get(slot as usize).copied() {
                        Some(CAPPED) => {
                            applied.series_limit += 1;
                            continue;
                        }
                        Some(number) if number != UNBOUND => number,
                        _ => {
                            applied.unknown_refs += 1;
                            continue;
                        }
                    }
                }
                Via::Id | Via::Define { .. } => {
                    let resolved = match prepared[at % RESOLVE_GROUP] {
                        Some(ahead) => registry.resolve_prepared(partial.kind, &partial.id, ahead),
                        None => registry.resolve(partial.kind, &partial.id),
                    };
                    if let Via::Define { slot } = partial.via {
                        let slots = dictionary
                            .get_or_insert_with(|| dictionaries.remove(&batch.connection).unwrap_or_default());
                        bind(slots, slot, resolved.map_or(CAPPED, |(number, _)| number), registry);
                    }
                    match resolved {
                        Ok((number, new)) => {
                            applied.new_series += u64::from(new);
                            number
                        }
                        Err(RegistryFull::Series) => {
                            applied.series_limit += 1;
                            continue;
                        }
                        Err(RegistryFull::Memory) => {
                            applied.memory_limit += 1;
                            continue;
                        }
                    }
                }
            };
            registry.touch(number, batch.window_start_ms);
            for (policy, slot) in self.policies.iter_mut().zip(&self.slots) {
                if let Some(slot) = *slot {
                    policy.tables[slot].merge(number, partial.kind, &partial.aggregate);
                }
            }
        }
        if let Some(dictionary) = dictionary {
            self.dictionaries.insert(batch.connection, dictionary);
        }
        for (policy, slot) in self.policies.iter_mut().zip(&self.slots) {
            if let Some(slot) = *slot {
                applied.gauge_order_ambiguous += policy.tables[slot].take_ambiguous_merges();
                applied.buckets_dropped += policy.tables[slot].take_buckets_dropped();
            }
        }
        applied
    }

    /// Binds the dictionary slots that `batch` defines, merging none of its
    /// values: the batch was refused after the decoder had learned its
    /// definitions, and a later batch of the same dictionary (already sent,
    /// or a retry) may name those series by ref alone. (Its partials were
    /// counted as refused: a definition the series cap refuses here is not
    /// counted again.)
    pub fn bind_definitions(&mut self, batch: &WindowPartials) {
        let mut dictionary = self.dictionaries.remove(&batch.connection).unwrap_or_default();
        for partial in &batch.partials {
            let Via::Define { slot } = partial.via else { continue };
            let number = self.registry.resolve(partial.kind, &partial.id).map_or(CAPPED, |(number, _)| number);
            bind(&mut dictionary, slot, number, &mut self.registry);
        }
        self.dictionaries.insert(batch.connection, dictionary);
    }

    /// Forgets `connection`'s dictionary (it closed, or its sender started
    /// a new one): its series may expire again.
    pub fn forget_dictionary(&mut self, connection: u64) {
        for number in self.dictionaries.remove(&connection).unwrap_or_default() {
            if is_series(number) {
                self.registry.unpin(number);
            }
        }
    }

    /// Whether a window may be merged at `now_ms`, and which policies' tiles of it have
    /// closed (it goes into the others'); nothing is changed.
    pub fn check(&self, window_start_ms: i64, window_ms: i64, now_ms: i64) -> Result<Admitted, Refusal> {
        let misaligned = |policy: String| Refusal::Misaligned { window_start_ms, window_ms, policy };
        let window_end_ms = match window_start_ms.checked_add(window_ms) {
            Some(end) if window_ms > 0 => end,
            _ => return Err(misaligned(self.policies.first().map(|p| p.policy.to_string()).unwrap_or_default())),
        };
        for policy in &self.policies {
            if policy.policy.tile_start_ms(window_start_ms) != policy.policy.tile_start_ms(window_end_ms - 1) {
                return Err(misaligned(policy.policy.to_string()));
            }
        }
        if window_end_ms > now_ms.saturating_add(self.buffer_future_ms) {
            return Err(Refusal::TooEarly { window_end_ms, buffer_future_ms: self.buffer_future_ms, now_ms });
        }
        let closed = |policy: &&PolicyTiles| policy.closed_for(policy.policy.tile_start_ms(window_start_ms));
        // The coarsest tile closes last; once it has closed, the window is refused whole, so
        // that no finer tile holds what its coarser tile lacks (after a shutdown's flush
        // closed every tile, a later window's finer tile may not have opened yet).
        if let Some(coarsest) = self.policies.iter().max_by_key(|policy| policy.resolution_ms).filter(closed) {
            return Err(Refusal::TooLate {
                window_start_ms,
                policy: coarsest.policy.to_string(),
                tile_end_ms: coarsest.policy.tile_start_ms(window_start_ms).saturating_add(coarsest.resolution_ms),
            });
        }
        Ok(Admitted { late: self.policies.iter().filter(closed).map(|policy| policy.policy).collect() })
    }
}

/// A window the tiler takes ([`Tiler::check`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    /// The policies whose tile of the window had closed: the window is missing from
    /// those tiles, and goes into the others'.
    pub late: Vec<StoragePolicy>,
}

/// Binds dictionary `slot` to series `number` (or [`CAPPED`]), pinning it there.
fn bind(dictionary: &mut Vec<SeriesNumber>, slot: u32, number: SeriesNumber, registry: &mut Registry) {
    let slot = slot as usize;
    if slot >= dictionary.len() {
        dictionary.resize(slot + 1, UNBOUND);
    }
    let bound = &mut dictionary[slot];
    if *bound != number {
        if is_series(*bound) {
            registry.unpin(*bound);
        }
        if is_series(number) {
            registry.pin(number);
        }
        *bound = number;
    }
}

/// Whether a dictionary slot's value is a series (not [`UNBOUND`] nor [`CAPPED`]).
fn is_series(number: SeriesNumber) -> bool {
    number < CAPPED
}

mod policy_tiles;
mod series;
#[cfg(test)]
mod tests;
