# sluice: `make help` lists the targets.

GO      ?= go
BUF     := $(GO) run github.com/bufbuild/buf/cmd/buf@v1.75.0
BINS    := controller aggregator sidecar configurator injector demo
PKGS    := ./...
# What --version and sluice_build_info say: the nearest tag (or the commit),
# and the commit.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X github.com/sluicehq/sluice/internal/cli.version=$(VERSION) -X github.com/sluicehq/sluice/internal/cli.revision=$(REVISION)

.PHONY: help build images test test-short bench bench-compare generate lint demo clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build every binary into bin/
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINS) sim)

images: ## container images without Docker: bin/images/sluice-<binary>.tar (TAG=dev)
	$(GO) run ./internal/tools/ocibuild/cmd -out bin/images -tag $(or $(TAG),dev) -revision '$(REVISION)'

test: ## what CI runs: gofmt, vet, every test with the race detector, e2e alone, the full-size tenants-zipf pair, a short fuzz run; every stage runs, failures listed at the end (STAGES="unit e2e" picks some)
	@bash scripts/test.sh

test-short: ## quick local loop: skips the long end-to-end tests
	@bash scripts/ensure-postgres.sh
	$(GO) test -short $(PKGS)

bench: ## benchmarks recorded in docs/benchmarks.md (Postgres ones start a throwaway cluster)
	@bash scripts/ensure-postgres.sh
	$(GO) test -run '^$$' -bench 'Decide' -benchmem -cpu 1,2 ./sidecar
	$(GO) test -run '^$$' -bench 'AddedLatency' -benchtime 20000x ./internal/agent/proxy
	$(GO) test -run '^$$' -bench 'Step' -benchmem ./pkg/dropratio
	$(GO) test -run '^$$' -bench . -benchtime 10x ./pkg/history
	$(GO) test -run '^$$' -bench . -benchtime 5x ./internal/configurator

.PHONY: bench-proxy
bench-proxy: ## what the sidecar proxy costs per request: direct vs a bare httputil.ReverseProxy vs the proxy alone vs the sidecar, HTTP/1.1 and gRPC, CPU and added latency (~2-3 min), and the middleware's own share; docs/benchmarks.md
	$(GO) test -run '^$$' -bench ProxyCost -benchtime 10000x -count 1 ./internal/agent/proxy
	$(GO) test -run '^$$' -bench 'MiddlewareDecide/admit' -benchmem -count 5 ./sidecar

bench-compare: ## sluice vs Redis + Lua, side by side (~6 min; QUICK=1 for a short check): tables in bin/bench-compare, plots in docs/img
	@bash scripts/ensure-redis.sh
	$(GO) test -race -count=1 -tags benchcompare ./bench/...
	$(GO) run ./bench/cmd/compare $(if $(QUICK),-quick)

.PHONY: bench-rls-compare
bench-rls-compare: ## Envoy's rate limit API: sluice's sidecars vs a gubernator v2.13.0 cluster, 3 replicas each: latency at concurrency 1 and 64, throughput, CPU per decision, accuracy (~2.5 min; its own module, bench/rlscompare); docs/benchmarks.md
	cd bench/rlscompare && $(GO) test -count=1 -run '^TestAccuracy$$' -bench Decision -benchtime 20000x -v .

generate: ## regenerate api/ Go code from the protos (plugins pinned in go.mod)
	$(GO) run ./internal/tools/protogen/cmd api

lint: ## gofmt, go vet, buf lint (STANDARD)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)
	$(BUF) lint

demo: ## run the whole loop locally: controller, 3 aggregators, 6 sidecars, a surge
	$(GO) run ./cmd/demo

.PHONY: lifecycle-demo
lifecycle-demo: ## README's limits-from-history transcript, replayed against a throwaway Postgres (seconds, after the build)
	@bash scripts/lifecycle-demo.sh

.PHONY: certs
certs: ## development mTLS: a CA and SPIFFE certificates into certs/ (SERVICES=checkout,web ZONES=zone-a TRUST_DOMAIN=cluster.local)
	$(GO) run ./internal/identity/devpki/cmd -dir "$${DIR:-certs}" -services "$${SERVICES:-checkout,web}" \
		-zones "$${ZONES:-zone-a}" -trust-domain "$${TRUST_DOMAIN:-cluster.local}"

clean:
	rm -rf bin

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 5s; FUZZ=regexp picks targets); crashers land in testdata/fuzz
	@bash scripts/fuzz.sh $(or $(FUZZTIME),5s) $(FUZZ)
