# syntax=docker/dockerfile:1
#
# One static, non-root image per sluice binary:
#
#   docker build --build-arg BINARY=controller -t ghcr.io/sluicehq/sluice-controller:v0.1.0 .
#
# BINARY is one of controller, aggregator, sidecar, configurator, injector.
# Every image holds its binary at /usr/local/bin/sluice, built with
# CGO_ENABLED=0 (no libc needed), on distroless's static base, which brings
# CA certificates (for Postgres with sslmode=verify-full) and runs as the
# user nonroot, 65532.
#
# Without Docker, `make images` builds the same layout with
# internal/tools/ocibuild (on an empty base, without CA certificates).

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
ARG BINARY
ARG VERSION=devel
ARG REVISION=
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    test -n "${BINARY}" || { echo "set --build-arg BINARY=<controller|aggregator|sidecar|configurator|injector>"; exit 1; } && \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/sluicehq/sluice/internal/cli.version=${VERSION} -X github.com/sluicehq/sluice/internal/cli.revision=${REVISION}" -o /out/sluice ./cmd/${BINARY}

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
