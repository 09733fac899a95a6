# A stand-in for the etcd image on machines without an image registry:
# Debian's etcd (the etcd-server package, /usr/bin/etcd on this host) on
# tessera-base:local. deploy/build-images.sh stages the context
# (deploy/.build/etcd/: this file, bin/etcd, an empty state/) and builds it as
# tessera-etcd:local. The binary sits where the official image has it, so the
# compose file's command works with either image.
FROM tessera-base:local

COPY bin/ /usr/local/bin/

# etcd's data directory (the compose file mounts a named volume here).
COPY --chown=65534:65534 state/ /etcd-data/

USER 65534:65534
EXPOSE 2379 2380
CMD ["/usr/local/bin/etcd"]
