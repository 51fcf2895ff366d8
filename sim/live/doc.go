// Package live is the simulator's live mode: the same scenario files as the
// deterministic mode (package sim), scaled down to fit one machine, run
// against the real controller, aggregator and sidecar binaries as processes
// on loopback, with internal/loadgen sending each flow's traffic. It fills
// the sim package's Result and BucketSeries from what the load generator saw,
// so that sim.Measure and sim.Summarize judge both modes by the same
// yardstick, and Compare puts the two modes side by side.
//
// A live run, for a scenario scaled by Scale:
//
//   - one controller, its limits file written from the scenario's limits;
//   - one aggregator per zone;
//   - a few sidecars per zone and service, each reporting to its own zone's
//     aggregator and failing over to the following zones' in scenario order;
//   - an upstream app served in-process behind every sidecar;
//   - one load generator per (callee, caller, zone), sending the scenario's
//     rate for that zone round-robin to the zone's sidecars; flows that
//     retry go through an in-process retrying client (see front);
//   - the scenario's events at their times: kill_aggregator is SIGKILL,
//     restart_controller is SIGTERM and a new process on the same ports
//     after down.
//
// The loop's intervals come from the scenario (report interval, surge check,
// flush interval, tick, stale-after, warm-up, policy TTL, republish
// threshold, p_max, min rate, release rate). Network delays and the failover
// delay are the real ones on loopback, not the scenario's.
package live
