//! Proves that parsing, building series keys and folding lines of known
//! series allocate nothing, with a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tessera_core::parse::{Parsed, parse_datagram};
use tessera_core::series::SeriesKey;
use tessera_core::table::{Table, TableOptions};

struct Counting;

thread_local! {
    // Counted per thread: the test harness's own thread may allocate while
    // the test runs (it books the test it has just started), and that is not
    // ours. A const-initialised `Cell` needs no allocation and no destructor.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: a thread being torn down has no counter left, and that is fine.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DATAGRAM: &[u8] = b"api.requests:1|c|#env:prod,route:/users,method:GET\n\
api.latency:12.5:13:14.25|ms|@0.5|#route:/users,env:prod\r\n\
queue.depth:42|g|#queue:emails\n\
queue.depth:+3|g|#queue:emails\n\
payload.size:512|h|T1700000000|c:83c1d2\n\
render:0.003|d|#zone:eu-1, region:eu\n\
users.online:user-1234|s|#app:web\n\
_e{5,5}:hello|world\n\
_sc|db.up|0\n\
bad line with no value\n\
bytes.total:1e6|c\n\
api.hits,env=prod,host=a,bad:1|c\n\
api.hits#host=a,env=prod:1|c\n\
api.[env=prod,host=a]hits:1|c|@0.5\n\
api.hits:1|c|#host:a|c:f00d\n";

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

/// One test, and allocations counted on this thread alone.
#[test]
fn parsing_and_folding_known_series_allocate_nothing() {
    // Parsing alone: never allocates, not even the first time.
    let mut metrics = 0;
    let parse_allocations = allocations_during(|| {
        for _ in 0..1000 {
            parse_datagram(DATAGRAM, |parsed| {
                if let Parsed::Metric(line) = parsed {
                    metrics += line.values().count() + usize::from(line.set_member().is_empty());
                }
            });
        }
    });
    assert!(metrics > 0);
    assert_eq!(parse_allocations, 0, "parsing allocated");

    // Building canonical ids: only while the reused buffer grows.
    let mut key = SeriesKey::default();
    parse_datagram(DATAGRAM, |parsed| {
        if let Parsed::Metric(line) = parsed {
            key.build(&line).unwrap();
        }
    });
    let key_allocations = allocations_during(|| {
        for _ in 0..1000 {
            parse_datagram(DATAGRAM, |parsed| {
                if let Parsed::Metric(line) = parsed {
                    key.build(&line).unwrap();
                }
            });
        }
    });
    assert_eq!(key_allocations, 0, "building series keys allocated");

    // Folding into a table: series are created on first sight, then never again.
    let mut table = Table::new(TableOptions::default());
    let fold = |table: &mut Table| {
        parse_datagram(DATAGRAM, |parsed| {
            if let Parsed::Metric(line) = parsed {
                table.observe(&line, 1_700_000_000_000).unwrap();
            }
        });
    };
    fold(&mut table);
    let series = table.len();
    table.cut(|_, _, _| {});
    fold(&mut table);
    table.cut(|_, _, _| {});
    let steady_allocations = allocations_during(|| {
        for _ in 0..1000 {
            fold(&mut table);
        }
        table.cut(|_, _, _| {});
    });
    assert_eq!(table.len(), series);
    assert_eq!(steady_allocations, 0, "folding known series allocated");
}
