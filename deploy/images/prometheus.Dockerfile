# A stand-in for the prom/prometheus image on machines without an image
# registry: Debian's prometheus and promtool (the prometheus package on this
# host) on tessera-base:local. deploy/build-images.sh stages the context
# (deploy/.build/prometheus/: this file, bin/, an empty state/) and builds it
# as tessera-prometheus:local. Paths, user, entrypoint and default flags are
# those of prom/prometheus, so the compose file works with either image.
#
# Debian's build serves its web UI from /usr/share/prometheus/web, which is
# not copied (it links to a few hundred MB of JavaScript packages): the HTTP
# API and Grafana work, the built-in UI pages do not.
FROM tessera-base:local

COPY bin/ /bin/

# The TSDB (the compose file mounts a named volume here).
COPY --chown=65534:65534 state/ /prometheus/

USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
