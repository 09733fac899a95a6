# Shared by the load scripts (sourced, not run): ports, the collector's
# config, readiness, metrics and process figures, and a CPU profile.

# Sets `bin` to $BIN_DIR (default target/release) and builds the release
# binaries when one of them is missing.
need_binaries() {
    bin=${BIN_DIR:-target/release}
    local daemon
    for daemon in tessera tessera-collector tessera-aggregator tessera-ingester; do
        [ -x "$bin/$daemon" ] || cargo build --release --bins >&2
    done
}

# Sets `work` to a fresh directory and `pids` to an empty list; at exit every
# pid in `pids` is killed and the directory removed.
make_work_dir() {
    work=$(mktemp -d)
    pids=()
    trap cleanup_work EXIT
}
cleanup_work() {
    local pid group
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
    for group in "${memory_cgroups[@]}"; do rmdir "$group" 2>/dev/null || true; done
}

# make_memory_cgroup NAME MIB: a cgroup v1 memory cgroup tessera-bench-NAME limited to MIB
# MiB, that `in_cgroup NAME` starts a daemon in (MEMORY_CGROUPS=1 in start_pipeline);
# removed at exit.
memory_cgroups=()
make_memory_cgroup() {
    local group=/sys/fs/cgroup/memory/tessera-bench-$1
    mkdir -p "$group"
    echo $(( $2 << 20 )) > "$group/memory.limit_in_bytes"
    memory_cgroups+=("$group")
}

# in_cgroup NAME COMMAND...: execs COMMAND in the memory cgroup made for NAME when
# MEMORY_CGROUPS=1, else as is (run it in a subshell: the subshell's pid becomes the
# command's).
in_cgroup() {
    local name=$1
    shift
    if [ "${MEMORY_CGROUPS:-0}" = 1 ]; then
        echo "$BASHPID" > "/sys/fs/cgroup/memory/tessera-bench-$name/cgroup.procs"
    fi
    exec "$@"
}

# set_memory_budgets COLLECTOR_MIB AGGREGATOR_MIB INGESTER_MIB: the pipeline's budgets in the
# configs of $work: `memory_limit` of each size; with MEMORY_CGROUPS=1 a memory cgroup of each
# size instead (make_memory_cgroup) and `memory_limit = "100%"`; with BUDGETS=0 none.
set_memory_budgets() {
    if [ "${MEMORY_CGROUPS:-0}" = 1 ]; then
        make_memory_cgroup collector "$1"
        make_memory_cgroup aggregator "$2"
        make_memory_cgroup ingester "$3"
        local daemon
        for daemon in collector aggregator ingester; do sed -i '1i memory_limit = "100%"' "$work/$daemon.toml"; done
        echo "memory cgroups (v1, hard limits): collector $1 MiB, aggregator $2 MiB, ingester $3 MiB; each daemon's memory_limit = \"100%\" of its cgroup's"
    elif [ "${BUDGETS:-1}" != 0 ]; then
        sed -i "1i memory_limit = \"$1MiB\"" "$work/collector.toml"
        sed -i "1i memory_limit = \"$2MiB\"" "$work/aggregator.toml"
        sed -i "1i memory_limit = \"$3MiB\"" "$work/ingester.toml"
        echo "budgets: collector $1 MiB, aggregator $2 MiB, ingester $3 MiB"
    else
        echo "no budgets"
    fi
}

# cgroup_report NAME: a memory cgroup's peak use (page cache included), how often it hit its
# limit, and the OOM kills in it.
cgroup_report() {
    local group=/sys/fs/cgroup/memory/tessera-bench-$1
    echo "$1: cgroup limit $(( $(cat $group/memory.limit_in_bytes) >> 20 )) MiB, peak use $(( $(cat $group/memory.max_usage_in_bytes) >> 20 )) MiB (page cache included), limit hit $(cat $group/memory.failcnt) times, oom kills $(awk '/oom_kill / {print $2}' $group/memory.oom_control)"
}

# A loopback port nobody listens on; `free_port DGRAM` for UDP.
free_port() {
    python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_${1:-STREAM}); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"
}

# Waits until /readyz on a telemetry port answers 200 (20 s at most).
wait_ready() {
    for _ in $(seq 200); do
        curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0
        sleep 0.1
    done
    echo "nothing ready on port $1" >&2
    return 1
}

# write_collector_config DIR UDP_PORT TELEMETRY_PORT READER_THREADS AGGREGATOR
# writes DIR/placement.toml (one aggregator owning 64 shards) and DIR/collector.toml.
# SERIES_DICTIONARY=true|false sets `[forward] series_dictionary` (left out
# when unset, for binaries that predate it). RULES=1 adds a mapping file
# (write_mapping_rules); LIMIT=1 a catch-all cardinality limit (write_limit_rule).
write_collector_config() {
    cat > "$1/placement.toml" <<TOML
num_shards = 64
[[instances]]
id = "aggregator"
endpoint = "$5"
TOML
    cat > "$1/collector.toml" <<TOML
[udp]
listen = "127.0.0.1:$2"
reader_threads = $4
recv_buffer_bytes = 33554432
[telemetry]
listen = "127.0.0.1:$3"
[placement]
kind = "static"
path = "$1/placement.toml"
TOML
    if [ -n "${SERIES_DICTIONARY:-}" ]; then
        printf '[forward]\nseries_dictionary = %s\n' "$SERIES_DICTIONARY" >> "$1/collector.toml"
    fi
    write_mapping_rules "$1"
    write_limit_rule "$1"
}

# write_limit_rule DIR: with LIMIT=1, `[[rules.limit]] match = "*"` with a bound no run
# reaches: every series takes a place under the limit, and none is folded.
write_limit_rule() {
    [ "${LIMIT:-0}" = 1 ] || return 0
    printf '[[rules.limit]]\nmatch = "*"\nmax_series = 100000000\n' >> "$1/collector.toml"
}

# write_mapping_rules DIR: with RULES=1, a statsd_exporter mapping file of 50 glob rules
# that match none of loadgen's names and one regex rule that maps every one of them,
# `loadgen.counter.7` -> `loadgen_counter_7{mapped="regex"}` (so --verify still finds
# them): every series walks the glob tree, misses, and takes the regex. Without RULES,
# nothing: no rules.
write_mapping_rules() {
    [ "${RULES:-0}" = 1 ] || return 0
    {
        echo "mappings:"
        for i in $(seq 1 50); do
            printf -- '- match: "app%d.*.requests"\n  name: "app%d_requests"\n  labels:\n    route: "$1"\n' "$i" "$i"
        done
        printf -- "- match: 'loadgen\\\\.(counter|gauge|timer|set|distribution)\\\\.(\\\\d+)'\\n  match_type: regex\\n"
        printf -- '  name: "loadgen_${1}_${2}"\n  labels:\n    mapped: "regex"\n'
    } > "$1/mapping.yml"
    printf '[mapping]\nfile = "%s"\n' "$1/mapping.yml" >> "$1/collector.toml"
}

# Sets the loopback ports of a one-collector, one-aggregator, one-ingester
# pipeline (udp_port, collector_http, aggregator_port, aggregator_http,
# ingester_port, ingester_http) and writes the collector's config and
# $work/aggregator.toml; $1: more top-level aggregator lines (e.g.
# `merge_threads = 2`). The ingester's config is the caller's.
write_pipeline_configs() {
    udp_port=$(free_port DGRAM)
    collector_http=$(free_port)
    aggregator_port=$(free_port)
    aggregator_http=$(free_port)
    ingester_port=$(free_port)
    ingester_http=$(free_port)
    write_collector_config "$work" "$udp_port" "$collector_http" "${READER_THREADS:-1}" "127.0.0.1:$aggregator_port"
    make_wire_tls "$work/tls"
    printf '%s\n' "$tls_forward" >> "$work/collector.toml"
    cat > "$work/aggregator.toml" <<TOML
instance_id = "aggregator"
listen = "127.0.0.1:$aggregator_port"
${1:-}
[placement]
kind = "static"
path = "$work/placement.toml"
[ingester]
endpoints = ["127.0.0.1:$ingester_port"]
[telemetry]
listen = "127.0.0.1:$aggregator_http"
$tls_ingester
$tls_listener
TOML
}

# make_wire_tls DIR: with WIRE_TLS=1, a CA, a server certificate for 127.0.0.1 and
# localhost, and a client certificate (openssl, EC P-256) in DIR, and sets the config
# lines of mutual TLS on both links: tls_listener (a listener's [tls]), tls_forward
# (the collector's [forward.tls]) and tls_ingester (the aggregator's [ingester.tls]).
# Without WIRE_TLS they are empty: plain TCP.
make_wire_tls() {
    tls_listener="" tls_forward="" tls_ingester=""
    [ "${WIRE_TLS:-0}" = 1 ] || return 0
    local dir=$1
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
        -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
    local name
    for name in server client; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
            -keyout "$dir/$name-key.pem" -out "$dir/$name.csr" 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$dir/$name.ext"
        openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
            -days 2 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
    done
    tls_listener=$(printf '[tls]\ncert_file = "%s"\nkey_file = "%s"\nclient_ca_file = "%s"' \
        "$dir/server.pem" "$dir/server-key.pem" "$dir/ca.pem")
    local client
    client=$(printf 'ca_file = "%s"\ncert_file = "%s"\nkey_file = "%s"' "$dir/ca.pem" "$dir/client.pem" "$dir/client-key.pem")
    tls_forward=$(printf '[forward.tls]\n%s' "$client")
    tls_ingester=$(printf '[ingester.tls]\n%s' "$client")
}

# write_ingester_config LINES: $work/ingester.toml of the one-ingester pipeline
# (write_pipeline_configs sets its ports), with LINES after the common keys: its
# [sink] and any other table.
write_ingester_config() {
    cat > "$work/ingester.toml" <<TOML
instance_id = "ingester"
listen = "127.0.0.1:$ingester_port"
data_dir = "$work/ingester"
[telemetry]
listen = "127.0.0.1:$ingester_http"
$1
${tls_listener:-}
TOML
}

# start_pipeline: starts the ingester and the aggregator on CPU 1 and the collector on
# CPU 0 from the configs in $work, sets `ingester`, `aggregator` and `collector` to
# their pids, and waits until all three are ready. With MEMORY_CGROUPS=1 each runs in the
# memory cgroup make_memory_cgroup made for it.
start_pipeline() {
    (in_cgroup ingester taskset -c 1 "$bin/tessera-ingester" --config "$work/ingester.toml" --log-level warn) \
        2>"$work/ingester.log" &
    pids+=($!)
    ingester=$!
    (in_cgroup aggregator taskset -c 1 "$bin/tessera-aggregator" --config "$work/aggregator.toml" --log-level warn) \
        2>"$work/aggregator.log" &
    pids+=($!)
    aggregator=$!
    (in_cgroup collector taskset -c 0 "$bin/tessera-collector" --config "$work/collector.toml" --log-level warn) \
        2>"$work/collector.log" &
    pids+=($!)
    collector=$!
    local port
    for port in $ingester_http $aggregator_http $collector_http; do wait_ready "$port"; done
}

# start_fake_kubelet: origin detection's stand-ins in $work: the recorded kubelet pod list
# (crates/collector/tests/data/kubelet-pods.json) served at /pods by python3's http.server,
# a token file, and a fake /proc that `in_fake_container` puts a command's process in.
# Sets `origin_config`, the collector's [origin] tables that read them.
start_fake_kubelet() {
    mkdir -p "$work/kubelet" "$work/proc"
    cp crates/collector/tests/data/kubelet-pods.json "$work/kubelet/pods"
    echo token > "$work/token"
    local port
    port=$(free_port)
    python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/kubelet" >/dev/null 2>&1 &
    pids+=($!)
    # Up before the collector starts: its first listing would fail, and lines wait a second
    # for the next (counted as source_error).
    local _
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/pods" >/dev/null && break
        sleep 0.05
    done
    origin_config=$(printf '[origin]\nenabled = true\nproc_root = "%s"\n[origin.kubelet]\nurl = "http://127.0.0.1:%s/pods"\ntoken_file = "%s"' \
        "$work/proc" "$port" "$work/token")
}

# in_fake_container COMMAND...: runs COMMAND as a process of the `app` container of the
# recorded pod `web-7d4b9c8f6d-x2x9q`, as far as a collector reading $work/proc can tell
# (the shell's PID, kept by exec, is in the fake /proc before the command starts).
in_fake_container() {
    sh -c 'mkdir -p "$0/$$" &&
        echo 0::/kubepods/burstable/pod0f1e2d3c-1111-2222-3333-444455556666/4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c > "$0/$$/cgroup" &&
        exec "$@"' "$work/proc" "$@"
}

# metric_sum PORT NAME [FILTER]: the sum of the samples of NAME (every label
# set whose line contains FILTER) at a telemetry port.
metric_sum() {
    curl -sf "http://127.0.0.1:$1/metrics" | awk -v name="$2" -v filter="${3:-}" '
        index($0, name) == 1 && (filter == "" || index($0, filter) > 0) { sum += $NF } END { printf "%.0f", sum + 0 }'
}

# Clock ticks a process has run (user + system), and its peak RSS in KiB.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
peak_rss_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

# start_profile PORT SECONDS FILE: with PROFILE_HZ set, takes a CPU profile at
# that frequency from a telemetry port in the background (what profiling
# costs is then part of the run); `finish_profile FILE` waits for it and
# sets `profile_note` to its size (empty without a profile).
# PROFILE_FORMAT=flamegraph takes an SVG instead of pprof's protobuf;
# PROFILE_OUT=FILE keeps a copy of the profile after the run.
profile_pid=""
profile_note=""
start_profile() {
    [ -n "${PROFILE_HZ:-}" ] || return 0
    curl -sf -o "$3" "http://127.0.0.1:$1/debug/pprof/profile?seconds=$2&frequency=$PROFILE_HZ&format=${PROFILE_FORMAT:-pprof}" &
    profile_pid=$!
    sleep 0.2
}
finish_profile() {
    [ -n "$profile_pid" ] || return 0
    wait "$profile_pid"
    profile_note=" profile_hz=$PROFILE_HZ profile_bytes=$(stat -c %s "$1")"
    if [ -n "${PROFILE_OUT:-}" ]; then cp "$1" "$PROFILE_OUT"; fi
}
