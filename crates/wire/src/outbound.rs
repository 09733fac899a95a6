//! The sending side every tessera hop shares: one bounded queue of framed
//! batches and one long-lived sender task per destination.
//!
//! The collector forwards partials to aggregators and the aggregator sends
//! tiles to ingesters the same way:
//!
//! - an [`OutboundQueue`] is bounded in bytes; a push that overflows it
//!   drops the **oldest** batches (never the ones just pushed), so a dead
//!   peer costs bounded memory and the freshest data goes first when it
//!   returns; every drop is counted through [`OutboundMetrics`];
//! - [`run_sender`] connects (with jittered backoff), performs the
//!   handshake, then sends one batch at a time and waits for its
//!   acknowledgement: `ok` forgets the batch, `retryable` puts it back at
//!   the head and waits a backoff (or, refused as `placement_stale`, hands it to
//!   the daemon's [`Redirect`] to be routed again), `permanent` drops it and counts the
//!   reason. A broken connection or a missing ack puts the batch back at
//!   the head and reconnects. A re-sent batch keeps its sequence, and the
//!   queue names the same stream in every connection's handshake
//!   ([`OutboundQueue::stream`]), so the receiver can take it once.
//!
//! **Series dictionaries.** A batch may name series by refs of its sender's
//! dictionary ([`Refs`]); refs mean something only on the connection that
//! saw their definitions, in order. The queue keeps a dictionary
//! *generation*: a sender starts a new one with every connection, and the
//! queue with every drop of a batch of the current one (its definitions
//! never arrive). The encoder starts an empty dictionary whenever the
//! generation it reads has changed. A batch of an older generation is
//! expanded ([`Expand`]) into batches that name every series in full before
//! it is sent.
//!
//! What differs between hops (metric names and units, the handshake role,
//! which rejection reasons are known) comes in through [`OutboundMetrics`]
//! and [`SenderSettings`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_proto::{AckReason, AckStatus, Role};

use crate::client;
use tokio::sync::Notify;

use tessera_runtime::Shutdown;
use tessera_runtime::logging::error_chain;
use tessera_runtime::{Backoff, sleep_or_stop};

/// A framed batch waiting to be sent.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Sequence written in the batch; the ack must carry it.
    pub sequence: u64,
    /// The whole frame, length prefix included.
    pub frame: Vec<u8>,
    /// Items (partials, series values) in the batch, for counts.
    pub items: u64,
    /// The dictionary whose refs the frame uses, if any.
    pub refs: Option<Refs>,
    /// The destination's last answer refused it as one it will not take (`fenced`,
    /// `placement_stale`), so it did not write it: whoever it goes to next is told so when it
    /// is routed again. Cleared when it is sent again and not answered.
    pub owner_refused: bool,
}

/// Turns a frame that names series by refs into frames that name them in
/// full (each with a fresh sequence from `sequences`, and the frame's own as
/// the one it was expanded from), for a connection that never saw the refs'
/// definitions.
pub trait Expand: Send + Sync {
    /// The expanded batches, in order, or why the frame cannot be expanded.
    fn expand(&self, frame: &[u8], sequences: &mut dyn FnMut() -> u64) -> Result<Vec<Batch>, String>;
}

/// The dictionary a batch's refs belong to.
#[derive(Clone)]
pub struct Refs {
    /// The queue's dictionary generation the batch was encoded for.
    pub generation: u64,
    /// How to name its series in full when that generation is gone.
    pub expand: Arc<dyn Expand>,
}

impl std::fmt::Debug for Refs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refs").field("generation", &self.generation).finish_non_exhaustive()
    }
}

/// Why a queue's dictionary generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationEnd {
    /// The sender opened a new connection.
    Connect,
    /// A batch of the generation was dropped (overflow or refusal).
    Dropped,
    /// The encoder started afresh: its dictionary held too many idle
    /// series, or the destination left the placement and its dictionary went.
    Rotated,
}

impl GenerationEnd {
    /// A stable metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            GenerationEnd::Connect => "connect",
            GenerationEnd::Dropped => "dropped",
            GenerationEnd::Rotated => "rotated",
        }
    }
}

/// Why batches were dropped on the way to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Pushed out of a full queue by newer batches.
    Overflow,
    /// Refused for good by the destination.
    Rejected,
    /// Of an ended dictionary generation, and its refs could not be
    /// expanded back to ids.
    Unexpandable,
}

/// How one hop counts what its queues and senders do.
pub trait OutboundMetrics: Send + Sync + 'static {
    /// The queue now holds `batches` batches, `bytes` bytes.
    fn queued(&self, batches: usize, bytes: usize);
    /// `batches` batches holding `items` items were dropped (called with `batches > 0`).
    fn dropped(&self, reason: DropReason, batches: u64, items: u64);
    /// A connect or handshake failed.
    fn connect_error(&self);
    /// The TLS handshake failed, for `reason` ([`crate::failure_label`]).
    fn tls_error(&self, _reason: &'static str) {}
    /// The connection was lost while sending or awaiting an ack.
    fn send_error(&self, reason: &'static str);
    /// The destination refused a batch for good, for `reason` (a closed set).
    fn rejected(&self, reason: &'static str);
    /// `batch` was acknowledged `latency` after it was sent.
    fn delivered(&self, batch: &Batch, latency: Duration);
    /// The dictionary generation ended ([`Refs`]).
    fn dictionary_ended(&self, _why: GenerationEnd) {}
    /// A batch of an ended generation was expanded into `batches` batches
    /// (or, with `Err`, could not be and was dropped).
    fn expanded(&self, _result: Result<usize, ()>) {}
}

#[derive(Default)]
struct State {
    batches: VecDeque<Batch>,
    bytes: usize,
}

/// One destination's FIFO of batches, bounded in bytes.
pub struct OutboundQueue<M> {
    endpoint: String,
    state: Mutex<State>,
    /// Bytes queued, readable without the lock (for admission checks).
    bytes: AtomicUsize,
    notify: Notify,
    next_sequence: AtomicU64,
    /// Names the queue's stream of batches to its receiver (`Hello.stream`).
    stream: u64,
    /// Whether a sender was started for the queue ([`OutboundQueue::claim_sender`]).
    sender_claimed: AtomicBool,
    in_flight: AtomicBool,
    /// Sequence of the batch in flight (meaningful while `in_flight`).
    in_flight_sequence: AtomicU64,
    connected: AtomicBool,
    /// The current dictionary generation ([`Refs`]).
    generation: AtomicU64,
    max_bytes: usize,
    metrics: M,
}

impl<M: OutboundMetrics> OutboundQueue<M> {
    /// An empty queue for `endpoint` bounded at `max_bytes`.
    pub fn new(endpoint: String, max_bytes: usize, metrics: M) -> OutboundQueue<M> {
        OutboundQueue {
            endpoint,
            state: Mutex::new(State::default()),
            bytes: AtomicUsize::new(0),
            notify: Notify::new(),
            next_sequence: AtomicU64::new(1),
            stream: new_stream_id(),
            sender_claimed: AtomicBool::new(false),
            in_flight: AtomicBool::new(false),
            in_flight_sequence: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            generation: AtomicU64::new(1),
            max_bytes,
            metrics,
        }
    }

    /// The endpoint this queue sends to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The metrics the queue reports to.
    pub fn metrics(&self) -> &M {
        &self.metrics
    }

    /// The id of this queue's stream of batches, sent in every connection's handshake
    /// (`Hello.stream`): the same across reconnections, another in another process or
    /// queue. A batch keeps its sequence when it is re-sent on a new connection, so a
    /// receiver can tell a re-sent batch it already took.
    pub fn stream(&self) -> u64 {
        self.stream
    }

    /// Whether the caller is the first to claim the queue's sender: a queue has one, so
    /// that one batch of its stream is in flight at a time, in queue order.
    pub fn claim_sender(&self) -> bool {
        !self.sender_claimed.swap(true, Ordering::AcqRel)
    }

    /// The sequence number for the next batch.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// The current dictionary generation: refs of batches encoded for it
    /// may be sent as they are.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Ends the current dictionary generation.
    pub fn end_generation(&self, why: GenerationEnd) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.metrics.dictionary_ended(why);
    }

    /// Ends the generation if `batch`, dropped, belonged to it: the
    /// definitions it carried never arrive.
    fn dropped_batch(&self, batch: &Batch) {
        if batch.refs.as_ref().is_some_and(|refs| refs.generation == self.generation()) {
            self.end_generation(GenerationEnd::Dropped);
        }
    }

    /// Bytes queued now.
    pub fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether `bytes` more fit under the bound now.
    pub fn has_room_for(&self, bytes: usize) -> bool {
        self.queued_bytes() + bytes < self.max_bytes
    }

    /// Whether the queue is at or over its bound.
    pub fn is_full(&self) -> bool {
        self.queued_bytes() >= self.max_bytes
    }

    /// Whether the sender holds a working connection.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Marks the connection up or down (the sender does; tests may).
    pub fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// Appends one batch; see [`OutboundQueue::push_all`].
    pub fn push(&self, batch: Batch) -> u64 {
        self.push_all(vec![batch])
    }

    /// Appends `batches`, then drops the oldest batches while over the
    /// bound (never one of those just pushed). Returns the items dropped.
    pub fn push_all(&self, batches: Vec<Batch>) -> u64 {
        let (dropped_batches, dropped_items) = {
            let mut state = self.lock();
            let keep = batches.len();
            for batch in batches {
                state.bytes += batch.frame.len();
                state.batches.push_back(batch);
            }
            let dropped = self.enforce_bound(&mut state, keep);
            self.publish(&state);
            dropped
        };
        if dropped_batches > 0 {
            self.metrics.dropped(DropReason::Overflow, dropped_batches, dropped_items);
        }
        self.notify.notify_one();
        dropped_items
    }

    /// Puts a batch that could not be delivered back at the head (it is the
    /// oldest); the batch is no longer in flight.
    pub fn push_front(&self, batch: Batch) {
        let (dropped_batches, dropped_items) = {
            let mut state = self.lock();
            state.bytes += batch.frame.len();
            state.batches.push_front(batch);
            let dropped = self.enforce_bound(&mut state, 1);
            self.publish(&state);
            dropped
        };
        self.in_flight.store(false, Ordering::Release);
        if dropped_batches > 0 {
            self.metrics.dropped(DropReason::Overflow, dropped_batches, dropped_items);
        }
    }

    /// Drops the oldest batches until the queue fits `max_bytes`, keeping at
    /// least `keep` batches (the newest, at least one).
    fn enforce_bound(&self, state: &mut State, keep: usize) -> (u64, u64) {
        let (mut batches, mut items) = (0, 0);
        while state.bytes > self.max_bytes && state.batches.len() > keep.max(1) {
            let Some(oldest) = state.batches.pop_front() else { break };
            state.bytes -= oldest.frame.len();
            batches += 1;
            items += oldest.items;
            self.dropped_batch(&oldest);
        }
        (batches, items)
    }

    /// Takes the oldest batch and marks it in flight.
    pub fn pop_front(&self) -> Option<Batch> {
        let mut state = self.lock();
        let batch = state.batches.pop_front()?;
        state.bytes -= batch.frame.len();
        self.in_flight_sequence.store(batch.sequence, Ordering::Relaxed);
        self.in_flight.store(true, Ordering::Release);
        self.publish(&state);
        Some(batch)
    }

    /// The batch in flight is done with (acknowledged or dropped).
    pub fn finish_in_flight(&self) {
        self.in_flight.store(false, Ordering::Release);
    }

    /// The highest sequence below which every batch is done with
    /// (acknowledged, or dropped and counted): for queues whose batches
    /// are numbered in the order they are pushed (tile batches; not the
    /// collector's, whose stale batches are renumbered when expanded).
    /// A sequence handed out but not pushed yet counts as done; callers
    /// record what they pushed after pushing it.
    pub fn resolved_through(&self) -> u64 {
        let state = self.lock();
        let mut unresolved = state.batches.front().map_or(u64::MAX, |batch| batch.sequence);
        if self.in_flight.load(Ordering::Acquire) {
            unresolved = unresolved.min(self.in_flight_sequence.load(Ordering::Relaxed));
        }
        if unresolved == u64::MAX { self.next_sequence.load(Ordering::Relaxed) - 1 } else { unresolved - 1 }
    }

    /// Whether nothing is queued or in flight.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.batches.is_empty() && !self.in_flight.load(Ordering::Acquire)
    }

    /// Empties the queue (at shutdown); returns the batches and items
    /// dropped, which the caller counts under its own reason.
    pub fn abandon(&self) -> (u64, u64) {
        let mut state = self.lock();
        let batches = state.batches.len() as u64;
        let items = state.batches.drain(..).map(|batch| batch.items).sum();
        state.bytes = 0;
        self.publish(&state);
        (batches, items)
    }

    /// Takes every queued batch (not the one in flight), oldest first, to
    /// send elsewhere: the destination left and its batches go to the new
    /// owners of their contents. They count as done with here.
    pub fn take_queued(&self) -> Vec<Batch> {
        let mut state = self.lock();
        let batches: Vec<Batch> = state.batches.drain(..).collect();
        state.bytes = 0;
        self.publish(&state);
        batches
    }

    fn has_batches(&self) -> bool {
        !self.lock().batches.is_empty()
    }

    fn publish(&self, state: &State) {
        self.bytes.store(state.bytes, Ordering::Relaxed);
        self.metrics.queued(state.batches.len(), state.bytes);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A stream id unlike any other process' or queue's: the process id and a per-process
/// count, mixed by the standard library's hasher under its keys drawn from the operating
/// system's randomness. Never 0 (which means none).
fn new_stream_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    hasher.finish().max(1)
}

/// Settings of a sender.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// This instance's id, sent in the handshake.
    pub source: String,
    /// The role this instance shakes hands as.
    pub role: Role,
    /// What the destination is, for logs (`aggregator`, `ingester`).
    pub peer: &'static str,
    /// Connect and handshake timeout.
    pub connect_timeout: Duration,
    /// Acknowledgement timeout.
    pub ack_timeout: Duration,
    /// First retry delay.
    pub reconnect_min: Duration,
    /// Longest retry delay.
    pub reconnect_max: Duration,
    /// Maps the reason of a permanent refusal to a closed set of metric labels.
    pub rejection_label: fn(&str) -> &'static str,
    /// Keeps an idle connection open; `None`: the sender sends often enough on its own
    /// (a collector sends every window).
    pub heartbeat: Option<Heartbeat>,
    /// TLS towards the destination; plain TCP when `None`.
    pub tls: Option<Arc<crate::client::ClientTls>>,
    /// Where a batch refused as `placement_stale` goes instead of back at the head: routed
    /// again by the sender's current placement. `None`: it waits and goes again, as any
    /// retryable refusal.
    pub redirect: Option<Redirect>,
}

/// Routes again a batch its destination refused as routed under a placement it no longer
/// owns some of ([`tessera_proto::AckReason::PlacementStale`]): `Ok` once its contents are
/// queued for their current owners (the batch is then done with here), `Err` with the batch
/// when they cannot be (it waits and goes again).
#[derive(Clone)]
pub struct Redirect(pub Arc<dyn Fn(Batch) -> Result<(), Batch> + Send + Sync>);

impl std::fmt::Debug for Redirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Redirect")
    }
}

/// When connected and idle for `after`, send `frame()` (a batch with nothing in it,
/// sequence 0), so that the receiver's idle deadline ([`crate::WireConnection`]) does not
/// close a healthy connection.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat {
    /// Idle time before a heartbeat.
    pub after: Duration,
    /// Builds the heartbeat frame, length prefix included.
    pub frame: fn() -> Vec<u8>,
}

/// Runs the sender of `queue` until `stop` fires.
pub async fn run_sender<M: OutboundMetrics>(queue: Arc<OutboundQueue<M>>, settings: SenderSettings, stop: Shutdown) {
    let endpoint = queue.endpoint().to_owned();
    let peer = settings.peer;
    let mut backoff = Backoff::new(settings.reconnect_min, settings.reconnect_max);
    loop {
        if !matches!(wait_for_work(&queue, &stop, None).await, Wait::Work) {
            return;
        }
        let connecting = client::connect(
            &endpoint,
            settings.role,
            &settings.source,
            queue.stream(),
            settings.connect_timeout,
            settings.tls.as_ref(),
        );
        let mut stream = match connecting.await {
            Ok(stream) => stream,
            Err(error) => {
                queue.metrics.connect_error();
                if let Some(reason) = error.tls_failure() {
                    queue.metrics.tls_error(reason);
                }
                tracing::warn!(%endpoint, peer, error = %error_chain(&error), "cannot reach the destination; will retry");
                if !sleep_or_stop(backoff.next_delay(), &stop).await {
                    return;
                }
                continue;
            }
        };
        tracing::info!(%endpoint, peer, "connected");
        // The peer knows none of the refs sent before.
        queue.end_generation(GenerationEnd::Connect);
        queue.set_connected(true);
        backoff.reset();
        let mut scratch = Vec::new();
        loop {
            match wait_for_work(&queue, &stop, settings.heartbeat.map(|heartbeat| heartbeat.after)).await {
                Wait::Work => {}
                Wait::Stop => {
                    queue.set_connected(false);
                    return;
                }
                Wait::Heartbeat => {
                    let Some(heartbeat) = settings.heartbeat else { continue };
                    let frame = (heartbeat.frame)();
                    let exchanged = client::exchange(&mut stream, &frame, 0, &mut scratch, settings.ack_timeout);
                    if let Err(error) = exchanged.await {
                        queue.metrics.send_error(error.reason());
                        tracing::warn!(%endpoint, peer, error = %error_chain(&error), "heartbeat failed; reconnecting");
                        queue.set_connected(false);
                        break;
                    }
                    continue;
                }
            }
            let Some(batch) = queue.pop_front() else { continue };
            if batch.refs.as_ref().is_some_and(|refs| refs.generation != queue.generation()) {
                // Expanding reads the whole generation's ids: off the async workers.
                let (expanding, items) = (queue.clone(), batch.items);
                if let Err(error) = tokio::task::spawn_blocking(move || expand_stale(&expanding, batch)).await {
                    tracing::error!(%endpoint, %error, items, "expanding a stale batch failed; it is lost");
                    queue.metrics.dropped(DropReason::Unexpandable, 1, items);
                    queue.finish_in_flight();
                }
                continue;
            }
            let started = Instant::now();
            let exchanged =
                client::exchange(&mut stream, &batch.frame, batch.sequence, &mut scratch, settings.ack_timeout);
            let ack = match exchanged.await {
                Ok(ack) => ack,
                Err(error) => {
                    queue.metrics.send_error(error.reason());
                    tracing::warn!(%endpoint, peer, error = %error_chain(&error), "connection lost; reconnecting");
                    // Sent, unanswered: the destination may have taken it.
                    queue.push_front(Batch { owner_refused: false, ..batch });
                    queue.set_connected(false);
                    break;
                }
            };
            match AckStatus::try_from(ack.status).unwrap_or(AckStatus::Unspecified) {
                AckStatus::Ok => {
                    queue.metrics.delivered(&batch, started.elapsed());
                    queue.finish_in_flight();
                    backoff.reset();
                }
                AckStatus::Retryable => {
                    // Refused as one it will not take while things stay as they are: if the
                    // destination leaves and the batch is routed again, the next owner is
                    // told that this one did not write it.
                    let refused_for_good = [AckReason::Fenced, AckReason::PlacementStale]
                        .iter()
                        .any(|reason| ack.reason == reason.as_str());
                    let mut batch = batch;
                    batch.owner_refused = refused_for_good;
                    let batch = match &settings.redirect {
                        Some(redirect) if ack.reason == AckReason::PlacementStale.as_str() => {
                            match (redirect.0)(batch) {
                                Ok(()) => {
                                    tracing::info!(%endpoint, peer, message = %ack.message, "batch routed again: the destination no longer owns some of it");
                                    queue.finish_in_flight();
                                    continue;
                                }
                                Err(batch) => batch,
                            }
                        }
                        _ => batch,
                    };
                    tracing::debug!(%endpoint, peer, reason = %ack.reason, "batch refused for now; retrying");
                    queue.push_front(batch);
                    if !sleep_or_stop(backoff.next_delay(), &stop).await {
                        queue.set_connected(false);
                        return;
                    }
                }
                AckStatus::Permanent | AckStatus::Unspecified => {
                    let reason = (settings.rejection_label)(&ack.reason);
                    tracing::warn!(%endpoint, peer, reason, message = %ack.message, items = batch.items, "batch rejected");
                    queue.metrics.rejected(reason);
                    queue.metrics.dropped(DropReason::Rejected, 1, batch.items);
                    queue.dropped_batch(&batch);
                    queue.finish_in_flight();
                }
            }
        }
    }
}

/// Puts the batches naming `batch`'s series in full back at the head of
/// the queue, in its place; drops and counts it if it cannot be expanded.
fn expand_stale<M: OutboundMetrics>(queue: &OutboundQueue<M>, mut batch: Batch) {
    if let Some(refs) = batch.refs.take() {
        match refs.expand.expand(&batch.frame, &mut || queue.next_sequence()) {
            Ok(expanded) => {
                queue.metrics.expanded(Ok(expanded.len()));
                let (dropped_batches, dropped_items) = {
                    let mut state = queue.lock();
                    for batch in expanded.into_iter().rev() {
                        state.bytes += batch.frame.len();
                        state.batches.push_front(batch);
                    }
                    // Ids take more room than refs: the queue stays within its bound.
                    let dropped = queue.enforce_bound(&mut state, 1);
                    queue.publish(&state);
                    dropped
                };
                if dropped_batches > 0 {
                    queue.metrics.dropped(DropReason::Overflow, dropped_batches, dropped_items);
                }
            }
            Err(error) => {
                queue.metrics.expanded(Err(()));
                tracing::error!(endpoint = %queue.endpoint, %error, items = batch.items, "a batch's refs cannot be expanded; dropped");
                queue.metrics.dropped(DropReason::Unexpandable, 1, batch.items);
            }
        }
    }
    queue.finish_in_flight();
}

/// What the sender waits for next.
enum Wait {
    /// A batch is queued.
    Work,
    /// Idle for the heartbeat interval.
    Heartbeat,
    /// Stop.
    Stop,
}

async fn wait_for_work<M: OutboundMetrics>(
    queue: &OutboundQueue<M>,
    stop: &Shutdown,
    heartbeat: Option<Duration>,
) -> Wait {
    let heartbeat_at = heartbeat.map(|after| tokio::time::Instant::now() + after);
    loop {
        if stop.is_triggered() {
            return Wait::Stop;
        }
        if queue.has_batches() {
            return Wait::Work;
        }
        if heartbeat_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
            return Wait::Heartbeat;
        }
        tokio::select! {
            () = queue.notify.notified() => {}
            () = stop.wait() => return Wait::Stop,
            // A notification can race the check above; look again now and then.
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// Records what the queue reports.
    #[derive(Default)]
    struct Recorded {
        dropped: StdMutex<Vec<(DropReason, u64, u64)>>,
        queued: StdMutex<(usize, usize)>,
        ended: StdMutex<Vec<GenerationEnd>>,
        expanded: StdMutex<Vec<Result<usize, ()>>>,
    }

    impl OutboundMetrics for Arc<Recorded> {
        fn queued(&self, batches: usize, bytes: usize) {
            *self.queued.lock().unwrap() = (batches, bytes);
        }
        fn dropped(&self, reason: DropReason, batches: u64, items: u64) {
            self.dropped.lock().unwrap().push((reason, batches, items));
        }
        fn connect_error(&self) {}
        fn send_error(&self, _: &'static str) {}
        fn rejected(&self, _: &'static str) {}
        fn delivered(&self, _: &Batch, _: Duration) {}
        fn dictionary_ended(&self, why: GenerationEnd) {
            self.ended.lock().unwrap().push(why);
        }
        fn expanded(&self, result: Result<usize, ()>) {
            self.expanded.lock().unwrap().push(result);
        }
    }

    /// Expands a frame into two batches naming `items` each, or fails.
    struct Halves(bool);

    impl Expand for Halves {
        fn expand(&self, frame: &[u8], sequences: &mut dyn FnMut() -> u64) -> Result<Vec<Batch>, String> {
            if !self.0 {
                return Err("no ids for this generation".into());
            }
            let half = frame.len() / 2;
            Ok((0..2)
                .map(|_| Batch {
                    sequence: sequences(),
                    frame: vec![1; half],
                    items: 1,
                    refs: None,
                    owner_refused: false,
                })
                .collect())
        }
    }

    fn with_refs(sequence: u64, bytes: usize, generation: u64, expand: bool) -> Batch {
        Batch { refs: Some(Refs { generation, expand: Arc::new(Halves(expand)) }), ..batch(sequence, bytes, 2) }
    }

    #[test]
    fn every_queue_names_a_stream_of_its_own() {
        let queues: Vec<_> =
            (0..100).map(|_| OutboundQueue::new("i:1".into(), 1 << 20, Arc::new(Recorded::default()))).collect();
        let mut streams: Vec<u64> = queues.iter().map(OutboundQueue::stream).collect();
        assert!(streams.iter().all(|&stream| stream != 0), "0 means none");
        streams.sort_unstable();
        streams.dedup();
        assert_eq!(streams.len(), 100);
        assert!(queues[0].claim_sender(), "the first claim starts the sender");
        assert!(!queues[0].claim_sender(), "and no second one");
    }

    #[test]
    fn resolved_through_stops_below_the_oldest_batch_queued_or_in_flight() {
        let queue = OutboundQueue::new("i:1".into(), 1 << 20, Arc::new(Recorded::default()));
        assert_eq!(queue.resolved_through(), 0);
        let sequences: Vec<u64> = (0..3).map(|_| queue.next_sequence()).collect();
        queue.push_all(sequences.iter().map(|&sequence| batch(sequence, 10, 1)).collect());
        assert_eq!(queue.resolved_through(), 0);
        let first = queue.pop_front().unwrap();
        assert_eq!(queue.resolved_through(), 0, "batch 1 is in flight");
        queue.push_front(first);
        assert_eq!(queue.resolved_through(), 0, "batch 1 is back for a retry");
        queue.pop_front().unwrap();
        queue.finish_in_flight();
        assert_eq!(queue.resolved_through(), 1);
        queue.pop_front().unwrap();
        queue.finish_in_flight();
        queue.pop_front().unwrap();
        assert_eq!(queue.resolved_through(), 2);
        queue.finish_in_flight();
        assert_eq!(queue.resolved_through(), 3);
    }

    #[test]
    fn dropping_a_batch_of_the_current_dictionary_ends_it_and_stale_batches_are_expanded() {
        let recorded = Arc::new(Recorded::default());
        let queue = OutboundQueue::new("i:1".into(), 250, recorded.clone());
        assert_eq!(queue.generation(), 1);
        // An overflow drop of a batch of generation 1: its definitions never arrive.
        queue.push_all(vec![with_refs(1, 100, 1, true), with_refs(2, 100, 1, true)]);
        queue.push(with_refs(3, 100, 1, true));
        assert_eq!((queue.generation(), recorded.ended.lock().unwrap().clone()), (2, vec![GenerationEnd::Dropped]));
        // A drop of a batch of an ended generation ends nothing more.
        queue.push(with_refs(4, 100, 1, true));
        assert_eq!(queue.generation(), 2);

        // Batch 3 is stale now: it goes back as two batches naming series in full, in its place.
        let stale = queue.pop_front().unwrap();
        assert_eq!(stale.sequence, 3);
        expand_stale(&queue, stale);
        let expanded: Vec<Batch> = std::iter::from_fn(|| queue.pop_front()).collect();
        let order: Vec<(u64, bool)> = expanded.iter().map(|batch| (batch.sequence, batch.refs.is_some())).collect();
        assert_eq!(order, [(1, false), (2, false), (4, true)], "sequences 1 and 2 were free in this queue");
        assert_eq!(*recorded.expanded.lock().unwrap(), vec![Ok(2)]);

        // One that cannot be expanded is dropped and counted.
        expand_stale(&queue, with_refs(5, 100, 1, false));
        assert!(queue.pop_front().is_none());
        assert_eq!(recorded.expanded.lock().unwrap().last(), Some(&Err(())));
        assert_eq!(recorded.dropped.lock().unwrap().last(), Some(&(DropReason::Unexpandable, 1, 2)));
    }

    fn batch(sequence: u64, bytes: usize, items: u64) -> Batch {
        Batch { sequence, frame: vec![0; bytes], items, refs: None, owner_refused: false }
    }

    #[test]
    fn overflow_drops_the_oldest_batches_and_reports_them() {
        let recorded = Arc::new(Recorded::default());
        let queue = OutboundQueue::new("i:1".into(), 250, recorded.clone());
        assert_eq!(queue.push_all(vec![batch(1, 100, 10), batch(2, 100, 20)]), 0);
        assert_eq!(*recorded.queued.lock().unwrap(), (2, 200));
        assert!(!queue.is_full());
        assert_eq!(queue.push(batch(3, 100, 30)), 10, "batch 1 dropped");
        assert_eq!(*recorded.dropped.lock().unwrap(), vec![(DropReason::Overflow, 1, 10)]);
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        assert!(!queue.is_idle(), "a batch is in flight");
        queue.push_front(batch(2, 100, 20));
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        queue.finish_in_flight();
        assert_eq!(queue.pop_front().unwrap().sequence, 3);
        queue.finish_in_flight();
        assert!(queue.is_idle());
    }

    /// A tile batch frame of `sequence`.
    fn tile_frame(sequence: u64) -> Batch {
        use tessera_proto::{Frame, TileBatch, frame::Body, framing};
        let frame = Frame { body: Some(Body::Tiles(TileBatch { sequence, ..TileBatch::default() })) };
        let frame = framing::encode_frame(&frame, framing::DEFAULT_MAX_FRAME_BYTES).unwrap();
        Batch { sequence, frame, items: 1, refs: None, owner_refused: false }
    }

    /// An aggregator's sender to an ingester, retrying after `retry`.
    fn ingester_sender(retry: Duration, redirect: Option<Redirect>) -> SenderSettings {
        SenderSettings {
            source: "test".into(),
            role: Role::Aggregator,
            peer: "ingester",
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(5),
            reconnect_min: retry,
            reconnect_max: retry,
            rejection_label: AckReason::label,
            heartbeat: None,
            tls: None,
            redirect,
        }
    }

    /// A batch refused `fenced` is marked refused by its owner (routed again, it says so);
    /// sent again and left unanswered (the connection lost), the mark is cleared: the
    /// destination may have taken it. Each is read from the queue while the sender waits to
    /// send it again.
    #[tokio::test]
    async fn a_refusal_for_good_marks_the_batch_and_an_unanswered_send_clears_it() {
        use tessera_proto::{Frame, frame::Body, framing};
        for answered in [true, false] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let endpoint = listener.local_addr().unwrap().to_string();
            let (seen, seen_here) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let (mut stream, _) = listener.accept().await.unwrap();
                framing::server_handshake(&mut stream, "test").await.unwrap();
                let mut scratch = Vec::new();
                let Ok(Frame { body: Some(Body::Tiles(batch)) }) =
                    framing::read_frame(&mut stream, &mut scratch, framing::DEFAULT_MAX_FRAME_BYTES).await
                else {
                    panic!("a tile batch")
                };
                if answered {
                    let answer =
                        Frame { body: Some(Body::Ack(AckReason::Fenced.ack(batch.sequence, "fenced".into()))) };
                    framing::write_frame(&mut stream, &answer, framing::DEFAULT_MAX_FRAME_BYTES).await.unwrap();
                }
                drop(stream);
                let _ = seen.send(());
            });
            let queue = Arc::new(OutboundQueue::new(endpoint, 1 << 20, Arc::new(Recorded::default())));
            // Marked refused before, by an earlier answer: only a refusal keeps it so.
            queue.push(Batch { owner_refused: !answered, ..tile_frame(1) });
            let stop = Shutdown::new();
            let sender =
                tokio::spawn(run_sender(queue.clone(), ingester_sender(Duration::from_secs(30), None), stop.clone()));
            seen_here.await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop.trigger();
            sender.await.unwrap();
            let batch = queue.pop_front().expect("the batch is queued again");
            assert_eq!(batch.owner_refused, answered, "answered `fenced`: {answered}");
        }
    }

    /// A batch refused as `placement_stale` goes to the daemon's redirect, once it takes it,
    /// instead of going to the same destination again; while the redirect gives it back it
    /// waits and goes again, as any retryable refusal.
    #[tokio::test]
    async fn a_batch_refused_as_routed_under_a_stale_placement_goes_to_the_redirect() {
        use tessera_proto::{Ack, Frame, frame::Body, framing};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        // Refuses batch 1 as stale every time, takes the others; returns what it was sent.
        let receiver = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            framing::server_handshake(&mut stream, "test").await.unwrap();
            let (mut scratch, mut sent) = (Vec::new(), Vec::new());
            while let Ok(Frame { body: Some(Body::Tiles(batch)) }) =
                framing::read_frame(&mut stream, &mut scratch, framing::DEFAULT_MAX_FRAME_BYTES).await
            {
                sent.push(batch.sequence);
                let ack = match batch.sequence {
                    1 => AckReason::PlacementStale.ack(1, "moved".into()),
                    other => Ack { sequence: other, status: AckStatus::Ok as i32, ..Ack::default() },
                };
                let answer = Frame { body: Some(Body::Ack(ack)) };
                if framing::write_frame(&mut stream, &answer, framing::DEFAULT_MAX_FRAME_BYTES).await.is_err() {
                    break;
                }
            }
            sent
        });
        // Gives the batch back the first time (no newer placement seen yet), takes it then.
        let offered = Arc::new(StdMutex::new(Vec::new()));
        let redirect = Redirect(Arc::new({
            let offered = offered.clone();
            move |batch: Batch| {
                let mut offered = offered.lock().unwrap();
                // Refused for good by the destination: the next owner is told (owner_refused).
                assert!(batch.owner_refused, "marked refused by its owner");
                offered.push(batch.sequence);
                if offered.len() == 1 { Err(batch) } else { Ok(()) }
            }
        }));
        let settings = ingester_sender(Duration::from_millis(10), Some(redirect));
        let queue = Arc::new(OutboundQueue::new(endpoint, 1 << 20, Arc::new(Recorded::default())));
        queue.push_all(vec![tile_frame(1), tile_frame(2)]);
        let stop = Shutdown::new();
        let sender = tokio::spawn(run_sender(queue.clone(), settings, stop.clone()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !queue.is_idle() {
            assert!(Instant::now() < deadline, "the queue never emptied");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.trigger();
        sender.await.unwrap();
        assert_eq!(*offered.lock().unwrap(), [1, 1], "offered, given back, offered again and taken");
        assert_eq!(receiver.await.unwrap(), [1, 1, 2], "sent again once after the first offer, never after");
        assert!(queue.metrics().dropped.lock().unwrap().is_empty(), "nothing dropped");
    }
}
