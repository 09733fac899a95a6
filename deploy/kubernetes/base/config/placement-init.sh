#!/bin/sh
# Writes the first placements, unless they exist: the ingesters' (INGESTERS
# pods of the tessera-ingester StatefulSet sharing SHARDS shards) and the
# aggregators' (AGGREGATORS pods of the tessera-aggregator StatefulSet, grouped
# in order into shard sets of REPLICATION_FACTOR; 2 and 2: the two replicas of
# one shard set holding every shard). Each instance is named by its pod and
# reached at its stable name under its headless Service,
# <pod>.<service>.<POD_NAMESPACE>.svc:<port>, as the daemons' configs say.
#
# The same logic as placement-init in deploy/docker-compose.yml: a placement
# that exists is kept as it is (a rerun, or one an operator changed with
# `tessera placement add|remove|replace`), and while etcd does not answer
# (starting, or not reachable yet) it retries, ATTEMPTS times a second apart,
# then exits 1 and the Job starts it again (backoffLimit).
#
# Environment: ETCD_ENDPOINTS (comma separated), POD_NAMESPACE, and optionally
# TESSERA_ENVIRONMENT (default "default"), AGGREGATORS, INGESTERS, SHARDS,
# REPLICATION_FACTOR, ATTEMPTS. deploy/kubernetes/test.sh runs it against a
# real etcd.
set -u

etcd=${ETCD_ENDPOINTS:?set ETCD_ENDPOINTS}
namespace=${POD_NAMESPACE:?set POD_NAMESPACE}
environment=${TESSERA_ENVIRONMENT:-default}
aggregators=${AGGREGATORS:-2}
ingesters=${INGESTERS:-2}
shards=${SHARDS:-64}
replication_factor=${REPLICATION_FACTOR:-2}
attempts=${ATTEMPTS:-30}

# Prints `--instance NAME-i=NAME-i.NAME.NAMESPACE.svc:PORT` for each of the COUNT
# pods of the StatefulSet NAME (whose headless Service is also NAME).
instances() {
    name=$1 count=$2 port=$3 ordinal=0
    while [ "$ordinal" -lt "$count" ]; do
        printf -- '--instance %s-%d=%s-%d.%s.%s.svc:%d ' \
            "$name" "$ordinal" "$name" "$ordinal" "$name" "$namespace" "$port"
        ordinal=$((ordinal + 1))
    done
}
ingester_instances=$(instances tessera-ingester "$ingesters" 7500)
aggregator_instances=$(instances tessera-aggregator "$aggregators" 7400)

attempt=1
while :; do
    # $ingester_instances and $aggregator_instances are split into words on
    # purpose: pod and Service names hold no spaces.
    if tessera placement show --etcd "$etcd" --environment "$environment" --tier ingesters >/dev/null 2>&1 ||
        tessera placement init --etcd "$etcd" --environment "$environment" --tier ingesters \
            $ingester_instances --shards "$shards"; then
        echo "placement-init: the ingesters' placement exists"
    else
        echo "placement-init: cannot write the ingesters' placement yet (attempt $attempt of $attempts)" >&2
        if [ "$attempt" -ge "$attempts" ]; then exit 1; fi
        attempt=$((attempt + 1))
        sleep 1
        continue
    fi
    if tessera placement show --etcd "$etcd" --environment "$environment"; then
        echo "placement-init: the aggregators' placement exists; keeping it"
        exit 0
    fi
    if tessera placement init --etcd "$etcd" --environment "$environment" \
        $aggregator_instances --shards "$shards" --replication-factor "$replication_factor"; then
        echo "placement-init: the aggregators' placement written"
        exit 0
    fi
    if [ "$attempt" -ge "$attempts" ]; then
        echo "placement-init: no aggregators' placement after $attempt attempts" >&2
        exit 1
    fi
    attempt=$((attempt + 1))
    sleep 1
done
