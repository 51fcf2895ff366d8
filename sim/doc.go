// Package sim is sluice's traffic-surge simulator in deterministic mode: it
// runs the production code of the whole loop — the sidecar's Limiter
// (decisions and counters), the reporter's report builder, the zone
// aggregators' and the controller's pure states, the control law, and
// policy conversion on the sidecars — in one goroutine, under a virtual
// clock, with arrivals drawn from a seeded random source. Nothing in the
// loop is a copy of production logic, and nothing touches the wall clock,
// a socket or another goroutine, so the same scenario and seed give the
// same output, byte for byte — except where a scenario sends tenants
// (Tenants): the sidecar's descriptor sketch hashes with a seed drawn at
// start-up and salts its coins with the wall clock, so those runs differ
// in the last digits of their measures.
//
// A Scenario (a YAML file, see Parse and the files in scenarios/) describes
// the topology, the loop's intervals, the limits, the traffic and the
// failures. Run simulates it and returns a Result: per caller and second
// what was offered, admitted and dropped, what the caller was allowed (from
// an oracle independent of the control law, see Allowed), and where the time
// to enforce went. Measure turns one caller's series into the scenario
// measures; WriteSummary, WriteCSV and WritePNG render a Result.
//
// A callee may be modelled (Service.Knee, and Brownout events that change
// it): a knee.Sim behind each of its sidecars answers what the sidecar
// admits, and the sidecar reports that as the callee's health, from which
// the controller estimates a capacity for a callee with an objective;
// Result.Capacities and MeasureCapacity show the estimate against the
// knee.
//
// Live mode and scale mode reuse Scenario, BucketSeries, Measure and
// Allowed, so that all modes report the same measures.
package sim
