//! A sender's and a listener's configuration keys; see the crate docs, *Configuration*.

use std::sync::Arc;
use std::time::Duration;

use tessera_runtime::config::InvalidSetting;
use tessera_runtime::logging::RateLimitedLog;

use crate::client::ClientTls;
use crate::tls::{ClientTlsConfig, Reloading, ServerTlsConfig, TlsError};

/// Largest frame a daemon accepts or sends by default, bytes.
pub const DEFAULT_MAX_FRAME_BYTES: usize = tessera_proto::framing::DEFAULT_MAX_FRAME_BYTES;

/// The checks of a sender's keys, for the `validate_sender` the macro generates.
#[doc(hidden)]
pub fn validate_sender(
    table: &str,
    max_queue_bytes: usize,
    max_frame_bytes: usize,
    timeouts_ms: [u64; 2],
    reconnect_ms: (u64, u64),
) -> Result<(), InvalidSetting> {
    let invalid = |key: &str, reason: &str| Err(InvalidSetting::new(format!("{table}.{key}"), reason));
    if !(1024..=u32::MAX as usize).contains(&max_frame_bytes) {
        return invalid("max_frame_bytes", "must be between 1024 and 4294967295");
    }
    if max_queue_bytes < max_frame_bytes {
        return invalid("max_queue_bytes", "must hold at least one frame (max_frame_bytes)");
    }
    for (key, timeout_ms) in ["connect_timeout_ms", "ack_timeout_ms"].into_iter().zip(timeouts_ms) {
        if timeout_ms == 0 {
            return invalid(key, "timeouts must be at least 1 ms");
        }
    }
    if reconnect_ms.0 == 0 || reconnect_ms.0 > reconnect_ms.1 {
        return invalid("reconnect_min_ms", "must be at least 1 and at most reconnect_max_ms");
    }
    Ok(())
}

/// The checks of a listener's keys, for the `validate_listener` the macro generates.
#[doc(hidden)]
pub fn validate_listener(
    max_frame_bytes: usize,
    max_connections: usize,
    handshake_timeout_ms: u64,
    idle_timeout_ms: u64,
) -> Result<(), InvalidSetting> {
    let invalid = |key: &str, reason: &str| Err(InvalidSetting::new(key, reason));
    if !(1024..=u32::MAX as usize).contains(&max_frame_bytes) {
        return invalid("max_frame_bytes", "must be between 1024 and 4294967295");
    }
    if max_connections == 0 {
        return invalid("max_connections", "must be at least 1");
    }
    if handshake_timeout_ms == 0 {
        return invalid("handshake_timeout_ms", "must be at least 1");
    }
    if idle_timeout_ms < 1_000 {
        return invalid(
            "idle_timeout_ms",
            "must be at least 1000 (senders send a batch or a heartbeat well within it)",
        );
    }
    Ok(())
}

pub use prometheus_client::metrics::counter::Counter;

/// Checks a sender's `[<table>.tls]` by building it once (files read, key matched).
#[doc(hidden)]
pub fn validate_client_tls(table: &str, tls: Option<&ClientTlsConfig>) -> Result<(), InvalidSetting> {
    match tls.map(ClientTlsConfig::client_config) {
        Some(Err(error)) => Err(InvalidSetting::new(format!("{table}.tls"), error.to_string())),
        _ => Ok(()),
    }
}

/// Checks a listener's `[tls]` by building it once.
#[doc(hidden)]
pub fn validate_server_tls(tls: Option<&ServerTlsConfig>) -> Result<(), InvalidSetting> {
    match tls.map(ServerTlsConfig::server_config) {
        Some(Err(error)) => Err(InvalidSetting::new("tls", error.to_string())),
        _ => Ok(()),
    }
}

/// What a failed reload does: a warning (rate-limited) and a count.
fn on_reload_error(reload_errors: Counter) -> impl Fn(&TlsError) + Send + Sync + 'static {
    static LOG: RateLimitedLog = RateLimitedLog::new("wire.tls_reload", 5);
    move |error| {
        reload_errors.inc();
        if LOG.allow() {
            tracing::warn!(%error, "TLS files changed but do not load; the previous certificates stay in use");
        }
    }
}

/// A sender's TLS, reloaded from its files (`None` without `tls`); a change that does
/// not load counts in `reload_errors` and keeps the previous configuration.
pub fn client_tls(tls: Option<&ClientTlsConfig>, reload_errors: Counter) -> Result<Option<Arc<ClientTls>>, TlsError> {
    let Some(settings) = tls.cloned() else { return Ok(None) };
    let build = settings.clone();
    let config = Reloading::new(settings.files(), move || build.client_config(), on_reload_error(reload_errors))?;
    Ok(Some(Arc::new(ClientTls { config, settings })))
}

/// A listener's TLS, reloaded from its files (`None` without `tls`); a change that does
/// not load counts in `reload_errors` and keeps the previous configuration.
pub fn server_tls(
    tls: Option<&ServerTlsConfig>,
    reload_errors: Counter,
) -> Result<Option<Arc<Reloading<rustls::ServerConfig>>>, TlsError> {
    let Some(settings) = tls.cloned() else { return Ok(None) };
    let config = Reloading::new(settings.files(), move || settings.server_config(), on_reload_error(reload_errors))?;
    Ok(Some(Arc::new(config)))
}

/// `ms` milliseconds.
#[doc(hidden)]
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Declares a config struct holding a sender's keys beside the daemon's own; see the
/// [crate docs](crate), *Configuration*. Each own field is `/// doc`, `name: Type = default`.
/// The struct gets `Default`, `validate_sender(table)` and `sender_settings(..)`.
#[macro_export]
macro_rules! sender_config {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty = $default:expr, )*
        }
        defaults {
            max_queue_bytes: $queue:expr, max_frame_bytes: $frame:expr, ack_timeout_ms: $ack:expr,
            shutdown_grace_secs: $grace:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty, )*
            /// Bound of each destination's queue, bytes. When a queue is full its oldest
            /// batches are dropped and counted (`drops_total{reason="queue_full"}`).
            /// (`max_buffer_bytes` is read as this key, its old name in `[ingester]`.)
            #[serde(alias = "max_buffer_bytes")]
            pub max_queue_bytes: usize,
            /// Largest frame sent; more is split into several batches.
            pub max_frame_bytes: usize,
            /// Connect (and handshake) timeout.
            pub connect_timeout_ms: u64,
            /// How long to wait for an acknowledgement before reconnecting.
            pub ack_timeout_ms: u64,
            /// First retry delay; doubles up to `reconnect_max_ms`, with jitter.
            pub reconnect_min_ms: u64,
            /// Longest retry delay.
            pub reconnect_max_ms: u64,
            /// On SIGTERM, how long to keep delivering what is queued.
            pub shutdown_grace_secs: u64,
            /// TLS towards the destinations (`ca_file`, `cert_file`, `key_file`,
            /// `server_name`, `insecure_skip_verify`); plain TCP when absent.
            pub tls: Option<$crate::ClientTlsConfig>,
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: $default, )*
                    max_queue_bytes: $queue,
                    max_frame_bytes: $frame,
                    connect_timeout_ms: 2_000,
                    ack_timeout_ms: $ack,
                    reconnect_min_ms: 100,
                    reconnect_max_ms: 5_000,
                    shutdown_grace_secs: $grace,
                    tls: None,
                }
            }
        }

        impl $name {
            /// Checks the sender's keys; `table` names them in the error (`forward`).
            ///
            /// # Errors
            ///
            /// The first key that cannot be used, and why.
            pub fn validate_sender(&self, table: &str) -> Result<(), $crate::__runtime::config::InvalidSetting> {
                $crate::__config::validate_sender(
                    table,
                    self.max_queue_bytes,
                    self.max_frame_bytes,
                    [self.connect_timeout_ms, self.ack_timeout_ms],
                    (self.reconnect_min_ms, self.reconnect_max_ms),
                )?;
                $crate::__config::validate_client_tls(table, self.tls.as_ref())
            }

            /// The sender's settings: it connects as `source` in `role` to a `peer`; a TLS
            /// file that changes and does not load is counted in `reload_errors`.
            ///
            /// # Errors
            ///
            /// When the TLS files cannot be used.
            pub fn sender_settings(
                &self,
                source: String,
                role: $crate::__proto::Role,
                peer: &'static str,
                heartbeat: Option<$crate::Heartbeat>,
                reload_errors: $crate::__config::Counter,
            ) -> Result<$crate::SenderSettings, $crate::TlsError> {
                Ok($crate::SenderSettings {
                    source,
                    role,
                    peer,
                    connect_timeout: $crate::__config::millis(self.connect_timeout_ms),
                    ack_timeout: $crate::__config::millis(self.ack_timeout_ms),
                    reconnect_min: $crate::__config::millis(self.reconnect_min_ms),
                    reconnect_max: $crate::__config::millis(self.reconnect_max_ms),
                    rejection_label: $crate::__proto::AckReason::label,
                    heartbeat,
                    tls: $crate::__config::client_tls(self.tls.as_ref(), reload_errors)?,
                    redirect: None,
                })
            }

            /// How long to keep delivering on SIGTERM.
            pub fn shutdown_grace(&self) -> ::std::time::Duration {
                ::std::time::Duration::from_secs(self.shutdown_grace_secs)
            }
        }
    };
}

/// Declares a config struct holding a wire listener's keys beside the daemon's own; see
/// the [crate docs](crate), *Configuration*. Each own field is `/// doc`, `name: Type = default`.
/// The struct gets `Default`, `validate_listener()` and `listener_settings(..)`.
#[macro_export]
macro_rules! listener_config {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty = $default:expr, )*
        }
        defaults { listen: $listen:expr, max_connections: $connections:expr, handshake_timeout_ms: $handshake:expr $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        $vis struct $name {
            /// Address of the wire listener the senders connect to.
            pub listen: ::std::net::SocketAddr,
            /// Largest frame body accepted, bytes; a bigger frame closes the connection.
            pub max_frame_bytes: usize,
            /// Most connections at once; one more is closed at once and counted
            /// (`frame_errors_total{reason="too_many_connections"}`).
            pub max_connections: usize,
            /// Time allowed for a connecting sender's handshake.
            pub handshake_timeout_ms: u64,
            /// After its handshake, a connection with no frame for this long is closed and
            /// counted (`frame_errors_total{reason="idle_timeout"}`). Senders send a batch
            /// every window or a heartbeat when idle, so only a stuck or half-open connection
            /// stays silent.
            pub idle_timeout_ms: u64,
            /// `[tls]`: TLS on the wire listener (`cert_file`, `key_file`, and `client_ca_file`
            /// to require client certificates); plain TCP when absent.
            pub tls: Option<$crate::ServerTlsConfig>,
            $( $(#[$fmeta])* $fvis $field: $ty, )*
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                $name {
                    listen: $listen.parse().expect("a valid default address"),
                    max_frame_bytes: $crate::DEFAULT_MAX_FRAME_BYTES,
                    max_connections: $connections,
                    handshake_timeout_ms: $handshake,
                    idle_timeout_ms: 30_000,
                    tls: None,
                    $( $field: $default, )*
                }
            }
        }

        impl $name {
            /// Checks the listener's keys.
            ///
            /// # Errors
            ///
            /// The first key that cannot be used, and why.
            pub fn validate_listener(&self) -> Result<(), $crate::__runtime::config::InvalidSetting> {
                $crate::__config::validate_listener(
                    self.max_frame_bytes,
                    self.max_connections,
                    self.handshake_timeout_ms,
                    self.idle_timeout_ms,
                )?;
                $crate::__config::validate_server_tls(self.tls.as_ref())
            }

            /// The listener's settings; it answers handshakes as `instance_id`; a TLS file
            /// that changes and does not load is counted in `reload_errors`.
            ///
            /// # Errors
            ///
            /// When the TLS files cannot be used.
            pub fn listener_settings(
                &self,
                instance_id: String,
                reload_errors: $crate::__config::Counter,
            ) -> Result<$crate::ListenerSettings, $crate::TlsError> {
                Ok($crate::ListenerSettings {
                    instance_id,
                    max_frame_bytes: self.max_frame_bytes,
                    max_connections: self.max_connections,
                    handshake_timeout: $crate::__config::millis(self.handshake_timeout_ms),
                    idle_timeout: $crate::__config::millis(self.idle_timeout_ms),
                    tls: $crate::__config::server_tls(self.tls.as_ref(), reload_errors)?,
                })
            }
        }
    };
}
