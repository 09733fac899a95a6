//! The reader's side of origin detection against a fake `/proc` and installed listings:
//! which tags each line gets, and how the lines without are counted.

use super::source::OriginTags;
use super::*;
use tessera_core::table::{Folded, Table, TableOptions};

const WEB: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const DB: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const STRANGER: &str = "3333333333333333333333333333333333333333333333333333333333333333";

struct Fixture {
    _proc: tempfile::TempDir,
    origins: Arc<Origins>,
    _resolver: Resolver,
    metrics: OriginMetrics,
}

/// PIDs 10 (in WEB), 20 (in DB), 30 (in STRANGER, which no source lists), 40 (a host
/// process); 50 has exited.
fn fixture(cardinality: Cardinality) -> Fixture {
    let proc = tempfile::tempdir().unwrap();
    for (pid, cgroup) in [
        (10, format!("4:memory:/docker/{WEB}\n")),
        (20, format!("0::/system.slice/docker-{DB}.scope\n")),
        (30, format!("4:memory:/docker/{STRANGER}\n")),
        (40, "4:memory:/user.slice\n".to_owned()),
    ] {
        std::fs::create_dir(proc.path().join(pid.to_string())).unwrap();
        std::fs::write(proc.path().join(format!("{pid}/cgroup")), cgroup).unwrap();
    }
    let config =
        OriginConfig { enabled: true, cardinality, proc_root: proc.path().to_owned(), ..OriginConfig::default() };
    let metrics = OriginMetrics::default();
    let (origins, resolver) = start(&config, &metrics).unwrap().unwrap();
    Fixture { _proc: proc, origins, _resolver: resolver, metrics }
}

fn listing() -> Listing {
    let tags = |container: &str, pod: &str, id: &str| OriginTags {
        low: vec![("kube_namespace".into(), "shop".into()), ("kube_container_name".into(), container.into())],
        orchestrator: vec![("pod_name".into(), pod.into())],
        high: vec![("container_id".into(), id.into())],
    };
    let mut listing = Listing::default();
    listing.containers.insert(WEB.into(), tags("web", "web-1", WEB));
    listing.containers.insert(DB.into(), tags("db", "db-0", DB));
    listing.pods.insert(("uid-1".into(), "web".into()), tags("web", "web-1", WEB));
    listing
}

/// Folds `datagram` from `pid` and returns the series ids of the table's cut.
fn fold(tagger: &mut Tagger, pid: Option<u32>, datagram: &[u8]) -> Vec<String> {
    let mut table = Table::new(TableOptions::default());
    tagger.set_sender(pid);
    let mut lines = 0;
    table.fold_datagram_from(datagram, Default::default(), 0, tagger, |folded| {
        assert!(matches!(folded, Folded::Metric), "{folded:?}");
        lines += 1;
    });
    tagger.finish_datagram(lines, table.take_origin_tags_left_off());
    tagger.publish_counts();
    let mut ids = Vec::new();
    table.cut(|_, id, _| ids.push(String::from_utf8(id.to_vec()).unwrap()));
    ids.sort();
    ids
}

fn untagged(metrics: &OriginMetrics, reason: &'static str) -> u64 {
    metrics.origin_untagged.get_or_create(&ByReason { reason }).get()
}

#[test]
fn a_sender_in_a_known_container_tags_every_line_and_the_line_tags_stay() {
    let fixture = fixture(Cardinality::Low);
    fixture.origins.install(listing(), false);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    let ids = fold(&mut tagger, Some(10), b"hits:1|c\nlatency:2|ms|#zone:a\n");
    assert_eq!(
        ids,
        [
            "hits|#kube_container_name:web,kube_namespace:shop",
            "latency|#kube_container_name:web,kube_namespace:shop,zone:a",
        ]
    );
    assert_eq!(fold(&mut tagger, Some(20), b"hits:1|c"), ["hits|#kube_container_name:db,kube_namespace:shop"]);
    assert_eq!(fixture.metrics.origin_tagged_lines.get(), 3);
    // A host process has nothing to add, and takes the one-pass parser.
    assert_eq!(fold(&mut tagger, Some(40), b"hits:1|c"), ["hits"]);
    assert_eq!(fixture.metrics.origin_host_lines.get(), 1);
}

#[test]
fn the_tier_decides_pod_name_and_container_id() {
    let fixture = fixture(Cardinality::High);
    fixture.origins.install(listing(), false);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(
        fold(&mut tagger, Some(10), b"hits:1|c"),
        [format!("hits|#container_id:{WEB},kube_container_name:web,kube_namespace:shop,pod_name:web-1")]
    );
    let fixture = fixture_with(Cardinality::Orchestrator);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(
        fold(&mut tagger, Some(10), b"hits:1|c"),
        ["hits|#kube_container_name:web,kube_namespace:shop,pod_name:web-1"]
    );
}

fn fixture_with(cardinality: Cardinality) -> Fixture {
    let fixture = fixture(cardinality);
    fixture.origins.install(listing(), false);
    fixture
}

#[test]
fn a_line_that_names_its_container_or_pod_wins_over_the_sender_and_loses_its_raw_id_below_high() {
    let fixture = fixture_with(Cardinality::Low);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    // Over UDP there is no sender: only lines that name their origin are tagged.
    let datagram = format!("a:1|c|c:ci-{DB}\nb:1|c|c:{WEB}\nc:1|c|e:it-false,cn-web,pu-uid-1\nd:1|c\n");
    assert_eq!(
        fold(&mut tagger, None, datagram.as_bytes()).len(),
        4,
        "the Unix socket's missing credentials do not drop anything"
    );
    let mut table = Table::new(TableOptions::default());
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    table.fold_datagram_from(datagram.as_bytes(), Default::default(), 0, &mut tagger, |_| {});
    let mut ids = Vec::new();
    table.cut(|_, id, _| ids.push(String::from_utf8(id.to_vec()).unwrap()));
    ids.sort();
    assert_eq!(
        ids,
        [
            "a|#kube_container_name:db,kube_namespace:shop",
            "b|#kube_container_name:web,kube_namespace:shop",
            "c|#kube_container_name:web,kube_namespace:shop",
            "d",
        ]
    );
    // From a sender in WEB, a line naming DB is DB's.
    assert_eq!(
        fold(&mut tagger, Some(10), format!("a:1|c|c:ci-{DB}").as_bytes()),
        ["a|#kube_container_name:db,kube_namespace:shop"]
    );
    // At `high`, a container no source lists still gets its id.
    let fixture = fixture_with(Cardinality::High);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(
        fold(&mut tagger, None, format!("a:1|c|c:ci-{STRANGER}").as_bytes()),
        [format!("a|#container_id:{STRANGER}")]
    );
}

#[test]
fn an_exited_sender_an_unknown_container_and_a_listing_not_yet_done_go_untagged_and_counted() {
    let fixture = fixture(Cardinality::Low);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    // No listing has finished: the first lines go on at once, untagged, and ask for one.
    assert_eq!(fold(&mut tagger, Some(10), b"hits:1|c\nhits:2|c"), ["hits"]);
    assert_eq!(untagged(&fixture.metrics, "pending"), 2);
    // The listing lands: the reader's pending entry is looked at again at once.
    fixture.origins.install(listing(), false);
    assert_eq!(fold(&mut tagger, Some(10), b"hits:1|c"), ["hits|#kube_container_name:web,kube_namespace:shop"]);
    // A container no source lists.
    assert_eq!(fold(&mut tagger, Some(30), b"hits:1|c"), ["hits"]);
    assert_eq!(untagged(&fixture.metrics, "unknown_container"), 1);
    // The listing its miss asked for knows it: its next lines are tagged.
    let mut with_stranger = listing();
    with_stranger.containers.insert(STRANGER.into(), listing().containers.remove(DB).unwrap());
    fixture.origins.install(with_stranger, false);
    assert_eq!(fold(&mut tagger, Some(30), b"hits:1|c"), ["hits|#kube_container_name:db,kube_namespace:shop"]);
    // A sender that exited before its datagram was read.
    assert_eq!(fold(&mut tagger, Some(50), b"hits:1|c\nmore:1|g"), ["hits", "more"]);
    assert_eq!(untagged(&fixture.metrics, "pid_gone"), 2);
    // No credentials at all.
    assert_eq!(fold(&mut tagger, None, b"hits:1|c"), ["hits"]);
    assert_eq!(untagged(&fixture.metrics, "no_credentials"), 1);
    assert_eq!(fixture.metrics.origin_tagged_lines.get(), 2);
}

#[test]
fn a_failed_source_keeps_what_it_knew() {
    let fixture = fixture_with(Cardinality::Low);
    let mut partial = Listing::default();
    partial.containers.insert(DB.into(), listing().containers.remove(DB).unwrap());
    fixture.origins.install(partial, true);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(fold(&mut tagger, Some(10), b"hits:1|c"), ["hits|#kube_container_name:web,kube_namespace:shop"]);
    // A listing that succeeds replaces: WEB is gone.
    let mut only_db = Listing::default();
    only_db.containers.insert(DB.into(), listing().containers.remove(DB).unwrap());
    fixture.origins.install(only_db, false);
    assert_eq!(
        fold(&mut tagger, Some(10), b"hits:1|c"),
        ["hits|#kube_container_name:web,kube_namespace:shop"],
        "cached for tags_ttl_secs"
    );
    let mut fresh = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(fold(&mut fresh, Some(10), b"hits:1|c"), ["hits"]);
    assert_eq!(untagged(&fixture.metrics, "unknown_container"), 1);
    // A container the failed listing could not have known: counted as the source's failure.
    fixture.origins.install(Listing::default(), true);
    let mut fresh = Tagger::new(Arc::clone(&fixture.origins));
    assert_eq!(fold(&mut fresh, Some(30), b"hits:1|c"), ["hits"]);
    assert_eq!(untagged(&fixture.metrics, "source_error"), 1);
}

#[test]
fn origin_tags_that_would_pass_the_tag_limit_are_left_off_and_the_line_is_kept() {
    let fixture = fixture_with(Cardinality::Low);
    let mut tagger = Tagger::new(Arc::clone(&fixture.origins));
    let tags: Vec<String> = (0..tessera_core::parse::MAX_TAGS).map(|index| format!("t{index:03}:x")).collect();
    let line = format!("hits:1|c|#{}", tags.join(","));
    let ids = fold(&mut tagger, Some(10), line.as_bytes());
    assert_eq!(ids, [format!("hits|#{}", tags.join(","))]);
    assert_eq!(untagged(&fixture.metrics, "too_many_tags"), 1, "counted");
    assert_eq!(fixture.metrics.origin_tagged_lines.get(), 0);
}

/// `|c:in-<inode>`: the resolver finds the cgroup directory with that inode and its
/// container; until it has, the line goes on untagged and counted.
#[tokio::test]
async fn a_line_naming_its_cgroup_inode_is_tagged_once_the_resolver_has_found_it() {
    use std::os::unix::fs::MetadataExt;
    let cgroups = tempfile::tempdir().unwrap();
    let container = cgroups.path().join("memory/docker").join(WEB);
    std::fs::create_dir_all(&container).unwrap();
    let inode = std::fs::metadata(&container).unwrap().ino();
    let config = OriginConfig { enabled: true, cgroup_root: cgroups.path().to_owned(), ..OriginConfig::default() };
    let metrics = OriginMetrics::default();
    let (origins, resolver) = start(&config, &metrics).unwrap().unwrap();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(resolver.run(shutdown.clone()));
    // Its first listing (of no source) done, the containers' tags as a source would give them.
    while origins.generation.load(Ordering::Acquire) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    origins.install(listing(), false);
    let mut tagger = Tagger::new(Arc::clone(&origins));
    let line = format!("hits:1|c|c:in-{inode}");
    assert_eq!(fold(&mut tagger, None, line.as_bytes()), ["hits"], "not found yet");
    assert_eq!(untagged(&metrics, "pending"), 1);
    let mut ids = Vec::new();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        ids = fold(&mut tagger, None, line.as_bytes());
        if ids != ["hits"] {
            break;
        }
    }
    assert_eq!(ids, ["hits|#kube_container_name:web,kube_namespace:shop"]);
    shutdown.trigger();
    running.await.unwrap();
}
