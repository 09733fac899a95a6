#!/usr/bin/env bash
# End-to-end test of the docker compose stack, with no image registry:
#
# 1. builds the images (deploy/build-images.sh: cargo build --release --bins,
#    then local images only);
# 2. brings the stack up with docker-compose.yml + docker-compose.local.yml as
#    project tessera-ci, and waits (polling, bounded) until every service is
#    healthy and Prometheus scrapes every daemon;
# 3. sends known statsd to the collector's published UDP port: 16 counter
#    series, a counter with a sample rate, a timer, a gauge and a set;
# 4. polls Prometheus's HTTP API until every expected series has its exact
#    value at 10s, that both ingesters write a share of the series (the
#    ingesters' placement), and that one of the two aggregators (replicas of
#    one shard set) leads;
# 5. failover: sends a second run of the same statsd, kills the leading
#    aggregator (SIGKILL) with it in its open tiles, sends a third; the other
#    replica must take over, and the values of all three runs must be exact
#    (the 10s tiles: one resolution per store, no `resolution` label; timers
#    in seconds); checks that the end-to-end latency histogram is exported;
# 6. evaluates every PromQL expression of the shipped Grafana dashboards:
#    each must succeed and return something;
# 7. brings the stack down with its volumes (also on failure or interrupt,
#    after printing the services' state and logs).
#
# It runs once per compose tool found: `docker-compose` (v1) and the
# `docker compose` plugin. The last line is "N passed, M failed"; the exit
# status is non-zero on any failure.
#
# Usage: deploy/test-compose.sh [--no-cargo]
#   --no-cargo   use the binaries already in target/release
# Environment: TESSERA_STATSD_PORT (default 18125) and TESSERA_PROMETHEUS_PORT
# (default 19090) are the host ports published for the test, away from the
# usual 8125 and 9090 so that a collector or Prometheus running on the host
# does not collide with it.
set -euo pipefail

deploy_dir=$(cd "$(dirname "$0")" && pwd)
project=tessera-ci
build_args=()
for arg in "$@"; do
    case $arg in
        --no-cargo) build_args+=(--no-cargo) ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "test-compose: unknown argument \`$arg\` (try --help)" >&2; exit 64 ;;
    esac
done

export TESSERA_STATSD_PORT=${TESSERA_STATSD_PORT:-18125}
export TESSERA_PROMETHEUS_PORT=${TESSERA_PROMETHEUS_PORT:-19090}
prometheus_url="http://127.0.0.1:$TESSERA_PROMETHEUS_PORT"

# Long-running services, each of which has a healthcheck.
services=(etcd prometheus ingester-1 ingester-2 aggregator-1 aggregator-2 collector)

log() {
    echo "test-compose: $*" >&2
}

for tool in curl jq docker; do
    if ! command -v "$tool" >/dev/null; then
        log "\`$tool\` not found (scripts/setup.sh installs it)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

compose_tools=()
if command -v docker-compose >/dev/null; then compose_tools+=("docker-compose"); fi
if docker compose version >/dev/null 2>&1; then compose_tools+=("docker compose"); fi
if ((${#compose_tools[@]} == 0)); then
    log "neither docker-compose nor the docker compose plugin is installed"
    echo "0 passed, 1 failed"
    exit 1
fi

if ! "$deploy_dir/build-images.sh" "${build_args[@]}"; then
    log "building the images failed"
    echo "0 passed, 1 failed"
    exit 1
fi

# --- helpers ----------------------------------------------------------------

# The compose command of the tool under test, for this project.
compose_tool=""
compose_command=()
use_compose_tool() {
    compose_tool=$1
    read -r -a compose_command <<<"$compose_tool"
    compose_command+=(-f "$deploy_dir/docker-compose.yml" -f "$deploy_dir/docker-compose.local.yml" -p "$project")
}
compose() {
    "${compose_command[@]}" "$@"
}

# Runs `$1` (a function) every half second until it succeeds or $2 seconds
# pass; then says what it was waiting for ($3) and fails.
wait_until() {
    local check=$1 limit_secs=$2 what=$3
    local deadline=$((SECONDS + limit_secs))
    until "$check"; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${limit_secs}s waiting for $what"
            return 1
        fi
        sleep 0.5
    done
}

# The health (or, without a healthcheck, the state) of a service's container.
service_health() {
    local id
    id=$(compose ps -q "$1" 2>/dev/null | awk 'NR == 1')
    if [ -z "$id" ]; then
        echo missing
        return
    fi
    docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
}

unhealthy_services=()
all_services_healthy() {
    unhealthy_services=()
    local service health
    for service in "${services[@]}"; do
        health=$(service_health "$service")
        if [ "$health" != healthy ]; then unhealthy_services+=("$service=$health"); fi
    done
    ((${#unhealthy_services[@]} == 0))
}

# Waits until every service is healthy; gives up at once when one is
# unhealthy (its healthcheck failed every retry) or after $1 seconds.
wait_for_healthy_services() {
    local deadline=$((SECONDS + $1))
    until all_services_healthy; do
        if [[ " ${unhealthy_services[*]} " == *"=unhealthy "* ]]; then
            log "unhealthy: ${unhealthy_services[*]}"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            log "timed out after $1s waiting for healthy services: ${unhealthy_services[*]}"
            return 1
        fi
        sleep 0.5
    done
}

# An instant query; prints the result vector as "labels<TAB>value" lines.
# Fails when Prometheus answers an error.
prometheus_query() {
    local answer
    answer=$(curl -fsS --max-time 5 "$prometheus_url/api/v1/query" --data-urlencode "query=$1") || return 1
    jq -e '.status == "success"' >/dev/null <<<"$answer" || return 1
    jq -r '.data.result[] | "\(.metric | del(.__name__) | tojson)\t\(.value[1])"' <<<"$answer"
}

# The single value of an instant query, or nothing.
prometheus_value() {
    prometheus_query "$1" 2>/dev/null | awk -F'\t' 'NR == 1 { print $2 }'
}

scrape_targets_down=""
all_scrape_targets_up() {
    local answer
    answer=$(curl -fsS --max-time 5 "$prometheus_url/api/v1/targets" 2>/dev/null) || return 1
    scrape_targets_down=$(jq -r '.data.activeTargets[] | select(.health != "up") | "\(.labels.instance) (\(.health))"' \
        <<<"$answer" | tr '\n' ' ')
    local up
    up=$(jq '[.data.activeTargets[] | select(.health == "up")] | length' <<<"$answer")
    [ -z "$scrape_targets_down" ] && ((up >= 7))
}

# Both ingesters write a share of the series (each owns half of the
# ingesters' shards).
both_ingesters_write() {
    [ "$(prometheus_value 'count(sum by (instance) (tessera_ingester_samples_written_total) > 0)')" = 2 ]
}

# Sends one datagram of statsd lines (one per argument) to the collector.
send_statsd() {
    local payload
    payload=$(printf '%s\n' "$@")
    printf '%s\n' "$payload" >"/dev/udp/127.0.0.1/$TESSERA_STATSD_PORT"
}

# A timer from three hosts, once a second for the whole test, for the
# application-timers dashboard (its rates need several tiles).
background_timer=""
start_background_timer() {
    (
        while :; do
            send_statsd "ci.app.latency:$((RANDOM % 200 + 1))|ms|#host:h$((RANDOM % 3))" 2>/dev/null || true
            sleep 1
        done
    ) &
    background_timer=$!
}
stop_background_timer() {
    if [ -n "$background_timer" ]; then
        kill "$background_timer" 2>/dev/null || true
        wait "$background_timer" 2>/dev/null || true
        background_timer=""
    fi
}

# --- what is sent and what Prometheus must then hold ------------------------

run_id=""
counter_series=16
counter_datagrams=25     # each datagram: one `ci.requests:1|c` line per series
rated_lines=40           # `ci.bytes:3|c|@0.25` counts 12 each
timer_lines=30           # `ci.latency:<10..39>|ms`
declare -A expected

send_known_statsd() {
    local datagram series line n
    for ((datagram = 0; datagram < counter_datagrams; datagram++)); do
        local lines=()
        for ((series = 0; series < counter_series; series++)); do
            lines+=("ci.requests:1|c|#run:$run_id,series:s$series")
        done
        send_statsd "${lines[@]}"
    done
    local rated=()
    for ((line = 0; line < rated_lines; line++)); do
        rated+=("ci.bytes:3|c|@0.25|#run:$run_id")
    done
    send_statsd "${rated[@]}"
    local timer_sum=0
    for ((n = 0; n < timer_lines; n++)); do
        send_statsd "ci.latency:$((10 + n))|ms|#run:$run_id"
        timer_sum=$((timer_sum + 10 + n))
    done
    # Gauge and set in one datagram each: one collector window, one tile.
    send_statsd "ci.temperature:21.5|g|#run:$run_id"
    send_statsd "ci.users:alice|s|#run:$run_id" "ci.users:bob|s|#run:$run_id" \
        "ci.users:carol|s|#run:$run_id" "ci.users:alice|s|#run:$run_id"

    # One resolution per store: the 10 s tiles, with no `resolution` label, as a query
    # written for statsd_exporter expects.
    local match="run=\"$run_id\""
    expected["count(ci_requests_total{$match})"]=$counter_series
    expected["sum(ci_requests_total{$match})"]=$((counter_series * counter_datagrams))
    expected["sum(ci_bytes_total{$match})"]=$((rated_lines * 12))
    # Timers are native histograms (the ingester's remote-write default), in seconds.
    expected["histogram_count(sum(ci_latency{$match}))"]=$timer_lines
    expected["histogram_sum(sum(ci_latency{$match}))"]=$(awk -v ms="$timer_sum" 'BEGIN { print ms / 1000 }')
    expected["sum(ci_temperature{$match})"]=21.5
    expected["sum(ci_users{$match})"]=3
}

mismatches=()
# Whether every expected query has its value now: exact, but for the rounding of a sum of
# timings divided by 1000 (a relative 1e-9).
values_match() {
    local query actual
    mismatches=()
    for query in "${!expected[@]}"; do
        actual=$(prometheus_value "$query")
        if ! awk -v a="$actual" -v b="${expected[$query]}" \
            'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a != "" && d <= m * 1e-9) }'; then
            mismatches+=("$query = ${actual:-nothing} (expected ${expected[$query]})")
        fi
    done
    ((${#mismatches[@]} == 0))
}

# Waits up to $1 seconds for every value to be exact in Prometheus, $2 naming what is
# awaited ($3, if given, ends the log line); lists the mismatches if not.
wait_until_exact() {
    local limit_secs=$1 what=$2
    if ! wait_until values_match "$limit_secs" "$what"; then
        printf '  %s\n' "${mismatches[@]}" >&2
        return 1
    fi
    log "every value exact${3:+ $3}"
}

# The two aggregators replicate one shard set: exactly one leads. Sets
# `leader` to its service name (aggregator-1 or aggregator-2).
leader=""
one_aggregator_leads() {
    local leaders
    leaders=$(prometheus_query 'tessera_aggregator_leader == 1' 2>/dev/null | cut -f1 | jq -r '.instance')
    [ "$(wc -w <<<"$leaders")" = 1 ] || return 1
    leader=${leaders%%:*}
}

# Whether the aggregator $survivor leads now, having won an election.
survivor=""
survivor_took_over() {
    [ "$(prometheus_value "tessera_aggregator_leader{instance=\"$survivor:9103\"}")" = 1 ] &&
        [ -n "$(prometheus_value "tessera_aggregator_elections_total{instance=\"$survivor:9103\",result=\"won\"} > 0")" ]
}

end_to_end_latency_exported() {
    local count
    count=$(prometheus_value 'sum(tessera_ingester_end_to_end_latency_seconds_count{resolution="10s"})')
    [ -n "$count" ] && awk -v c="$count" 'BEGIN { exit !(c > 0) }'
}

# Whether Prometheus has scraped metadata (a `# TYPE` line, with or without samples) for
# the metric named in an expression: `x_total`, `x_bucket`, `x_count`, `x_sum`, `x_info` belong to
# the family `x`.
metric_is_exported() {
    local name=$1 family
    for family in "$name" "${name%_total}" "${name%_bucket}" "${name%_count}" "${name%_sum}" "${name%_info}"; do
        grep -qxF "$family" <<<"$exported_families" && return 0
    done
    return 1
}

# Every `expr` of every panel of every dashboard must evaluate, non-empty, and every
# metric it names must be one the daemons export. No expression has an
# `or vector(0)` fallback: the daemons export every drop and refusal reason at 0
# from the start, so an empty answer means a wrong name or a missing metric.
# Template variables take their default values, except the application-timers
# dashboard's `timer`, which is the background timer this test sends.
dashboard_expressions_work() {
    local dashboard expression failures=0 total=0 answer name variable value
    exported_families=$(curl -fsS --max-time 5 "$prometheus_url/api/v1/metadata" | jq -r '.data | keys[]') || return 1
    for dashboard in "$deploy_dir"/grafana/dashboards/*.json; do
        local -A variables=()
        while IFS=$'\t' read -r variable value; do
            [ -n "$variable" ] && variables[$variable]=$value
        done < <(jq -r '.templating.list[]? | "\(.name)\t\(.current.value)"' "$dashboard")
        [ -n "${variables[timer]:-}" ] && variables[timer]=ci_app_latency
        while IFS= read -r expression; do
            for variable in "${!variables[@]}"; do
                expression=${expression//"\${$variable}"/${variables[$variable]}}
                expression=${expression//"\$$variable"/${variables[$variable]}}
            done
            total=$((total + 1))
            if ! answer=$(prometheus_query "$expression"); then
                log "dashboard $(basename "$dashboard"): query failed: $expression"
                failures=$((failures + 1))
            elif [[ $expression == *"vector(0)"* ]]; then
                log "dashboard $(basename "$dashboard"): a fallback hides missing data: $expression"
                failures=$((failures + 1))
            elif [ -z "$answer" ]; then
                log "dashboard $(basename "$dashboard"): no result: $expression"
                failures=$((failures + 1))
            fi
            for name in $(grep -oE '\b(tessera|process)_[a-z0-9_]+' <<<"$expression" | sort -u); do
                if ! metric_is_exported "$name"; then
                    log "dashboard $(basename "$dashboard"): no daemon exports \`$name\`: $expression"
                    failures=$((failures + 1))
                fi
            done
        done < <(jq -r '.panels | .. | objects | select(has("expr")) | .expr' "$dashboard")
        unset variables
    done
    log "dashboards: $((total - failures)) of $total expressions return data and name exported metrics"
    ((failures == 0 && total > 0))
}

# --- one run per compose tool -------------------------------------------------

show_state_and_logs() {
    log "state of the services:"
    compose ps >&2 || true
    log "logs of the services (last 80 lines each):"
    compose logs --no-color --tail=80 >&2 || true
}

bring_down() {
    stop_background_timer
    if [ -z "$compose_tool" ]; then return; fi
    log "$compose_tool down -v"
    compose down -v --remove-orphans >/dev/null 2>&1 || compose down -v --remove-orphans >&2 || true
}

on_interrupt() {
    log "interrupted"
    bring_down
    echo "$passed passed, $((failed + 1)) failed"
    exit 130
}

test_with_compose_tool() {
    log "=== $compose_tool: up (project $project, statsd on udp $TESSERA_STATSD_PORT, Prometheus on $prometheus_url)"
    compose down -v --remove-orphans >/dev/null 2>&1 || true
    if ! timeout 300 "${compose_command[@]}" up -d >&2; then
        log "$compose_tool up failed"
        return 1
    fi
    if ! wait_for_healthy_services 120; then
        return 1
    fi
    local placement_init
    placement_init=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}}' \
        "$(compose ps -q placement-init | awk 'NR == 1')")
    if [ "$placement_init" != "exited 0" ]; then
        log "placement-init did not complete: $placement_init"
        return 1
    fi
    if ! wait_until all_scrape_targets_up 60 "Prometheus to scrape every daemon"; then
        log "scrape targets not up: ${scrape_targets_down:-none found}"
        return 1
    fi

    # The shipped configs keep the CPU profiler off (their telemetry ports are reachable
    # from every container): it answers 403 while /metrics answers.
    local probe_out
    if probe_out=$(compose exec -T collector http-probe "http://127.0.0.1:9102/debug/pprof/profile?seconds=1" 2>&1) \
        || [[ $probe_out != *403* ]]; then
        log "the collector's profiler is not refused: $probe_out"
        return 1
    fi
    log "the profiler is off in the shipped configs ($probe_out)"

    log "sending statsd (run tag $run_id) to udp 127.0.0.1:$TESSERA_STATSD_PORT"
    start_background_timer
    send_known_statsd
    # The replicas start together. When the first statsd lands in a tile that began before
    # both did, neither saw it whole: one leads once etcd has said "no leader" for the
    # longest tile plus max_buffer_past, and flushes what it held. 120 s covers that.
    wait_until_exact 120 "the 10s tiles in Prometheus" || return 1
    if ! wait_until both_ingesters_write 30 "both ingesters to write a share of the series"; then
        return 1
    fi
    log "both ingesters write"
    if ! wait_until one_aggregator_leads 30 "one aggregator to lead the shard set"; then
        return 1
    fi

    # Failover: a second run of statsd goes into the open tiles of both
    # replicas, the leader is killed (SIGKILL) before it flushes them, and a
    # third run follows. The other replica must take over and flush every
    # tile exactly once: the tiles of all three runs stay exact.
    local first_run=$run_id
    run_id="${first_run}b"
    send_known_statsd
    local leader_container
    leader_container=$(compose ps -q "$leader" | awk 'NR == 1')
    if [ "$leader" = aggregator-1 ]; then survivor=aggregator-2; else survivor=aggregator-1; fi
    log "killing the leading aggregator ($leader) mid-tile; $survivor must take over"
    docker kill --signal KILL "$leader_container" >/dev/null
    run_id="${first_run}c"
    send_known_statsd
    if ! wait_until survivor_took_over 60 "$survivor to win the election and lead"; then
        return 1
    fi
    log "$survivor leads"
    wait_until_exact 60 "the 10s tiles of the three runs in Prometheus" "after the failover" || return 1
    if ! wait_until end_to_end_latency_exported 30 "the end-to-end latency histogram"; then
        return 1
    fi
    # A histogram series exists from its first observation, and a rate over it
    # needs two scrapes after that: give the expressions a little while.
    wait_until dashboard_expressions_work 60 "every dashboard expression to return data"
}

passed=0
failed=0
trap on_interrupt INT TERM
for tool in "${compose_tools[@]}"; do
    use_compose_tool "$tool"
    run_id="run$$x$RANDOM"
    expected=()
    if test_with_compose_tool; then
        log "=== $compose_tool: passed"
        passed=$((passed + 1))
    else
        show_state_and_logs
        log "=== $compose_tool: FAILED"
        failed=$((failed + 1))
    fi
    bring_down
done
trap - INT TERM

echo "$passed passed, $failed failed"
((failed == 0))
