//! The tiler's steady-state merge, for instruction counts with callgrind
//! (wall clock on a shared machine is noisy; instruction counts are not).
//!
//! Puts `SERIES` counters (default 10 000) in the default policies' tables,
//! then merges every series `ROUNDS` times (default 20) in batches of
//! 10 000. The difference between a run with `ROUNDS=20` and one with
//! `ROUNDS=0`, divided by `20 * SERIES`, is the cost of one partial named
//! by id; with `REFS=1`, of one named by a connection dictionary's slot:
//!
//! ```text
//! cargo build --release -p tessera-aggregator --example merge_rounds
//! for rounds in 0 20; do
//!   ROUNDS=$rounds valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/merge_rounds 2>&1 | grep Collected
//! done
//! ```

use tessera_aggregator::{Partial, Tiler, TilerSettings, Via, WindowPartials};
use tessera_core::aggregate::Aggregate;
use tessera_core::parse::MetricKind;

const NOW: i64 = 1_700_000_045_000;
const WINDOW: i64 = 1_700_000_044_000;
const BATCH: usize = 10_000;

/// The policies these numbers were measured with since the start: 10 s and 1 min tiles.
const TWO_POLICIES: [&str; 2] = ["10s:2d", "1m:40d"];

fn main() {
    let variable =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default);
    let (series, rounds) = (variable("SERIES", 10_000), variable("ROUNDS", 20));
    // REFS=1: the first round names every series by id with a dictionary
    // slot, the others by the slot alone, as a collector's dictionary does.
    let by_ref = variable("REFS", 0) != 0;
    let batches: Vec<WindowPartials> = (0..series.div_ceil(BATCH))
        .map(|index| WindowPartials {
            connection: 1,
            window_start_ms: WINDOW,
            window_ms: 1000,
            partials: (index * BATCH..((index + 1) * BATCH).min(series))
                .map(|n| Partial {
                    via: if by_ref { Via::Define { slot: n as u32 } } else { Via::Id },
                    kind: MetricKind::Counter,
                    id: format!(
                        "http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}",
                        n % 50,
                        n % 1000
                    )
                    .into_bytes(),
                    aggregate: Aggregate::Counter(1.0),
                })
                .collect(),
        })
        .collect();
    let policies = TWO_POLICIES.iter().map(|text| text.parse().expect("default policies parse")).collect();
    let mut tiler = Tiler::new(TilerSettings::new(policies), NOW);
    for batch in &batches {
        tiler.accept(batch, NOW, &mut |_| {}).expect("the window is open");
    }
    let batches: Vec<WindowPartials> = if by_ref {
        let by_slot = |partial: &Partial| match partial.via {
            Via::Define { slot } => Partial { via: Via::Ref { slot }, id: Vec::new(), ..partial.clone() },
            _ => partial.clone(),
        };
        batches
            .iter()
            .map(|batch| WindowPartials { partials: batch.partials.iter().map(by_slot).collect(), ..batch.clone() })
            .collect()
    } else {
        batches
    };
    let mut unknown = 0;
    for _ in 0..rounds {
        for batch in &batches {
            unknown += tiler.accept(batch, NOW, &mut |_| {}).expect("the window is open").unknown_refs;
        }
    }
    assert_eq!(unknown, 0, "every slot was defined in the first round");
    println!("{} series held, {} merges", tiler.series_held(0), (rounds + 1) * series);
}
