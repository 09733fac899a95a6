# openssl for the tls-init service of docker-compose.mtls.yml, which runs
# deploy/make-certs.sh (mounted) in it. Built from Debian with an image
# registry; deploy/build-images.sh builds tessera-certs:local from this host's
# openssl instead (images/certs.Dockerfile).
ARG RUNTIME_IMAGE=debian:bookworm-slim
FROM ${RUNTIME_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssl \
    && rm -rf /var/lib/apt/lists/*
# The certificates' volume starts out with this owner: the daemons (user 65534)
# read the keys, which only their owner may.
RUN mkdir -p /etc/tessera/tls && chown 65534:65534 /etc/tessera/tls
USER 65534:65534
WORKDIR /etc/tessera/tls
CMD ["openssl", "version"]
