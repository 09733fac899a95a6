//! Text rendering of a placement for `tessera placement show`.

use std::collections::BTreeMap;
use std::fmt::Write;

use tessera_topology::{Placement, ShardState};

/// Each replicated shard set's leader (the instance that flushes its
/// tiles), from `/tessera/<env>/leader/<set>`.
pub fn leaders(placement: &Placement, leaders: &BTreeMap<u32, String>) -> String {
    let mut out = String::from("\nSET  LEADER\n");
    for shard_set in placement.shard_sets().keys() {
        let leader = leaders.get(shard_set).map_or("none (no replica holds the leader key)", String::as_str);
        let _ = writeln!(out, "{shard_set:<3}  {leader}");
    }
    out
}

/// The placement as a header and one row per instance.
///
/// `alive` lists the instances holding a liveness lease (`None`: unknown).
pub fn placement(key: &str, placement: &Placement, alive: Option<&[String]>, now_ms: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "placement `{key}` version {}, updated {}",
        placement.version(),
        time_and_distance(placement.updated_at_ms(), now_ms)
    );
    let _ = writeln!(out, "{} shards, replication factor {}", placement.num_shards(), placement.replication_factor());
    match placement.pending_until_ms() {
        Some(until_ms) => {
            let _ = writeln!(out, "moves pending until {}", time_and_distance(until_ms, now_ms));
        }
        None => {
            let _ = writeln!(out, "no moves pending");
        }
    }
    out.push('\n');

    let mut rows = vec![
        ["INSTANCE", "ENDPOINT", "SET", "ALIVE", "SHARDS", "AVAILABLE", "INITIALIZING", "LEAVING"].map(String::from),
    ];
    for instance in placement.instances() {
        let mut available = Vec::new();
        let mut initializing: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        let mut leaving: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        for shard in &instance.shards {
            match ShardState::try_from(shard.state) {
                Ok(ShardState::Initializing) => initializing.entry(shard.cutover_ms).or_default().push(shard.id),
                Ok(ShardState::Leaving) => leaving.entry(shard.cutoff_ms).or_default().push(shard.id),
                _ => available.push(shard.id),
            }
        }
        let is_alive = match alive {
            Some(alive) => {
                if alive.contains(&instance.id) {
                    "yes"
                } else {
                    "no"
                }
            }
            None => "?",
        };
        rows.push([
            instance.id.clone(),
            instance.endpoint.clone(),
            instance.shard_set_id.to_string(),
            is_alive.to_owned(),
            instance.shards.len().to_string(),
            ranges(&available),
            timed_ranges("from", &initializing, now_ms),
            timed_ranges("until", &leaving, now_ms),
        ]);
    }
    let widths: Vec<usize> = (0..8).map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0)).collect();
    for row in &rows {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<width$}  ", width = widths[column]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(alive) = alive {
        let strangers: Vec<&str> =
            alive.iter().filter(|id| placement.instance(id).is_none()).map(String::as_str).collect();
        if !strangers.is_empty() {
            let _ = writeln!(out, "\nalive but not in the placement: {}", strangers.join(", "));
        }
    }
    out
}

/// Shard ids as compact ranges, `0-3,8,10-12`; `-` when empty.
pub fn ranges(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let first = sorted[index];
        let mut last = first;
        while index + 1 < sorted.len() && sorted[index + 1] == last + 1 {
            index += 1;
            last = sorted[index];
        }
        parts.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
        index += 1;
    }
    if parts.is_empty() { "-".to_owned() } else { parts.join(",") }
}

fn timed_ranges(word: &str, groups: &BTreeMap<i64, Vec<u32>>, now_ms: i64) -> String {
    if groups.is_empty() {
        return "-".to_owned();
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(time, ids)| format!("{} {word} {}", ranges(ids), time_and_distance(*time, now_ms)))
        .collect();
    parts.join("; ")
}

/// `2026-11-21T23:52:00Z (in 1m48s)`.
pub fn time_and_distance(time_ms: i64, now_ms: i64) -> String {
    if time_ms == 0 {
        return "never".to_owned();
    }
    let delta_secs = (time_ms - now_ms) / 1000;
    let distance = match delta_secs {
        0 => "now".to_owned(),
        secs if secs > 0 => format!("in {}", duration(secs)),
        secs => format!("{} ago", duration(-secs)),
    };
    format!("{} ({distance})", utc(time_ms))
}

fn duration(secs: i64) -> String {
    match secs {
        ..60 => format!("{secs}s"),
        60..3_600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h{:02}m", secs / 3_600, secs / 60 % 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs / 3_600 % 24),
    }
}

/// RFC 3339 UTC time of unix milliseconds, to the second.
pub fn utc(time_ms: i64) -> String {
    let secs = time_ms.div_euclid(1000);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", of_day / 3_600, of_day / 60 % 60, of_day % 60)
}
