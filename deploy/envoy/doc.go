// Package envoy holds two example Envoy bootstraps that front a callee and
// the tests that check them against Envoy's v3 protos and sluice:
// envoy.yaml drops its callers' requests at the ratios the sluice
// controller serves as an RTDS runtime layer; envoy-rls.yaml asks the
// sluice sidecar next to it through Envoy's ratelimit filter and rate limit
// service API (sidecar/rls). It has no Go code of its own; see
// docs/dataplanes.md.
package envoy
