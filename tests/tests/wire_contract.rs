//! Cross-crate: aggregates built by `tessera-core` travel in
//! `tessera-proto` frames over a real TCP connection and merge back to
//! exactly what was observed.

use std::collections::HashMap;

use tessera_core::aggregate::{Aggregate, kind_from_proto, kind_to_proto};
use tessera_core::parse::{Parsed, parse_datagram};
use tessera_core::shard::shard_of;
use tessera_core::table::{Table, TableOptions};
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Frame, PartialBatch, Role, SeriesValue, ShardPartials, frame::Body};

#[tokio::test]
async fn partials_cross_a_real_socket_and_merge_back_exactly() {
    let datagram = b"req:1|c|#route:/a\nreq:3|c|@0.5|#route:/a\nlat:10:20|ms\nlat:30|ms|@0.25\nusers:a|s\nusers:b|s\nusers:a|s\ntemp:5|g\ntemp:+2|g";
    let mut table = Table::new(TableOptions::default());
    parse_datagram(datagram, |parsed| {
        if let Parsed::Metric(line) = parsed {
            table.observe(&line, 1_000).unwrap();
        }
    });
    let mut by_shard: HashMap<u32, Vec<SeriesValue>> = HashMap::new();
    let mut expected = HashMap::new();
    table.cut(|kind, id, aggregate| {
        by_shard.entry(shard_of(id, 16)).or_default().push(SeriesValue {
            r#ref: 0,
            series_id: id.to_vec(),
            r#type: kind_to_proto(kind) as i32,
            aggregate: Some(aggregate.to_proto()),
        });
        expected.insert((kind, id.to_vec()), aggregate.clone());
    });
    let batch = PartialBatch {
        dictionary: 0,
        source: "test".into(),
        sequence: 1,
        window_start_ms: 0,
        window_ms: 1000,
        placement_version: 1,
        watermark_ms: 1000,
        expanded_from: 0,
        shards: by_shard.into_iter().map(|(shard, series)| ShardPartials { shard, series }).collect(),
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        framing::server_handshake(&mut stream, "server").await.unwrap();
        let mut scratch = Vec::new();
        framing::read_frame(&mut stream, &mut scratch, DEFAULT_MAX_FRAME_BYTES).await.unwrap()
    });
    let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
    framing::client_handshake(&mut client, Role::Collector, "client").await.unwrap();
    let frame = Frame { body: Some(Body::Partials(batch)) };
    framing::write_frame(&mut client, &frame, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
    let received = server.await.unwrap();

    let Some(Body::Partials(batch)) = received.body else { panic!("not a partial batch") };
    let mut got = HashMap::new();
    for shard in batch.shards {
        for value in shard.series {
            assert_eq!(shard_of(&value.series_id, 16), shard.shard, "series routed to its shard");
            let kind = kind_from_proto(value.r#type).unwrap();
            got.insert((kind, value.series_id), Aggregate::from_proto(&value.aggregate.unwrap()).unwrap());
        }
    }
    assert_eq!(got, expected);
    let counter = got.iter().find(|((_, id), _)| id == b"req|#route:/a").unwrap().1;
    assert_eq!(counter.counter(), Some(1.0 + 6.0));
}
