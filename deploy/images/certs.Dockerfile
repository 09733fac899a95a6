# openssl for the tls-init service of docker-compose.mtls.yml, built from
# this host's files for machines without an image registry:
# deploy/build-images.sh stages the build context (deploy/.build/certs/: this
# file, rootfs/ with openssl, the libraries it links and openssl.cnf, plus rm,
# mkdir and chmod, and an empty state/) and builds it as tessera-certs:local
# when openssl is installed here.
FROM tessera-base:local

COPY rootfs/ /

# The certificates' volume starts out with this owner: the daemons (user 65534)
# read the keys, which only their owner may.
COPY --chown=65534:65534 state/ /etc/tessera/tls/

USER 65534:65534
WORKDIR /etc/tessera/tls
CMD ["openssl", "version"]
