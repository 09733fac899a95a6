//! One shutdown signal for a whole daemon.
//!
//! [`Shutdown`] is cheap to clone and is handed to every library entry point, so that the
//! daemon binaries, `tessera local` and tests drive the same code. It is triggered once,
//! either by SIGTERM / SIGINT ([`Shutdown::from_signals`]) or by code ([`Shutdown::trigger`]),
//! and stays triggered. Tasks `.await` [`Shutdown::wait`]; plain threads (UDP readers,
//! aggregation loops) poll [`Shutdown::is_triggered`], a single atomic load, or sleep in
//! [`Shutdown::wait_blocking_timeout`] between ticks.
//!
//! ```
//! use std::time::Duration;
//! use tessera_runtime::Shutdown;
//!
//! let shutdown = Shutdown::new();
//! let flusher = std::thread::spawn({
//!     let shutdown = shutdown.clone();
//!     move || {
//!         let mut flushes = 0;
//!         // Flush every second until shutdown, then one last time.
//!         while !shutdown.wait_blocking_timeout(Duration::from_secs(1)) {
//!             flushes += 1;
//!         }
//!         flushes + 1
//!     }
//! });
//! shutdown.trigger();
//! assert!(flusher.join().unwrap() >= 1);
//! ```

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// A cloneable, trigger-once shutdown signal; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Read by plain threads on every loop turn: one atomic load.
    triggered: AtomicBool,
    /// Wakes async waiters. The sender lives as long as any clone, so it never closes.
    sender: watch::Sender<bool>,
    /// Wakes threads sleeping in `wait_blocking_timeout`. The mutex guards nothing but the
    /// check-then-sleep, so that a trigger cannot slip between the two.
    thread_lock: Mutex<()>,
    thread_wakeup: Condvar,
}

impl Shutdown {
    /// A signal that only [`trigger`](Self::trigger) sets off (tests, `tessera local`).
    pub fn new() -> Self {
        let (sender, _receiver) = watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                triggered: AtomicBool::new(false),
                sender,
                thread_lock: Mutex::new(()),
                thread_wakeup: Condvar::new(),
            }),
        }
    }

    /// A signal that SIGTERM or SIGINT sets off (Ctrl-C elsewhere than Unix).
    ///
    /// Spawns a listener task, so it must be called inside a tokio runtime. A second
    /// signal after the first ends the process at once (exit code 128 + signal number), so
    /// that an operator can still stop a drain that hangs.
    ///
    /// # Errors
    ///
    /// When the signal handlers cannot be installed.
    pub fn from_signals() -> io::Result<Self> {
        let shutdown = Self::new();
        spawn_signal_listener(shutdown.clone())?;
        Ok(shutdown)
    }

    /// Sets the signal off and wakes every waiter. Later calls do nothing.
    pub fn trigger(&self) {
        if self.inner.triggered.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.sender.send_replace(true);
        // Taking the lock orders this wake-up after any waiter's check of `triggered`.
        let _guard = self.inner.thread_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.inner.thread_wakeup.notify_all();
    }

    /// Whether the signal is set off; one atomic load, fine on any hot loop.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::Acquire)
    }

    /// Resolves once the signal is set off (at once if it already is).
    pub async fn wait(&self) {
        let mut receiver = self.inner.sender.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = receiver.wait_for(|triggered| *triggered).await;
    }

    /// Waits for the next tick of `ticks`; returns whether it came first, `false` once the
    /// signal is set off. Made for tasks that tick: `while shutdown.tick(&mut ticks).await { work() }`.
    pub async fn tick(&self, ticks: &mut tokio::time::Interval) -> bool {
        tokio::select! {
            () = self.wait() => false,
            _ = ticks.tick() => true,
        }
    }

    /// Blocks the calling (non-async) thread until the signal is set off or `timeout`
    /// passes; returns whether it is set off. Made for dedicated threads that tick:
    /// `while !shutdown.wait_blocking_timeout(tick) { work() }`.
    pub fn wait_blocking_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.inner.thread_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            if self.is_triggered() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            guard = match self.inner.thread_wakeup.wait_timeout(guard, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(unix)]
fn spawn_signal_listener(shutdown: Shutdown) -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut signals_seen = 0;
        loop {
            let (name, number) = tokio::select! {
                _ = sigterm.recv() => ("SIGTERM", 15),
                _ = sigint.recv() => ("SIGINT", 2),
            };
            signals_seen += 1;
            if signals_seen > 1 {
                tracing::warn!(signal = name, "second shutdown signal, exiting without draining");
                std::process::exit(128 + number);
            }
            tracing::info!(signal = name, "shutdown signal received, draining");
            shutdown.trigger();
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn spawn_signal_listener(shutdown: Shutdown) -> io::Result<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!(signal = "ctrl-c", "shutdown signal received, draining");
            shutdown.trigger();
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!(signal = "ctrl-c", "second shutdown signal, exiting without draining");
            std::process::exit(130);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_wakes_async_waiters_and_threads() {
        let shutdown = Shutdown::new();
        assert!(!shutdown.is_triggered());

        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let shutdown = shutdown.clone();
                tokio::spawn(async move { shutdown.wait().await })
            })
            .collect();
        let sleeper = std::thread::spawn({
            let shutdown = shutdown.clone();
            // Far longer than the test may take: returning means the trigger woke it.
            move || shutdown.wait_blocking_timeout(Duration::from_secs(600))
        });
        let poller = std::thread::spawn({
            let shutdown = shutdown.clone();
            move || {
                let mut turns = 0u64;
                while !shutdown.is_triggered() {
                    turns += 1;
                    std::thread::yield_now();
                }
                turns
            }
        });

        shutdown.trigger();
        shutdown.trigger(); // idempotent

        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("waiter woke")
                .expect("waiter task did not panic");
        }
        assert!(sleeper.join().expect("sleeper thread did not panic"));
        poller.join().expect("poller thread did not panic");
        assert!(shutdown.is_triggered());
        // Waiting after the fact returns at once.
        shutdown.wait().await;
        assert!(shutdown.wait_blocking_timeout(Duration::ZERO));
    }

    #[test]
    fn blocking_wait_times_out_when_not_triggered() {
        let shutdown = Shutdown::new();
        assert!(!shutdown.wait_blocking_timeout(Duration::from_millis(5)));
    }
}
