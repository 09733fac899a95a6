//! A full disk under the ingester's queue, for real: the queue lives on a small tmpfs that
//! the test mounts and fills. While it is full every batch is answered `Retryable`
//! (`queue_io`) and nothing unwritten is acknowledged; once space is back the ingester
//! takes batches again on its own (rotating segments included), and every batch that was
//! acknowledged reaches the sink exactly once.

mod support {
    pub mod wire;
}

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::wire::{batch, counter, metric_value, recent_tile_end_ms, start_ingester, wait_until};
use tessera_proto::{AckStatus, TileBatch};

const SERIES: usize = 20;

/// A tmpfs of `bytes` mounted on a fresh directory, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs failed: this test needs root (or CAP_SYS_ADMIN), as scripts/test.sh has"
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Grows a file until the disk is full (again: the ingester frees space as its queue
    /// drains); returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let chunk = vec![0u8; 1024];
        while file.write_all(&chunk).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn tiles_at(sequence: u64, t0: i64) -> TileBatch {
    let tiles = (0..SERIES).map(|n| counter(&format!("disk.full.c{n}"), 1.0)).collect();
    batch(sequence, "10s:2d", t0 + sequence as i64 * 10_000, tiles)
}

/// Every `disk_full_c*_total` sample in the sink's closed files: series -> [(time, value)].
fn sink_samples(dir: &Path) -> BTreeMap<String, Vec<(String, f64)>> {
    let mut samples: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|extension| extension != "om") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines().filter(|line| line.starts_with("disk_full_c")) {
            let mut fields = line.rsplitn(3, ' ');
            let (Some(time), Some(value), Some(series)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            samples.entry(series.to_owned()).or_default().push((time.to_owned(), value.parse().unwrap()));
        }
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_answered_retryable_and_the_queue_recovers_when_space_is_back() {
    let disk = SmallDisk::mount(512 << 10);
    let sink = tempfile::tempdir().unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[queue]\nsegment_max_bytes = 4096\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\nrotate_secs = 3600\n",
        disk.path().display(),
        sink.path().display()
    );
    let (ingester, telemetry, shutdown, mut sender) = start_ingester(&config).await;
    let t0 = recent_tile_end_ms(10);

    for sequence in 0..3 {
        let ack = sender.send(tiles_at(sequence, t0)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
    // The disk fills up. A batch that still fits in the segment's last allocated page is
    // taken (it is written); the first that needs a new page or a new segment is refused,
    // retryably, and so is every try while the disk stays full. Each time, the queue has
    // drained first and holds only its active segment, so that it frees no space of its
    // own between the filling and the try.
    let queue = ingester.queue("default").unwrap();
    let settled = || ingester.pending_records() == 0 && queue.segments() == 1;
    let filler = disk.path().join("filler");
    let mut refused_at = None;
    for sequence in 3..13 {
        wait_until("the queue to settle", Duration::from_secs(10), settled).await;
        disk.fill();
        let ack = sender.send(tiles_at(sequence, t0)).await;
        match AckStatus::try_from(ack.status) {
            Ok(AckStatus::Ok) => {}
            Ok(AckStatus::Retryable) => {
                assert_eq!(ack.reason, "queue_io", "{ack:?}");
                refused_at = Some(sequence);
                break;
            }
            _ => panic!("unexpected answer on a full disk: {ack:?}"),
        }
    }
    let refused_at = refused_at.expect("a batch refused while the disk is full");
    for _ in 0..4 {
        wait_until("the queue to settle", Duration::from_secs(10), settled).await;
        disk.fill();
        let ack = sender.send(tiles_at(refused_at, t0)).await;
        assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Retryable as i32, "queue_io"), "{ack:?}");
    }
    let text = telemetry.encode().unwrap();
    assert!(metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="retryable",reason="queue_io""#) >= 5.0);

    // Space is back: the same batch is taken, and the ones after it, with no restart.
    std::fs::remove_file(filler).unwrap();
    tokio::time::timeout(Duration::from_secs(30), sender.send_until_ok(tiles_at(refused_at, t0)))
        .await
        .expect("the queue takes batches again within 30 s of space coming back");
    let total = refused_at + 10;
    for sequence in refused_at + 1..total {
        let ack = sender.send(tiles_at(sequence, t0)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "batch {sequence} after recovery: {ack:?}");
    }
    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    shutdown.trigger();
    ingester.wait().await;

    // Every acknowledged batch is in the sink once: one sample per tile, counting up by one.
    let samples = sink_samples(sink.path());
    assert_eq!(samples.len(), SERIES, "{samples:?}");
    for (series, points) in samples {
        let values: Vec<f64> = points.iter().map(|(_, value)| *value).collect();
        let expected: Vec<f64> = (1..=total).map(|n| n as f64).collect();
        assert_eq!(values, expected, "{series}");
    }
}
