//! Fuzzes the statsd parser, series ids and table folding on arbitrary datagrams.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::parse::{Parsed, parse_datagram};
use tessera_core::series::SeriesKey;
use tessera_core::table::{Table, TableOptions};

fuzz_target!(|data: &[u8]| {
    let mut key = SeriesKey::default();
    let mut table = Table::new(TableOptions { max_series: Some(64), ..TableOptions::default() });
    parse_datagram(data, |parsed| {
        if let Parsed::Metric(line) = parsed {
            assert!(!line.name.is_empty());
            assert!(line.sample_rate > 0.0 && line.sample_rate <= 1.0);
            for value in line.values() {
                assert!(value.value.is_finite());
            }
            key.build(&line).expect("accepted lines have at most MAX_TAGS tags");
            let _ = table.observe(&line, 0);
        }
    });
    table.cut(|_, id, aggregate| {
        assert!(!id.is_empty());
        let _ = aggregate.to_proto();
    });
});
