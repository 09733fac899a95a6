//! The flusher's watermark against reader cuts fed by hand: it never claims a window
//! whose data has not been sent, when a reader is late or has not reported yet.

use std::time::Duration;

use tessera_core::aggregate::Aggregate;
use tessera_core::parse::MetricKind;
use tessera_proto::frame::Body;
use tessera_proto::framing;
use tessera_rules::RuleSet;
use tessera_runtime::shutdown::Shutdown;
use tessera_topology::{Placement, PlacementHandle};

use crate::metrics::Metrics;
use tessera_wire::SenderSettings;

use super::*;
use crate::intake::{Cut, CutEntry, cut_links};
use crate::outbound::{Destinations, OutboundSettings, Router};

const W: i64 = 1_700_000_000_000;

struct Harness {
    flusher: Flusher,
    /// The readers' ends: pieces the flusher gives back come out of `spares`.
    links: crate::intake::CutLinks,
    destinations: Destinations,
    _runtime: tokio::runtime::Runtime,
}

fn harness(readers: usize) -> Harness {
    harness_with_rules(readers, "")
}

/// A flusher whose rules are `rules` (the `[rules]` table, without its header).
fn harness_with_rules(readers: usize, rules: &str) -> Harness {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (links, flusher_links) = cut_links(16, 16);
    // Senders stop at once: what is flushed stays in the queue for the test to read.
    let stop_senders = Shutdown::new();
    stop_senders.trigger();
    let outbound = OutboundSettings {
        window_ms: 1_000,
        max_frame_bytes: 1 << 20,
        max_queue_bytes: 1 << 20,
        series_dictionary: false,
        sender: SenderSettings {
            source: "host-1".into(),
            role: tessera_proto::Role::Collector,
            peer: "aggregator",
            connect_timeout: Duration::from_millis(100),
            ack_timeout: Duration::from_millis(100),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(100),
            rejection_label: tessera_proto::AckReason::label,
            heartbeat: None,
            tls: None,
            redirect: None,
        },
    };
    let metrics = Metrics::default();
    let rules = toml::from_str(rules).unwrap();
    let rules = RuleSet::compile(None, &rules, &metrics.rules).unwrap();
    let rules = Arc::new(RulesHandle::new(rules));
    let settings = FlushSettings { window_ms: 1_000, flush_delay_ms: 150, readers, rules, rules_idle_ms: 10_000 };
    let placement = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:9")], 4, 1, 0).unwrap());
    let destinations = Destinations::new(outbound.max_queue_bytes, metrics.senders.clone(), metrics.drops.clone());
    {
        let _inside = runtime.enter();
        destinations.start_senders(&outbound.sender, &stop_senders);
    }
    let router = Router::new(outbound, placement, destinations.clone(), metrics.drops.clone());
    let flusher = Flusher::new(flusher_links, settings, router, metrics.window, metrics.rules);
    Harness { flusher, links, destinations, _runtime: runtime }
}

fn cut(reader: usize, window_start_ms: i64, through_ms: i64, ids: &[&str]) -> Cut {
    let mut cut = Cut { reader, window_start_ms, through_ms, ..Cut::default() };
    for id in ids {
        let id_start = cut.ids.len() as u32;
        cut.ids.extend_from_slice(id.as_bytes());
        let id_end = cut.ids.len() as u32;
        cut.entries.push(CutEntry { kind: MetricKind::Counter, id_start, id_end, aggregate: Aggregate::Counter(1.0) });
    }
    cut
}

/// One piece of reader 0's cut of window `W`: the last one (`more` false) says the
/// reader got to the next window.
fn piece(ids: &[&str], more: bool) -> Cut {
    let through = if more { W } else { W + 1_000 };
    Cut { more, ..cut(0, W, through, ids) }
}

/// Every batch queued so far, decoded, in send order (taken off the queues).
fn sent_batches(destinations: &Destinations) -> Vec<tessera_proto::PartialBatch> {
    let mut batches = Vec::new();
    for queue in destinations.entries().iter().map(|entry| entry.queue.clone()) {
        while let Some(batch) = queue.pop_front() {
            let (frame, _) = framing::decode_frame(&batch.frame, 1 << 20).unwrap().unwrap();
            let Some(Body::Partials(partials)) = frame.body else { panic!("not partials") };
            batches.push(partials);
        }
    }
    batches
}

/// Every batch queued so far: (window start, partials, watermark), in send order.
fn sent(destinations: &Destinations) -> Vec<(i64, usize, i64)> {
    let count = |batch: &tessera_proto::PartialBatch| batch.shards.iter().map(|shard| shard.series.len()).sum();
    sent_batches(destinations).iter().map(|batch| (batch.window_start_ms, count(batch), batch.watermark_ms)).collect()
}

/// Every series sent so far: (window start, id, counter value), sorted.
fn sent_series(destinations: &Destinations) -> Vec<(i64, String, f64)> {
    let mut series = Vec::new();
    for batch in sent_batches(destinations) {
        for value in batch.shards.iter().flat_map(|shard| &shard.series) {
            let Some(tessera_proto::aggregate::Value::Counter(counter)) =
                value.aggregate.as_ref().and_then(|aggregate| aggregate.value.clone())
            else {
                panic!("not a counter: {value:?}")
            };
            series.push((batch.window_start_ms, String::from_utf8_lossy(&value.series_id).into_owned(), counter));
        }
    }
    series.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    series
}

/// Once a batch says everything ending at or before M was sent, no later batch may
/// carry data for a window ending at or before M.
fn assert_truthful(batches: &[(i64, usize, i64)]) {
    let mut claimed = 0;
    for &(window, partials, watermark) in batches {
        if partials > 0 {
            assert!(window + 1_000 > claimed, "data of the window at {window} after watermark {claimed}: {batches:?}");
        }
        claimed = claimed.max(watermark);
    }
}

#[test]
fn a_late_reader_holds_the_watermark_and_its_cut_still_goes_out_below_it() {
    let mut harness = harness(2);
    // Reader 0 moves past W; reader 1 has not reported at all yet.
    harness.flusher.merge(cut(0, W, W + 1_000, &["a"]));
    harness.flusher.flush_due(W + 1_000 + 10);
    assert!(sent(&harness.destinations).is_empty(), "W is neither complete nor past its flush delay");
    // The flush delay passes: W goes out without reader 1, and claims nothing.
    harness.flusher.flush_due(W + 1_000 + 200);
    let first = sent(&harness.destinations);
    assert_eq!(first.iter().map(|batch| batch.1).sum::<usize>(), 1);
    assert!(first.iter().all(|batch| batch.2 == 0), "no watermark before every reader reported: {first:?}");
    // Reader 1 hands in its cut of W late; reader 0 goes on to W + 1 s.
    harness.flusher.merge(cut(1, W, W + 2_000, &["b"]));
    harness.flusher.merge(cut(0, W + 1_000, W + 2_000, &["a"]));
    harness.flusher.flush_due(W + 2_000 + 10);
    let mut all = first;
    all.extend(sent(&harness.destinations));
    assert_truthful(&all);
    assert_eq!(all.iter().map(|batch| batch.1).sum::<usize>(), 3, "{all:?}");
    assert_eq!(all.last().unwrap().2, W + 2_000, "both readers are past W + 1 s and it was sent: {all:?}");
}

#[test]
fn idle_windows_are_announced_and_the_watermark_follows_the_slowest_reader() {
    let mut harness = harness(2);
    harness.flusher.merge(cut(0, W, W + 3_000, &[]));
    harness.flusher.merge(cut(1, W, W + 1_000, &[]));
    harness.flusher.flush_due(W + 3_100);
    let batches = sent(&harness.destinations);
    assert_eq!(batches, vec![(W, 0, W + 1_000)], "one empty batch, up to the slower reader");
    harness.flusher.merge(cut(1, W + 1_000, W + 3_000, &[]));
    harness.flusher.flush_due(W + 3_200);
    assert_eq!(sent(&harness.destinations), vec![(W + 2_000, 0, W + 3_000)]);
    // Nothing new: nothing sent.
    harness.flusher.flush_due(W + 3_300);
    assert!(sent(&harness.destinations).is_empty());
}

#[test]
fn a_window_goes_out_under_the_ids_the_rules_give_merged_where_two_series_meet() {
    let rules = "deny = [\"debug.*\"]\n[[rollup]]\nmatch = \"api\"\naggregate_without = [\"user\"]\n";
    let mut harness = harness_with_rules(1, rules);
    // One reader: the window's only cut is rewritten in place, then merged because two
    // users roll up into one series.
    harness.flusher.merge(cut(0, W, W + 1_000, &["api|#route:a,user:1", "api|#route:a,user:2", "debug.x", "web"]));
    harness.flusher.flush_due(W + 1_000 + 10);
    assert_eq!(sent_series(&harness.destinations), vec![(W, "api|#route:a".into(), 2.0), (W, "web".into(), 1.0)]);
    // A window where no two series meet goes out as it is, rewritten.
    harness.flusher.merge(cut(0, W + 1_000, W + 2_000, &["api|#route:b,user:3"]));
    harness.flusher.flush_due(W + 2_000 + 10);
    assert_eq!(sent_series(&harness.destinations), vec![(W + 1_000, "api|#route:b".into(), 1.0)]);
}

#[test]
fn the_cuts_of_several_readers_merge_under_the_rolled_up_id() {
    let mut harness = harness_with_rules(2, "[[rollup]]\nmatch = \"*\"\naggregate_without = [\"host\"]\n");
    harness.flusher.merge(cut(0, W, W + 1_000, &["req|#host:a", "req|#host:b"]));
    harness.flusher.merge(cut(1, W, W + 1_000, &["req|#host:c", "other"]));
    harness.flusher.flush_due(W + 1_000 + 10);
    assert_eq!(sent_series(&harness.destinations), vec![(W, "other".into(), 1.0), (W, "req".into(), 3.0)]);
}

#[test]
fn a_reload_applies_from_its_window_and_a_window_before_keeps_the_old_rules() {
    let mut harness = harness_with_rules(1, "name_prefix = \"old.\"");
    let metrics = Metrics::default();
    let new = RuleSet::compile(None, &toml::from_str("name_prefix = \"new.\"").unwrap(), &metrics.rules).unwrap();
    harness.flusher.settings.rules.replace(new, W + 1_000);
    harness.flusher.merge(cut(0, W, W + 1_000, &["a"]));
    harness.flusher.merge(cut(0, W + 1_000, W + 2_000, &["a"]));
    harness.flusher.flush_due(W + 2_000 + 10);
    assert_eq!(sent_series(&harness.destinations), vec![(W, "old.a".into(), 1.0), (W + 1_000, "new.a".into(), 1.0)]);
}

#[test]
fn with_one_reader_and_no_rules_a_window_in_pieces_is_routed_as_they_come_and_each_given_back() {
    let mut harness = harness(1);
    harness.flusher.receive(piece(&["a", "b"], true));
    harness.flusher.flush_due(W + 1_000 + 10);
    assert!(harness.links.spares.try_recv().is_ok(), "the piece is routed and given back before the window ends");
    let before = sent(&harness.destinations);
    assert!(before.iter().all(|batch| batch.0 < W && batch.1 == 0), "nothing of W before its last piece: {before:?}");
    harness.flusher.receive(piece(&["c"], false));
    assert!(harness.links.spares.try_recv().is_ok());
    harness.flusher.flush_due(W + 1_000 + 10);
    let batches = sent_batches(&harness.destinations);
    let claims: Vec<(i64, usize, i64)> = batches
        .iter()
        .map(|batch| {
            (batch.window_start_ms, batch.shards.iter().map(|shard| shard.series.len()).sum(), batch.watermark_ms)
        })
        .collect();
    assert_truthful(&claims);
    assert_eq!(claims.last().unwrap().2, W + 1_000, "the last piece moved the watermark: {claims:?}");
    let mut ids: Vec<&[u8]> = batches
        .iter()
        .flat_map(|batch| &batch.shards)
        .flat_map(|shard| &shard.series)
        .map(|value| &value.series_id[..])
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![&b"a"[..], b"b", b"c"], "the window went out once, whole");
}

#[test]
fn with_rules_in_force_the_pieces_are_put_together_and_two_series_meeting_across_pieces_go_out_once() {
    let mut harness = harness_with_rules(1, "[[rollup]]\nmatch = \"api\"\naggregate_without = [\"user\"]\n");
    harness.flusher.receive(piece(&["api|#user:1", "web"], true));
    assert!(harness.links.spares.try_recv().is_err(), "a piece is held until its cut is whole");
    harness.flusher.receive(piece(&["api|#user:2"], false));
    harness.flusher.flush_due(W + 1_000 + 10);
    assert_eq!(sent_series(&harness.destinations), vec![(W, "api".into(), 2.0), (W, "web".into(), 1.0)]);
}

#[test]
fn with_several_readers_a_cut_in_pieces_merges_with_the_others() {
    let mut harness = harness(2);
    harness.flusher.receive(Cut { more: true, ..cut(0, W, W, &["a", "b"]) });
    harness.flusher.receive(cut(1, W, W + 1_000, &["b", "c"]));
    harness.flusher.flush_due(W + 1_000 + 10);
    let before = sent(&harness.destinations);
    assert!(before.iter().all(|batch| batch.0 < W && batch.1 == 0), "reader 0 has not finished W: {before:?}");
    harness.flusher.receive(Cut { more: false, ..cut(0, W, W + 1_000, &["a"]) });
    harness.flusher.flush_due(W + 1_000 + 10);
    assert_eq!(
        sent_series(&harness.destinations),
        vec![(W, "a".into(), 2.0), (W, "b".into(), 2.0), (W, "c".into(), 1.0)]
    );
}

#[test]
fn a_window_cut_short_by_its_reader_going_goes_out_without_claiming_it_whole() {
    let mut harness = harness(1);
    harness.flusher.receive(piece(&["a"], true));
    // The next piece is of the next window: the rest of W never comes.
    harness.flusher.receive(cut(0, W + 1_000, W + 2_000, &["b"]));
    harness.flusher.flush_due(W + 2_000 + 10);
    let batches = sent(&harness.destinations);
    assert_eq!(batches.first().map(|batch| (batch.0, batch.1)), Some((W, 1)), "{batches:?}");
    assert!(batches.first().unwrap().2 <= W, "W is not claimed whole: {batches:?}");
    assert_truthful(&batches);
}

#[test]
fn a_window_larger_than_a_frame_goes_out_as_it_is_routed_claiming_nothing_until_its_last_frame() {
    let mut harness = harness(1);
    let ids: Vec<String> = (0..30_000).map(|i| format!("a.long.enough.series.name.{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Each series takes about 40 bytes: 20 000 of them pass the 512 KiB a frame holds.
    harness.flusher.receive(piece(&ids[..20_000], true));
    let early = sent_batches(&harness.destinations);
    let early_series: usize = early.iter().flat_map(|batch| &batch.shards).map(|shard| shard.series.len()).sum();
    assert!(early_series > 0, "frames go out before the window's last piece");
    assert!(early.iter().all(|batch| batch.watermark_ms <= W), "and claim nothing of W");
    harness.flusher.receive(piece(&ids[20_000..], false));
    let late = sent_batches(&harness.destinations);
    assert_eq!(late.last().map(|batch| batch.watermark_ms), Some(W + 1_000), "the last frame claims W");
    let mut seen: Vec<Vec<u8>> = early
        .iter()
        .chain(&late)
        .flat_map(|batch| &batch.shards)
        .flat_map(|shard| &shard.series)
        .map(|value| value.series_id.clone())
        .collect();
    seen.sort_unstable();
    let mut expected: Vec<Vec<u8>> = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
    expected.sort_unstable();
    assert_eq!(seen, expected, "every series once");
}
