//! The file paths: static placement files and the watcher's cache file.

use std::path::Path;

use tessera_topology::{CacheError, Placement, PlacementSource, StaticFileError, load_static};
use tessera_topology::{read_cache, write_cache};

fn write(directory: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = directory.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn static_files_load_or_say_what_is_wrong() {
    let directory = tempfile::tempdir().unwrap();
    let good = write(
        directory.path(),
        "good.toml",
        "num_shards = 4\n[[instances]]\nid = \"a\"\nendpoint = \"127.0.0.1:7400\"\n",
    );
    let placement = load_static(&good).unwrap();
    assert_eq!(placement.shards_of("a").len(), 4);

    let unknown = write(directory.path(), "unknown.toml", "num_shards = 4\nnum_replicas = 2\ninstances = []\n");
    let error = load_static(&unknown).unwrap_err();
    assert!(matches!(error, StaticFileError::Parse { .. }), "{error}");
    let source = std::error::Error::source(&error).unwrap().to_string();
    assert!(source.contains("num_replicas"), "{source}");

    let invalid =
        write(directory.path(), "invalid.toml", "num_shards = 0\n[[instances]]\nid = \"a\"\nendpoint = \"h:1\"\n");
    let error = load_static(&invalid).unwrap_err();
    assert!(matches!(error, StaticFileError::Invalid { .. }), "{error}");
    assert!(error.to_string().contains("invalid.toml"), "{error}");

    let error = load_static(directory.path().join("missing.toml")).unwrap_err();
    assert!(matches!(error, StaticFileError::Read { .. }), "{error}");
}

#[tokio::test]
async fn a_static_source_gives_a_fixed_handle() {
    let directory = tempfile::tempdir().unwrap();
    let path =
        write(directory.path(), "placement.toml", "num_shards = 2\n[[instances]]\nid = \"a\"\nendpoint = \"h:1\"\n");
    let handle = PlacementSource::Static { path }.start().await.unwrap();
    assert_eq!(handle.version(), 1);
    assert!(handle.current().owns("a", 1, 0));
}

#[test]
fn cache_files_round_trip_atomically() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("nested").join("placement.pb");
    let first = Placement::init(&[("a", "h:1")], 8, 1, 1).unwrap();
    write_cache(&path, &first).unwrap();
    assert_eq!(read_cache(&path).unwrap(), first);

    let second = Placement::init(&[("a", "h:1"), ("b", "h:2")], 8, 1, 2).unwrap();
    write_cache(&path, &second).unwrap();
    assert_eq!(read_cache(&path).unwrap(), second);
    let leftovers: Vec<_> =
        std::fs::read_dir(path.parent().unwrap()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["placement.pb"], "no temporary file is left behind");

    std::fs::write(&path, b"\xff\xff\xff").unwrap();
    assert!(matches!(read_cache(&path), Err(CacheError::Decode { .. })));
    assert!(matches!(read_cache(&directory.path().join("absent.pb")), Err(CacheError::Io { .. })));
}
