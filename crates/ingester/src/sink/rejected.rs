//! The rejected-samples log: samples storage refused for good, kept for an operator.
//!
//! One line per sample:
//!
//! ```text
//! <logged_at_ms> target=<target> status=<status> policy=<policy> <series> <value> <timestamp_ms> reason="<storage's message>"
//! ```
//!
//! The file is bounded: once it passes half of `max_bytes` it is renamed to `<path>.1`
//! (replacing the previous one) and a new file is started, so the two together stay
//! under about `max_bytes`. Writes are rare (only permanent rejections) and small;
//! failures are logged and otherwise ignored.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use super::SinkRequest;
use super::openmetrics::{write_series, write_value};
use crate::queue::series::decode_labels;

/// The rejected-samples log; see the [module docs](self).
pub struct RejectedLog {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<(File, u64)>>,
}

impl RejectedLog {
    /// A log at `path` bounded to about `max_bytes` (with its one rotated file).
    pub fn new(path: PathBuf, max_bytes: u64) -> RejectedLog {
        RejectedLog { path, max_bytes, file: Mutex::new(None) }
    }

    /// Where the log is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Appends every sample of `request`, refused with `status` and `reason`.
    pub fn write(&self, target: &str, request: &SinkRequest, status: u16, reason: &str) {
        let logged_at_ms = tessera_core::clock::now_ms();
        let reason = reason.replace(['\n', '"'], " ");
        let mut text = String::with_capacity(request.samples.len() * 128);
        let prefix = |text: &mut String| {
            let _ = write!(
                text,
                "{logged_at_ms} target={target} status={status} policy={} ",
                request.record.storage_policy
            );
        };
        for sample in &request.samples {
            if !sample.lines.is_empty() {
                // A per-tile target's sample: its lines as they were sent.
                for line in String::from_utf8_lossy(&sample.lines).lines() {
                    prefix(&mut text);
                    let _ = writeln!(text, "{line} reason=\"{reason}\"");
                }
                continue;
            }
            prefix(&mut text);
            match decode_labels(&sample.labels) {
                Ok(labels) => write_series(&mut text, &labels),
                Err(_) => text.push_str("<undecodable labels>"),
            }
            text.push(' ');
            write_value(&mut text, sample.value);
            let _ = writeln!(text, " {} reason=\"{reason}\"", request.record.tile_end_ms);
        }
        if let Err(error) = self.append(text.as_bytes()) {
            tracing::warn!(%error, path = %self.path.display(), "cannot write the rejected-samples log");
        }
    }

    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut guard = self.file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let rotate = guard.as_ref().is_some_and(|(_, len)| *len >= self.max_bytes / 2);
        if rotate {
            *guard = None;
            let mut rotated = self.path.clone().into_os_string();
            rotated.push(".1");
            std::fs::rename(&self.path, rotated)?;
        }
        if guard.is_none() {
            if let Some(parent) = self.path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = OpenOptions::new().create(true).append(true).open(&self.path)?;
            let len = file.metadata()?.len();
            *guard = Some((file, len));
        }
        let (file, len) = guard.as_mut().expect("opened above");
        file.write_all(bytes)?;
        *len += bytes.len() as u64;
        Ok(())
    }
}
