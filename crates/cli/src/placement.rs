//! `tessera placement`: read and change the aggregators' or the ingesters'
//! placement in etcd.
//!
//! ```text
//! tessera placement --etcd http://127.0.0.1:2379 --environment prod init \
//!     --instance agg-1=10.0.0.1:7400 --instance agg-2=10.0.0.2:7400 --shards 64 --replication-factor 1
//! tessera placement show
//! tessera placement add --instance agg-3=10.0.0.3:7400
//! tessera placement remove --instance agg-1
//! tessera placement replace --old agg-2 --new agg-4=10.0.0.4:7400
//! tessera placement finalize
//! tessera placement --tier ingesters init --instance ing-1=10.0.1.1:7500 --instance ing-2=10.0.1.2:7500 --shards 64
//! tessera placement --tier ingesters show
//! ```
//!
//! `--tier ingesters` works on the ingesters' placement
//! (`/tessera/<env>/ingesters/placement`): replication factor 1, every
//! series written by the one ingester owning its shard. Ingesters also fail
//! dead instances over and join by themselves (see the ingester's README).
//!
//! Every change reads the placement with its etcd revision, computes the
//! next one with `tessera_topology` (which validates it: every shard owned
//! by RF instances, no instance twice in a shard set), and writes it with
//! compare-and-swap: if someone else changed the placement in between,
//! nothing is written and the command says so.
//!
//! Shards move at a tile boundary: the old owners keep a moving shard
//! until the cutover, the new owners take it from then. The cutover is the
//! first multiple of `--boundary-secs` (default 60, a multiple of 10 s and
//! 1 min tiles) at least `--delay-secs` (default 30) from now, so that
//! every collector and aggregator sees the new placement first.
//! `finalize` later drops the finished moves' leaving entries, once the
//! last tile before the cutover has been flushed (`--settle-secs`).

mod render;

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args as ClapArgs, Subcommand};
use tessera_core::clock::now_ms;
use tessera_topology::{EtcdConfig, MoveTiming, Placement, PlacementStore, StoreError, Tier};

/// Flags of `tessera placement`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// etcd client URLs (repeat the flag or separate with commas).
    #[arg(long = "etcd", value_delimiter = ',', default_value = "http://127.0.0.1:2379", global = true)]
    etcd: Vec<String>,
    /// Environment: the placement lives at `/tessera/<environment>/placement`.
    #[arg(long, default_value = "default", global = true)]
    environment: String,
    /// Time allowed for each etcd request, milliseconds.
    #[arg(long, default_value_t = 5_000, global = true)]
    timeout_ms: u64,
    /// Whose placement: `aggregators` (`/tessera/<environment>/placement`) or
    /// `ingesters` (`/tessera/<environment>/ingesters/placement`).
    #[arg(long, default_value = "aggregators", value_parser = parse_tier, global = true)]
    tier: Tier,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the first placement: instances grouped in order into shard sets
    /// of the replication factor, shards dealt round-robin to the sets.
    Init(InitArgs),
    /// Show instances, shard sets, shard states with cutover and cutoff
    /// times, and which instances are alive (hold their etcd lease).
    Show,
    /// Add instances (a whole shard set: a multiple of the replication
    /// factor); just enough shards move to them to balance the sets.
    Add(AddArgs),
    /// Remove instances (whole shard sets); their shards move to the least
    /// loaded remaining sets.
    Remove(RemoveArgs),
    /// Replace one instance by a new one that takes all its shards.
    Replace(ReplaceArgs),
    /// Complete every move whose cutover has passed by `--settle-secs`:
    /// drop leaving entries, mark initializing shards available.
    Finalize(FinalizeArgs),
}

/// An instance given as `id=host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InstanceSpec {
    id: String,
    endpoint: String,
}

fn parse_tier(text: &str) -> Result<Tier, String> {
    match text {
        "aggregators" | "aggregator" => Ok(Tier::Aggregators),
        "ingesters" | "ingester" => Ok(Tier::Ingesters),
        other => Err(format!("unknown tier `{other}`: `aggregators` or `ingesters`")),
    }
}

fn parse_instance(text: &str) -> Result<InstanceSpec, String> {
    let Some((id, endpoint)) = text.split_once('=') else {
        return Err(format!("`{text}` is not `id=host:port`"));
    };
    let (id, endpoint) = (id.trim(), endpoint.trim());
    if id.is_empty() || id.contains('/') {
        return Err(format!("instance id `{id}` must be non-empty and without `/`"));
    }
    let port_ok = endpoint.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(format!("endpoint `{endpoint}` of `{id}` is not `host:port`"));
    }
    Ok(InstanceSpec { id: id.to_owned(), endpoint: endpoint.to_owned() })
}

#[derive(Debug, ClapArgs)]
struct InitArgs {
    /// An instance, `id=host:port` (repeat; order forms the shard sets).
    #[arg(long = "instance", required = true, value_parser = parse_instance)]
    instances: Vec<InstanceSpec>,
    /// Number of shards series are hashed into.
    #[arg(long)]
    shards: u32,
    /// Instances owning each shard.
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
}

/// When moves take effect.
#[derive(Debug, Clone, Copy, ClapArgs)]
struct TimingArgs {
    /// Earliest a move may take effect, seconds from now.
    #[arg(long, default_value_t = 30)]
    delay_secs: u64,
    /// Moves take effect on a multiple of this, seconds since the epoch;
    /// it must be a multiple of every storage policy's resolution.
    #[arg(long, default_value_t = 60)]
    boundary_secs: u64,
}

impl TimingArgs {
    fn timing(self, now_ms: i64) -> anyhow::Result<MoveTiming> {
        if self.boundary_secs == 0 {
            bail!("--boundary-secs must be at least 1");
        }
        let delay_ms = i64::try_from(self.delay_secs.saturating_mul(1000)).context("--delay-secs is too large")?;
        let boundary_ms =
            i64::try_from(self.boundary_secs.saturating_mul(1000)).context("--boundary-secs is too large")?;
        Ok(MoveTiming::new(now_ms).with_delay_ms(delay_ms).with_boundary_ms(boundary_ms))
    }
}

#[derive(Debug, ClapArgs)]
struct AddArgs {
    /// A new instance, `id=host:port` (repeat for a shard set of several).
    #[arg(long = "instance", required = true, value_parser = parse_instance)]
    instances: Vec<InstanceSpec>,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(Debug, ClapArgs)]
struct RemoveArgs {
    /// Id of an instance to remove (repeat to name a whole shard set).
    #[arg(long = "instance", required = true)]
    instances: Vec<String>,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(Debug, ClapArgs)]
struct ReplaceArgs {
    /// Id of the instance that goes away.
    #[arg(long)]
    old: String,
    /// The instance that takes its shards, `id=host:port`.
    #[arg(long, value_parser = parse_instance)]
    new: InstanceSpec,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(Debug, ClapArgs)]
struct FinalizeArgs {
    /// How long after a cutover its move may be completed, seconds: the
    /// largest tile plus the aggregators' `buffer_past`, so that the last
    /// tile before the cutover has been flushed by the old owner.
    #[arg(long, default_value_t = 90)]
    settle_secs: u64,
}

/// Runs `tessera placement`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: Args) -> anyhow::Result<ExitCode> {
    let config = EtcdConfig {
        request_timeout_ms: args.timeout_ms.max(1),
        ..EtcdConfig::new(args.etcd, args.environment).for_tier(args.tier)
    };
    let store = PlacementStore::connect(config).await.context("connecting to etcd")?;
    let now = now_ms();
    let written = match args.command {
        Command::Show => {
            print!("{}", show(&store, now).await?);
            return Ok(ExitCode::SUCCESS);
        }
        Command::Init(init) => self::init(&store, &init, now).await?,
        Command::Add(add) => {
            let pairs: Vec<(&str, &str)> =
                add.instances.iter().map(|spec| (spec.id.as_str(), spec.endpoint.as_str())).collect();
            let timing = add.timing.timing(now)?;
            change(&store, |current| current.add_instances(&pairs, timing)).await?
        }
        Command::Remove(remove) => {
            let timing = remove.timing.timing(now)?;
            change(&store, |current| current.remove_instances(&remove.instances, timing)).await?
        }
        Command::Replace(replace) => {
            let timing = replace.timing.timing(now)?;
            let new = &replace.new;
            change(&store, |current| current.replace_instance(&replace.old, &new.id, &new.endpoint, timing)).await?
        }
        Command::Finalize(finalize) => match self::finalize(&store, finalize.settle_secs, now).await? {
            Some(written) => written,
            None => return Ok(ExitCode::SUCCESS),
        },
    };
    println!("wrote placement version {}", written.version());
    if let Some(until_ms) = written.pending_until_ms() {
        println!("shards move at {}", render::time_and_distance(until_ms, now));
    }
    println!();
    print!("{}", show(&store, now).await?);
    Ok(ExitCode::SUCCESS)
}

/// The placement and liveness as a table.
async fn show(store: &PlacementStore, now_ms: i64) -> anyhow::Result<String> {
    let (placement, _) = store.get().await.map_err(|error| explain(error, store))?;
    let alive = match store.alive_instances().await {
        Ok(alive) => Some(alive),
        Err(error) => {
            eprintln!("tessera: cannot read liveness: {error}");
            None
        }
    };
    let mut text = render::placement(store.placement_key(), &placement, alive.as_deref(), now_ms);
    if placement.replication_factor() > 1 {
        match store.leaders().await {
            Ok(leaders) => text.push_str(&render::leaders(&placement, &leaders)),
            Err(error) => eprintln!("tessera: cannot read the shard sets' leaders: {error}"),
        }
    }
    Ok(text)
}

async fn init(store: &PlacementStore, args: &InitArgs, now_ms: i64) -> anyhow::Result<Placement> {
    let pairs: Vec<(&str, &str)> =
        args.instances.iter().map(|spec| (spec.id.as_str(), spec.endpoint.as_str())).collect();
    if store.config().tier == Tier::Ingesters && args.replication_factor != 1 {
        bail!("the ingesters' placement has replication factor 1: every series has one writer");
    }
    let placement =
        Placement::init(&pairs, args.shards, args.replication_factor, now_ms).context("invalid placement")?;
    match store.compare_and_swap(None, &placement).await {
        Ok(_) => Ok(placement),
        Err(StoreError::Conflict { key }) => {
            bail!("a placement already exists at `{key}`: use `add`, `remove` or `replace` to change it")
        }
        Err(error) => Err(explain(error, store)),
    }
}

/// Reads the placement, computes the next one, and writes it if nobody
/// changed it in between.
async fn change(
    store: &PlacementStore,
    next: impl FnOnce(&Placement) -> Result<Placement, tessera_topology::PlacementError>,
) -> anyhow::Result<Placement> {
    let (current, revision) = store.get().await.map_err(|error| explain(error, store))?;
    let next = next(&current).with_context(|| format!("cannot change placement version {}", current.version()))?;
    store.compare_and_swap(Some(revision), &next).await.map_err(|error| explain(error, store))?;
    Ok(next)
}

/// Completes due moves; `None` (with a message) when nothing is due.
async fn finalize(store: &PlacementStore, settle_secs: u64, now_ms: i64) -> anyhow::Result<Option<Placement>> {
    let settle_ms = i64::try_from(settle_secs.saturating_mul(1000)).context("--settle-secs is too large")?;
    let (current, revision) = store.get().await.map_err(|error| explain(error, store))?;
    let Some(next) = current.finalize(now_ms.saturating_sub(settle_ms)) else {
        match current.pending_until_ms() {
            Some(until_ms) => println!(
                "nothing to finalize yet: moves complete at {}, finalize after {}",
                render::time_and_distance(until_ms, now_ms),
                render::time_and_distance(until_ms.saturating_add(settle_ms), now_ms)
            ),
            None => println!("nothing to finalize: no shard is moving"),
        }
        return Ok(None);
    };
    // `finalize` stamps the time it was given; the change is made now.
    let mut next = next.into_proto();
    next.updated_at_ms = now_ms;
    let next = Placement::from_proto(next);
    store.compare_and_swap(Some(revision), &next).await.map_err(|error| explain(error, store))?;
    Ok(Some(next))
}

/// Store errors in words an operator can act on.
fn explain(error: StoreError, store: &PlacementStore) -> anyhow::Error {
    match error {
        StoreError::Conflict { key } => anyhow::anyhow!(
            "the placement at `{key}` was changed by someone else since it was read; nothing was written: \
             run `tessera placement show` and try again"
        ),
        StoreError::NotFound { key } => {
            anyhow::anyhow!("no placement at `{key}`: create one with `tessera placement init`")
        }
        other => anyhow::Error::new(other).context(format!("etcd at {}", store.config().endpoints.join(","))),
    }
}

#[cfg(test)]
mod tests;
