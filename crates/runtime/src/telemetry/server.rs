//! The HTTP endpoint: the dashboard page at `/` (and its assets and data),
//! `/metrics`, `/healthz`, `/readyz`, `/debug/pprof/profile`, `/debug/pprof/heap`; HTTPS
//! only when the web config has `tls_server_config` ([`super::web_config`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use super::dashboard::{DASHBOARD_CSS, DASHBOARD_JS, Dashboard, INDEX_HTML};
use super::profile::{ProfileError, ProfileRequest, take_profile};
use super::web_config::Tls;
use super::{Readiness, Telemetry};
use crate::Shutdown;

/// Content type of `/metrics`.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the telemetry endpoint could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen for telemetry on {address}: {error}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// What binding returned.
        error: io::Error,
    },
    /// The server stopped on an I/O error.
    #[error("telemetry endpoint on {address} failed: {error}")]
    Serve {
        /// The bound address.
        address: SocketAddr,
        /// What serving returned.
        error: io::Error,
    },
}

/// The running telemetry endpoint, returned by [`serve`].
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    task: JoinHandle<io::Result<()>>,
}

impl ServerHandle {
    /// The bound address: the real port when port 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Resolves once the server has stopped: after the shutdown signal, when requests in
    /// flight are answered and connections closed.
    ///
    /// # Errors
    ///
    /// When the server stopped on an I/O error.
    pub async fn stopped(self) -> Result<(), ServeError> {
        match self.task.await {
            Ok(result) => result.map_err(|error| ServeError::Serve { address: self.local_addr, error }),
            Err(join_error) if join_error.is_panic() => std::panic::resume_unwind(join_error.into_panic()),
            // Cancelled: the runtime is shutting down, which stops the server too.
            Err(_) => Ok(()),
        }
    }
}

#[derive(Clone)]
struct Endpoint {
    telemetry: Telemetry,
    readiness: Readiness,
    dashboard: Dashboard,
    /// A profile in progress ends early when this fires.
    shutdown: Shutdown,
}

/// Binds `address` (port 0 picks a free port) and serves the telemetry endpoint on it in a
/// spawned task until `shutdown` is triggered; see the [module docs](super) for the paths.
/// Returns once bound, so [`ServerHandle::local_addr`] is already reachable.
///
/// # Errors
///
/// [`ServeError::Bind`] when the address cannot be bound.
pub async fn serve(
    address: SocketAddr,
    telemetry: Telemetry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> Result<ServerHandle, ServeError> {
    let listener = TcpListener::bind(address).await.map_err(|error| ServeError::Bind { address, error })?;
    let local_addr = listener.local_addr().map_err(|error| ServeError::Bind { address, error })?;
    let dashboard = Dashboard::start(telemetry.clone(), shutdown.clone());
    let (tls, telemetry_for_tls) = (telemetry.tls(), telemetry.clone());
    let router = Router::new()
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX_HTML) }))
        .route(
            "/dashboard.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], DASHBOARD_JS) }),
        )
        .route("/dashboard.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], DASHBOARD_CSS) }))
        .route("/dashboard/data", get(dashboard_data))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/debug/pprof/profile", get(profile))
        .route("/debug/pprof/heap", get(heap))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(telemetry.clone(), require_basic_auth))
        .with_state(Endpoint { telemetry, readiness, dashboard, shutdown: shutdown.clone() });
    let task = match tls {
        Some(tls) => {
            let listener = TlsListener::start(listener, local_addr, tls, telemetry_for_tls, shutdown.clone());
            spawn_server(listener, router, shutdown)
        }
        None => spawn_server(listener, router, shutdown),
    };
    Ok(ServerHandle { local_addr, task })
}

/// Serves `router` on `listener` (plain TCP, or TLS) in a task of its own until `shutdown`.
fn spawn_server<L>(listener: L, router: Router, shutdown: Shutdown) -> JoinHandle<io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.wait().await }).await
    })
}

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The telemetry port with `tls_server_config`: TCP connections accepted here, each
/// handshake in a task of its own under [`HANDSHAKE_TIMEOUT`] (a slow or silent client holds
/// up no one), and only those that completed handed to the HTTP server. Failures are
/// counted by reason ([`Telemetry::count_tls_failure`]).
struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    fn start(
        listener: TcpListener,
        local_addr: SocketAddr,
        tls: Arc<Tls>,
        telemetry: Telemetry,
        shutdown: Shutdown,
    ) -> TlsListener {
        let (sender, handshaken) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of descriptors, say: wait rather than spin.
                            tracing::warn!(%error, "telemetry port: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = shutdown.wait() => return,
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                let (sender, telemetry) = (sender.clone(), telemetry.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            let reason = crate::tls::failure_label(&error);
                            tracing::debug!(%error, %peer, reason, "telemetry port: TLS handshake failed");
                            telemetry.count_tls_failure(reason);
                        }
                        Err(_) => telemetry.count_tls_failure("timeout"),
                    }
                });
            }
        });
        TlsListener { handshaken, local_addr }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The acceptor stopped (shutdown): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local_addr)
    }
}

/// With a web config ([`super::web_config`]), every path but the probes needs basic auth;
/// the bcrypt check runs off the async workers.
async fn require_basic_auth(
    State(telemetry): State<Telemetry>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(auth) = telemetry.basic_auth() else { return next.run(request).await };
    if matches!(request.uri().path(), "/healthz" | "/readyz") {
        return next.run(request).await;
    }
    let authorization = request.headers().get(header::AUTHORIZATION).map(|value| value.as_bytes().to_vec());
    let verdict = tokio::task::spawn_blocking(move || auth.check(authorization.as_deref())).await;
    match verdict {
        Ok(super::web_config::Verdict::Allowed) => next.run(request).await,
        Ok(super::web_config::Verdict::Refused(_)) | Err(_) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"tessera\"")],
            "unauthorized: this telemetry port requires basic auth (its web config)\n",
        )
            .into_response(),
    }
}

async fn metrics(State(endpoint): State<Endpoint>) -> Response {
    match endpoint.telemetry.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(_) => {
            tracing::error!("a metric failed to encode");
            (StatusCode::INTERNAL_SERVER_ERROR, "a metric failed to encode\n").into_response()
        }
    }
}

#[derive(serde::Deserialize)]
struct DataQuery {
    /// Only points after this time, unix ms (the page's last point).
    #[serde(default)]
    since: i64,
}

async fn dashboard_data(State(endpoint): State<Endpoint>, Query(query): Query<DataQuery>) -> Response {
    let json = endpoint.dashboard.to_json(endpoint.telemetry.daemon(), query.since);
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], json).into_response()
}

async fn not_found() -> Response {
    let message = "not found; this endpoint serves / (dashboard), /metrics, /healthz, /readyz, /debug/pprof/profile\n";
    (StatusCode::NOT_FOUND, message).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(endpoint): State<Endpoint>) -> Response {
    let unmet = endpoint.readiness.unmet();
    if unmet.is_empty() {
        return (StatusCode::OK, "ready\n").into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", unmet.join(", "))).into_response()
}

async fn profile(State(endpoint): State<Endpoint>, RawQuery(query): RawQuery) -> Response {
    let metrics = endpoint.telemetry.profile_metrics().clone();
    if !endpoint.telemetry.profiling() {
        metrics.refuse("disabled");
        let message = "CPU profiling is off on this daemon (`[telemetry] profiling = false`)\n";
        return (StatusCode::FORBIDDEN, message).into_response();
    }
    let request = match ProfileRequest::from_query(query.as_deref().unwrap_or_default()) {
        Ok(request) => request,
        Err(reason) => {
            metrics.refuse("bad_request");
            return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response();
        }
    };
    let shutdown = endpoint.shutdown.clone();
    let sampler_metrics = metrics.clone();
    let taken = tokio::task::spawn_blocking(move || take_profile(request, &shutdown, &sampler_metrics)).await;
    match taken {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, request.format.content_type())], body).into_response(),
        Ok(Err(ProfileError::Busy)) => (StatusCode::CONFLICT, format!("{}\n", ProfileError::Busy)).into_response(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "CPU profile failed");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response()
        }
        Err(_) => {
            metrics.refuse("sampler");
            (StatusCode::INTERNAL_SERVER_ERROR, "the profile task failed\n").into_response()
        }
    }
}

async fn heap() -> Response {
    let message = "no heap profile: tessera uses the system allocator, which has no cheap sampling heap \
                   profiler (see the README, Profiling); /debug/pprof/profile gives CPU profiles\n";
    (StatusCode::NOT_IMPLEMENTED, message).into_response()
}
