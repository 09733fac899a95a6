//! Tests across the loadgen modules: what the generated datagrams parse
//! into, packing, expected totals, and whole runs against real sockets on
//! 127.0.0.1.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use tessera_core::parse::{MetricKind, Parsed, parse_datagram};
use tessera_core::series::SeriesKey;

use super::expect::{ExpectedSeries, Stat, expected_totals, write_tsv};
use super::order::{Order, Permutation, SenderOrder, Zipf};
use super::workload::{LineSource, PackLimits, Packed, Workload, WorkloadConfig};
use super::{Args, Config, execute};

#[derive(Debug, Parser)]
struct TestCli {
    #[command(flatten)]
    args: Args,
}

fn config(flags: &[&str]) -> Config {
    let cli = TestCli::try_parse_from(std::iter::once("loadgen").chain(flags.iter().copied())).unwrap();
    Config::from_args(&cli.args).unwrap()
}

fn workload(series: u64, mix: &str, tags: u32, sample_rate: Option<f64>, datagram_bytes: usize) -> Arc<Workload> {
    workload_in(Order::Sequential, series, mix, tags, sample_rate, datagram_bytes)
}

fn workload_in(
    order: Order,
    series: u64,
    mix: &str,
    tags: u32,
    sample_rate: Option<f64>,
    datagram_bytes: usize,
) -> Arc<Workload> {
    Arc::new(Workload::new(&WorkloadConfig {
        series,
        mix: mix.parse().unwrap(),
        tags_per_line: tags,
        sample_rate,
        values_per_series: 4,
        seed: 7,
        max_datagram_bytes: datagram_bytes,
        series_offset: 0,
        order,
    }))
}

/// What a receiver aggregated for one series.
#[derive(Debug, Default)]
struct Seen {
    kind: Option<MetricKind>,
    lines: u64,
    /// Σ value / sample rate.
    scaled_sum: f64,
    /// Σ 1 / sample rate.
    scaled_count: f64,
    last: f64,
    members: HashSet<Vec<u8>>,
}

/// A minimal statsd aggregator over tessera's parser.
#[derive(Debug, Default)]
struct Receiver {
    series: HashMap<Vec<u8>, Seen>,
    lines: u64,
    key: SeriesKey,
}

impl Receiver {
    fn receive(&mut self, datagram: &[u8], tags_per_line: usize) {
        parse_datagram(datagram, |parsed| {
            let Parsed::Metric(line) = parsed else { panic!("not a metric: {parsed:?}") };
            assert_eq!(line.tags().count(), tags_per_line);
            self.key.build(&line).unwrap();
            let seen = self.series.entry(self.key.id().to_vec()).or_default();
            assert!(seen.kind.is_none_or(|kind| kind == line.kind));
            seen.kind = Some(line.kind);
            seen.lines += 1;
            seen.scaled_sum += line.first.value / line.sample_rate;
            seen.scaled_count += 1.0 / line.sample_rate;
            seen.last = line.first.value;
            if line.kind == MetricKind::Set {
                seen.members.insert(line.set_member().to_vec());
            }
            self.lines += 1;
        });
    }

    /// Checks that exactly the expected series arrived, each with its
    /// expected statistic.
    fn assert_matches(&self, workload: &Workload, lines_by_sender: &[u64]) {
        let expected: HashMap<Vec<u8>, ExpectedSeries> = expected_totals(workload, lines_by_sender)
            .map(|expected| (id_of(workload, expected.series), expected))
            .collect();
        assert_eq!(self.series.len(), expected.len(), "series received vs expected");
        assert_eq!(self.lines, lines_by_sender.iter().sum::<u64>());
        for (id, expected) in &expected {
            let seen = self.series.get(id).unwrap_or_else(|| panic!("{} missing", String::from_utf8_lossy(id)));
            assert_eq!(seen.kind, Some(expected.kind));
            assert_eq!(seen.lines, expected.lines);
            let actual = match expected.stat {
                Stat::Sum => seen.scaled_sum,
                Stat::Count => seen.scaled_count,
                Stat::Last => seen.last,
                Stat::Cardinality => seen.members.len() as f64,
            };
            let tolerance = 1e-9 * expected.value.abs().max(1.0);
            assert!((actual - expected.value).abs() <= tolerance, "{expected:?}: got {actual}");
        }
    }
}

fn id_of(workload: &Workload, series: u64) -> Vec<u8> {
    let (mut name, mut tags, mut key) = (Vec::new(), Vec::new(), SeriesKey::default());
    workload.write_name(&mut name, series);
    workload.write_tags(&mut tags, series);
    key.build_from_parts(workload.kind(series), &name, &tags).unwrap();
    key.id().to_vec()
}

/// The payloads of the first `lines` lines of a sender, in batches of at
/// most `max_datagrams`.
fn payloads(source: &mut LineSource, lines: u64, max_datagrams: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut left = lines;
    while left > 0 {
        let batch = source.next_batch(max_datagrams, left);
        assert!(batch.datagrams.len() <= max_datagrams.max(1));
        assert_eq!(batch.lines, batch.datagrams.iter().map(|datagram| u64::from(datagram.lines)).sum::<u64>());
        out.extend(batch.datagrams.iter().map(|datagram| datagram.payload(batch.bytes).to_vec()));
        left -= batch.lines;
    }
    out
}

/// The lines (without newlines) of the first `lines` lines of a sender.
fn lines_of(source: &mut LineSource, lines: u64) -> Vec<String> {
    let mut out = Vec::new();
    for payload in payloads(source, lines, 64) {
        out.extend(payload.split(|byte| *byte == b'\n').map(|line| String::from_utf8(line.to_vec()).unwrap()));
    }
    assert_eq!(out.len() as u64, lines);
    out
}

/// The series number at the end of a line's name, `loadgen.<type>.<i>:...`.
fn series_of(line: &str) -> u64 {
    let name = line.split(':').next().unwrap();
    name.rsplit('.').next().unwrap().parse().unwrap()
}

const ORDERS: [Order; 4] =
    [Order::Sequential, Order::Random, Order::Zipf { exponent: 1.0 }, Order::Zipf { exponent: 0.7 }];

#[test]
fn generated_datagrams_parse_into_the_expected_lines_and_series() {
    let cases = [
        (1, 0, None, 1400),
        (1, 3, Some(0.25), 1400),
        (3, 2, Some(0.1), 200),
        (2, 0, Some(1.0), 1),
        (4, 64, None, 9000),
    ];
    for ((senders, tags, sample_rate, datagram_bytes), order) in
        cases.into_iter().flat_map(|case| ORDERS.map(|order| (case, order)))
    {
        let workload = workload_in(
            order,
            101,
            "counter=5,gauge=2,timer=2,histogram=1,distribution=1,set=1",
            tags,
            sample_rate,
            datagram_bytes,
        );
        for max_cycle_bytes in [usize::MAX, 0] {
            let mut receiver = Receiver::default();
            let mut lines_by_sender = Vec::new();
            for sender in 0..senders {
                let series = workload.sender_series(sender, senders);
                let mut source = LineSource::new(&workload, series.clone(), max_cycle_bytes);
                assert_eq!(source.is_precomputed(), max_cycle_bytes == usize::MAX);
                // Two and a half cycles, plus a different amount per sender.
                let lines = (series.end - series.start) * 10 + 3 + sender as u64;
                for payload in payloads(&mut source, lines, 7) {
                    assert!(!payload.ends_with(b"\n"));
                    receiver.receive(&payload, tags as usize);
                }
                lines_by_sender.push(lines);
            }
            receiver.assert_matches(&workload, &lines_by_sender);
            // Every type of the mix arrived.
            let kinds: HashSet<_> = receiver.series.values().filter_map(|seen| seen.kind).collect();
            assert_eq!(kinds.len(), MetricKind::ALL.len());
        }
    }
}

#[test]
fn lines_have_the_documented_format() {
    let workload = workload(10, "counter=1,gauge=1,timer=1,set=1,distribution=1", 2, Some(0.5), 1400);
    let mut source = LineSource::new(&workload, 0..10, usize::MAX);
    let batch = source.next_batch(1, 5);
    let text = String::from_utf8(batch.datagrams[0].payload(batch.bytes).to_vec()).unwrap();
    let lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(lines[0], "loadgen.counter.0:1|c|@0.5|#k0:v0,k1:v0");
    assert!(lines[1].starts_with("loadgen.gauge.1:") && lines[1].ends_with("|g|#k0:v1,k1:v1"), "{}", lines[1]);
    assert!(lines[2].starts_with("loadgen.timer.2:") && lines[2].ends_with("|ms|@0.5|#k0:v2,k1:v2"), "{}", lines[2]);
    assert!(lines[3].starts_with("loadgen.distribution.3:") && lines[3].ends_with("|d|#k0:v3,k1:v3"), "{}", lines[3]);
    assert_eq!(lines[4], "loadgen.set.4:16|s|#k0:v4,k1:v4");
}

#[test]
fn packing_respects_datagram_bytes() {
    for datagram_bytes in [1, 20, 45, 200, 1400] {
        let workload = workload(500, "counter=70,gauge=10,timer=10,set=5,distribution=5", 1, Some(0.5), datagram_bytes);
        let mut packed = Packed::default();
        let limits = PackLimits { max_lines: 2000, max_datagrams: usize::MAX, max_bytes: usize::MAX };
        assert_eq!(workload.pack(&(0..500), 0, limits, &mut packed), 2000);
        assert_eq!(packed.datagrams.iter().map(|datagram| u64::from(datagram.lines)).sum::<u64>(), 2000);
        let payloads: Vec<&[u8]> = packed.datagrams.iter().map(|datagram| datagram.payload(&packed.bytes)).collect();
        for (index, payload) in payloads.iter().enumerate() {
            let lines = payload.split(|byte| *byte == b'\n').count();
            assert_eq!(lines as u32, packed.datagrams[index].lines);
            assert!(payload.len() <= datagram_bytes || lines == 1, "{} bytes over {datagram_bytes}", payload.len());
            // Greedy: the next line would not have fitted.
            if let Some(next) = payloads.get(index + 1) {
                let next_line = next.split(|byte| *byte == b'\n').next().unwrap();
                assert!(payload.len() + 1 + next_line.len() > datagram_bytes);
            }
        }
        if datagram_bytes == 1 {
            assert!(packed.datagrams.iter().all(|datagram| datagram.lines == 1));
        }
        if datagram_bytes == 1400 {
            let (_last, full) = payloads.split_last().unwrap();
            assert!(full.iter().all(|payload| payload.len() > 1300), "datagrams are filled");
        }
    }
}

#[test]
fn precomputed_and_streamed_sources_send_the_same_lines() {
    let workload = workload(37, "counter=3,gauge=1,set=1", 1, None, 100);
    let mut cycle = LineSource::new(&workload, 5..37, usize::MAX);
    let mut stream = LineSource::new(&workload, 5..37, 0);
    assert!(cycle.is_precomputed() && !stream.is_precomputed());
    // Ragged batch limits cut datagrams mid-way; the lines must still match.
    let mut cycle_lines = Vec::new();
    let mut stream_lines = Vec::new();
    for (max_datagrams, max_lines) in [(1, 1), (3, 5), (64, 1000), (2, 2), (5, 77), (64, 400)] {
        for (source, lines) in [(&mut cycle, &mut cycle_lines), (&mut stream, &mut stream_lines)] {
            let batch = source.next_batch(max_datagrams, max_lines);
            assert!(batch.lines <= max_lines);
            for datagram in batch.datagrams {
                lines.extend(datagram.payload(batch.bytes).split(|byte| *byte == b'\n').map(<[u8]>::to_vec));
            }
        }
    }
    assert_eq!(cycle_lines.len(), stream_lines.len());
    assert_eq!(cycle_lines, stream_lines);
    // Untruncated, whole cycles give identical datagrams.
    let mut cycle = LineSource::new(&workload, 0..37, usize::MAX);
    let mut stream = LineSource::new(&workload, 0..37, 0);
    assert_eq!(payloads(&mut cycle, 37 * 4 * 3, 16), payloads(&mut stream, 37 * 4 * 3, 16));
}

#[test]
fn random_order_sends_every_series_once_per_pass_and_the_lines_of_sequential_order() {
    let mix = "counter=3,gauge=1,set=1,timer=1";
    let sequential = workload_in(Order::Sequential, 75, mix, 1, Some(0.5), 300);
    let random = workload_in(Order::Random, 75, mix, 1, Some(0.5), 300);
    for total in [75 * 9, 75 * 9 + 1, 75 * 6 + 40, 75 * 2 - 1, 30] {
        let mut receiver = Receiver::default();
        let mut lines_by_sender = Vec::new();
        for sender in 0..2 {
            let series = random.sender_series(sender, 2);
            let series_here = series.end - series.start;
            let lines = random.sender_total_lines(&series, total);
            assert_eq!(lines, sequential.sender_total_lines(&series, total));
            let random_lines = lines_of(&mut LineSource::new(&random, series.clone(), usize::MAX), lines);
            let streamed = lines_of(&mut LineSource::new(&random, series.clone(), 0), lines);
            assert_eq!(random_lines, streamed, "precomputed and streamed random order");
            // One more pass than was sent, for the lines the partial one could have reached.
            let whole_pass_lines = lines.div_ceil(series_here) * series_here;
            let sequential_lines =
                lines_of(&mut LineSource::new(&sequential, series.clone(), usize::MAX), whole_pass_lines);
            let passes = random_lines.chunks(series_here as usize).zip(sequential_lines.chunks(series_here as usize));
            for (pass, (random_pass, sequential_pass)) in passes.enumerate() {
                let visited: HashSet<u64> = random_pass.iter().map(|line| series_of(line)).collect();
                assert_eq!(visited.len(), random_pass.len(), "pass {pass} visits a series twice");
                assert!(visited.iter().all(|index| series.contains(index)));
                let mut random_sorted = random_pass.to_vec();
                random_sorted.sort();
                if random_pass.len() as u64 == series_here {
                    // A whole pass: the same lines as sequential order, in another order.
                    let mut sequential_sorted = sequential_pass.to_vec();
                    sequential_sorted.sort();
                    assert_eq!(random_sorted, sequential_sorted, "pass {pass}");
                    assert_ne!(random_pass, sequential_pass, "pass {pass} is in insertion order");
                } else {
                    // The partial pass: lines sequential order sends in that pass, once each.
                    assert!(random_pass.iter().all(|line| sequential_pass.contains(line)), "pass {pass}");
                }
            }
            for line in &random_lines {
                receiver.receive(line.as_bytes(), 1);
            }
            lines_by_sender.push(lines);
        }
        // The expectations follow the series the partial pass reached.
        receiver.assert_matches(&random, &lines_by_sender);
        // As many series got each count as in sequential order.
        let mut random_counts: Vec<u64> = expected_totals(&random, &lines_by_sender).map(|e| e.lines).collect();
        let mut sequential_counts: Vec<u64> = expected_totals(&sequential, &lines_by_sender).map(|e| e.lines).collect();
        random_counts.sort_unstable();
        sequential_counts.sort_unstable();
        assert_eq!(random_counts, sequential_counts, "{total} lines");
    }
}

#[test]
fn random_order_depends_on_the_seed_and_the_pass() {
    let range = 0..1000;
    let order = |seed| SenderOrder::new(Order::Random, seed, &range, 4);
    let pass_of = |order: &SenderOrder, pass: u64| -> Vec<u64> {
        (pass * 1000..(pass + 1) * 1000).map(|line| order.line(line).0).collect()
    };
    let (seed_1, seed_2) = (order(1), order(2));
    let first_pass = pass_of(&seed_1, 0);
    assert_ne!(first_pass, pass_of(&seed_2, 0), "another seed, another order");
    assert_eq!(first_pass, pass_of(&order(1), 0), "the same seed, the same order");
    for pass in 1..4 {
        assert_ne!(first_pass, pass_of(&seed_1, pass), "each pass of a cycle has its own order");
    }
    assert_eq!(first_pass, pass_of(&seed_1, 4), "the cycle repeats");
    // Far from insertion order: few series in their own place, few steps to a neighbour.
    let in_place = first_pass.iter().enumerate().filter(|(place, series)| *place as u64 == **series).count();
    let neighbours = first_pass.windows(2).filter(|pair| pair[0].abs_diff(pair[1]) == 1).count();
    assert!(in_place < 10 && neighbours < 20, "{in_place} in place, {neighbours} neighbours");
}

#[test]
fn permutations_are_bijections_that_invert() {
    for n in [1, 2, 3, 5, 8, 64, 65, 1000, 4097] {
        let bits = u64::BITS - (n - 1u64).leading_zeros();
        for (key, pass) in [(0, 0), (1, 0), (1, 3), (0xdead_beef, 7)] {
            let permutation = Permutation::new(bits, key, pass);
            let mut reached = vec![false; n as usize];
            for position in 0..n {
                let place = permutation.apply(position, n);
                assert!(!reached[place as usize], "{n} places: {place} reached twice");
                reached[place as usize] = true;
                assert_eq!(permutation.invert(place, n), position);
            }
        }
    }
}

#[test]
fn zipf_order_favours_low_ranks_and_is_seeded() {
    // A cycle of 100 000 lines: 1000 passes of 100 series.
    let range = 0..100;
    let lines = 100_000;
    let counts = |exponent: f64, seed: u64| -> Vec<u64> {
        let order = SenderOrder::new(Order::Zipf { exponent }, seed, &range, 1000);
        let mut counts = vec![0; 100];
        for line in 0..lines {
            counts[order.line(line).0 as usize] += 1;
        }
        counts
    };
    for exponent in [1.0, 0.5, 2.0] {
        let counts = counts(exponent, 1);
        assert_eq!(counts.iter().sum::<u64>(), lines);
        let normaliser: f64 = (1..=100).map(|rank| (rank as f64).powf(-exponent)).sum();
        for rank in [1u64, 2, 3, 10, 50, 100] {
            let expected = lines as f64 * (rank as f64).powf(-exponent) / normaliser;
            let seen = counts[rank as usize - 1] as f64;
            // Five standard deviations of a binomial count, plus one.
            let slack = 5.0 * expected.sqrt() + 1.0;
            assert!((seen - expected).abs() <= slack, "exponent {exponent}, rank {rank}: {seen} vs {expected:.0}");
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9] && counts[9] > counts[99], "{counts:?}");
    }
    assert_eq!(counts(1.0, 7), counts(1.0, 7), "the same seed, the same draws");
    let order = |seed| SenderOrder::new(Order::Zipf { exponent: 1.0 }, seed, &range, 1000);
    let draws = |seed| (0..1000).map(|line| order(seed).line(line).0).collect::<Vec<_>>();
    assert_eq!(draws(3), draws(3));
    assert_ne!(draws(3), draws(4), "another seed, other draws");
    // One rank, whatever the draw.
    let single = Zipf::new(1, 1.0);
    assert!((0..100).all(|draw| single.sample(|| f64::from(draw) / 100.0) == 1));
}

#[test]
fn zipf_expectations_count_what_was_sent() {
    let zipf = workload_in(Order::Zipf { exponent: 1.2 }, 40, "counter=2,gauge=1,set=1,timer=1", 0, Some(0.5), 200);
    // Cycles of 20 series × 4 passes = 80 lines per sender.
    for lines in [[0, 1], [79, 80], [81, 159], [240, 333]] {
        let mut receiver = Receiver::default();
        for (sender, sent) in lines.iter().enumerate() {
            let series = zipf.sender_series(sender, 2);
            for line in lines_of(&mut LineSource::new(&zipf, series, 0), *sent) {
                receiver.receive(line.as_bytes(), 0);
            }
        }
        receiver.assert_matches(&zipf, &lines);
        // Rank 1 (series 0) gets about 1 / Σ r^-1.2 ≈ 32 % of its sender's lines.
        if lines[0] >= 80 {
            let top = expected_totals(&zipf, &lines).next().unwrap();
            assert!(top.series == 0 && top.lines > lines[0] / 5, "{top:?}");
        }
    }
}

#[test]
fn a_total_splits_into_equal_shares_per_series() {
    for (series, senders, total) in [(10, 3, 7), (10, 3, 25), (7, 7, 100), (1000, 4, 123_457), (5, 2, 0)] {
        let workload = workload(series, "counter=1", 0, None, 1400);
        let lines_by_sender: Vec<u64> = (0..senders)
            .map(|sender| workload.sender_total_lines(&workload.sender_series(sender, senders), total))
            .collect();
        assert_eq!(lines_by_sender.iter().sum::<u64>(), total);
        let counts: Vec<u64> = expected_totals(&workload, &lines_by_sender).map(|expected| expected.lines).collect();
        let equal_share: Vec<u64> = (0..series)
            .map(|index| total / series + u64::from(index < total % series))
            .filter(|lines| *lines > 0)
            .collect();
        assert_eq!(counts, equal_share, "{series} series, {senders} senders, {total} lines");
    }
}

#[test]
fn expected_totals_follow_the_sample_rate_and_the_last_pass() {
    let counters = workload(3, "counter=1", 0, Some(0.5), 1400);
    let sums: Vec<(u64, f64)> = expected_totals(&counters, &[7]).map(|e| (e.lines, e.value)).collect();
    assert_eq!(sums, [(3, 6.0), (2, 4.0), (2, 4.0)]);

    let gauges = workload(2, "gauge=1", 0, Some(0.5), 1400);
    let last: Vec<ExpectedSeries> = expected_totals(&gauges, &[11]).collect();
    // Series 0 was sent 6 times: passes 0, 1, 2, 3, 0, 1.
    assert_eq!((last[0].lines, last[0].stat, last[0].value), (6, Stat::Last, gauges.value(0, 1) as f64));
    assert_eq!((last[1].lines, last[1].value), (5, gauges.value(1, 0) as f64));

    let sets = workload(2, "set=1", 0, Some(0.5), 1400);
    let cardinality: Vec<f64> = expected_totals(&sets, &[5]).map(|e| e.value).collect();
    assert_eq!(cardinality, [3.0, 2.0]);

    let timers = workload(2, "timer=1,distribution=1", 0, Some(0.25), 1400);
    let counts: Vec<(MetricKind, f64)> = expected_totals(&timers, &[1, 1]).map(|e| (e.kind, e.value)).collect();
    assert_eq!(counts, [(MetricKind::Timer, 4.0), (MetricKind::Distribution, 1.0)]);
}

#[test]
fn expect_tsv_lists_each_sent_series() {
    let workload = workload(4, "counter=1,gauge=1", 11, None, 1400);
    let mut out = Vec::new();
    write_tsv(&mut out, &workload, &[3]).unwrap();
    let text = String::from_utf8(out).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows[0], "id\tname\ttags\ttype\tlines\tstat\texpected");
    assert_eq!(rows.len(), 4, "series 3 was not sent: {text}");
    let counter: Vec<&str> = rows[1].split('\t').collect();
    assert_eq!(counter[1], "loadgen.counter.0");
    // tessera's canonical id sorts the tags bytewise.
    assert_eq!(counter[0], "loadgen.counter.0|#k0:v0,k1:v0,k10:v0,k2:v0,k3:v0,k4:v0,k5:v0,k6:v0,k7:v0,k8:v0,k9:v0");
    assert_eq!(counter[2], "k0:v0,k1:v0,k2:v0,k3:v0,k4:v0,k5:v0,k6:v0,k7:v0,k8:v0,k9:v0,k10:v0");
    assert_eq!(&counter[3..], ["counter", "1", "sum", "1"]);
    let gauge: Vec<&str> = rows[2].split('\t').collect();
    assert_eq!(&gauge[3..6], ["gauge", "1", "last"]);
    assert_eq!(gauge[6], workload.value(1, 0).to_string());
}

/// A UDP socket on 127.0.0.1:0 with a big receive buffer.
fn udp_receiver() -> std::net::UdpSocket {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    socket.set_recv_buffer_size(32 << 20).unwrap();
    socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    let socket: std::net::UdpSocket = socket.into();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    socket
}

/// Receives datagrams until `lines` lines arrived or none came for 2 s.
fn receive_lines(socket: &std::net::UdpSocket, lines: u64, tags: usize) -> Receiver {
    let mut receiver = Receiver::default();
    let mut buf = vec![0u8; 65536];
    while receiver.lines < lines {
        let Ok(len) = socket.recv(&mut buf) else { break };
        receiver.receive(&buf[..len], tags);
    }
    receiver
}

#[test]
fn total_lines_reach_a_udp_socket_exactly() {
    let socket = udp_receiver();
    let target = socket.local_addr().unwrap().to_string();
    let total = 20_000;
    let receiving = std::thread::spawn(move || receive_lines(&socket, total, 2));
    let flags = ["--target", &target, "--total-lines", "20000", "--rate-lines-per-sec", "200000"];
    let config =
        config(&[&flags[..], &["--senders", "2", "--series", "999", "--tags", "2", "--sample-rate", "0.5"]].concat());
    let summary = execute(&config, &Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(summary.lines, total);
    assert_eq!(summary.lines_by_sender.iter().sum::<u64>(), total);
    assert_eq!(summary.precomputed_senders, 2);
    assert!(summary.error.is_none());
    let receiver = receiving.join().unwrap();
    assert_eq!(receiver.lines, total, "lines received");
    receiver.assert_matches(&config.workload, &summary.lines_by_sender);
    let json = summary.to_json();
    assert!(json.starts_with("{\"transport\":\"udp\",\"target\":\"127.0.0.1:") && json.ends_with(",\"error\":null}"));
    assert!(json.contains(",\"lines\":20000,"), "{json}");
    assert!(
        json.contains(
            "\"counter\":{\"series\":699,\"series_sent\":699,\"lines\":13994,\"stat\":\"sum\",\"expected\":27988}"
        ),
        "{json}"
    );
    assert!(summary.to_text().contains("sent 20000 lines in "));
}

#[test]
fn every_order_reaches_a_udp_socket_exactly() {
    for order in ["random", "zipf"] {
        let socket = udp_receiver();
        let target = socket.local_addr().unwrap().to_string();
        let receiving = std::thread::spawn(move || receive_lines(&socket, 9_999, 0));
        let flags = ["--target", &target, "--total-lines", "9999", "--rate-lines-per-sec", "200000"];
        let config = config(&[&flags[..], &["--senders", "2", "--series", "301", "--order", order]].concat());
        let summary = execute(&config, &Arc::new(AtomicBool::new(false))).unwrap();
        assert_eq!(summary.lines, 9_999);
        let receiver = receiving.join().unwrap();
        assert_eq!(receiver.lines, 9_999, "{order}: lines received");
        receiver.assert_matches(&config.workload, &summary.lines_by_sender);
    }
}

#[test]
fn total_lines_reach_a_tcp_listener_exactly() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let receiving = std::thread::spawn(move || {
        let mut received = Vec::new();
        for _ in 0..3 {
            let (mut stream, _) = listener.accept().unwrap();
            stream.read_to_end(&mut received).unwrap();
        }
        received
    });
    let config = config(&["--tcp", "--target", &target, "--total-lines", "30001", "--senders", "3", "--series", "100"]);
    let summary = execute(&config, &Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(summary.lines, 30_001);
    // The connections close when their senders end.
    let received = receiving.join().unwrap();
    assert!(received.ends_with(b"\n"));
    let mut receiver = Receiver::default();
    receiver.receive(&received, 0);
    receiver.assert_matches(&config.workload, &summary.lines_by_sender);
}

#[test]
fn total_lines_reach_a_unix_datagram_socket_exactly() {
    let path = std::env::temp_dir().join(format!("tessera-loadgen-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let receiving = std::thread::spawn(move || {
        let mut receiver = Receiver::default();
        let mut buf = vec![0u8; 65536];
        while receiver.lines < 12_345 {
            let Ok(len) = socket.recv(&mut buf) else { break };
            receiver.receive(&buf[..len], 0);
        }
        receiver
    });
    let config = config(&["--unix", path.to_str().unwrap(), "--total-lines", "12345", "--datagram-bytes", "512"]);
    let summary = execute(&config, &Arc::new(AtomicBool::new(false))).unwrap();
    let receiver = receiving.join().unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(summary.lines, 12_345);
    receiver.assert_matches(&config.workload, &summary.lines_by_sender);
}

#[test]
fn a_paced_run_stays_within_its_rate() {
    let socket = udp_receiver();
    let target = socket.local_addr().unwrap().to_string();
    let config =
        config(&["--target", &target, "--rate-lines-per-sec", "50000", "--duration-secs", "0.2", "--series", "10"]);
    let summary = execute(&config, &Arc::new(AtomicBool::new(false))).unwrap();
    // The bucket lets a batch go once the lines before it are due, so at
    // most one batch (about a millisecond of lines, plus a datagram) more.
    let allowed = 50_000.0 * summary.elapsed.as_secs_f64() + 50.0 + 100.0;
    assert!(summary.lines > 0 && (summary.lines as f64) <= allowed, "{} lines, {allowed} allowed", summary.lines);
}

#[test]
fn an_unbounded_run_stops_when_told() {
    let socket = udp_receiver();
    let target = socket.local_addr().unwrap().to_string();
    let config = config(&["--target", &target, "--senders", "2", "--max-cycle-bytes", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let summary = execute(&config, &stop).unwrap();
    stopper.join().unwrap();
    assert!(summary.lines > 0);
    assert_eq!(summary.precomputed_senders, 0);
    assert_eq!(summary.lines_by_sender.iter().sum::<u64>(), summary.lines);
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    let cases: [(&[&str], &str); 7] = [
        (&["--datagram-bytes", "65508"], "--datagram-bytes 65508 exceeds the largest UDP payload, 65507 bytes"),
        (&["--senders", "3", "--series", "2"], "--senders 3 exceeds --series 2: each sender needs a series of its own"),
        (&["--sample-rate", "0"], "invalid sample rate `0`: expected a number in (0, 1]"),
        (&["--tags", "65"], "--tags 65 exceeds the 64 tags a line may carry"),
        (&["--duration-secs=-1"], "invalid --duration-secs `-1`"),
        (&["--target", "nowhere"], "invalid --target `nowhere`"),
        (&["--order", "zipf", "--zipf-exponent", "0"], "invalid --zipf-exponent `0`: expected a number above 0"),
    ];
    for (flags, message) in cases {
        let cli = TestCli::try_parse_from(std::iter::once("loadgen").chain(flags.iter().copied())).unwrap();
        let error = Config::from_args(&cli.args).unwrap_err();
        assert_eq!(error.to_string(), message);
    }
    let error = TestCli::try_parse_from(["loadgen", "--mix", "counter=1,timer"]).unwrap_err();
    assert!(error.to_string().contains("mix entry `timer` is not `type=weight`"), "{error}");
    let error = TestCli::try_parse_from(["loadgen", "--order", "shuffled"]).unwrap_err();
    assert!(error.to_string().contains("[possible values: sequential, random, zipf]"), "{error}");
}

#[test]
fn a_series_offset_renames_the_series_and_their_tags() {
    let config = config(&["--series", "2", "--mix", "counter=1", "--tags", "1", "--series-offset", "1000"]);
    let mut line = Vec::new();
    config.workload.write_line(&mut line, 1, 0);
    assert_eq!(String::from_utf8(line).unwrap(), "loadgen.counter.1001:1|c|#k0:v1001\n");
}
