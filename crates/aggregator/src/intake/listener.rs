//! The wire listener: collectors connect, shake hands, then send partial
//! batch frames, each answered by an ack.
//!
//! A connection task only moves bytes, through [`tessera_wire::serve_batches`]: it
//! reads one frame (refusing one over `max_frame_bytes` from its length prefix alone),
//! hands its body to the decoder thread, waits for the answer, writes the ack, and reads
//! the next frame. One batch in flight per connection is the backpressure: a sender
//! waiting for its ack sends nothing more.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Sender;
use tessera_runtime::{RateLimitedLog, Shutdown};
use tessera_wire::ListenerMetrics;
use tessera_wire::{ListenerSettings, WireConnection, WireError};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{FrameJob, Inbound};

static CONNECTION_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.connection", 5);

/// Connection numbers, unique in the process (watermarks are kept per connection).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Accepts connections until `shutdown` fires.
pub async fn accept_loop(
    listener: TcpListener,
    jobs: Sender<Inbound>,
    settings: ListenerSettings,
    counters: ListenerMetrics,
    shutdown: Shutdown,
) {
    let context = (jobs, shutdown.clone());
    tessera_wire::serve_wire(
        listener,
        settings,
        "collector",
        counters,
        &CONNECTION_LOG,
        shutdown,
        context,
        serve_connection,
    )
    .await;
}

/// Serves one collector after its handshake; whatever ended the connection, it holds no
/// tile back any more.
async fn serve_connection(
    mut wire: WireConnection,
    peer: SocketAddr,
    (jobs, shutdown): (Sender<Inbound>, Shutdown),
) -> Result<(), WireError> {
    let (source, stream) = (wire.hello.instance_id.clone(), wire.hello.stream);
    tracing::debug!(%peer, %source, stream, "collector connected");
    let connection = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    if jobs.send(Inbound::Opened { connection, source, stream }).is_err() {
        return Ok(());
    }
    let served = serve_frames(&mut wire, connection, &jobs, &shutdown).await;
    let _ = jobs.send(Inbound::Closed { connection });
    served
}

/// Answers frames until the connection ends ([`tessera_wire::serve_batches`]).
async fn serve_frames(
    wire: &mut WireConnection,
    connection: u64,
    jobs: &Sender<Inbound>,
    shutdown: &Shutdown,
) -> Result<(), WireError> {
    tessera_wire::serve_batches(wire, shutdown, |frame| async move {
        let (reply, answer) = oneshot::channel();
        jobs.send(Inbound::Frame(FrameJob { connection, frame, reply })).ok()?;
        answer.await.ok()
    })
    .await
}
