# The tessera image built from binaries compiled on this host, for machines
# without an image registry. deploy/build-images.sh stages the build context
# (deploy/.build/tessera/: this file, bin/ and an empty state/) and builds it
# as tessera:local; deploy/docker-compose.local.yml points the tessera
# services at it. With a registry, deploy/Dockerfile builds the same image
# from source instead.
#
# tessera-base:local is this host's own loader and shared libraries plus sh,
# bash and sleep (see build-images.sh), so binaries built here run unchanged.
FROM tessera-base:local

# tessera, tessera-collector, tessera-aggregator, tessera-ingester (the base
# has http-probe, the healthcheck helper, in the same directory).
COPY bin/ /usr/local/bin/

# Placement caches and the ingester's durable queue. A named volume mounted
# here starts out with this owner, so the daemons need not run as root.
COPY --chown=65534:65534 state/ /var/lib/tessera/

USER 65534:65534
WORKDIR /var/lib/tessera
CMD ["tessera", "--help"]
