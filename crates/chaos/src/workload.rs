//! The campaign's workload: series of every statsd type whose exact outcome is known,
//! sent in rounds at known times, and the ledger of what was sent when.
//!
//! Series `i` of each kind goes to collector `i % collectors`. A round sends one line
//! of every series; rounds go out twice a second, at 250 ms and 750 ms past the second,
//! far from the collectors' one-second window edges (collectors stamp datagrams with
//! the kernel's receive time), and the ledger keeps the clock just before and just
//! after each round, so the checker knows which window, and so which tile, every line
//! fell in (or the two it may have fallen in, when a starved sender straddled an edge).
//!
//! | kind | line of series `i` in round `r` | checked |
//! |---|---|---|
//! | counter | `chaos.counter:<1 + (r + i) % 3>\|c\|#series:<i>` | cumulative total, per tile and over the run |
//! | gauge | `chaos.gauge:<(7r + i) % 1000>\|g` when `r % 4 == 0`, else `+2` or `-1` | last value |
//! | timer | `chaos.timer:<(13r + 7i) % 1000>\|ms` | cumulative count, per tile and over the run |
//! | set | `chaos.set:m<r % 7>\|s` | distinct members per tile |

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_core::clock::now_ms;

/// The statsd types of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `|c`.
    Counter,
    /// `|g`, set and adjusted.
    Gauge,
    /// `|ms`.
    Timer,
    /// `|s`.
    Set,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [Kind::Counter, Kind::Gauge, Kind::Timer, Kind::Set];

    /// The statsd name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "chaos.counter",
            Kind::Gauge => "chaos.gauge",
            Kind::Timer => "chaos.timer",
            Kind::Set => "chaos.set",
        }
    }
}

/// Members of a set series cycle through this many values.
pub const SET_MEMBERS: u64 = 7;

/// What series `series` of `kind` sends in round `round`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Line {
    /// A counter increment.
    Add(f64),
    /// A gauge set.
    Set(f64),
    /// A gauge delta.
    Delta(f64),
    /// A timer observation, in ms.
    Observe(f64),
    /// A set member.
    Member(u64),
}

/// The line of `series` of `kind` in `round`.
pub fn line(kind: Kind, series: u64, round: u64) -> Line {
    match kind {
        Kind::Counter => Line::Add((1 + (round + series) % 3) as f64),
        Kind::Gauge if round.is_multiple_of(4) => Line::Set(((7 * round + series) % 1_000) as f64),
        Kind::Gauge if round % 2 == 1 => Line::Delta(2.0),
        Kind::Gauge => Line::Delta(-1.0),
        Kind::Timer => Line::Observe(((13 * round + 7 * series) % 1_000) as f64),
        Kind::Set => Line::Member(round % SET_MEMBERS),
    }
}

fn format_line(out: &mut String, kind: Kind, series: u64, round: u64) {
    use std::fmt::Write;
    let name = kind.name();
    let _ = match line(kind, series, round) {
        Line::Add(value) => writeln!(out, "{name}:{value}|c|#series:{series}"),
        Line::Set(value) => writeln!(out, "{name}:{value}|g|#series:{series}"),
        Line::Delta(value) => writeln!(out, "{name}:{value:+}|g|#series:{series}"),
        Line::Observe(value) => writeln!(out, "{name}:{value}|ms|#series:{series}"),
        Line::Member(member) => writeln!(out, "{name}:m{member}|s|#series:{series}"),
    };
}

/// One round as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Its number.
    pub number: u64,
    /// The clock (unix ms) just before its first datagram.
    pub before_ms: i64,
    /// The clock just after its last datagram.
    pub after_ms: i64,
}

/// The series and how they are spread over collectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Series of each kind.
    pub series_per_kind: u64,
    /// Collectors.
    pub collectors: usize,
}

impl Workload {
    /// The collector that series `series` (of any kind) is sent to.
    pub fn collector_of(&self, series: u64) -> usize {
        (series % self.collectors as u64) as usize
    }

    /// The datagrams of one round for collector `collector`, each at most 1 400 bytes.
    pub fn datagrams(&self, collector: usize, round: u64) -> Vec<String> {
        let mut datagrams = Vec::new();
        let mut current = String::new();
        let mut line = String::new();
        for kind in Kind::ALL {
            for series in (collector as u64..self.series_per_kind).step_by(self.collectors) {
                line.clear();
                format_line(&mut line, kind, series, round);
                if current.len() + line.len() > 1_400 {
                    datagrams.push(std::mem::take(&mut current));
                }
                current.push_str(&line);
            }
        }
        if !current.is_empty() {
            datagrams.push(current);
        }
        datagrams
    }
}

/// The sending thread and its ledger.
pub struct Sender {
    ledger: Arc<Mutex<Vec<Round>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Rounds go out at these offsets (ms) into every second.
pub const ROUND_OFFSETS_MS: [i64; 2] = [250, 750];

impl Sender {
    /// Starts sending rounds of `workload` to `targets` (one statsd address per
    /// collector) from the next round offset on.
    pub fn start(workload: Workload, targets: Vec<SocketAddr>) -> std::io::Result<Sender> {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        let ledger = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("chaos-sender".into()).spawn({
            let (ledger, stop) = (ledger.clone(), stop.clone());
            move || {
                let mut round = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    sleep_until_next_offset();
                    let rounds: Vec<Vec<String>> =
                        (0..targets.len()).map(|collector| workload.datagrams(collector, round)).collect();
                    let before_ms = now_ms();
                    for (datagrams, target) in rounds.iter().zip(&targets) {
                        for datagram in datagrams {
                            // A collector that is down refuses nothing over UDP: the line is
                            // lost, which the checker excuses around the collector's faults.
                            let _ = socket.send_to(datagram.as_bytes(), target);
                        }
                    }
                    let after_ms = now_ms();
                    ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Round {
                        number: round,
                        before_ms,
                        after_ms,
                    });
                    round += 1;
                }
            }
        })?;
        Ok(Sender { ledger, stop, thread: Some(thread) })
    }

    /// Rounds sent so far.
    pub fn rounds(&self) -> usize {
        self.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Stops sending and returns the ledger.
    pub fn finish(mut self) -> Vec<Round> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn sleep_until_next_offset() {
    let now = now_ms();
    let into_second = now.rem_euclid(1_000);
    let next = ROUND_OFFSETS_MS
        .iter()
        .map(|offset| offset - into_second)
        .find(|wait| *wait > 0)
        .unwrap_or(1_000 + ROUND_OFFSETS_MS[0] - into_second);
    std::thread::sleep(Duration::from_millis(next as u64));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_goes_to_one_collector_in_datagrams_under_1400_bytes() {
        let workload = Workload { series_per_kind: 500, collectors: 2 };
        let mut lines = 0;
        for collector in 0..2 {
            for datagram in workload.datagrams(collector, 3) {
                assert!(datagram.len() <= 1_400);
                for line in datagram.lines() {
                    let series: u64 = line.rsplit_once("series:").unwrap().1.parse().unwrap();
                    assert_eq!(workload.collector_of(series), collector);
                    lines += 1;
                }
            }
        }
        assert_eq!(lines, 4 * 500);
    }

    #[test]
    fn gauges_are_set_then_adjusted() {
        assert_eq!(line(Kind::Gauge, 3, 8), Line::Set(59.0));
        assert_eq!(line(Kind::Gauge, 3, 9), Line::Delta(2.0));
        assert_eq!(line(Kind::Gauge, 3, 10), Line::Delta(-1.0));
        let mut text = String::new();
        format_line(&mut text, Kind::Gauge, 3, 10);
        assert_eq!(text, "chaos.gauge:-1|g|#series:3\n");
        text.clear();
        format_line(&mut text, Kind::Gauge, 3, 9);
        assert_eq!(text, "chaos.gauge:+2|g|#series:3\n");
    }
}
