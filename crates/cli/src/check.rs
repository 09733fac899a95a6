//! `tessera check`: shows how tessera parses statsd lines.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tessera_core::parse::{MetricKind, ParseOptions, Parsed, RejectReason, parse_datagram_with};
use tessera_core::series::SeriesKey;
use tessera_core::shard::shard_of;
use tessera_rules::{RuleMetrics, RuleSet, Targets};

/// Flags of `tessera check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Files of newline-separated statsd lines; stdin when none.
    files: Vec<PathBuf>,
    /// Number of shards to compute each series' shard for.
    #[arg(long, default_value_t = 64)]
    num_shards: u32,
    /// Longest accepted line, in bytes.
    #[arg(long, default_value_t = tessera_core::parse::DEFAULT_MAX_LINE_BYTES)]
    max_line_bytes: usize,
    /// Leave InfluxDB tags in the name (`api.hits,env=prod`); also off when the `--rules`
    /// file's `[parse] influxdb_tags` is false.
    #[arg(long)]
    no_influxdb_tags: bool,
    /// Leave Librato tags in the name (`api.hits#env=prod`); also off when the `--rules`
    /// file's `[parse] librato_tags` is false.
    #[arg(long)]
    no_librato_tags: bool,
    /// Leave SignalFx tags in the name (`api.[env=prod]hits`); also off when the `--rules`
    /// file's `[parse] signalfx_tags` is false.
    #[arg(long)]
    no_signalfx_tags: bool,
    /// Print only the summary.
    #[arg(long, short)]
    quiet: bool,
    /// A statsd_exporter mapping file: validate it, and show what each line maps to.
    #[arg(long, value_name = "FILE")]
    mapping: Option<PathBuf>,
    /// A collector configuration file: validate its `[mapping]` and `[rules]`, and show
    /// what each line becomes (with `--mapping`, that file replaces its `[mapping]`).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// A statsd line to check (repeatable); read instead of the files or stdin.
    #[arg(long, value_name = "LINE")]
    line: Vec<String>,
}

/// The collector configuration `--rules` names; the defaults without it.
fn load_config(args: &Args) -> anyhow::Result<tessera_collector::Config> {
    Ok(match &args.rules {
        Some(path) => tessera_runtime::config::load_toml::<tessera_collector::Config>(Some(path))?,
        None => tessera_collector::Config::default(),
    })
}

/// The rules `--mapping` and `--rules` name, compiled; `None` when neither is given.
fn load_rules(args: &Args, mut config: tessera_collector::Config) -> anyhow::Result<Option<RuleSet>> {
    if args.mapping.is_none() && args.rules.is_none() {
        return Ok(None);
    }
    if let Some(path) = &args.mapping {
        config.mapping.file = Some(path.clone());
    }
    Ok(Some(config.rule_set(&RuleMetrics::default())?))
}

/// The parser settings: the name tag styles of the configuration's `[parse]`, less those
/// the flags turn off, and `--max-line-bytes`.
fn parse_options(args: &Args, config: &tessera_collector::Config) -> ParseOptions {
    let configured = config.parse.options();
    ParseOptions {
        max_line_bytes: args.max_line_bytes,
        influxdb_tags: configured.influxdb_tags && !args.no_influxdb_tags,
        librato_tags: configured.librato_tags && !args.no_librato_tags,
        signalfx_tags: configured.signalfx_tags && !args.no_signalfx_tags,
    }
}

/// What the rules make of series `id`: the ids it goes out under, and the rules that acted.
fn describe_rules(rules: &RuleSet, kind: MetricKind, id: &[u8], num_shards: u32) -> String {
    let outcome = rules.apply(kind, id);
    let targets = match &outcome.targets {
        Targets::Same => format!("unchanged\tshard={}", shard_of(id, num_shards)),
        Targets::Dropped => "dropped".to_owned(),
        targets => targets
            .new_ids()
            .map(|id| format!("{}\tshard={}", String::from_utf8_lossy(id), shard_of(id, num_shards)))
            .collect::<Vec<_>>()
            .join("\t+ "),
    };
    let hits: Vec<String> = outcome
        .hits
        .iter()
        .filter_map(|slot| rules.hit_label(*slot))
        .map(|(rule, action)| format!("{rule} {}", action.as_str()))
        .collect();
    rules.release_outcome(&outcome, id);
    if hits.is_empty() { format!("\t-> {targets}") } else { format!("\t-> {targets}\trules={}", hits.join("; ")) }
}

/// Runs `tessera check`; exits 1 when any line was rejected.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    let options = parse_options(&args, &config);
    let rules = load_rules(&args, config)?;
    let mut out = std::io::stdout().lock();
    if let Some(rules) = &rules
        && !args.quiet
    {
        writeln!(out, "rules ok")?;
        for note in rules.notes() {
            writeln!(out, "note\t{note}")?;
        }
    }
    let mut input = Vec::new();
    if !args.line.is_empty() {
        for line in &args.line {
            input.extend_from_slice(line.as_bytes());
            input.push(b'\n');
        }
    } else if args.files.is_empty() {
        std::io::stdin().lock().read_to_end(&mut input).context("reading stdin")?;
    } else {
        for path in &args.files {
            let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            for line in std::io::BufReader::new(file).split(b'\n') {
                input.extend(line.with_context(|| format!("reading {}", path.display()))?);
                input.push(b'\n');
            }
        }
    }
    let mut key = SeriesKey::default();
    let (mut metrics, mut events, mut rejected) = (0usize, 0usize, [0usize; RejectReason::ALL.len()]);
    let mut write_error = None;
    parse_datagram_with(&input, options, |parsed| {
        let line = match parsed {
            Parsed::Metric(line) => {
                metrics += 1;
                key.build(&line).expect("accepted lines fit the tag limit");
                let values: Vec<String> = if line.kind == MetricKind::Set {
                    vec![String::from_utf8_lossy(line.set_member()).into_owned()]
                } else {
                    line.values().map(|v| v.value.to_string()).collect()
                };
                let mapped = match &rules {
                    Some(rules) => describe_rules(rules, line.kind, key.id(), args.num_shards),
                    None => String::new(),
                };
                let skipped = match line.name_tag_errors {
                    0 => String::new(),
                    errors => format!("\tmalformed_name_tags={errors}"),
                };
                format!(
                    "ok\t{}\t{}\tvalues={}\trate={}\tshard={}{skipped}{mapped}",
                    line.kind.as_str(),
                    String::from_utf8_lossy(key.id()),
                    values.join(","),
                    line.sample_rate,
                    shard_of(key.id(), args.num_shards)
                )
            }
            Parsed::Event(_) | Parsed::ServiceCheck(_) => {
                events += 1;
                "event\t(counted, not a metric)".to_owned()
            }
            Parsed::Rejected { reason, line } => {
                rejected[reason.index()] += 1;
                format!("rejected\t{reason}\t{}", String::from_utf8_lossy(line))
            }
        };
        if !args.quiet
            && write_error.is_none()
            && let Err(error) = writeln!(out, "{line}")
        {
            write_error = Some(error);
        }
    });
    if let Some(error) = write_error {
        return Err(error).context("writing to stdout");
    }
    let total_rejected: usize = rejected.iter().sum();
    writeln!(out, "{metrics} metric lines, {events} events or service checks, {total_rejected} rejected")?;
    for reason in RejectReason::ALL {
        if rejected[reason.index()] > 0 {
            writeln!(out, "  {reason}: {}", rejected[reason.index()])?;
        }
    }
    Ok(if total_rejected == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
