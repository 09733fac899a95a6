//! The disk under the ingester's queue failing, for real.
//!
//! - **Full**: the queue lives on a small tmpfs that the test mounts and fills. While it is
//!   full every batch is answered `Retryable` (`queue_io`) and nothing unwritten is
//!   acknowledged; once space is back the ingester takes batches again on its own (rotating
//!   segments included).
//! - **Failing fsync**: the queue lives on an ext2 filesystem on a loop device whose sparse
//!   backing file sits on a small tmpfs; once that tmpfs is full, `write` still succeeds but
//!   writing the new blocks back fails below the filesystem and `fsync` reports it. The batch
//!   is answered `Retryable`, the segment is sealed, and once the device takes writes again
//!   the queue goes on in a new segment, with no restart.
//!
//! In every case each batch that was acknowledged reaches the sink exactly once.

mod support {
    pub mod wire;
}

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::wire::{Sender, batch, counter, metric_value, recent_tile_end_ms, start_ingester, wait_until};
use tessera_ingester::Ingester;
use tessera_proto::{AckStatus, TileBatch};
use tessera_runtime::{Shutdown, Telemetry};

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

    fn filler(&self) -> PathBuf {
        self.path().join("filler")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Grows a file until the disk is full (again: the ingester frees space as its queue
    /// drains); returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.filler();
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

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("run {program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed (this test needs root and e2fsprogs, as scripts/test.sh has): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// An ext2 filesystem (4 KiB blocks, `errors=continue`) on a loop device whose backing file
/// is a sparse 64 MiB file on a 16 MiB tmpfs. The filesystem always has room; the tmpfs
/// runs out. The device takes write requests of one block at most. Unmounted and detached
/// on drop, the device's request size set back as it was.
struct FailingDisk {
    mount: tempfile::TempDir,
    device: String,
    /// The device's `max_sectors_kb` before the test limited it.
    max_request_kb: String,
    back: SmallDisk,
}

/// Where the largest request block device `device` (`/dev/loopN`) takes is set, in KiB.
fn max_request_kb_path(device: &str) -> PathBuf {
    let name = device.rsplit('/').next().unwrap_or(device);
    Path::new("/sys/block").join(name).join("queue").join("max_sectors_kb")
}

impl FailingDisk {
    fn mount() -> FailingDisk {
        let back = SmallDisk::mount(16 << 20);
        let image = back.path().join("disk.img");
        std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
        let device = run("losetup", &["--find", "--show", image.to_str().unwrap()]);
        let limit = max_request_kb_path(&device);
        let max_request_kb = std::fs::read_to_string(&limit)
            .unwrap_or_else(|error| panic!("read {}: {error}", limit.display()))
            .trim()
            .to_owned();
        let mount = tempfile::tempdir().unwrap();
        let disk = FailingDisk { mount, device, max_request_kb, back };
        // One block per write request. The loop driver takes a write that stops short as done:
        // a request that starts on a block the backing file holds and runs on into blocks it
        // cannot hold succeeds, and the blocks after the first are dropped without an error.
        // Whether a segment's new blocks follow its first one on disk (and so go in one
        // request with it) depends on which CPU allocated them and on what other files took
        // blocks in between, so without this the fsync sealing a full segment now and then
        // succeeded (under load: nothing counted at risk, the data gone).
        std::fs::write(&limit, "4").unwrap_or_else(|error| panic!("write {}: {error}", limit.display()));
        run("mkfs.ext2", &["-q", "-F", "-b", "4096", "-N", "256", &disk.device]);
        run("mount", &["-o", "errors=continue", &disk.device, disk.path().to_str().unwrap()]);
        disk
    }

    fn path(&self) -> &Path {
        self.mount.path()
    }

    /// From now on, until [`FailingDisk::heal`], writing back any block the filesystem
    /// allocates fails: `fstrim` punches every free block out of the backing file, then the
    /// tmpfs is filled, so a newly written block finds no page to land in (and, each request
    /// being one block, its write fails even next to an allocated block). Writes already
    /// made to allocated blocks (the tail of a segment's last block) still succeed.
    fn fail_new_blocks(&self) {
        run("fstrim", &[self.path().to_str().unwrap()]);
        self.back.fill();
    }

    fn heal(&self) {
        std::fs::remove_file(self.back.filler()).unwrap();
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let mount = self.mount.path().to_str().unwrap_or_default();
        let unmounted = Command::new("umount").arg(mount).status().is_ok_and(|status| status.success());
        if !unmounted {
            let _ = Command::new("umount").args(["-l", mount]).status();
        }
        // The device outlives the test: its request size goes back as it was.
        let _ = std::fs::write(max_request_kb_path(&self.device), &self.max_request_kb);
        // Detaches now, or when the lazy unmount lets go of it (autoclear).
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
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

/// Batches `0..total` are each in the sink once: one sample per series and tile, the
/// cumulative counters counting up by one.
fn assert_each_batch_once(sink: &Path, total: u64) {
    let samples = sink_samples(sink);
    assert_eq!(samples.len(), SERIES, "{samples:?}");
    for (series, points) in samples {
        let values: Vec<f64> = points.iter().map(|(_, value)| *value).collect();
        let expected: Vec<f64> = (1..=total).map(|n| n as f64).collect();
        assert_eq!(values, expected, "{series}");
    }
}

/// Sends batches `sequences` in turn, each acknowledged `Ok`.
async fn send_all_ok(sender: &mut Sender, t0: i64, sequences: std::ops::Range<u64>) {
    for sequence in sequences {
        let ack = sender.send(tiles_at(sequence, t0)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "batch {sequence}: {ack:?}");
    }
}

/// Sends batches `sequences` in turn until one is refused (`Retryable`/`queue_io`) and
/// returns its sequence; before each, waits for `settled` and runs `break_disk`.
async fn first_refused(
    sender: &mut Sender,
    t0: i64,
    sequences: std::ops::Range<u64>,
    settled: impl Fn() -> bool,
    mut break_disk: impl FnMut(),
) -> u64 {
    for sequence in sequences {
        wait_until("the queue to settle", Duration::from_secs(10), &settled).await;
        break_disk();
        let ack = sender.send(tiles_at(sequence, t0)).await;
        match AckStatus::try_from(ack.status) {
            Ok(AckStatus::Ok) => {}
            Ok(AckStatus::Retryable) => {
                assert_eq!(ack.reason, "queue_io", "{ack:?}");
                return sequence;
            }
            _ => panic!("unexpected answer while the disk fails: {ack:?}"),
        }
    }
    panic!("no batch was refused while the disk failed");
}

/// Sends batch `sequence` `tries` times while the disk stays broken, each time after waiting
/// for `settled` and running `break_disk`: every try is refused (`Retryable`/`queue_io`).
async fn stays_refused(
    sender: &mut Sender,
    t0: i64,
    sequence: u64,
    tries: usize,
    settled: impl Fn() -> bool,
    mut break_disk: impl FnMut(),
) {
    for _ in 0..tries {
        wait_until("the queue to settle", Duration::from_secs(10), &settled).await;
        break_disk();
        let ack = sender.send(tiles_at(sequence, t0)).await;
        assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Retryable as i32, "queue_io"), "{ack:?}");
    }
}

/// Whether the queue has drained and holds only its active segment, so that it frees no
/// space of its own before the next batch.
fn settled(ingester: &Ingester) -> bool {
    ingester.pending_records() == 0 && ingester.queue("default").unwrap().segments() == 1
}

/// Once the disk works again: the refused batch is taken within 30 s (no restart), then
/// `more` batches after it; waits for the queue to drain; returns how many batches there were.
async fn recover(sender: &mut Sender, t0: i64, refused_at: u64, more: u64, ingester: &Ingester) -> u64 {
    tokio::time::timeout(Duration::from_secs(30), sender.send_until_ok(tiles_at(refused_at, t0)))
        .await
        .expect("the queue takes batches again within 30 s of the disk working");
    let total = refused_at + 1 + more;
    send_all_ok(sender, t0, refused_at + 1..total).await;
    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_answered_retryable_and_the_queue_recovers_when_space_is_back() {
    let disk = SmallDisk::mount(512 << 10);
    let (ingester, telemetry, shutdown, mut sender, sink) = start_on(disk.path(), "segment_max_bytes = 4096").await;
    let t0 = recent_tile_end_ms(10);
    send_all_ok(&mut sender, t0, 0..3).await;
    // The disk fills up. A batch that still fits in the segment's last allocated page is
    // taken (it is written); the first that needs a new page or a new segment is refused,
    // retryably, and so is every try while the disk stays full. Each time, the queue has
    // drained first and holds only its active segment, so that it frees no space of its
    // own between the filling and the try.
    let refused_at = first_refused(
        &mut sender,
        t0,
        3..13,
        || settled(&ingester),
        || {
            disk.fill();
        },
    )
    .await;
    stays_refused(
        &mut sender,
        t0,
        refused_at,
        4,
        || settled(&ingester),
        || {
            disk.fill();
        },
    )
    .await;
    let text = telemetry.encode().unwrap();
    assert!(metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="retryable",reason="queue_io""#) >= 5.0);

    // Space is back: the same batch is taken, and the ones after it, with no restart.
    std::fs::remove_file(disk.filler()).unwrap();
    let total = recover(&mut sender, t0, refused_at, 9, &ingester).await;
    shutdown.trigger();
    ingester.wait().await;

    assert_each_batch_once(sink.path(), total);
}

/// An ingester queueing in `data_dir` (`queue`: more `[queue]` keys) and writing to a file
/// sink in a fresh directory, returned last, with a sender connected to it.
async fn start_on(data_dir: &Path, queue: &str) -> (Ingester, Telemetry, Shutdown, Sender, tempfile::TempDir) {
    let sink = tempfile::tempdir().unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[queue]\ncheckpoint_interval_secs = 1\n{queue}\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\nrotate_secs = 3600\n",
        data_dir.display(),
        sink.path().display()
    );
    let (ingester, telemetry, shutdown, sender) = start_ingester(&config).await;
    (ingester, telemetry, shutdown, sender, sink)
}

fn queue_counter(text: &str, name: &str) -> f64 {
    metric_value(text, name, r#"target="default""#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_answered_retryable_and_the_queue_goes_on_in_a_new_segment() {
    let disk = FailingDisk::mount();
    // fsync = "always" (the default): a batch is acknowledged only after its fsync.
    let (ingester, telemetry, shutdown, mut sender, sink) = start_on(disk.path(), "fsync = \"always\"").await;
    let t0 = recent_tile_end_ms(10);
    send_all_ok(&mut sender, t0, 0..3).await;

    // New blocks fail to write back. A batch that fits in the segment's last block is taken;
    // the first that needs a new block is written, its fsync fails, and it is refused.
    let refused_at = first_refused(&mut sender, t0, 3..13, || settled(&ingester), || disk.fail_new_blocks()).await;
    let text = telemetry.encode().unwrap();
    assert_eq!(
        queue_counter(&text, "tessera_ingester_queue_fsync_errors_total"),
        1.0,
        "the refusal was a failed fsync"
    );
    // While the device keeps failing, starting a new segment fails too: still refused.
    stays_refused(&mut sender, t0, refused_at, 3, || settled(&ingester), || disk.fail_new_blocks()).await;

    // The device takes writes again: the same batch is taken in a new segment, and the
    // ones after it, with no restart.
    disk.heal();
    let total = recover(&mut sender, t0, refused_at, 9, &ingester).await;
    let text = telemetry.encode().unwrap();
    assert!(metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="retryable",reason="queue_io""#) >= 4.0);
    // Nothing acknowledged was left undurable: with fsync = "always" nothing is at risk.
    assert_eq!(queue_counter(&text, "tessera_ingester_queue_records_at_risk_total"), 0.0);
    shutdown.trigger();
    ingester.wait().await;
    assert_each_batch_once(sink.path(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_interval_fsync_acknowledged_records_of_a_failed_fsync_are_counted_at_risk_and_still_delivered() {
    let disk = FailingDisk::mount();
    // The interval is long enough that the only fsync is the one sealing a full segment.
    let queue_config = "fsync = \"interval\"\nfsync_interval_ms = 600000\nsegment_max_bytes = 16384";
    let (ingester, telemetry, shutdown, mut sender, sink) = start_on(disk.path(), queue_config).await;
    let t0 = recent_tile_end_ms(10);
    let queue = ingester.queue("default").unwrap();
    wait_until("the queue to settle", Duration::from_secs(10), || queue.segments() == 1).await;
    disk.fail_new_blocks();

    // Batches are acknowledged once written; the one that fills the segment makes it rotate,
    // the fsync sealing it fails, and the new segment cannot be made durable: refused.
    let refused_at = first_refused(&mut sender, t0, 0..200, || true, || {}).await;
    assert!(refused_at >= 2, "the segment held several acknowledged batches before it filled");
    let text = telemetry.encode().unwrap();
    assert_eq!(queue_counter(&text, "tessera_ingester_queue_fsync_errors_total"), 1.0);
    // Every batch acknowledged since the last good fsync (all of them: there was none).
    assert_eq!(queue_counter(&text, "tessera_ingester_queue_records_at_risk_total"), refused_at as f64);

    disk.heal();
    let total = recover(&mut sender, t0, refused_at, 4, &ingester).await;
    shutdown.trigger();
    ingester.wait().await;
    // The records at risk were still delivered: the process never lost them.
    assert_each_batch_once(sink.path(), total);
}
