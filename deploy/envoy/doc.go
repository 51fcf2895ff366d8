// Package envoy holds an example Envoy bootstrap (envoy.yaml) that fronts a
// callee and drops its callers' requests at the ratios the sluice controller
// serves as an RTDS runtime layer, and the tests that check it against
// Envoy's v3 protos and the controller. It has no Go code of its own; see
// docs/dataplanes.md.
package envoy
