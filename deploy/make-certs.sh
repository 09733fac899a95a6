#!/bin/sh
# Makes the certificates of mutual TLS on the wire links (collector ->
# aggregator -> ingester) with openssl, EC P-256 keys, in DIR:
#
#   ca.crt, ca.key                  the CA that signs the others (10 years); every
#                                   daemon trusts it, and it alone, on the wire
#   aggregator.crt, aggregator.key  server certificate for the collectors and client
#                                   certificate towards the ingesters; names:
#                                   $TESSERA_AGGREGATOR_HOSTS
#   ingester.crt, ingester.key      server certificate for the aggregators; names:
#                                   $TESSERA_INGESTER_HOSTS
#   collector.crt, collector.key    client certificate
#
# The names are those the senders dial, as the placements list the endpoints
# (default: the compose stack's aggregator-1 aggregator-2, ingester-1 ingester-2);
# an IP address becomes an IP name. Leaf certificates last $TESSERA_CERT_DAYS days
# (default 365).
#
# What is already there and valid for 30 more days is kept, so running it again
# (the compose stack's tls-init does at every `up`) renews only what is about to
# expire, and the daemons reload it from disk without a restart. A new CA
# re-issues every certificate. After changing the names, delete the certificate
# concerned. The README (*Recipe: mutual TLS on the wire*) shows how to run it.
#
# Usage: deploy/make-certs.sh DIR
set -eu

dir=${1:?usage: make-certs.sh DIR}
days=${TESSERA_CERT_DAYS:-365}
aggregator_hosts=${TESSERA_AGGREGATOR_HOSTS:-aggregator-1 aggregator-2}
ingester_hosts=${TESSERA_INGESTER_HOSTS:-ingester-1 ingester-2}

mkdir -p "$dir"
cd "$dir"
umask 077

# fresh NAME: NAME.crt and NAME.key exist and the certificate is valid for 30 more days.
fresh() {
    [ -f "$1.crt" ] && [ -f "$1.key" ] && openssl x509 -in "$1.crt" -noout -checkend 2592000 >/dev/null
}

# names HOST...: a subjectAltName value, DNS:host or IP:address for each.
names() {
    list=""
    for host in "$@"; do
        case $host in
            *[!0-9.]* ) entry="DNS:$host" ;;
            * ) entry="IP:$host" ;;
        esac
        list="${list:+$list,}$entry"
    done
    printf '%s' "$list"
}

# issue NAME EXTENSION...: NAME.key and NAME.crt, signed by the CA.
issue() {
    name=$1
    shift
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$name.key"
    openssl req -new -key "$name.key" -subj "/CN=$name" -out "$name.csr"
    printf '%s\n' "$@" "keyUsage=critical,digitalSignature" "basicConstraints=critical,CA:FALSE" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days "$days" \
        -extfile "$name.ext" -out "$name.crt"
    rm -f "$name.csr" "$name.ext"
    chmod 0644 "$name.crt"
    echo "make-certs: issued $dir/$name.crt" >&2
}

new_ca=0
if ! fresh ca; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=tessera wire CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out ca.crt
    chmod 0644 ca.crt
    new_ca=1
    echo "make-certs: made a new CA, $dir/ca.crt" >&2
fi

# Word splitting of the host lists is wanted here.
# shellcheck disable=SC2086
{
    if [ "$new_ca" = 1 ] || ! fresh aggregator; then
        issue aggregator "subjectAltName=$(names $aggregator_hosts)" "extendedKeyUsage=serverAuth,clientAuth"
    fi
    if [ "$new_ca" = 1 ] || ! fresh ingester; then
        issue ingester "subjectAltName=$(names $ingester_hosts)" "extendedKeyUsage=serverAuth"
    fi
}
if [ "$new_ca" = 1 ] || ! fresh collector; then
    issue collector "extendedKeyUsage=clientAuth"
fi

openssl verify -CAfile ca.crt aggregator.crt ingester.crt collector.crt >&2
echo "make-certs: certificates in $dir are valid" >&2
