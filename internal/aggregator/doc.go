// Package aggregator is sluice's zone aggregator: it takes the load reports
// of a zone's sidecars, keeps the latest rate of every live sidecar, and
// sends their sums to the controller once per flush interval.
//
// State is the pure part (no goroutines, no clock, no I/O), which the
// simulator drives directly; Service wraps it in the gRPC server for
// sidecars and the uplink to the controller.
package aggregator
