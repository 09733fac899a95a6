//! The InfluxDB target: each tile in line protocol, named as Telegraf's statsd input writes
//! it, POSTed to InfluxDB 1.x's `/write` or 2.x's `/api/v2/write`.
//!
//! **Names** ([`InfluxNaming::write`]), Telegraf's defaults (`metric_separator = "_"`, no
//! templates, `parse_data_dog_tags`):
//!
//! | statsd | measurement, tags | fields |
//! |---|---|---|
//! | counter | `<name>` with `.` → `_`, tags as tags, `metric_type=counter` | `value` (integer: the tile's count, rounded) |
//! | gauge | … `metric_type=gauge` | `value` (float) |
//! | set | … `metric_type=set` | `value` (integer: distinct members) |
//! | timer, histogram, distribution | … `metric_type=timing` / `histogram` / `distribution` | `count` (integer), `lower`, `upper`, `mean`, `median`, `stddev`, `sum`, and `<p>_percentile` per `percentiles` (default `[90]`) |
//!
//! Timers are in the unit they were sent in (`|ms` in ms), as Telegraf writes them.
//! `count`, `lower`, `upper`, `sum`, `mean` and `stddev` (population) are exact;
//! `median` and the percentiles come from the sketch within its relative error (1.08 %).
//! A bare DogStatsD tag `k` is written `k=true`. Measurement names escape `,` and spaces,
//! tag keys and values `,`, `=` and spaces, with a backslash; a tag left empty is
//! dropped and counted. Each point is stamped with the tile's end (`precision=ms`).
//!
//! **Answers.** 204 (any 2xx) is written. A point written twice (same measurement, tags and
//! time) is replaced, so resends are safe. 400 is permanent: InfluxDB refused some points
//! for good (a field type conflict, a malformed point); counted by status, logged with
//! InfluxDB's message and written to the rejected-samples log. 401 and 403 are retryable
//! (`unauthorized`: the records wait in the queue for the operator to fix the credential),
//! as for remote write. 404 is retryable too (`not_found`) with a clear error: the database
//! or bucket does not exist yet, and the records wait until it does. 429 and 5xx are
//! retryable, not before the `Retry-After` they give.

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use tessera_core::parse::MetricKind;
use tessera_runtime::logging::error_chain;

use super::graphite::{Changes, Stats, Tile, TileValue};
use super::remote_write::{HttpsClient, https_client};
use super::{Sink, SinkError, SinkRequest, shorten};

/// How series are named in line protocol (Telegraf's statsd input's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct InfluxNaming {
    /// What joins the parts of a dotted name (Telegraf's `metric_separator`, `_`).
    pub separator: String,
    /// Percentiles written as `<p>_percentile` fields (Telegraf's `percentiles`, `[90]`).
    pub percentiles: Vec<f64>,
}

impl Default for InfluxNaming {
    fn default() -> Self {
        InfluxNaming { separator: "_".to_owned(), percentiles: vec![90.0] }
    }
}

impl InfluxNaming {
    /// Appends the line-protocol point of `tile`, stamped `timestamp_ms`, to `out`.
    pub fn write(&self, tile: &Tile<'_>, timestamp_ms: i64, out: &mut String, changes: &mut Changes) {
        let (name, tags) = tessera_core::series::split_id(tile.id);
        let name = String::from_utf8_lossy(name);
        let measurement = name.replace('.', &self.separator);
        if measurement.is_empty() {
            changes.keys_sanitized += 1;
            return;
        }
        escape(out, &measurement, b", ");
        let metric_type = match tile.value {
            TileValue::Counter(_) => "counter",
            TileValue::Gauge(_) => "gauge",
            TileValue::Set(_) => "set",
            TileValue::Distribution(MetricKind::Timer, _) => "timing",
            TileValue::Distribution(MetricKind::Histogram, _) => "histogram",
            TileValue::Distribution(..) => "distribution",
        };
        let mut pairs: Vec<(String, String)> = vec![("metric_type".to_owned(), metric_type.to_owned())];
        for tag in tags.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()) {
            let (key, value) = match tag.iter().position(|byte| *byte == b':') {
                Some(colon) => (&tag[..colon], &tag[colon + 1..]),
                None => (tag, &b"true"[..]),
            };
            let (key, value) = (String::from_utf8_lossy(key), String::from_utf8_lossy(value));
            if key.is_empty() || value.is_empty() || key == "metric_type" {
                changes.tags_dropped += 1;
                continue;
            }
            pairs.push((key.into_owned(), value.into_owned()));
        }
        // Line protocol wants tags sorted by key for the fastest writes.
        pairs.sort();
        for (key, value) in &pairs {
            out.push(',');
            escape(out, key, b",= ");
            out.push('=');
            escape(out, value, b",= ");
        }
        out.push(' ');
        let mut fields = Fields { out, first: true };
        match tile.value {
            TileValue::Counter(count) => fields.integer("value", count),
            TileValue::Gauge(value) => fields.float("value", value),
            TileValue::Set(members) => fields.integer("value", members),
            TileValue::Distribution(kind, distribution) => {
                let stats = Stats::of(kind, distribution, tile);
                fields.integer("count", stats.count);
                fields.float("lower", stats.min);
                fields.float("upper", stats.max);
                fields.float("mean", stats.mean);
                fields.float("median", stats.statsd_median(distribution));
                fields.float("stddev", stats.std);
                fields.float("sum", stats.sum);
                for &percentile in &self.percentiles {
                    let value = stats.quantile(distribution, percentile / 100.0);
                    fields.float(&format!("{percentile}_percentile"), value);
                }
            }
        }
        let _ = writeln!(fields.out, " {timestamp_ms}");
    }
}

/// Writes a point's fields, `,`-separated.
struct Fields<'a> {
    out: &'a mut String,
    first: bool,
}

impl Fields<'_> {
    fn separate(&mut self, name: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        escape(self.out, name, b",= ");
        self.out.push('=');
    }

    fn float(&mut self, name: &str, value: f64) {
        self.separate(name);
        let value = if value.is_finite() { value } else { 0.0 };
        let _ = write!(self.out, "{value}");
    }

    fn integer(&mut self, name: &str, value: f64) {
        self.separate(name);
        let value = if value.is_finite() { value.round() as i64 } else { 0 };
        let _ = write!(self.out, "{value}i");
    }
}

/// Appends `text` with a backslash before each of `special`.
fn escape(out: &mut String, text: &str, special: &[u8]) {
    for c in text.chars() {
        if c == '\n' || c == '\r' {
            out.push(' ');
            continue;
        }
        if c.is_ascii() && special.contains(&(c as u8)) {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Settings of an InfluxDB target.
#[derive(Debug)]
pub struct InfluxSettings {
    /// The write endpoint with its query (`/write?db=…&precision=ms` or
    /// `/api/v2/write?org=…&bucket=…&precision=ms`).
    pub url: Uri,
    /// What the endpoint names: `database \`x\`` or `bucket \`x\``, for errors.
    pub destination: String,
    /// `Basic …` (1.x) or `Token …` (2.x), if any.
    pub authorization: Option<HeaderValue>,
    /// Whole-request deadline.
    pub request_timeout: Duration,
    /// TCP connect deadline.
    pub connect_timeout: Duration,
    /// Idle connections kept.
    pub max_idle_connections: usize,
}

/// An InfluxDB target; see the [module docs](self).
pub struct InfluxSink {
    settings: InfluxSettings,
    client: HttpsClient,
    user_agent: HeaderValue,
}

impl InfluxSink {
    /// A sink writing to `settings.url`. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// For an `https` URL, when the system has no roots to trust.
    pub fn new(settings: InfluxSettings) -> Result<InfluxSink, tessera_wire::TlsError> {
        let tls = match settings.url.scheme_str() {
            Some("https") => tessera_wire::ClientTlsConfig::default().client_config()?,
            _ => super::remote_write::unused_tls(),
        };
        let client = https_client(settings.connect_timeout, settings.max_idle_connections, tls, None);
        let user_agent = HeaderValue::from_static(concat!("tessera-ingester/", env!("CARGO_PKG_VERSION")));
        Ok(InfluxSink { settings, client, user_agent })
    }

    fn refusal(&self, status: u16, message: String, retry_after: Option<Duration>) -> SinkError {
        let destination = &self.settings.destination;
        match status {
            400 => SinkError::Permanent { status, message: format!("InfluxDB refused points for good: {message}") },
            401 | 403 => SinkError::Retryable {
                reason: "unauthorized",
                message: format!("{status} (check the credentials; the data waits in the queue): {message}"),
                overloaded: false,
            },
            404 => SinkError::Retryable {
                reason: "not_found",
                message: format!("{destination} does not exist (create it; the data waits in the queue): {message}"),
                overloaded: false,
            },
            429 | 500..=599 => {
                let reason = if status == 429 { "status_429" } else { "status_5xx" };
                let message = format!("{status}: {message}");
                match retry_after {
                    Some(after) => SinkError::RetryAfter { reason, message, after },
                    None => SinkError::Retryable { reason, message, overloaded: true },
                }
            }
            _ => SinkError::Permanent { status, message: format!("{status}: {message}") },
        }
    }
}

/// `Retry-After` in seconds (InfluxDB sends seconds; an HTTP date is not read).
fn retry_after(headers: &hyper::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds.min(300)))
}

impl Sink for InfluxSink {
    fn kind(&self) -> &'static str {
        "influxdb"
    }

    async fn write(&self, request: &SinkRequest) -> Result<(), SinkError> {
        let size = request.samples.iter().map(|sample| sample.lines.len()).sum();
        let mut body = Vec::with_capacity(size);
        for sample in &request.samples {
            body.extend_from_slice(&sample.lines);
        }
        if body.is_empty() {
            return Ok(());
        }
        let mut builder = hyper::Request::post(self.settings.url.clone())
            .header(CONTENT_TYPE, "text/plain; charset=utf-8")
            .header(USER_AGENT, self.user_agent.clone());
        if let Some(authorization) = &self.settings.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        let http = builder.body(Full::new(Bytes::from(body))).map_err(|error| SinkError::Permanent {
            status: 0,
            message: format!("cannot build the request: {error}"),
        })?;
        let exchange = async {
            let response = self.client.request(http).await.map_err(|error| SinkError::Retryable {
                reason: "network",
                message: error_chain(&error),
                overloaded: false,
            })?;
            let status = response.status();
            let after = retry_after(response.headers());
            let body = Limited::new(response.into_body(), 64 << 10).collect().await;
            if status.is_success() {
                return Ok(());
            }
            let message = match body {
                Ok(body) => shorten(&String::from_utf8_lossy(&body.to_bytes()), 512),
                Err(error) => format!("(body unreadable: {error})"),
            };
            Err(self.refusal(status.as_u16(), message, after))
        };
        match tokio::time::timeout(self.settings.request_timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(SinkError::Retryable {
                reason: "timeout",
                message: format!("no answer within {:?}", self.settings.request_timeout),
                overloaded: true,
            }),
        }
    }
}

/// The endpoint of a target: `base` (`http://host:8086`, a path prefix kept) with 1.x's
/// `/write?db=&rp=&precision=ms` or 2.x's `/api/v2/write?org=&bucket=&precision=ms`.
pub fn endpoint(base: &str, v2: bool, database_or_bucket: &str, rp_or_org: &str) -> String {
    let base = base.trim_end_matches('/');
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|byte| match byte {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(byte).to_string(),
                other => format!("%{other:02X}"),
            })
            .collect()
    };
    if v2 {
        format!("{base}/api/v2/write?org={}&bucket={}&precision=ms", encode(rp_or_org), encode(database_or_bucket))
    } else if rp_or_org.is_empty() {
        format!("{base}/write?db={}&precision=ms", encode(database_or_bucket))
    } else {
        format!("{base}/write?db={}&rp={}&precision=ms", encode(database_or_bucket), encode(rp_or_org))
    }
}

#[cfg(test)]
mod tests;
