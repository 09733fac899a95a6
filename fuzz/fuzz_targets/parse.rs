//! Fuzzes the statsd parser, series ids and table folding on arbitrary
//! datagrams, and checks that the collector's fast path (simple lines
//! folded in place) folds every datagram into the same series as the full
//! parser does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::aggregate::Aggregate;
use tessera_core::parse::{MetricKind, ParseOptions, Parsed, parse_datagram};
use tessera_core::series::SeriesKey;
use tessera_core::table::{Table, TableOptions};

fn cut(table: &mut Table) -> Vec<(Vec<u8>, MetricKind, Aggregate)> {
    let mut out = Vec::new();
    table.cut(|kind, id, aggregate| {
        assert!(!id.is_empty());
        let _ = aggregate.to_proto();
        out.push((id.to_vec(), kind, aggregate.clone()));
    });
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

fuzz_target!(|data: &[u8]| {
    let mut key = SeriesKey::default();
    let options = TableOptions { max_series: Some(64), ..TableOptions::default() };
    let mut full = Table::new(options);
    parse_datagram(data, |parsed| {
        if let Parsed::Metric(line) = parsed {
            assert!(!line.name.is_empty());
            assert!(line.sample_rate > 0.0 && line.sample_rate <= 1.0);
            for value in line.values() {
                assert!(value.value.is_finite());
            }
            key.build(&line).expect("accepted lines have at most MAX_TAGS tags");
            let _ = full.observe(&line, 0);
        }
    });
    let mut fast = Table::new(options);
    fast.fold_datagram(data, ParseOptions::default(), 0, |_| {});
    let (fast, full) = (cut(&mut fast), cut(&mut full));
    // NaN sums never occur (values are finite), so equality is exact.
    assert_eq!(fast, full, "the fast path folds differently");
});
