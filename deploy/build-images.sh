#!/usr/bin/env bash
# Builds every image the compose stack needs without an image registry (no
# `docker pull`), from files on this host:
#
#   tessera-base:local        this host's dynamic loader and the shared libraries
#                             `ldd` lists for every binary below, plus sh, bash,
#                             sleep, cat and ls, and the http-probe healthcheck
#                             helper; made with `docker import`
#   tessera:local             tessera, tessera-collector, tessera-aggregator and
#                             tessera-ingester from `cargo build --release --bins`
#   tessera-etcd:local        Debian's etcd (/usr/bin/etcd, package etcd-server)
#   tessera-prometheus:local  Debian's prometheus and promtool (package prometheus)
#   tessera-certs:local       this host's openssl, for the tls-init service of
#                             docker-compose.mtls.yml (built only when openssl is
#                             installed; the plain stack does not need it)
#
# The base is the host's own libraries rather than a Debian release: binaries
# built here run unchanged whatever the host's glibc is, and nothing is
# downloaded. Then:
#
#   docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.local.yml up -d
#
# Usage: deploy/build-images.sh [--no-cargo]
#   --no-cargo   use the binaries already in target/$TESSERA_PROFILE (no cargo build)
# TESSERA_PROFILE=debug packs the debug binaries instead of release ones (the
# test suite does this: it has just built them, and a functional test does
# not need optimised code).
#
# Build contexts are staged in deploy/.build/ (git-ignored). Unchanged inputs
# reuse the existing images: the base is re-imported only when its files
# change, and docker's build cache covers the rest.
set -euo pipefail
trap 'echo "build-images: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

deploy_dir=$(cd "$(dirname "$0")" && pwd)
repo_dir=$(dirname "$deploy_dir")
build_dir="$deploy_dir/.build"
run_cargo=1

for arg in "$@"; do
    case $arg in
        --no-cargo) run_cargo=0 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-images: unknown argument \`$arg\` (try --help)" >&2; exit 64 ;;
    esac
done

fail() {
    echo "build-images: $*" >&2
    exit 1
}

# Which host binary provides each program; Debian package names for the message.
need_program() {
    local program=$1 package=$2
    command -v "$program" >/dev/null || fail "\`$program\` not found: install $package (scripts/setup.sh does)"
}
need_program docker docker.io
need_program ldd libc-bin
need_program etcd etcd-server
need_program prometheus prometheus
need_program promtool prometheus

profile="${TESSERA_PROFILE:-release}"
case "$profile" in
    release) profile_flag=(--release) ;;
    debug) profile_flag=() ;;
    *) fail "TESSERA_PROFILE must be release or debug, not $profile" ;;
esac
if ((run_cargo)); then
    echo "build-images: cargo build ${profile_flag[*]} --bins" >&2
    (cd "$repo_dir" && cargo build "${profile_flag[@]}" --bins)
fi
release_dir="${CARGO_TARGET_DIR:-$repo_dir/target}/$profile"
tessera_binaries=()
for name in tessera tessera-collector tessera-aggregator tessera-ingester; do
    [ -x "$release_dir/$name" ] || fail "$release_dir/$name is missing: run \`cargo build ${profile_flag[*]} --bins\`"
    tessera_binaries+=("$release_dir/$name")
done
etcd_binary=$(command -v etcd)
prometheus_binaries=("$(command -v prometheus)" "$(command -v promtool)")
tools=(sh bash sleep cat ls)

rm -rf "$build_dir"
mkdir -p "$build_dir"

# --- tessera-base:local ------------------------------------------------------

rootfs="$build_dir/base/rootfs"
mkdir -p "$rootfs"/{bin,etc,tmp,usr/local/bin}
chmod 1777 "$rootfs/tmp"

# Copies host file $1 to the same path in the root filesystem, following
# links so that the copy is a real file.
copy_to_rootfs() {
    local source=$1
    mkdir -p "$rootfs$(dirname "$source")"
    cp -L "$source" "$rootfs$source"
}

# The shared objects (and the loader) a dynamic binary needs, one path a line;
# nothing for a static binary.
shared_libraries_of() {
    ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' || true
}

libraries=()
for program in "${tools[@]}"; do
    path=$(command -v "$program") || fail "\`$program\` not found on this host"
    cp -L "$path" "$rootfs/bin/$program"
    mapfile -t -O "${#libraries[@]}" libraries < <(shared_libraries_of "$path")
done
for binary in "${tessera_binaries[@]}" "$etcd_binary" "${prometheus_binaries[@]}"; do
    mapfile -t -O "${#libraries[@]}" libraries < <(shared_libraries_of "$binary")
done
# Name resolution modules, for glibc versions that still load them (2.34 and
# later have them built in and these files are absent or stubs).
for module in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2; do
    path=$(ldconfig -p 2>/dev/null | awk -v name="$module" '!found && $1 == name && /x86-64|64bit|AArch64/ { print $NF; found = 1 }')
    if [ -n "$path" ]; then libraries+=("$path"); fi
done
mapfile -t libraries < <(printf '%s\n' "${libraries[@]}" | sort -u)
for library in "${libraries[@]}"; do
    copy_to_rootfs "$library"
done

cp "$deploy_dir/images/http-probe" "$rootfs/usr/local/bin/http-probe"
chmod 0755 "$rootfs/usr/local/bin/http-probe"
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"

# A reproducible archive, so that its digest says whether anything changed.
base_tar="$build_dir/base/rootfs.tar"
tar --create --file "$base_tar" --directory "$rootfs" \
    --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner .
base_digest=$(sha256sum "$base_tar" | cut -d' ' -f1)
current_digest=$(docker image inspect tessera-base:local \
    --format '{{ index .Config.Labels "tessera.rootfs.sha256" }}' 2>/dev/null || true)
if [ "$current_digest" = "$base_digest" ]; then
    echo "build-images: tessera-base:local is up to date" >&2
else
    echo "build-images: docker import tessera-base:local (${#libraries[@]} libraries)" >&2
    docker import \
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
        --change "LABEL tessera.rootfs.sha256=$base_digest" \
        --change 'CMD ["/bin/sh"]' \
        "$base_tar" tessera-base:local >/dev/null
fi

# --- images on top of the base ---------------------------------------------

# Stages a build context: the Dockerfile, bin/ with the given files, and an
# empty state/ (copied with the daemon's owner into the data directory).
stage_context() {
    local name=$1
    shift
    local context="$build_dir/$name"
    mkdir -p "$context/bin" "$context/state"
    cp "$deploy_dir/images/$name.Dockerfile" "$context/Dockerfile"
    cp -L "$@" "$context/bin/"
}

build_image() {
    local name=$1 tag=$2
    echo "build-images: docker build $tag" >&2
    local log="$build_dir/$name.log"
    if ! docker build --tag "$tag" "$build_dir/$name" >"$log" 2>&1; then
        cat "$log" >&2
        fail "building $tag failed"
    fi
}

stage_context tessera "${tessera_binaries[@]}"
stage_context etcd "$etcd_binary"
stage_context prometheus "${prometheus_binaries[@]}"

build_image tessera tessera:local
build_image etcd tessera-etcd:local
build_image prometheus tessera-prometheus:local
built="tessera-base:local tessera:local tessera-etcd:local tessera-prometheus:local"

# --- tessera-certs:local (the mTLS override's tls-init) -----------------------

# openssl, the libraries it links that the base may lack (libssl, libcrypto),
# its configuration, and the few tools deploy/make-certs.sh uses beside it.
if openssl_binary=$(command -v openssl); then
    certs_rootfs="$build_dir/certs/rootfs"
    mkdir -p "$certs_rootfs/usr/bin" "$build_dir/certs/state"
    cp "$deploy_dir/images/certs.Dockerfile" "$build_dir/certs/Dockerfile"
    cp -L "$openssl_binary" "$certs_rootfs/usr/bin/openssl"
    for program in rm mkdir chmod; do
        path=$(command -v "$program") || fail "\`$program\` not found on this host"
        cp -L "$path" "$certs_rootfs/usr/bin/$program"
    done
    openssl_dir=$(openssl version -d | sed -n 's/^OPENSSLDIR: "\(.*\)"$/\1/p')
    if [ -f "$openssl_dir/openssl.cnf" ]; then
        mkdir -p "$certs_rootfs$openssl_dir"
        cp -L "$openssl_dir/openssl.cnf" "$certs_rootfs$openssl_dir/openssl.cnf"
    fi
    for binary in "$openssl_binary" "$certs_rootfs"/usr/bin/{rm,mkdir,chmod}; do
        while read -r library; do
            mkdir -p "$certs_rootfs$(dirname "$library")"
            cp -L "$library" "$certs_rootfs$library"
        done < <(shared_libraries_of "$binary")
    done
    build_image certs tessera-certs:local
    built="$built tessera-certs:local"
else
    echo "build-images: openssl not found: no tessera-certs:local (only docker-compose.mtls.yml needs it)" >&2
fi

echo "build-images: done: $built" >&2
