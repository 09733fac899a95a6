//! Prometheus remote write 1.0.
//!
//! Each request is a `WriteRequest` ([`crate::prompb`]) with one `TimeSeries` per sample,
//! snappy block-compressed, POSTed with
//!
//! ```text
//! Content-Encoding: snappy
//! Content-Type: application/x-protobuf
//! X-Prometheus-Remote-Write-Version: 0.1.0
//! User-Agent: tessera-ingester/<version>
//! ```
//!
//! and, when `m3_headers` is on, `M3-Metrics-Type: aggregated` and
//! `M3-Storage-Policy: <policy>` so that an M3 coordinator writes the samples to the
//! aggregated namespace of that policy.
//!
//! **HTTPS and credentials.** An `https://` URL is spoken over rustls (HTTP/1.1), trusting
//! `[sink.tls] ca_file` or the system's roots, presenting `cert_file`/`key_file` (mTLS)
//! when set; the TLS files are reloaded when they change ([`tessera_wire::Reloading`]). Every
//! request carries `Authorization` (`basic_auth`, or a bearer token re-read from its file
//! when the file changes: rotating tokens work) and the configured `headers`
//! (`X-Scope-OrgID` for Mimir, Cortex, Grafana Cloud). With `tenant_label`, each request is
//! split by the value of that label, one request per tenant with the tenant in
//! `tenant_header`; series without the label go with the configured headers alone.
//! Secrets are never logged.
//!
//! Answers: 2xx is written; 429 and 5xx are retryable and say storage is overloaded; 401
//! and 403 are retryable too (`unauthorized`: a wrong or expired credential is fixed by the
//! operator, and until then the data waits in the durable queue, never acknowledged as
//! written); any other status is permanent. One 500 is not: Prometheus without
//! `--enable-feature=native-histograms` refuses a whole request holding a native histogram
//! with "native histograms are disabled", and would refuse it forever; that answer is
//! [`SinkError::HistogramsRefused`] (the pool refuses the histograms, counted and logged,
//! and sends the rest alone). A network error is retryable, a failed TLS handshake too
//! (`tls`: an unknown or expired certificate, logged with the reason); a request that takes
//! longer than `request_timeout` is abandoned as retryable and overloaded. The client is
//! hyper 1 with a connection pool.

use std::time::Duration;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use hyper::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;
use tessera_runtime::logging::{RateLimitedLog, error_chain};
use tessera_wire::ClientTls;
use tessera_wire::Reloading;

use super::metadata::Families;
use super::openmetrics::Helps;
use super::prompb;
use super::{Sink, SinkError, SinkRequest, StoredSample, shorten};

/// What Prometheus answers (a 500, refusing the whole request) to native histograms when it
/// runs without `--enable-feature=native-histograms`.
const HISTOGRAMS_DISABLED: &str = "native histograms are disabled";

/// Most bytes of an error body kept for logs.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// Uncompressed bytes of metadata per request, about (a family's entry is 60 to 150 bytes).
pub const METADATA_REQUEST_BYTES: usize = 512 << 10;

/// Settings of a remote-write target.
#[derive(Debug)]
pub struct RemoteWriteSettings {
    /// Endpoint, e.g. `http://127.0.0.1:9090/api/v1/write`.
    pub url: Uri,
    /// Send the M3 coordinator headers.
    pub m3_headers: bool,
    /// Whole-request deadline.
    pub request_timeout: Duration,
    /// TCP connect deadline.
    pub connect_timeout: Duration,
    /// Idle connections kept per host.
    pub max_idle_connections: usize,
    /// TLS for an `https` URL (its files reloaded when they change); the system's roots
    /// when `None`.
    pub tls: Option<Arc<ClientTls>>,
    /// The `Authorization` header, if any.
    pub authorization: Option<Authorization>,
    /// Headers sent with every request.
    pub headers: HeaderMap,
    /// Split requests by tenant: the label whose value is the tenant, and the header it
    /// goes in.
    pub tenant: Option<(String, HeaderName)>,
    /// Send each family's metadata every `metadata_interval`
    /// ([`RemoteWriteSink::send_metadata`]); never with a tenant label or M3 headers.
    pub metadata: bool,
    /// How often the metadata goes out.
    pub metadata_interval: Duration,
    /// The help texts of that metadata.
    pub helps: Helps,
}

/// How a target authenticates requests.
#[derive(Debug)]
pub enum Authorization {
    /// `Basic base64(user:password)`, read once at start.
    Basic(HeaderValue),
    /// `Bearer <token>`, the token re-read from its file when the file changes.
    Bearer(TokenFile),
}

impl Authorization {
    /// `Basic` credentials (the header is marked sensitive: never logged).
    pub fn basic(username: &str, password: &str) -> Result<Authorization, hyper::header::InvalidHeaderValue> {
        let mut value = HeaderValue::from_str(&format!(
            "Basic {}",
            tessera_core::base64::encode(format!("{username}:{password}").as_bytes())
        ))?;
        value.set_sensitive(true);
        Ok(Authorization::Basic(value))
    }

    fn header(&self) -> Result<HeaderValue, SinkError> {
        match self {
            Authorization::Basic(value) => Ok(value.clone()),
            Authorization::Bearer(file) => file.current(),
        }
    }
}

/// A bearer token in a file, re-read when the file's modification time or size changes
/// (looked at at each request: a rotated token is used by the next one); a change that
/// does not read keeps the old token, logged and counted once.
#[derive(Debug)]
pub struct TokenFile(Reloading<HeaderValue, String>);

static TOKEN_LOG: RateLimitedLog = RateLimitedLog::new("ingester.bearer_token", 5);

impl TokenFile {
    /// Reads the token in `path` now.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or its content is not a header value.
    pub fn open(
        path: PathBuf,
        reload_errors: prometheus_client::metrics::counter::Counter,
    ) -> Result<TokenFile, String> {
        let file = path.clone();
        let on_error = move |error: &String| {
            reload_errors.inc();
            if TOKEN_LOG.allow() {
                tracing::warn!(error, "cannot re-read the bearer token; the previous one stays in use");
            }
        };
        let reloading =
            Reloading::checked_every(vec![path], Duration::ZERO, move || read_token(&file).map(Arc::new), on_error)?;
        Ok(TokenFile(reloading))
    }

    fn current(&self) -> Result<HeaderValue, SinkError> {
        Ok(HeaderValue::clone(&self.0.current()))
    }
}

fn read_token(path: &std::path::Path) -> Result<HeaderValue, String> {
    let token =
        std::fs::read_to_string(path).map_err(|error| format!("bearer_token_file `{}`: {error}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(format!("bearer_token_file `{}` is empty", path.display()));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| format!("bearer_token_file `{}` holds characters a header cannot carry", path.display()))?;
    value.set_sensitive(true);
    Ok(value)
}

/// Why a remote-write URL is not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    /// Not a URL.
    #[error("invalid remote write url `{url}`: {reason}")]
    Invalid {
        /// The URL given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// Not http or https with a host.
    #[error("remote write url `{0}` must be http://host[:port]/path or https://host[:port]/path")]
    Scheme(String),
}

/// Parses and checks a remote-write URL.
pub fn parse_url(url: &str) -> Result<Uri, UrlError> {
    let uri: Uri = url.parse().map_err(|error: hyper::http::uri::InvalidUri| UrlError::Invalid {
        url: url.to_owned(),
        reason: error.to_string(),
    })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(UrlError::Scheme(url.to_owned()));
    }
    Ok(uri)
}

/// hyper's pooled client over rustls (or plain TCP for `http`).
pub(super) type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A pooled HTTP/1.1 client for `http` and `https` URLs, trusting what `tls` trusts, with
/// `server_name` for every host when set.
pub(super) fn https_client(
    connect_timeout: Duration,
    max_idle_connections: usize,
    tls: Arc<ClientConfig>,
    server_name: Option<String>,
) -> HttpsClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config((*tls).clone()).https_or_http();
    let builder = match server_name.and_then(|name| rustls::pki_types::ServerName::try_from(name).ok()) {
        Some(name) => builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name)),
        None => builder,
    };
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(max_idle_connections)
        .build(builder.enable_http1().wrap_connector(connector))
}

/// A Prometheus remote-write target; see the [module docs](self).
pub struct RemoteWriteSink {
    /// The client, and the TLS configuration it was built with (rebuilt when that changes).
    client: Mutex<(Arc<ClientConfig>, HttpsClient)>,
    settings: RemoteWriteSettings,
    user_agent: HeaderValue,
}

/// A TLS configuration for plain `http` targets, never used: the connector needs one.
pub(super) fn unused_tls() -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions();
    let config =
        builder.map(|builder| builder.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth());
    Arc::new(config.unwrap_or_else(|_| unreachable!("ring supports the default TLS versions")))
}

impl RemoteWriteSink {
    /// A sink writing to `settings.url`. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// For an `https` URL without `tls`, when the system has no roots to trust.
    pub fn new(settings: RemoteWriteSettings) -> Result<RemoteWriteSink, tessera_wire::TlsError> {
        let tls = match (&settings.tls, settings.url.scheme_str()) {
            (Some(tls), _) => tls.config.current(),
            (None, Some("https")) => tessera_wire::ClientTlsConfig::default().client_config()?,
            (None, _) => unused_tls(),
        };
        let client = Self::client_with(&settings, tls.clone());
        let user_agent = HeaderValue::from_static(concat!("tessera-ingester/", env!("CARGO_PKG_VERSION")));
        Ok(RemoteWriteSink { client: Mutex::new((tls, client)), settings, user_agent })
    }

    fn client_with(settings: &RemoteWriteSettings, tls: Arc<ClientConfig>) -> HttpsClient {
        let name = settings.tls.as_ref().and_then(|tls| tls.settings.server_name.clone());
        https_client(settings.connect_timeout, settings.max_idle_connections, tls, name)
    }

    /// The client for the next request: rebuilt when the TLS files changed.
    fn client(&self) -> HttpsClient {
        let mut client = self.client.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tls) = &self.settings.tls {
            let current = tls.config.current();
            if !Arc::ptr_eq(&current, &client.0) {
                *client = (current.clone(), Self::client_with(&self.settings, current));
            }
        }
        client.1.clone()
    }

    /// Builds the compressed body of `request`.
    pub fn body(request: &SinkRequest) -> Result<Vec<u8>, SinkError> {
        Self::body_of(&request.samples, request.record.tile_end_ms)
    }

    fn body_of(samples: &[StoredSample], tile_end_ms: i64) -> Result<Vec<u8>, SinkError> {
        let mut body = Vec::new();
        prompb::encode_write_request(&mut body, samples, tile_end_ms);
        Self::compressed(&body)
    }

    fn compressed(body: &[u8]) -> Result<Vec<u8>, SinkError> {
        prompb::compress(body).map_err(|error| SinkError::Permanent { status: 0, message: format!("snappy: {error}") })
    }

    /// Whether this target sends metadata: asked for, and no tenant label or M3 headers
    /// (a metadata request has no series to take a tenant or a storage policy from).
    pub fn sends_metadata(&self) -> bool {
        self.settings.metadata && self.settings.tenant.is_none() && !self.settings.m3_headers
    }

    /// How often [`send_metadata`](Self::send_metadata) should run.
    pub fn metadata_interval(&self) -> Duration {
        self.settings.metadata_interval
    }

    /// Sends the type, help and unit of every family in `families`, in requests of about
    /// [`METADATA_REQUEST_BYTES`] each; returns how many families went out.
    pub async fn send_metadata(&self, families: &Families) -> Result<usize, SinkError> {
        let snapshot = families.snapshot();
        let entries: Vec<prompb::MetadataEntry<'_>> = snapshot
            .iter()
            .map(|(family, meta)| {
                (family.as_str(), meta.type_name, self.settings.helps.of(family, meta.type_name), meta.unit)
            })
            .collect();
        let mut start = 0;
        while start < entries.len() {
            let mut bytes = 0;
            let mut end = start;
            while end < entries.len() && (end == start || bytes < METADATA_REQUEST_BYTES) {
                bytes += prompb::metadata_entry_len(&entries[end]);
                end += 1;
            }
            let mut body = Vec::with_capacity(bytes);
            prompb::encode_metadata_request(&mut body, &entries[start..end]);
            self.post(Self::compressed(&body)?, None, None).await?;
            start = end;
        }
        Ok(entries.len())
    }

    async fn exchange(&self, request: hyper::Request<Full<Bytes>>) -> Result<(), SinkError> {
        let response = self.client().request(request).await.map_err(|error| {
            // A refused certificate (unknown CA, expired, wrong name) is told from the network.
            match tessera_wire::tls_failure(&error) {
                Some(failure) => SinkError::Retryable {
                    reason: "tls",
                    message: format!("TLS handshake failed ({failure}): {}", error_chain(&error)),
                    overloaded: false,
                },
                None => SinkError::Retryable { reason: "network", message: error_chain(&error), overloaded: false },
            }
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ERROR_BODY_BYTES).collect().await;
        if status.is_success() {
            return Ok(());
        }
        let message = match body {
            Ok(body) => shorten(&String::from_utf8_lossy(&body.to_bytes()), 512),
            Err(error) => format!("(body unreadable: {error})"),
        };
        let code = status.as_u16();
        if message.contains(HISTOGRAMS_DISABLED) {
            return Err(SinkError::HistogramsRefused { status: code, message });
        }
        Err(match code {
            401 | 403 => SinkError::Retryable {
                reason: "unauthorized",
                message: format!("{code} (check the credentials; the data waits in the queue): {message}"),
                overloaded: false,
            },
            429 => SinkError::Retryable { reason: "status_429", message, overloaded: true },
            500..=599 => {
                SinkError::Retryable { reason: "status_5xx", message: format!("{code}: {message}"), overloaded: true }
            }
            _ => SinkError::Permanent { status: code, message },
        })
    }
}

impl Sink for RemoteWriteSink {
    fn kind(&self) -> &'static str {
        "remote_write"
    }

    async fn write(&self, request: &SinkRequest) -> Result<(), SinkError> {
        let Some((label, header)) = &self.settings.tenant else {
            return self.send(request, &request.samples, None).await;
        };
        // One request per tenant, in the order tenants first appear.
        let mut tenants: Vec<(Option<String>, Vec<StoredSample>)> = Vec::new();
        for sample in &request.samples {
            let mut tenant = None;
            let _ = crate::queue::series::visit_labels(&sample.labels, |name, value| {
                if name == label {
                    tenant = Some(value.to_owned());
                }
            });
            match tenants.iter_mut().find(|(known, _)| *known == tenant) {
                Some((_, samples)) => samples.push(sample.clone()),
                None => tenants.push((tenant, vec![sample.clone()])),
            }
        }
        for (tenant, samples) in &tenants {
            let value = match tenant.as_deref().map(HeaderValue::from_str) {
                Some(Ok(value)) => Some((header, value)),
                Some(Err(_)) => {
                    let message = format!(
                        "tenant `{}` of label `{label}` is not a valid header value",
                        tenant.as_deref().unwrap_or_default()
                    );
                    return Err(SinkError::Permanent { status: 0, message });
                }
                None => None,
            };
            self.send(request, samples, value).await?;
        }
        Ok(())
    }
}

impl RemoteWriteSink {
    /// Sends `samples` of `request` as one remote-write request, with `tenant` as a header.
    async fn send(
        &self,
        request: &SinkRequest,
        samples: &[StoredSample],
        tenant: Option<(&HeaderName, HeaderValue)>,
    ) -> Result<(), SinkError> {
        let body = Self::body_of(samples, request.record.tile_end_ms)?;
        self.post(body, tenant, Some(&request.record.storage_policy)).await
    }

    /// POSTs one compressed `WriteRequest`, with `tenant` as a header and, with M3 headers
    /// on, the `storage_policy` of its samples.
    async fn post(
        &self,
        body: Vec<u8>,
        tenant: Option<(&HeaderName, HeaderValue)>,
        storage_policy: Option<&str>,
    ) -> Result<(), SinkError> {
        let mut builder = hyper::Request::post(self.settings.url.clone())
            .header(CONTENT_ENCODING, "snappy")
            .header(CONTENT_TYPE, "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header(USER_AGENT, self.user_agent.clone());
        if let Some(headers) = builder.headers_mut() {
            headers.extend(self.settings.headers.clone());
            if let Some(authorization) = &self.settings.authorization {
                headers.insert(AUTHORIZATION, authorization.header()?);
            }
            if let Some((name, value)) = tenant {
                headers.insert(name.clone(), value);
            }
        }
        if let Some(storage_policy) = storage_policy.filter(|_| self.settings.m3_headers) {
            builder = builder.header("M3-Metrics-Type", "aggregated");
            match HeaderValue::from_str(storage_policy) {
                Ok(policy) => builder = builder.header("M3-Storage-Policy", policy),
                Err(_) => {
                    return Err(SinkError::Permanent {
                        status: 0,
                        message: format!("storage policy `{storage_policy}` is not a valid header value"),
                    });
                }
            }
        }
        let http_request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| SinkError::Permanent { status: 0, message: error.to_string() })?;
        match tokio::time::timeout(self.settings.request_timeout, self.exchange(http_request)).await {
            Ok(result) => result,
            Err(_) => Err(SinkError::Retryable {
                reason: "timeout",
                message: format!("no answer within {:?}", self.settings.request_timeout),
                overloaded: true,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_http_or_https_with_a_host() {
        assert!(parse_url("http://127.0.0.1:9090/api/v1/write").is_ok());
        assert!(parse_url("https://m3:7201/api/v1/prom/remote/write").is_ok());
        assert_eq!(parse_url("ftp://m3:7201/write"), Err(UrlError::Scheme("ftp://m3:7201/write".into())));
        assert!(matches!(parse_url("/api/v1/write"), Err(UrlError::Scheme(_))));
        assert!(matches!(parse_url("http://bad host/"), Err(UrlError::Invalid { .. })));
    }

    #[test]
    fn a_rotated_bearer_token_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let errors = prometheus_client::metrics::counter::Counter::default();
        let file = TokenFile::open(path.clone(), errors.clone()).unwrap();
        assert_eq!(file.current().unwrap(), "Bearer first");
        std::fs::write(&path, "second-and-longer").unwrap();
        assert_eq!(file.current().unwrap(), "Bearer second-and-longer");
        std::fs::write(&path, "").unwrap();
        assert_eq!(file.current().unwrap(), "Bearer second-and-longer", "an empty rotation keeps the old token");
        assert_eq!(errors.get(), 1, "and is counted");
        assert_eq!(file.current().unwrap(), "Bearer second-and-longer");
        assert_eq!(errors.get(), 1, "once, not at every request while it stays broken");
        assert!(TokenFile::open(dir.path().join("missing"), errors).unwrap_err().contains("missing"));
    }
}
