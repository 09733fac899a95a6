use std::time::Duration;

use tessera_topology::testing::EtcdServer;

use super::*;

/// A time on a minute boundary.
const T0: i64 = 1_700_000_040_000;

fn spec(text: &str) -> InstanceSpec {
    parse_instance(text).unwrap()
}

fn timing() -> TimingArgs {
    TimingArgs { delay_secs: 30, boundary_secs: 60 }
}

#[test]
fn leaders_are_shown_per_shard_set() {
    let placement = Placement::init(&[("a", "h:1"), ("b", "h:2"), ("c", "h:3"), ("d", "h:4")], 8, 2, T0).unwrap();
    let leaders = [(1, "b".to_owned())].into();
    let text = render::leaders(&placement, &leaders);
    assert_eq!(text, "\nSET  LEADER\n1    b\n2    none (no replica holds the leader key)\n");
}

#[test]
fn instances_parse_as_id_equals_endpoint() {
    assert_eq!(spec("agg-1=10.0.0.1:7400"), InstanceSpec { id: "agg-1".into(), endpoint: "10.0.0.1:7400".into() });
    assert_eq!(spec(" agg-1 = host.example:7400 ").endpoint, "host.example:7400");
    for (bad, fragment) in [
        ("agg-1", "not `id=host:port`"),
        ("=h:1", "must be non-empty"),
        ("a/b=h:1", "without `/`"),
        ("agg-1=10.0.0.1", "not `host:port`"),
        ("agg-1=:7400", "not `host:port`"),
        ("agg-1=h:99999", "not `host:port`"),
    ] {
        let err = parse_instance(bad).unwrap_err();
        assert!(err.contains(fragment), "{bad}: {err}");
    }
}

#[test]
fn moves_land_on_the_boundary_after_the_delay() {
    let cutover = timing().timing(T0 + 10_000).unwrap().cutover_ms().unwrap();
    assert_eq!(cutover, T0 + 60_000);
    assert!(TimingArgs { delay_secs: 0, boundary_secs: 0 }.timing(T0).is_err());
}

#[test]
fn rendering_helpers() {
    assert_eq!(render::ranges(&[8, 0, 1, 2, 3, 10, 11, 12, 3]), "0-3,8,10-12");
    assert_eq!(render::ranges(&[]), "-");
    assert_eq!(render::utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(render::utc(951_782_400_000), "2000-02-29T00:00:00Z");
    assert_eq!(render::utc(T0), "2023-11-14T22:14:00Z");
    assert_eq!(render::time_and_distance(T0 + 108_000, T0), "2023-11-14T22:15:48Z (in 1m48s)");
    assert_eq!(render::time_and_distance(T0 - 7_200_000, T0), "2023-11-14T20:14:00Z (2h00m ago)");
}

#[test]
fn show_lists_states_times_and_liveness() {
    let placement = Placement::init(&[("agg-a", "h1:7400"), ("agg-b", "h2:7400")], 8, 1, T0).unwrap();
    let moved = placement.add_instance("agg-c", "h3:7400", timing().timing(T0).unwrap()).unwrap();
    let alive = vec!["agg-a".to_owned(), "agg-z".to_owned()];
    let text = render::placement("/tessera/test/placement", &moved, Some(&alive), T0);
    assert!(text.contains("version 2"), "{text}");
    assert!(text.contains("moves pending until 2023-11-14T22:15:00Z (in 1m00s)"), "{text}");
    let row = |id: &str| text.lines().find(|line| line.starts_with(id)).unwrap_or_else(|| panic!("{id} in\n{text}"));
    assert!(row("agg-a").contains(" yes "), "{text}");
    assert!(row("agg-b").contains(" no "), "{text}");
    assert!(row("agg-c").contains("from 2023-11-14T22:15:00Z"), "{text}");
    assert!(row("agg-a").contains("until 2023-11-14T22:15:00Z"), "{text}");
    assert!(text.contains("alive but not in the placement: agg-z"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_change_the_placement_in_etcd_with_compare_and_swap() {
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let store = PlacementStore::connect(etcd.config("cli")).await.unwrap();
    let err = show(&store, T0).await.unwrap_err();
    assert!(err.to_string().contains("tessera placement init"), "{err}");

    let init_args =
        InitArgs { instances: vec![spec("agg-a=h1:7400"), spec("agg-b=h2:7400")], shards: 8, replication_factor: 1 };
    assert_eq!(init(&store, &init_args, T0).await.unwrap().version(), 1);
    let err = init(&store, &init_args, T0).await.unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    let bad = InitArgs { replication_factor: 3, ..init_args };
    assert!(init(&store, &bad, T0).await.unwrap_err().to_string().contains("invalid placement"));

    let _lease = store.register_instance("agg-a", Duration::from_secs(5)).await.unwrap();
    let text = show(&store, T0).await.unwrap();
    assert!(text.lines().any(|line| line.starts_with("agg-a") && line.contains(" yes ")), "{text}");
    assert!(text.lines().any(|line| line.starts_with("agg-b") && line.contains(" no ")), "{text}");

    // Another writer changes the placement between our read and our write: nothing is written.
    let err = change(&store, |current| {
        let sneaky = current.add_instance("agg-x", "hx:7400", timing().timing(T0).unwrap())?;
        let writer = store.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let (_, revision) = writer.get().await.unwrap();
                writer.compare_and_swap(Some(revision), &sneaky).await.unwrap();
            })
        });
        current.add_instance("agg-c", "h3:7400", timing().timing(T0).unwrap())
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("changed by someone else"), "{err}");
    let (current, _) = store.get().await.unwrap();
    assert!(current.instance("agg-x").is_some() && current.instance("agg-c").is_none());

    // While shards move, further changes are refused; finalize completes them once settled.
    let err =
        change(&store, |current| current.remove_instance("agg-a", timing().timing(T0).unwrap())).await.unwrap_err();
    assert!(format!("{err:#}").contains("still moving"), "{err:#}");
    let cutover = current.pending_until_ms().unwrap();
    assert!(finalize(&store, 90, cutover + 89_000).await.unwrap().is_none());
    let settled = finalize(&store, 90, cutover + 90_000).await.unwrap().unwrap();
    assert!(!settled.has_pending_moves());
    assert_eq!(settled.updated_at_ms(), cutover + 90_000);

    let replaced =
        change(&store, |current| current.replace_instance("agg-b", "agg-d", "h4:7400", timing().timing(T0).unwrap()))
            .await
            .unwrap();
    finalize(&store, 90, replaced.pending_until_ms().unwrap() + 90_000).await.unwrap().unwrap();
    let (last, _) = store.get().await.unwrap();
    let ids: Vec<&str> = last.instances().iter().map(|instance| instance.id.as_str()).collect();
    assert_eq!(ids, ["agg-a", "agg-d", "agg-x"]);
    last.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingesters_placement_is_its_own_key_with_one_owner_per_shard() {
    assert_eq!(parse_tier("ingesters"), Ok(Tier::Ingesters));
    assert_eq!(parse_tier("aggregators"), Ok(Tier::Aggregators));
    assert!(parse_tier("collectors").unwrap_err().contains("aggregators` or `ingesters"));
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let aggregators = PlacementStore::connect(etcd.config("tiers")).await.unwrap();
    let ingesters = PlacementStore::connect(etcd.config("tiers").for_tier(Tier::Ingesters)).await.unwrap();
    assert_eq!(ingesters.placement_key(), "/tessera/tiers/ingesters/placement");

    let replicated =
        InitArgs { instances: vec![spec("ing-a=h1:7500"), spec("ing-b=h2:7500")], shards: 8, replication_factor: 2 };
    let err = init(&ingesters, &replicated, T0).await.unwrap_err();
    assert!(err.to_string().contains("replication factor 1"), "{err}");
    let args = InitArgs { replication_factor: 1, ..replicated };
    init(&ingesters, &args, T0).await.unwrap();
    let err = show(&aggregators, T0).await.unwrap_err();
    assert!(err.to_string().contains("tessera placement init"), "the aggregators' key is untouched: {err}");
    let text = show(&ingesters, T0).await.unwrap();
    assert!(text.contains("/tessera/tiers/ingesters/placement") && text.contains("ing-b"), "{text}");
}
