//! The one entry point daemons use: a [`PlacementSource`] from their config
//! becomes a [`PlacementHandle`] that always has a current placement.
//!
//! ```toml
//! [placement]
//! kind = "static"
//! path = "/etc/tessera/placement.toml"
//! ```
//!
//! or
//!
//! ```toml
//! [placement]
//! kind = "etcd"
//! endpoints = ["http://127.0.0.1:2379"]
//! env = "prod"
//! cache_path = "/var/lib/tessera/placement.pb"
//! ```
//!
//! Reading the current placement is cheap enough for hot paths (an atomic
//! pointer load); [`PlacementHandle::generation`] is a single atomic load
//! that tells a hot loop when to pick up a new [`Routing`](crate::Routing)
//! (see [`crate::handle`]).

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::SourceError;
use crate::etcd::{EtcdConfig, Watcher};
use crate::handle::PlacementHandle;

/// Where a daemon gets its placement from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlacementSource {
    /// A static TOML placement file, read once at start (see
    /// [`StaticFile`](crate::StaticFile)).
    Static {
        /// The placement file.
        path: PathBuf,
    },
    /// The placement in etcd, watched (see [`EtcdConfig`] for the keys).
    Etcd(EtcdConfig),
}

impl PlacementSource {
    /// Loads the first placement and, for etcd, starts watching.
    pub async fn start(&self) -> Result<PlacementHandle, SourceError> {
        match self {
            PlacementSource::Static { path } => {
                let placement = crate::static_file::load_static(path)?;
                Ok(PlacementHandle::fixed(placement))
            }
            PlacementSource::Etcd(config) => Ok(Watcher::start(config.clone()).await?.handle()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_from_toml() {
        let source: PlacementSource = toml::from_str("kind = \"static\"\npath = \"p.toml\"\n").unwrap();
        assert_eq!(source, PlacementSource::Static { path: "p.toml".into() });

        let source: PlacementSource =
            toml::from_str("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nenv = \"prod\"\ncache_path = \"c.pb\"\n")
                .unwrap();
        assert_eq!(source, PlacementSource::Etcd(EtcdConfig::new(["http://e:2379"], "prod").with_cache_path("c.pb")));
    }

    #[test]
    fn unknown_source_keys_are_rejected() {
        let err = toml::from_str::<PlacementSource>("kind = \"static\"\npath = \"p\"\nreload = true\n").unwrap_err();
        assert!(err.to_string().contains("reload"), "{err}");
        let err = toml::from_str::<PlacementSource>("kind = \"etcd\"\nendpoints = []\nenv = \"e\"\nkey = \"k\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
        let err = toml::from_str::<PlacementSource>("kind = \"consul\"\n").unwrap_err();
        assert!(err.to_string().contains("consul"), "{err}");
    }
}
