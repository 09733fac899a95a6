//! Origin detection: the container and pod behind each metric, as tags.
//!
//! ```text
//!  unix socket ──datagram + sender's PID (SO_PASSCRED)──▶ unix-reader ─┐
//!  any listener ──line with |c:ci-<id> / |c:in-<inode> / |e:pu-…,cn-…──▶ ├─ Tagger (per reader thread):
//!                                                                      │  PID → /proc/<pid>/cgroup → container id,
//!                                                                      │  key → tags from its own cache, else
//!                                                                      │  from the shared Origins snapshot
//!  resolver task: lists the Docker Engine API and/or the kubelet ◀─────┘  (a miss asks for a listing)
//!  (`source.rs`) every `refresh_secs`, and at once on a miss
//! ```
//!
//! **Never in the way.** A reader never waits on a source: a line whose origin is not yet
//! known goes on without origin tags, at once, and is counted
//! (`origin_untagged_total{reason="pending"}`); the listing it asked for tags the lines
//! that follow. A sender whose PID has exited before its datagram was read, a container
//! no source knows, a source that fails or is slow: the metric goes on untagged, counted
//! by reason. Sources are listed whole, so the tags of a container that started more
//! than `refresh_secs` before its first metric are already known.
//!
//! **Before sharding.** The tags are part of the series id from the reader on, like tags
//! the client sent: every host's partials of a series still meet on one aggregator.
//!
//! **Cardinality.** As in the Datadog agent, the default adds only low-cardinality tags
//! (namespace, owner, container name, image, allow-listed labels); `orchestrator` adds
//! the pod name, `high` the container id. The raw `container_id` tag that a line's
//! `|c:` field gives (statsd_exporter's behaviour) follows the same rule: with origin
//! detection on, it is there only at `high`.

mod cgroup;
mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_core::parse::Line;
use tessera_runtime::Shutdown;

pub use crate::config::{Cardinality, OriginConfig};

use cgroup::{PidOrigin, container_id_of_inode, pid_origin};
use source::{Docker, Kubelet, Listing};

/// `{source, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BySourceResult {
    source: &'static str,
    result: &'static str,
}

/// `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByResult {
    result: &'static str,
}

/// `{reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReason {
    reason: &'static str,
}

/// Why a line went on without origin tags (`origin_untagged_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Untagged {
    /// Its sender's PID had exited before the datagram was read.
    PidGone = 0,
    /// No source knows its container (or pod).
    UnknownContainer = 1,
    /// Its container's tags were being looked up.
    Pending = 2,
    /// The Unix socket gave no sender credentials.
    NoCredentials = 3,
    /// Its `|c:in-<inode>` names no container's cgroup.
    UnknownCgroup = 4,
    /// The last listing of a tag source failed or timed out, and no source knows it.
    SourceError = 5,
    /// With its origin tags the line would pass the tag limit: it went on without them.
    TooManyTags = 6,
}

impl Untagged {
    const ALL: [Untagged; 7] = [
        Untagged::PidGone,
        Untagged::UnknownContainer,
        Untagged::Pending,
        Untagged::NoCredentials,
        Untagged::UnknownCgroup,
        Untagged::SourceError,
        Untagged::TooManyTags,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Untagged::PidGone => "pid_gone",
            Untagged::UnknownContainer => "unknown_container",
            Untagged::Pending => "pending",
            Untagged::NoCredentials => "no_credentials",
            Untagged::UnknownCgroup => "unknown_cgroup",
            Untagged::SourceError => "source_error",
            Untagged::TooManyTags => "too_many_tags",
        }
    }
}

tessera_runtime::metrics! {
    /// Origin detection's metrics.
    pub struct OriginMetrics {
        /// Listings of a tag source (docker, kubelet), per source and result (ok, error, timeout)
        origin_lookups: Family<BySourceResult, Counter>,
        /// Origins a reader found in its own cache (hit) or had to look for (miss), per datagram or line
        origin_cache: Family<ByResult, Counter>,
        /// Lines that went on without origin tags, per reason (pid_gone, unknown_container, pending,
        /// no_credentials, unknown_cgroup, source_error, too_many_tags); the lines themselves are kept
        origin_untagged: Family<ByReason, Counter>,
        /// Lines that carry origin tags
        origin_tagged_lines: Counter,
        /// Lines from processes outside any container (nothing to tag)
        origin_host_lines: Counter,
        /// Containers and pods' containers the last listings know
        origin_known_containers: Gauge,
    }
}

/// One origin: a container, or a pod's container by its external data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Container(Box<str>),
    Pod(Box<str>, Box<str>),
}

/// What the shared side knows of one origin.
#[derive(Debug, Clone)]
enum Known {
    Tags(Arc<[u8]>),
    Unknown,
    Pending,
    SourceError,
}

/// The last listings, and the inodes resolved so far.
#[derive(Default)]
struct Snapshot {
    tags: HashMap<Key, Arc<[u8]>>,
    inodes: HashMap<u64, Option<Box<str>>>,
    listed: bool,
    /// Whether a source failed at the last listing.
    failed: bool,
}

/// What every reader shares: the last listings, and the way to ask for a new one.
pub struct Origins {
    snapshot: Mutex<Snapshot>,
    /// Bumped at each listing: a reader's pending entries are looked at again.
    generation: AtomicU64,
    /// A reader met an origin the last listing did not know: list again. Permits do not
    /// add up, so any number of misses asks for one listing.
    listing_wanted: tokio::sync::Notify,
    /// Cgroup inodes (`|c:in-<inode>`) to find the container of.
    inodes_wanted: tokio::sync::mpsc::Sender<u64>,
    cardinality: Cardinality,
    ttl: Duration,
    proc_root: PathBuf,
    metrics: OriginMetrics,
}

/// Runs the sources; owns the receiving end of the readers' requests.
pub struct Resolver {
    origins: Arc<Origins>,
    inodes_wanted: tokio::sync::mpsc::Receiver<u64>,
    docker: Option<Docker>,
    kubelet: Option<Kubelet>,
    refresh: Duration,
    timeout: Duration,
    cgroup_root: PathBuf,
}

/// Starts origin detection for `config` (when enabled): the shared side, and the resolver
/// to spawn.
pub fn start(config: &OriginConfig, metrics: &OriginMetrics) -> Result<Option<(Arc<Origins>, Resolver)>, String> {
    if !config.enabled {
        return Ok(None);
    }
    let kubelet = match &config.kubelet {
        Some(kubelet) => {
            let url: hyper::Uri = kubelet.url.parse().map_err(|error| format!("origin.kubelet.url: {error}"))?;
            let tls = (url.scheme_str() == Some("https"))
                .then(|| source::kubelet_tls(kubelet.ca_file.as_deref(), kubelet.tls_verify))
                .transpose()
                .map_err(|error| format!("origin.kubelet: {error}"))?;
            Some(Kubelet { url, token_file: kubelet.token_file.clone(), tls, labels: kubelet.labels.clone() })
        }
        None => None,
    };
    let docker =
        config.docker.as_ref().map(|docker| Docker { socket: docker.socket.clone(), labels: docker.labels.clone() });
    for (source, on) in [("docker", docker.is_some()), ("kubelet", kubelet.is_some())] {
        if on {
            for result in ["ok", "error", "timeout"] {
                let _ = metrics.origin_lookups.get_or_create(&BySourceResult { source, result });
            }
        }
    }
    let (inodes_wanted, inodes_received) = tokio::sync::mpsc::channel(256);
    let origins = Arc::new(Origins {
        snapshot: Mutex::new(Snapshot::default()),
        generation: AtomicU64::new(0),
        listing_wanted: tokio::sync::Notify::new(),
        inodes_wanted,
        cardinality: config.cardinality,
        ttl: Duration::from_secs(config.tags_ttl_secs),
        proc_root: config.proc_root.clone(),
        metrics: metrics.clone(),
    });
    let resolver = Resolver {
        origins: Arc::clone(&origins),
        inodes_wanted: inodes_received,
        docker,
        kubelet,
        refresh: Duration::from_secs(config.refresh_secs),
        timeout: Duration::from_millis(config.lookup_timeout_ms),
        cgroup_root: config.cgroup_root.clone(),
    };
    Ok(Some((origins, resolver)))
}

impl std::fmt::Debug for Origins {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Origins")
            .field("cardinality", &self.cardinality)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Origins {
    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the last listings say of `key`; asks for a listing when they do not know it
    /// (or none has finished yet).
    fn known(&self, key: &Key) -> Known {
        let snapshot = self.lock();
        if let Some(tags) = snapshot.tags.get(key) {
            return Known::Tags(Arc::clone(tags));
        }
        let (listed, failed) = (snapshot.listed, snapshot.failed);
        drop(snapshot);
        self.listing_wanted.notify_one();
        match (listed, failed) {
            (false, _) => Known::Pending,
            (true, true) => Known::SourceError,
            (true, false) => Known::Unknown,
        }
    }

    /// The container of the cgroup with inode `inode`: `Some(None)` for none,
    /// `None` while it is being looked for.
    fn container_of_inode(&self, inode: u64) -> Option<Option<Box<str>>> {
        let found = self.lock().inodes.get(&inode).cloned();
        if found.is_none() {
            // Full (asked already, many times) or closed (shutting down): nothing to add.
            let _ = self.inodes_wanted.try_send(inode);
        }
        found
    }
}

impl Resolver {
    /// Lists the sources every `refresh`, and when a reader asks (at most once a second),
    /// until `shutdown`.
    pub async fn run(mut self, shutdown: Shutdown) {
        const MIN_INTERVAL: Duration = Duration::from_secs(1);
        let mut last_listing: Option<Instant> = None;
        loop {
            let due = last_listing.map_or(Duration::ZERO, |at| self.refresh.saturating_sub(at.elapsed()));
            tokio::select! {
                () = shutdown.wait() => return,
                () = tokio::time::sleep(due) => {}
                () = self.origins.listing_wanted.notified() => {
                    if let Some(at) = last_listing
                        && at.elapsed() < MIN_INTERVAL
                    {
                        // Asked again within the second: at most one listing a second.
                        tokio::time::sleep(MIN_INTERVAL - at.elapsed()).await;
                    }
                }
                inode = self.inodes_wanted.recv() => {
                    let Some(inode) = inode else { return };
                    let root = self.cgroup_root.clone();
                    let container = tokio::task::spawn_blocking(move || container_id_of_inode(&root, inode))
                        .await
                        .unwrap_or_default();
                    self.origins.lock().inodes.insert(inode, container.map(String::into_boxed_str));
                    self.origins.generation.fetch_add(1, Ordering::Release);
                    continue;
                }
            }
            self.list().await;
            last_listing = Some(Instant::now());
        }
    }

    /// Lists every source, and replaces the snapshot with what they know. A source that
    /// fails keeps what it knew (its last listing's entries stay).
    async fn list(&mut self) {
        let metrics = &self.origins.metrics;
        let mut listing = Listing::default();
        let mut failed = false;
        let docker = match &self.docker {
            Some(docker) => Some(source::within(self.timeout, docker.list()).await),
            None => None,
        };
        let kubelet = match &self.kubelet {
            Some(kubelet) => Some(source::within(self.timeout, kubelet.list()).await),
            None => None,
        };
        for (name, result) in [("docker", docker), ("kubelet", kubelet)] {
            let Some(result) = result else { continue };
            match result {
                Ok(found) => {
                    metrics.origin_lookups.get_or_create(&BySourceResult { source: name, result: "ok" }).inc();
                    listing.merge(found);
                }
                Err(error) => {
                    metrics
                        .origin_lookups
                        .get_or_create(&BySourceResult { source: name, result: error.result() })
                        .inc();
                    tracing::warn!(source = name, %error, "origin detection: cannot list the tag source");
                    failed = true;
                }
            }
        }
        self.origins.install(listing, failed);
    }
}

impl Origins {
    /// Makes `listing` what readers find; with `keep`, entries it lacks stay as they were
    /// (a source failed, and its containers are still there).
    fn install(&self, listing: Listing, keep: bool) {
        let mut tags: HashMap<Key, Arc<[u8]>> = HashMap::with_capacity(listing.containers.len() + listing.pods.len());
        for (id, found) in listing.containers {
            tags.insert(Key::Container(id.into()), found.render(self.cardinality));
        }
        for ((uid, container), found) in listing.pods {
            tags.insert(Key::Pod(uid.into(), container.into()), found.render(self.cardinality));
        }
        let mut snapshot = self.lock();
        if keep {
            for (key, value) in snapshot.tags.drain() {
                tags.entry(key).or_insert(value);
            }
        }
        self.metrics.origin_known_containers.set(tags.len() as i64);
        snapshot.tags = tags;
        snapshot.listed = true;
        snapshot.failed = keep;
        drop(snapshot);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// A reader thread's side: its own caches (no lock per datagram), and its counts, added
/// to the shared metrics once per batch through handles taken once.
pub struct Tagger {
    origins: Arc<Origins>,
    /// What was found of the current datagram's sender: its tags, none (a host process),
    /// or why not; `None` off the Unix socket, and once the datagram is counted.
    sender: Option<Result<Option<Arc<[u8]>>, Untagged>>,
    /// Lines of the current datagram that named their own origin.
    named_lines: u64,
    /// Senders by PID.
    pids: HashMap<u32, Cached>,
    /// Origins named in lines (`|c:` / `|e:`), by the field's bytes.
    fields: HashMap<Box<[u8]>, Cached>,
    counts: Counts,
    handles: Handles,
}

#[derive(Clone)]
struct Cached {
    /// `Ok(tags)`, or why there are none.
    tags: Result<Option<Arc<[u8]>>, Untagged>,
    until: Instant,
    /// The listing generation it was found in: an origin not found is looked for again
    /// in the next.
    generation: u64,
}

#[derive(Default)]
struct Counts {
    hits: u64,
    misses: u64,
    tagged: u64,
    host: u64,
    untagged: [u64; Untagged::ALL.len()],
}

/// Entries kept per reader: past this, the expired ones go (and, if none has, all).
const MAX_CACHED: usize = 65_536;

impl Tagger {
    /// A tagger for one reader thread.
    pub fn new(origins: Arc<Origins>) -> Tagger {
        Tagger {
            handles: Handles::new(&origins.metrics),
            origins,
            sender: None,
            named_lines: 0,
            pids: HashMap::new(),
            fields: HashMap::new(),
            counts: Counts::default(),
        }
    }

    /// Sets the sender of the datagram about to be folded: its PID from the Unix socket's
    /// credentials (`None` when the kernel gave none). Its lines are counted by
    /// [`Tagger::finish_datagram`].
    pub fn set_sender(&mut self, pid: Option<u32>) {
        self.sender = Some(match pid {
            None => Err(Untagged::NoCredentials),
            Some(pid) => self.sender_of(pid),
        });
    }

    fn sender_of(&mut self, pid: u32) -> Result<Option<Arc<[u8]>>, Untagged> {
        let now = Instant::now();
        let generation = self.origins.generation.load(Ordering::Acquire);
        if let Some(cached) = self.pids.get(&pid).filter(|cached| cached.fresh(now, generation)) {
            self.counts.hits += 1;
            return cached.tags.clone();
        }
        self.counts.misses += 1;
        let tags = match pid_origin(&self.origins.proc_root, pid) {
            PidOrigin::Container(id) => self.container_tags(&Key::Container(id.into())),
            PidOrigin::NoContainer => Ok(None),
            PidOrigin::Gone => Err(Untagged::PidGone),
        };
        let cached = self.cache_entry(tags.clone(), now, generation);
        insert_bounded(&mut self.pids, pid, cached, now);
        tags
    }

    /// Counts the lines of the datagram just folded (`lines` metric lines in all): those
    /// that did not name their own origin took the sender's; `left_off` of the tagged ones
    /// went on without their tags, which would have passed the tag limit.
    pub fn finish_datagram(&mut self, lines: u64, left_off: u64) {
        let from_sender = lines.saturating_sub(std::mem::take(&mut self.named_lines));
        if let Some(result) = self.sender.take() {
            self.count_result(&result, from_sender);
        }
        let left_off = left_off.min(self.counts.tagged);
        self.counts.tagged -= left_off;
        self.counts.untagged[Untagged::TooManyTags as usize] += left_off;
    }

    /// Counts `lines` lines of one origin result.
    fn count_result(&mut self, tags: &Result<Option<Arc<[u8]>>, Untagged>, lines: u64) {
        match tags {
            Ok(Some(_)) => self.counts.tagged += lines,
            Ok(None) => self.counts.host += lines,
            Err(reason) => self.counts.untagged[*reason as usize] += lines,
        }
    }

    fn cache_entry(&self, tags: Result<Option<Arc<[u8]>>, Untagged>, now: Instant, generation: u64) -> Cached {
        Cached { tags, until: now + self.origins.ttl, generation }
    }

    /// The tags of `key` from the snapshot; at `high`, a container nobody lists still gets
    /// its id.
    fn container_tags(&self, key: &Key) -> Result<Option<Arc<[u8]>>, Untagged> {
        match self.origins.known(key) {
            Known::Tags(tags) => Ok(Some(tags)),
            Known::Pending | Known::Unknown | Known::SourceError if self.origins.cardinality == Cardinality::High => {
                match key {
                    Key::Container(id) => Ok(Some(format!("container_id:{id}").into_bytes().into())),
                    Key::Pod(..) => Err(Untagged::UnknownContainer),
                }
            }
            Known::Pending => Err(Untagged::Pending),
            Known::Unknown => Err(Untagged::UnknownContainer),
            Known::SourceError => Err(Untagged::SourceError),
        }
    }

    /// The origin a line names itself: `|c:ci-<id>` (or a bare id), `|c:in-<inode>`, or
    /// `|e:` external data with `pu-<pod uid>` and `cn-<container name>`.
    fn line_origin(&self, line: &Line<'_>) -> Option<Result<Option<Arc<[u8]>>, Untagged>> {
        let field = std::str::from_utf8(line.container_id).ok()?;
        if !field.is_empty() {
            // DogStatsD 1.1 clients send `ci-<id>` or `in-<inode>`, older ones the bare id;
            // a comma joins the two (`ci-<id>,in-<inode>`), and the id wins.
            let mut id = None;
            let mut inode = None;
            for part in field.split(',') {
                match part.split_at_checked(3) {
                    Some(("ci-", rest)) => id = Some(rest),
                    Some(("in-", rest)) => inode = rest.parse::<u64>().ok(),
                    _ => id = id.or(Some(part)),
                }
            }
            if let Some(id) = id.filter(|id| !id.is_empty()) {
                return Some(self.container_tags(&Key::Container(id.into())));
            }
            let inode = inode?;
            return Some(match self.origins.container_of_inode(inode) {
                Some(Some(id)) => self.container_tags(&Key::Container(id)),
                Some(None) => Err(Untagged::UnknownCgroup),
                None => Err(Untagged::Pending),
            });
        }
        let external = std::str::from_utf8(line.external_data).ok().filter(|data| !data.is_empty())?;
        let (mut uid, mut name) = (None, None);
        for part in external.split(',') {
            match part.split_at_checked(3) {
                Some(("pu-", rest)) => uid = Some(rest),
                Some(("cn-", rest)) => name = Some(rest),
                _ => {}
            }
        }
        Some(self.container_tags(&Key::Pod(uid?.into(), name?.into())))
    }

    /// Adds this batch's counts to the shared metrics.
    pub fn publish_counts(&mut self) {
        let counts = std::mem::take(&mut self.counts);
        let handles = &self.handles;
        let adds = [(&handles.hit, counts.hits), (&handles.miss, counts.misses), (&handles.tagged, counts.tagged)];
        let adds = adds.into_iter().chain([(&handles.host, counts.host)]);
        for (counter, count) in adds.chain(handles.untagged.iter().zip(counts.untagged)) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
    }
}

/// A reader's handles on the shared counters, taken once: the Unix reader adds to them
/// after every datagram.
struct Handles {
    hit: Counter,
    miss: Counter,
    tagged: Counter,
    host: Counter,
    /// By [`Untagged`], in its order.
    untagged: [Counter; Untagged::ALL.len()],
}

impl Handles {
    fn new(metrics: &OriginMetrics) -> Handles {
        let cache = |result| metrics.origin_cache.get_or_create(&ByResult { result }).clone();
        Handles {
            hit: cache("hit"),
            miss: cache("miss"),
            tagged: metrics.origin_tagged_lines.clone(),
            host: metrics.origin_host_lines.clone(),
            untagged: Untagged::ALL
                .map(|reason| metrics.origin_untagged.get_or_create(&ByReason { reason: reason.as_str() }).clone()),
        }
    }
}

impl Cached {
    /// Whether the entry still stands: within its TTL, and, for an origin no listing knew
    /// (or none had finished), only until the next listing, which its miss asked for.
    fn fresh(&self, now: Instant, generation: u64) -> bool {
        now < self.until && (self.tags.is_ok() || generation == self.generation)
    }
}

fn insert_bounded<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Cached>, key: K, value: Cached, now: Instant) {
    if map.len() >= MAX_CACHED {
        map.retain(|_, cached| cached.until > now);
        if map.len() >= MAX_CACHED {
            map.clear();
        }
    }
    map.insert(key, value);
}

impl tessera_core::table::Origin for Tagger {
    fn sender_tags(&self) -> Option<Arc<[u8]>> {
        self.sender.clone()?.ok()?
    }

    fn tags_for(&mut self, line: &Line<'_>) -> Option<Arc<[u8]>> {
        if line.container_id.is_empty() && line.external_data.is_empty() {
            return self.sender_tags();
        }
        self.named_lines += 1;
        let field: &[u8] = if line.container_id.is_empty() { line.external_data } else { line.container_id };
        let now = Instant::now();
        let generation = self.origins.generation.load(Ordering::Acquire);
        let tags = match self.fields.get(field).filter(|cached| cached.fresh(now, generation)) {
            Some(cached) => {
                self.counts.hits += 1;
                cached.tags.clone()
            }
            None => {
                self.counts.misses += 1;
                // A field that names nothing usable: the sender's tags.
                let tags = self.line_origin(line).unwrap_or_else(|| Ok(self.sender_tags()));
                let cached = self.cache_entry(tags.clone(), now, generation);
                insert_bounded(&mut self.fields, field.into(), cached, now);
                tags
            }
        };
        self.count_result(&tags, 1);
        tags.unwrap_or(None)
    }
}

#[cfg(test)]
mod tests;
