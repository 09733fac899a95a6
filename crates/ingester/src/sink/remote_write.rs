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
//! Answers: 2xx is written; 429 and 5xx are retryable and say storage is overloaded; any
//! other status is permanent. One 500 is not: Prometheus without
//! `--enable-feature=native-histograms` refuses a whole request holding a native histogram
//! with "native histograms are disabled", and would refuse it forever; that answer is
//! [`SinkError::HistogramsRefused`] (the pool refuses the histograms, counted and logged,
//! and sends the rest alone). A network error is retryable; a request that takes longer
//! than `request_timeout` is abandoned as retryable and overloaded. The client is hyper
//! 1 over plain HTTP/1.1 with a connection pool; TLS is not built in (put a local proxy in
//! front of a TLS endpoint).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderValue, USER_AGENT};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Sink, SinkError, SinkRequest, shorten};
use crate::prompb;
use tessera_runtime::logging::error_chain;

/// What Prometheus answers (a 500, refusing the whole request) to native histograms when it
/// runs without `--enable-feature=native-histograms`.
const HISTOGRAMS_DISABLED: &str = "native histograms are disabled";

/// Most bytes of an error body kept for logs.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// Settings of a remote-write target.
#[derive(Debug, Clone)]
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
    /// Not plain http with a host.
    #[error("remote write url `{0}` must be http://host[:port]/path (TLS is not built in)")]
    Scheme(String),
}

/// Parses and checks a remote-write URL.
pub fn parse_url(url: &str) -> Result<Uri, UrlError> {
    let uri: Uri = url.parse().map_err(|error: hyper::http::uri::InvalidUri| UrlError::Invalid {
        url: url.to_owned(),
        reason: error.to_string(),
    })?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(UrlError::Scheme(url.to_owned()));
    }
    Ok(uri)
}

/// A Prometheus remote-write target; see the [module docs](self).
pub struct RemoteWriteSink {
    client: Client<HttpConnector, Full<Bytes>>,
    settings: RemoteWriteSettings,
    user_agent: HeaderValue,
}

impl RemoteWriteSink {
    /// A sink writing to `settings.url`. Needs a tokio runtime.
    pub fn new(settings: RemoteWriteSettings) -> RemoteWriteSink {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(settings.max_idle_connections)
            .build(connector);
        let user_agent = HeaderValue::from_static(concat!("tessera-ingester/", env!("CARGO_PKG_VERSION")));
        RemoteWriteSink { client, settings, user_agent }
    }

    /// Builds the compressed body of `request`.
    pub fn body(request: &SinkRequest) -> Result<Vec<u8>, SinkError> {
        let mut body = Vec::new();
        prompb::encode_write_request(&mut body, &request.samples, request.record.tile_end_ms);
        prompb::compress(&body).map_err(|error| SinkError::Permanent { status: 0, message: format!("snappy: {error}") })
    }

    async fn exchange(&self, request: hyper::Request<Full<Bytes>>) -> Result<(), SinkError> {
        let response = self.client.request(request).await.map_err(|error| SinkError::Retryable {
            reason: "network",
            message: error_chain(&error),
            overloaded: false,
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
        let body = Self::body(request)?;
        let mut builder = hyper::Request::post(self.settings.url.clone())
            .header(CONTENT_ENCODING, "snappy")
            .header(CONTENT_TYPE, "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header(USER_AGENT, self.user_agent.clone());
        if self.settings.m3_headers {
            builder = builder.header("M3-Metrics-Type", "aggregated");
            match HeaderValue::from_str(&request.record.storage_policy) {
                Ok(policy) => builder = builder.header("M3-Storage-Policy", policy),
                Err(_) => {
                    return Err(SinkError::Permanent {
                        status: 0,
                        message: format!(
                            "storage policy `{}` is not a valid header value",
                            request.record.storage_policy
                        ),
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
    fn urls_must_be_plain_http_with_a_host() {
        assert!(parse_url("http://127.0.0.1:9090/api/v1/write").is_ok());
        assert_eq!(
            parse_url("https://m3:7201/api/v1/prom/remote/write"),
            Err(UrlError::Scheme("https://m3:7201/api/v1/prom/remote/write".into()))
        );
        assert!(matches!(parse_url("/api/v1/write"), Err(UrlError::Scheme(_))));
        assert!(matches!(parse_url("http://bad host/"), Err(UrlError::Invalid { .. })));
    }
}
