//! A small TCP proxy in front of a daemon's wire port or the store, as Toxiproxy is:
//! it passes bytes through, and on the schedule delays them, stalls them, cuts every
//! connection, or answers every request `503`. This kernel has no `netem` qdisc, so
//! the campaign puts one of these on each link into an aggregator, an ingester and the
//! store, and the placements name the proxy's address.
//!
//! Each connection has two pumps (one per direction); each pump is a reader thread
//! that stamps every chunk with when it arrived, and a writer thread that sends it on
//! once it is due (arrival + the delay in force) and nothing is stalled. A cut closes
//! both sides of every connection open at that moment; while the mode is `Reset`, new
//! connections are closed as they come.
//!
//! ```no_run
//! use tessera_chaos::proxy::{Mode, Proxy};
//!
//! let proxy = Proxy::start("127.0.0.1:7000".parse().unwrap()).unwrap();
//! // point the client at proxy.address() ...
//! proxy.set(Mode::Stall);
//! proxy.set(Mode::Pass);
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes go through as they come.
    Pass,
    /// Bytes go through this much later.
    Delay(Duration),
    /// No byte goes through; connections stay open.
    Stall,
    /// Connections are cut as they come, and those open when this mode is set.
    Reset,
    /// Every connection gets `503 Service Unavailable` and is closed (an HTTP store
    /// that refuses).
    Refuse503,
}

struct State {
    mode: Mutex<Mode>,
    /// Bumped on every cut: a pump whose epoch is older closes its connection.
    epoch: AtomicU64,
    stopped: AtomicBool,
    connections: AtomicU64,
    cut: AtomicU64,
}

impl State {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running proxy; stops accepting when dropped.
pub struct Proxy {
    address: SocketAddr,
    upstream: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(State {
            mode: Mutex::new(Mode::Pass),
            epoch: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            cut: AtomicU64::new(0),
        });
        let accept_state = state.clone();
        std::thread::Builder::new()
            .name(format!("proxy-{}", address.port()))
            .spawn(move || accept_loop(listener, upstream, accept_state))?;
        Ok(Proxy { address, upstream, state })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Sets the mode; `Reset` also cuts every open connection now.
    pub fn set(&self, mode: Mode) {
        *self.state.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mode;
        if mode == Mode::Reset {
            self.state.epoch.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Connections accepted so far, and connections cut.
    pub fn counts(&self) -> (u64, u64) {
        (self.state.connections.load(Ordering::Relaxed), self.state.cut.load(Ordering::Relaxed))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<State>) {
    while !state.stopped.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(_) => continue,
        };
        state.connections.fetch_add(1, Ordering::Relaxed);
        match state.mode() {
            Mode::Reset => {
                state.cut.fetch_add(1, Ordering::Relaxed);
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            Mode::Refuse503 => {
                std::thread::spawn(move || refuse(client));
                continue;
            }
            _ => {}
        }
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(1)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let epoch = state.epoch.load(Ordering::SeqCst);
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else { continue };
            let state = state.clone();
            std::thread::spawn(move || pump(from, to, state, epoch));
        }
    }
}

/// Reads the request head, answers 503, closes.
fn refuse(mut client: TcpStream) {
    let _ = client.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buffer = [0u8; 64 * 1024];
    let _ = client.read(&mut buffer);
    let _ = client
        .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 8\r\nConnection: close\r\n\r\nrefused\n");
    let _ = client.shutdown(Shutdown::Both);
}

/// One direction of a connection: a reader thread stamps chunks, this thread sends
/// each once it is due.
fn pump(from: TcpStream, mut to: TcpStream, state: Arc<State>, epoch: u64) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_state = state.clone();
    let reader_from = from.try_clone();
    std::thread::spawn(move || {
        let Ok(mut from) = reader_from else { return };
        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            if reader_state.epoch.load(Ordering::SeqCst) != epoch {
                return;
            }
            match from.read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => {
                    if chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() {
                        return;
                    }
                }
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                Err(_) => return,
            }
        }
    });
    let cut = |state: &State| state.epoch.load(Ordering::SeqCst) != epoch;
    'chunks: loop {
        let (arrived, chunk) = match due.recv_timeout(Duration::from_millis(100)) {
            Ok(chunk) => chunk,
            Err(mpsc::RecvTimeoutError::Timeout) if !cut(&state) => continue,
            Err(_) => break,
        };
        loop {
            if cut(&state) {
                break 'chunks;
            }
            let wait = match state.mode() {
                Mode::Stall => Some(Duration::from_millis(20)),
                Mode::Delay(delay) => (arrived + delay).checked_duration_since(Instant::now()),
                _ => None,
            };
            match wait {
                Some(wait) => std::thread::sleep(wait.min(Duration::from_millis(20))),
                None => break,
            }
        }
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    if cut(&state) {
        state.cut.fetch_add(1, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(bytes)?;
        let mut answer = vec![0u8; bytes.len()];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    }

    #[test]
    fn passes_stalls_and_cuts() {
        let proxy = Proxy::start(echo_server()).unwrap();
        let mut stream = TcpStream::connect(proxy.address()).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
        assert_eq!(round_trip(&mut stream, b"hello").unwrap(), b"hello");

        proxy.set(Mode::Stall);
        assert!(round_trip(&mut stream, b"stuck").is_err(), "a stalled link passes nothing");
        proxy.set(Mode::Pass);
        let mut late = vec![0u8; 5];
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.read_exact(&mut late).unwrap();
        assert_eq!(late, b"stuck", "what a stall held goes through afterwards, in order");

        proxy.set(Mode::Reset);
        let mut buffer = [0u8; 8];
        assert!(matches!(stream.read(&mut buffer), Ok(0) | Err(_)), "an open connection is cut");
        let mut again = TcpStream::connect(proxy.address()).unwrap();
        again.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(again.read(&mut buffer), Ok(0) | Err(_)), "a new connection is cut while the mode holds");
        proxy.set(Mode::Pass);
        let mut fresh = TcpStream::connect(proxy.address()).unwrap();
        fresh.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(round_trip(&mut fresh, b"back").unwrap(), b"back");
        assert!(proxy.counts().1 >= 2);
    }

    #[test]
    fn delays_by_the_delay_in_force_and_refuses_with_503() {
        let proxy = Proxy::start(echo_server()).unwrap();
        proxy.set(Mode::Delay(Duration::from_millis(300)));
        let mut stream = TcpStream::connect(proxy.address()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = Instant::now();
        assert_eq!(round_trip(&mut stream, b"slow").unwrap(), b"slow");
        // Both directions are delayed: at least 600 ms, whatever the machine's load.
        assert!(started.elapsed() >= Duration::from_millis(600), "{:?}", started.elapsed());

        proxy.set(Mode::Refuse503);
        let mut client = TcpStream::connect(proxy.address()).unwrap();
        client.write_all(b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    }
}
