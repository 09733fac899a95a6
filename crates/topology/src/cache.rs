//! The local placement cache file: the last placement a watcher saw, as
//! protobuf bytes (the same encoding as in etcd), so that a daemon can
//! start on it while etcd is down.
//!
//! Writes are atomic: the bytes go to a temporary file in the same
//! directory, are synced, and the temporary file is renamed over the cache.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CacheError;
use crate::placement::Placement;

/// Writes `placement` to `path` atomically (temporary file, fsync, rename),
/// creating the parent directory when missing.
pub fn write_cache(path: &Path, placement: &Placement) -> Result<(), CacheError> {
    let io_error = |source| CacheError::Io { path: path.to_owned(), source };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&directory).map_err(io_error)?;
    let file_name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = directory.join(format!(".{file_name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&placement.encode_to_vec())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        // Make the rename itself durable; not every platform can open a directory.
        if let Ok(directory) = std::fs::File::open(&directory) {
            let _ = directory.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map_err(io_error)
}

/// Reads, decodes and validates the cache file at `path`.
pub fn read_cache(path: &Path) -> Result<Placement, CacheError> {
    let bytes = std::fs::read(path).map_err(|source| CacheError::Io { path: path.to_owned(), source })?;
    let placement = Placement::decode(&bytes).map_err(|source| CacheError::Decode { path: path.to_owned(), source })?;
    placement.validate().map_err(|source| CacheError::Invalid { path: path.to_owned(), source })?;
    Ok(placement)
}
