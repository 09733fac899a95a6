//! Heap bytes per series the collector's rules cache holds, for a few rule files: the
//! rules stage alone (no reader tables, no senders), measured by a counting allocator.
//!
//! ```sh
//! cargo run --release -p tessera-benches --example rule_cache_memory [SERIES]
//! ```
//!
//! Prints, per rule file, the bytes the cache and the limits hold per cached series
//! once every series went through one cut (the ids routed are allocated before and
//! not counted).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use tessera_core::parse::MetricKind;
use tessera_rules::{LimitConfig, Overflow, RollupConfig, RuleCache, RuleMetrics, RuleSet, RulesConfig, RulesHandle};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the counter only
// adds up the sizes it is asked for and given back.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on as it came.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn limit(matches: &str) -> LimitConfig {
    LimitConfig { matches: matches.to_owned(), max_series: usize::MAX, overflow: Overflow::Fold }
}

fn main() {
    let series: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let rollup = RollupConfig {
        matches: "api.*".to_owned(),
        aggregate_without: vec!["user".to_owned()],
        keep_original: true,
        name: Some("api.by_route".to_owned()),
    };
    let cases = [
        (
            "a name prefix (every series renamed)",
            RulesConfig { name_prefix: Some("app.".to_owned()), ..Default::default() },
        ),
        ("a catch-all limit", RulesConfig { limit: vec![limit("*")], ..Default::default() }),
        (
            "a rollup that keeps the original, under a limit",
            RulesConfig { rollup: vec![rollup], limit: vec![limit("*")], ..Default::default() },
        ),
    ];
    let ids: Vec<Vec<u8>> =
        (0..series).map(|n| format!("api.requests|#route:/r{},user:{n}", n % 100).into_bytes()).collect();
    println!("{series} series, ids like {}", String::from_utf8_lossy(&ids[series - 1]));
    for (name, config) in cases {
        let metrics = RuleMetrics::default();
        let set = RuleSet::compile(None, &config, &metrics).expect("the rules compile");
        let mut cache = RuleCache::new(Arc::new(RulesHandle::new(set)), metrics, i64::MAX);
        let before = HELD.load(Ordering::Relaxed);
        let mut cut = cache.begin(0).expect("rules in force");
        for id in &ids {
            cut.route(MetricKind::Counter, id, |target| {
                std::hint::black_box(target);
            });
        }
        cut.finish();
        let held = HELD.load(Ordering::Relaxed) - before;
        println!("{name}: {:.0} bytes per series", held as f64 / series as f64);
        drop(cache);
    }
}
