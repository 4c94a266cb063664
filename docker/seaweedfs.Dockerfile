# SeaweedFS (Apache-2.0), the deployment's S3 server, built from source at the version the tests run
# (trajlake.store.seaweedfs_build.SEAWEEDFS_VERSION; tests/docker/test_compose.py checks they agree).
# The module has a `replace` directive, so it cannot be `go install`ed: its source is downloaded alone,
# copied out of the read-only module cache and built there as the main module.
FROM golang:1.26-bookworm AS build
ARG SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
RUN go mod download github.com/seaweedfs/seaweedfs@${SEAWEEDFS_VERSION} \
 && cp -r "$(go env GOMODCACHE)/github.com/seaweedfs/seaweedfs@${SEAWEEDFS_VERSION}" /src \
 && chmod -R u+w /src \
 && cd /src && CGO_ENABLED=0 go build -ldflags="-s -w" -o /weed ./weed

FROM debian:bookworm-slim
COPY --from=build /weed /usr/local/bin/weed
ENTRYPOINT ["weed"]
