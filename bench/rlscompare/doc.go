// Package rlscompare sets sluice's answer to Envoy's rate limit API beside
// a rate limit service that counts in one place: the same decisions asked
// of sluice's sidecars (sidecar/rls, each deciding from the ratios it
// holds) and of a gubernator v2.13.0 cluster (each decision owned by one
// peer, the others forwarding to it, or, GLOBAL, answering from copies),
// 3 replicas of each on loopback behind a round-robin client.
// envoyproxy/ratelimit is not served by the module proxy this was built
// with; gubernator, with its own client, is the alternative.
//
// It is a module of its own, so that gubernator's dependencies (some 300
// modules) stay out of sluice's build and CI:
//
//	make bench-rls-compare
//
// runs BenchmarkDecision (latency at concurrency 1 and 64, throughput, CPU
// per decision) and TestAccuracy (a caller at 5× its limit through each
// trio for 20 s). Figures in docs/benchmarks.md.
package rlscompare
