//! Criterion benchmarks of tessera's hot paths, and the inputs they share.
//!
//! One file per hot path in `benches/`: `parse`, `aggregate`, `sketch`,
//! `shard`. Run them with `cargo bench -p tessera-benches`.

/// Builds datagrams of about `datagram_bytes` holding counter lines of
/// `series` distinct series (`bench.counter.<i>`), in a fixed order.
pub fn counter_datagrams(series: usize, datagram_bytes: usize, tagged: bool) -> (Vec<Vec<u8>>, usize) {
    let lines = (0..series).map(|i| {
        if tagged {
            format!("bench.counter.{}:1|c|#env:prod,host:h{},route:/api/v{}\n", i / 16, i % 16, i % 3)
        } else {
            format!("bench.counter.{i}:1|c\n")
        }
    });
    (pack(lines, datagram_bytes), series)
}

/// Packs `lines` into datagrams of about `datagram_bytes`.
fn pack(lines: impl Iterator<Item = String>, datagram_bytes: usize) -> Vec<Vec<u8>> {
    let mut datagrams = Vec::new();
    let mut current = Vec::with_capacity(datagram_bytes);
    for line in lines {
        if current.len() + line.len() > datagram_bytes && !current.is_empty() {
            datagrams.push(std::mem::take(&mut current));
        }
        current.extend_from_slice(line.as_bytes());
    }
    if !current.is_empty() {
        datagrams.push(current);
    }
    datagrams
}

/// [`counter_datagrams`] of untagged series with the lines in a seeded random order: each
/// series once, as in the fixed order, but not in the order a table inserted them (which
/// lets the hardware prefetcher read a table's slots in sequence). Real traffic arrives in
/// no such order.
pub fn shuffled_counter_datagrams(series: usize, datagram_bytes: usize, seed: u64) -> (Vec<Vec<u8>>, usize) {
    let mut order: Vec<usize> = (0..series).collect();
    let mut state = seed | 1;
    for i in (1..order.len()).rev() {
        // xorshift64*: enough for a benchmark's shuffle.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let pick = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % (i as u64 + 1)) as usize;
        order.swap(i, pick);
    }
    let lines = order.into_iter().map(|i| format!("bench.counter.{i}:1|c\n"));
    (pack(lines, datagram_bytes), series)
}

/// A realistic DogStatsD mix: counters, gauges, timers with sample rates,
/// distributions, sets, tags, in ~1400-byte datagrams.
pub fn mixed_datagrams(lines_wanted: usize) -> (Vec<Vec<u8>>, usize) {
    let lines = (0..lines_wanted).map(|i| match i % 6 {
        0 => format!("http.requests:1|c|#env:prod,route:/r{},status:200\n", i % 50),
        1 => format!("queue.depth:{}|g|#queue:q{}\n", i % 1000, i % 10),
        2 => format!("http.latency:{}.{}|ms|@0.5|#route:/r{}\n", i % 500, i % 10, i % 50),
        3 => format!("payload.bytes:{}|d|#service:api\n", i % 9000),
        4 => format!("users.active:user{}|s|#app:web\n", i % 2000),
        _ => format!("jobs.done:{}|c\n", i % 7),
    });
    (pack(lines, 1400), lines_wanted)
}

/// Where a line carries its tags: the inputs of the `tag_style` benchmarks,
/// which send the same series (name and two tags) written each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagStyle {
    /// No tags: `bench.counter.7:1|c`.
    Plain,
    /// DogStatsD, tags sorted: `bench.counter.7:1|c|#env:prod,host:h3`.
    DogStatsd,
    /// DogStatsD, tags not sorted (the full parser and a key build):
    /// `bench.counter.7:1|c|#host:h3,env:prod`.
    DogStatsdUnsorted,
    /// InfluxDB / Telegraf, in the name: `bench.counter.7,env=prod,host=h3:1|c`.
    InfluxDb,
    /// Librato, in the name: `bench.counter.7#env=prod,host=h3:1|c`.
    Librato,
    /// SignalFx, cut out of the name: `bench.[env=prod,host=h3]counter.7:1|c`.
    SignalFx,
}

impl TagStyle {
    /// Every style, in a fixed order.
    pub const ALL: [TagStyle; 6] = [
        TagStyle::Plain,
        TagStyle::DogStatsd,
        TagStyle::DogStatsdUnsorted,
        TagStyle::InfluxDb,
        TagStyle::Librato,
        TagStyle::SignalFx,
    ];

    /// A short label for benchmark ids.
    pub fn as_str(self) -> &'static str {
        match self {
            TagStyle::Plain => "plain",
            TagStyle::DogStatsd => "dogstatsd",
            TagStyle::DogStatsdUnsorted => "dogstatsd_unsorted",
            TagStyle::InfluxDb => "influxdb",
            TagStyle::Librato => "librato",
            TagStyle::SignalFx => "signalfx",
        }
    }

    /// Line `i` of `series` distinct series, written in this style (with its newline).
    fn line(self, i: usize) -> String {
        let (name, host) = (i / 16, i % 16);
        match self {
            TagStyle::Plain => format!("bench.counter.{i}:1|c\n"),
            TagStyle::DogStatsd => format!("bench.counter.{name}:1|c|#env:prod,host:h{host}\n"),
            TagStyle::DogStatsdUnsorted => format!("bench.counter.{name}:1|c|#host:h{host},env:prod\n"),
            TagStyle::InfluxDb => format!("bench.counter.{name},env=prod,host=h{host}:1|c\n"),
            TagStyle::Librato => format!("bench.counter.{name}#env=prod,host=h{host}:1|c\n"),
            TagStyle::SignalFx => format!("bench.[env=prod,host=h{host}]counter.{name}:1|c\n"),
        }
    }
}

/// Builds ~1400-byte datagrams of counter lines of `series` distinct series,
/// each line written in `style`.
pub fn tag_style_datagrams(style: TagStyle, series: usize) -> (Vec<Vec<u8>>, usize) {
    (pack((0..series).map(|i| style.line(i)), 1400), series)
}
