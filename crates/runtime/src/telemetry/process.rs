//! The standard `process_*` metrics, read at scrape time.
//!
//! Names follow the Prometheus client libraries' process collector, so stock dashboards
//! work: `process_start_time_seconds` everywhere; on Linux also `process_cpu_seconds_total`
//! (user + system, all threads) and `process_resident_memory_bytes`, both from
//! `/proc/self/stat`. The clock tick and page size that scale them come from
//! `/proc/self/auxv` (`AT_CLKTCK`, `AT_PAGESZ`), read once, which needs no `unsafe`
//! `sysconf` call.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// Encodes the process metrics on each scrape.
#[derive(Debug)]
pub(super) struct ProcessCollector {
    start_time_seconds: f64,
}

impl ProcessCollector {
    /// Reads the process start time: the kernel's on Linux, else the time of this call.
    pub(super) fn new() -> Self {
        #[cfg(target_os = "linux")]
        if let Some(start_time_seconds) = linux::start_time_seconds() {
            return Self { start_time_seconds };
        }
        Self { start_time_seconds: tessera_core::clock::now_secs() }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_unlabelled(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            &ConstGauge::new(self.start_time_seconds),
        )?;

        #[cfg(target_os = "linux")]
        if let Some(usage) = linux::usage() {
            use prometheus_client::metrics::counter::ConstCounter;

            encode_unlabelled(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                &ConstCounter::new(usage.cpu_seconds),
            )?;
            encode_unlabelled(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                &ConstGauge::new(usage.resident_memory_bytes),
            )?;
        }
        Ok(())
    }
}

/// Encodes `metric`, which has no labels, as the family `name`.
fn encode_unlabelled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::OnceLock;

    /// Clock ticks per second and page size of this process.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub(super) struct Units {
        pub(super) clock_ticks_per_second: u64,
        pub(super) page_size_bytes: u64,
    }

    /// What Linux has used on every mainstream architecture for decades; only for when
    /// `/proc/self/auxv` cannot be read.
    const FALLBACK_UNITS: Units = Units { clock_ticks_per_second: 100, page_size_bytes: 4096 };

    /// CPU and memory use at one moment.
    #[derive(Debug, PartialEq)]
    pub(super) struct Usage {
        pub(super) cpu_seconds: f64,
        pub(super) resident_memory_bytes: u64,
    }

    /// The fields of `/proc/<pid>/stat` used here, in their raw units.
    #[derive(Debug, PartialEq)]
    pub(super) struct Stat {
        pub(super) user_ticks: u64,
        pub(super) system_ticks: u64,
        pub(super) start_ticks_after_boot: u64,
        pub(super) resident_pages: u64,
    }

    pub(super) fn usage() -> Option<Usage> {
        let stat = read_stat()?;
        let units = units();
        Some(Usage {
            cpu_seconds: (stat.user_ticks + stat.system_ticks) as f64 / units.clock_ticks_per_second as f64,
            resident_memory_bytes: stat.resident_pages * units.page_size_bytes,
        })
    }

    pub(super) fn start_time_seconds() -> Option<f64> {
        let stat = read_stat()?;
        let boot_time_seconds = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(boot_time_seconds as f64 + stat.start_ticks_after_boot as f64 / units().clock_ticks_per_second as f64)
    }

    fn read_stat() -> Option<Stat> {
        parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }

    fn units() -> Units {
        static UNITS: OnceLock<Units> = OnceLock::new();
        *UNITS.get_or_init(|| std::fs::read("/proc/self/auxv").ok().map_or(FALLBACK_UNITS, |auxv| parse_auxv(&auxv)))
    }

    /// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
    /// parentheses, so fields are counted from the last `)`.
    pub(super) fn parse_stat(text: &str) -> Option<Stat> {
        let after_command = &text[text.rfind(')')? + 1..];
        // Field 3 (state) is index 0 here, so field N is index N - 3.
        let fields: Vec<&str> = after_command.split_ascii_whitespace().collect();
        let field = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
        Some(Stat {
            user_ticks: field(14)?,
            system_ticks: field(15)?,
            start_ticks_after_boot: field(22)?,
            resident_pages: field(24)?,
        })
    }

    /// Reads `btime` (boot time, seconds since the epoch) from `/proc/stat`.
    pub(super) fn parse_boot_time(text: &str) -> Option<u64> {
        text.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|value| value.trim().parse().ok())
    }

    /// Reads `AT_CLKTCK` (17) and `AT_PAGESZ` (6) from the auxiliary vector: pairs of
    /// native-endian machine words, ending with `AT_NULL` (0).
    pub(super) fn parse_auxv(auxv: &[u8]) -> Units {
        const AT_NULL: u64 = 0;
        const AT_PAGESZ: u64 = 6;
        const AT_CLKTCK: u64 = 17;
        const WORD: usize = size_of::<usize>();

        let word = |bytes: &[u8]| -> u64 {
            let mut native = [0u8; WORD];
            native.copy_from_slice(bytes);
            usize::from_ne_bytes(native) as u64
        };
        let mut units = FALLBACK_UNITS;
        for pair in auxv.chunks_exact(2 * WORD) {
            let (key, value) = (word(&pair[..WORD]), word(&pair[WORD..]));
            match key {
                AT_NULL => break,
                AT_PAGESZ if value > 0 => units.page_size_bytes = value,
                AT_CLKTCK if value > 0 => units.clock_ticks_per_second = value,
                _ => {}
            }
        }
        units
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::linux::*;

    #[test]
    fn parses_stat_with_a_command_holding_spaces_and_parentheses() {
        let text = "4242 (tessera (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 50 0 0 20 0 9 0 123456 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let stat = parse_stat(text).expect("valid stat line");
        assert_eq!(
            stat,
            Stat { user_ticks: 250, system_ticks: 50, start_ticks_after_boot: 123456, resident_pages: 2560 }
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn parses_boot_time() {
        assert_eq!(parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu  1 2 3\n"), None);
    }

    #[test]
    fn parses_clock_tick_and_page_size_from_auxv() {
        let mut auxv = Vec::new();
        for (key, value) in [(16usize, 0xbfebfbffusize), (6, 65536), (17, 250), (0, 0), (6, 1)] {
            auxv.extend_from_slice(&key.to_ne_bytes());
            auxv.extend_from_slice(&value.to_ne_bytes());
        }
        let units = parse_auxv(&auxv);
        assert_eq!((units.clock_ticks_per_second, units.page_size_bytes), (250, 65536));
        let fallback = parse_auxv(&[]);
        assert_eq!((fallback.clock_ticks_per_second, fallback.page_size_bytes), (100, 4096));
    }

    #[test]
    fn reads_this_process() {
        let usage = usage().expect("/proc/self/stat is readable on Linux");
        assert!(usage.resident_memory_bytes > 0);
        assert!(usage.cpu_seconds >= 0.0);
        let start = start_time_seconds().expect("/proc/stat is readable on Linux");
        let now = tessera_core::clock::now_secs();
        assert!(start <= now + 1.0 && start > now - 86_400.0 * 365.0, "start {start}, now {now}");
    }
}
