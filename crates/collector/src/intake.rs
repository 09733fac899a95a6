//! Intake: the UDP, TCP and Unix-socket listeners, and the readers that
//! fold what they receive into window cuts.
//!
//! ```text
//!  UDP socket 0..N (SO_REUSEPORT) ──recvmmsg──▶ udp-reader-N ─┐
//!  Unix datagram socket ──────────────────────▶ unix-reader ──┼─ each owns a Reader: parse, fold into
//!  TCP connections (tokio tasks) ──line chunks─▶ tcp-lines ───┘  its own table, cut at every window
//!                                                                 turn ──Cut──▶ the flusher (window)
//! ```
//!
//! - `udp.rs`: several reader threads, each with its own `SO_REUSEPORT`
//!   socket on the same address, batched receive with `recvmmsg` (`sys.rs`,
//!   the collector's only unsafe code), a large receive buffer, kernel drops
//!   read back from `/proc/net/udp`;
//! - `stream.rs`: newline-delimited statsd over TCP, many connections, fed
//!   to one line thread;
//! - `unix.rs`: a Unix datagram socket read by its own thread;
//! - `reader.rs`: the [`Reader`] each of those threads owns, and the
//!   [`Cut`]s it hands to the flusher;
//! - `origin.rs`: origin detection, the container and pod behind each line as tags, which
//!   each reader adds as it folds (the sources are listed by a task of their own).
//!
//! Nothing on the receive path is shared between readers.

mod metrics;
pub mod origin;
mod reader;
mod stream;
mod sys;
mod udp;
mod unix;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::bounded;
use tessera_core::table::ObserverSource;
use tessera_runtime::daemon::spawn_thread;
use tessera_runtime::{Shutdown, StartError};

use crate::config::{Config, GaugeDeltasConfig};
pub use metrics::IntakeMetrics;
use reader::Reader;
pub use reader::{Cut, CutEntry, CutLinks, FlusherLinks, ReaderSettings, cut_links};
pub use sys::{lower_this_thread_priority, return_large_buffers_when_freed};
use tessera_runtime::telemetry::Drops;
use udp::KernelDrops;
pub use udp::poll_kernel_drops;

/// The bound listeners and their reader threads.
pub struct Listeners {
    /// One thread per reader; each cuts its last window and returns after shutdown.
    pub readers: Vec<JoinHandle<()>>,
    /// The bound UDP address.
    pub udp_addr: Option<SocketAddr>,
    /// The bound TCP address.
    pub tcp_addr: Option<SocketAddr>,
    /// The Unix socket path.
    pub unix_path: Option<PathBuf>,
    /// The UDP sockets' kernel drop counters, for [`poll_kernel_drops`].
    pub kernel_drops: Option<KernelDrops>,
}

/// Binds every listener `config` turns on (UDP, then Unix, then TCP) and
/// starts its reader threads, each handing its cuts to `links`. New timer, histogram
/// and distribution series of the readers' tables take their classic histogram buckets
/// or summary quantiles from `observers` (the mapping file's rules).
pub async fn start(
    config: &Config,
    settings: &ReaderSettings,
    observers: Option<Arc<dyn ObserverSource>>,
    links: CutLinks,
    metrics: &IntakeMetrics,
    drops: &Drops,
    shutdown: &Shutdown,
) -> Result<Listeners, StartError> {
    let new_reader = |listener: &'static str, gauge_deltas: GaugeDeltasConfig| {
        Reader::new(
            settings,
            observers.clone(),
            gauge_deltas.into(),
            links.clone(),
            metrics.listener(listener, drops),
            metrics.clone(),
            drops.clone(),
        )
    };

    let mut readers = Vec::new();
    let mut udp_addr = None;
    let mut kernel_drops = None;
    if config.udp.enabled {
        let threads = config.udp_reader_threads();
        let what = format!("udp {}", config.udp.listen);
        let (sockets, stamped) = udp::bind(&config.udp, threads).map_err(|source| StartError::bind(what, source))?;
        metrics.udp_receive_stamps.set(i64::from(stamped));
        udp_addr = sockets.first().and_then(|socket| socket.local_addr().ok());
        let granted = udp::granted_recv_buffer(&sockets[0]);
        metrics.udp_recv_buffer_bytes.set(granted as i64);
        if granted < config.udp.recv_buffer_bytes {
            tracing::warn!(
                granted,
                wanted = config.udp.recv_buffer_bytes,
                "the kernel granted a smaller UDP receive buffer than configured; raise net.core.rmem_max"
            );
        }
        kernel_drops = Some(KernelDrops::new(&sockets));
        for (index, socket) in sockets.into_iter().enumerate() {
            let reader = new_reader("udp", config.udp.gauge_deltas);
            let (batch, max_bytes, stop) =
                (config.udp.batch_datagrams, config.udp.max_datagram_bytes, shutdown.clone());
            readers.push(spawn_thread(format!("udp-reader-{index}"), move || {
                udp::read_loop(socket, reader, batch, max_bytes, stop)
            })?);
        }
        tracing::info!(address = ?udp_addr, threads, recv_buffer_bytes = granted, "listening on udp");
    }
    let mut unix_path = None;
    if let Some(path) = &config.unix.path {
        let what = format!("unix {}", path.display());
        let socket = unix::bind(path, config.unix.mode, settings.origins.is_some())
            .map_err(|source| StartError::bind(what, source))?;
        let reader = new_reader("unix", config.unix.gauge_deltas);
        let (max_bytes, stop) = (config.udp.max_datagram_bytes, shutdown.clone());
        readers.push(spawn_thread("unix-reader", move || unix::read_loop(socket, reader, max_bytes, stop))?);
        unix_path = Some(path.clone());
        tracing::info!(path = %path.display(), "listening on unix datagram socket");
    }
    let mut tcp_addr = None;
    if let Some(address) = config.tcp.listen {
        let what = format!("tcp {address}");
        let listener = stream::bind(address).await.map_err(|source| StartError::bind(what, source))?;
        tcp_addr = listener.local_addr().ok();
        let (line_sender, line_receiver) = bounded(stream::CHANNEL_CHUNKS);
        let reader = new_reader("tcp", config.tcp.gauge_deltas);
        let stop = shutdown.clone();
        readers.push(spawn_thread("tcp-lines", move || stream::line_loop(line_receiver, reader, stop))?);
        let settings = stream::StreamSettings {
            max_line_bytes: config.parse.max_line_bytes,
            max_connections: config.tcp.max_connections,
        };
        tokio::spawn(stream::accept_loop(
            listener,
            line_sender,
            settings,
            metrics.listener("tcp", drops),
            shutdown.clone(),
        ));
        tracing::info!(address = ?tcp_addr, "listening on tcp");
    }
    Ok(Listeners { readers, udp_addr, tcp_addr, unix_path, kernel_drops })
}
