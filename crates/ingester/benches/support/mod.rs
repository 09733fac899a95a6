//! What the ingester's benchmarks feed it.

use tessera_proto::TileBatch;
use tessera_testkit::tiles::{batch, counter};

/// A 10 s tile batch ending at `tile_end_ms` of `count` counters, each added 1: HTTP
/// requests by endpoint (50) and host (1 000), one series per `series` tag.
pub fn request_counters(count: usize, tile_end_ms: i64) -> TileBatch {
    let tiles = (0..count)
        .map(|n| {
            let id =
                format!("http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}", n % 50, n % 1000);
            counter(&id, 1.0)
        })
        .collect();
    batch(tile_end_ms, tiles)
}
