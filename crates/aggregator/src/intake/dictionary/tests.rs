use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use prost::Message;
use tessera_core::aggregate::{Aggregate, Distribution, Gauge};
use tessera_core::shard::shard_of;
use tessera_proto::frame::Body;
use tessera_proto::{Frame, PartialBatch, SeriesValue, ShardPartials};
use tessera_topology::{Placement, PlacementHandle};

use super::*;
use crate::intake::{Decoded, Decoder};
use crate::tile::{Tiler, TilerSettings, WindowPartials};

#[test]
fn slots_are_dense_per_thread_and_kept_for_a_repeated_definition() {
    let mut dictionary = ConnectionDictionary::default();
    dictionary.restart(7);
    assert_eq!(dictionary.define(1, MetricKind::Counter, 4, 0), 0);
    assert_eq!(dictionary.define(2, MetricKind::Counter, 5, 1), 0);
    assert_eq!(dictionary.define(9, MetricKind::Gauge, 6, 0), 1);
    assert_eq!(dictionary.define(1, MetricKind::Counter, 4, 0), 0, "sent again: same slot");
    assert_eq!(dictionary.define(1, MetricKind::Gauge, 4, 0), 2, "redefined as another series: a new slot");
    assert_eq!((dictionary.len(), dictionary.get(9).map(|entry| entry.shard)), (3, Some(6)));
    assert!(dictionary.get(3).is_none() && dictionary.get(1000).is_none());
    dictionary.restart(8);
    assert!(dictionary.is_empty() && dictionary.get(1).is_none());
}

#[test]
fn a_rollback_undoes_the_definitions_of_the_refused_batch_only() {
    let mut dictionary = ConnectionDictionary::default();
    dictionary.restart(1);
    dictionary.begin();
    dictionary.define(1, MetricKind::Counter, 4, 0);
    dictionary.begin();
    dictionary.define(2, MetricKind::Counter, 5, 0);
    dictionary.define(1, MetricKind::Gauge, 4, 0);
    dictionary.rollback();
    assert_eq!(dictionary.len(), 1);
    assert!(dictionary.get(2).is_none());
    let kept = dictionary.get(1).expect("defined by the batch before");
    assert_eq!((kept.kind, kept.slot), (MetricKind::Counter, 0));
    assert_eq!(dictionary.define(3, MetricKind::Set, 6, 0), 3, "slots handed out are not reused");
}

// Equivalence: the same partials, sent by id or through dictionaries, merge
// into the same tiles. The frames go through the real decoder (one per
// aggregator, with its per-connection dictionaries) and the real merge
// threads' tilers (two, so slots are dense per thread); only the
// collector's side is written out here, following the wire contract.

/// A time on a minute boundary.
const T0: i64 = 1_700_000_040_000;
const SHARDS: u32 = 8;
const MERGE_THREADS: usize = 2;
const SERIES: usize = 24;

/// Series `index`: a counter, a gauge or a timer, by `index % 3`.
fn series(index: usize) -> (MetricKind, Vec<u8>) {
    let kind = [MetricKind::Counter, MetricKind::Gauge, MetricKind::Timer][index % 3];
    (kind, format!("svc.metric_{index}|env=prod").into_bytes())
}

fn aggregate(kind: MetricKind, value: f64, window_start_ms: i64) -> Aggregate {
    match kind {
        MetricKind::Counter => Aggregate::Counter(value),
        MetricKind::Gauge => {
            let stamp_ns = window_start_ms * 1_000_000 + value as i64;
            let mut gauge = Gauge::with_value(value, stamp_ns);
            gauge.add_delta(1.5, stamp_ns + 1);
            Aggregate::Gauge(Box::new(gauge))
        }
        _ => {
            let mut distribution = Distribution::default();
            distribution.insert(value, 1.0);
            distribution.insert(value * 3.0 + 1.0, 2.0);
            Aggregate::Distribution(Box::new(distribution))
        }
    }
}

/// How one collector sends one window's batch.
#[derive(Debug, Clone, Copy)]
enum Send {
    /// In its current dictionary.
    Dictionary,
    /// In a new dictionary (a reconnect, a dropped batch, a rotation).
    NewDictionary,
    /// In full, with no dictionary (a stale batch re-sent expanded).
    Expanded,
}

/// One collector's batch for one window: which series, with what values.
#[derive(Debug, Clone)]
struct Window {
    connection: u64,
    send: Send,
    /// Refused after decoding (too late, buffers full): nothing merged,
    /// but later batches of its dictionary may name its series by ref.
    refused: bool,
    /// Seconds without any window before this one.
    gap_secs: i64,
    values: Vec<(usize, f64)>,
}

fn windows() -> impl Strategy<Value = Vec<Window>> {
    let send = prop_oneof![6 => Just(Send::Dictionary), 1 => Just(Send::NewDictionary), 1 => Just(Send::Expanded)];
    let values = proptest::collection::btree_map(0..SERIES, 1u32..1_000, 1..SERIES)
        .prop_map(|values| values.into_iter().map(|(series, value)| (series, f64::from(value))).collect());
    let refused = proptest::bool::weighted(0.15);
    let window = (0u64..2, send, refused, 0i64..4, values).prop_map(|(connection, send, refused, gap_secs, values)| {
        Window { connection, send, refused, gap_secs, values }
    });
    proptest::collection::vec(window, 1..40)
}

/// A collector's side of the dictionary, as the wire contract has it.
#[derive(Default)]
struct Sender {
    generation: u64,
    refs: HashMap<usize, u32>,
}

/// The frame one collector sends for `window` (window number `index`, starting at `start_ms`).
fn frame(window: &Window, index: usize, start_ms: i64, senders: Option<&mut HashMap<u64, Sender>>) -> Vec<u8> {
    let mut groups: BTreeMap<u32, Vec<SeriesValue>> = BTreeMap::new();
    let mut dictionary = 0;
    let mut sender = senders.map(|senders| senders.entry(window.connection).or_default());
    if let Some(sender) = sender.as_deref_mut() {
        if matches!(window.send, Send::NewDictionary) || sender.generation == 0 {
            sender.generation += 1;
            sender.refs.clear();
        }
        if !matches!(window.send, Send::Expanded) {
            dictionary = sender.generation;
        }
    }
    for &(index_of_series, value) in &window.values {
        let (kind, id) = series(index_of_series);
        let shard = shard_of(&id, SHARDS);
        let mut wire = SeriesValue {
            r#ref: 0,
            series_id: id,
            r#type: tessera_core::aggregate::kind_to_proto(kind) as i32,
            aggregate: Some(aggregate(kind, value, start_ms).to_proto()),
        };
        if let Some(sender) = sender.as_deref_mut().filter(|_| dictionary != 0) {
            let next = sender.refs.len() as u32 + 1;
            match sender.refs.get(&index_of_series) {
                Some(&known) => {
                    wire.r#ref = known;
                    wire.series_id.clear();
                    wire.r#type = 0;
                }
                None => {
                    sender.refs.insert(index_of_series, next);
                    wire.r#ref = next;
                }
            }
        }
        groups.entry(shard).or_default().push(wire);
    }
    let batch = PartialBatch {
        sequence: index as u64,
        window_start_ms: start_ms,
        window_ms: 1_000,
        dictionary,
        shards: groups.into_iter().map(|(shard, series)| ShardPartials { shard, series }).collect(),
        ..PartialBatch::default()
    };
    Frame { body: Some(Body::Partials(batch)) }.encode_to_vec()
}

/// Every closed tile's value per (policy, tile end, series id).
type Tiles = BTreeMap<(usize, i64, Vec<u8>), tessera_proto::SeriesValue>;

/// Sends `windows` through a decoder and the merge threads' tilers, with
/// or without dictionaries, and closes every tile. With `expiring`, tiles
/// are 1 s and 5 s, close before each later window, and a series idle for
/// one tile expires (its number is reused, by another kind too).
fn merge(windows: &[Window], with_dictionary: bool, expiring: bool) -> Tiles {
    let placement = PlacementHandle::fixed(Placement::init(&[("a", "h:1")], SHARDS, 1, 0).expect("a valid placement"));
    let mut decoder = Decoder::new("a".to_owned(), placement, MERGE_THREADS);
    let policies = if expiring { ["1s:1h", "5s:1h"] } else { ["10s:2d", "1m:40d"] };
    let mut settings = TilerSettings::new(policies.iter().map(|policy| policy.parse().expect("policy")).collect());
    if expiring {
        settings.expire_after_empty_tiles = Some(1);
    }
    let mut tilers: Vec<Tiler> = (0..MERGE_THREADS).map(|_| Tiler::new(settings.clone(), T0)).collect();
    let mut senders = HashMap::new();
    let mut tiles = Tiles::new();
    let mut emit = |tile: crate::tile::ClosedTile| {
        for value in tile.values {
            let previous = tiles.insert((tile.policy_index, tile.tile_end_ms, value.series_id.clone()), value);
            assert!(previous.is_none(), "a tile closed twice");
        }
    };
    let mut start_ms = T0;
    for (index, window) in windows.iter().enumerate() {
        start_ms += (1 + window.gap_secs) * 1_000;
        if expiring {
            tilers.iter_mut().for_each(|tiler| tiler.close_through(start_ms, &mut emit));
        }
        let frame = frame(window, index, start_ms, with_dictionary.then_some(&mut senders));
        let batch = match decoder.decode(window.connection, &frame) {
            Decoded::Batch { batch, .. } => batch,
            other => panic!("window {index} was not accepted: {other:?}"),
        };
        if let Some(connection) = decoder.take_forgotten() {
            tilers.iter_mut().for_each(|tiler| tiler.forget_dictionary(connection));
        }
        for (tiler, share) in tilers.iter_mut().zip(batch.shares) {
            let batch = WindowPartials {
                connection: window.connection,
                window_start_ms: batch.window_start_ms,
                window_ms: batch.window_ms,
                partials: share,
            };
            if window.refused {
                tiler.bind_definitions(&batch);
                continue;
            }
            let applied = tiler.apply(&batch, &mut emit);
            assert_eq!((applied.unknown_refs, applied.series_limit), (0, 0));
        }
    }
    tilers.iter_mut().for_each(|tiler| tiler.close_all(&mut emit));
    tiles
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_same_partials_merge_into_the_same_tiles_with_or_without_dictionaries(windows in windows()) {
        same_tiles_with_or_without_dictionaries(&windows, false)?;
    }

    #[test]
    fn the_same_partials_merge_into_the_same_tiles_with_or_without_dictionaries_while_series_expire(
        windows in windows()
    ) {
        same_tiles_with_or_without_dictionaries(&windows, true)?;
    }
}

fn same_tiles_with_or_without_dictionaries(windows: &[Window], expiring: bool) -> Result<(), TestCaseError> {
    let by_id = merge(windows, false, expiring);
    let by_dictionary = merge(windows, true, expiring);
    let merged = windows.iter().any(|window| !window.refused);
    prop_assert_eq!(by_id.is_empty(), !merged);
    prop_assert_eq!(by_id.len(), by_dictionary.len());
    for (key, value) in &by_id {
        prop_assert_eq!(Some(value), by_dictionary.get(key), "tile {:?}", key);
    }
    Ok(())
}
