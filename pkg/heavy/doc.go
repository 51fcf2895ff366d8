// Package heavy counts a descriptor's values (tenants, API keys, client
// IPs) per window in fixed memory, and names the few values that count
// most: the heavy hitters. Memory is set by Options, never by the number of
// distinct values, and the request path (Add of a value under the heavy
// threshold) takes no lock and allocates nothing.
//
// # What it is
//
// A Sketch holds two windows, current and previous. Each window is a
// table of counts and a heavy set of at most K values whose estimate
// reached the threshold. The table is a Space-Saving summary made
// set-associative: lines of Ways (8) slots, one 64-byte cache line each,
// a slot a value's tag (27 bits of its hash and the window's epoch) and
// its count. A value is counted in its own slot of its line; a value new
// to a full line takes the slot of least count m, with count m + 1, from
// the value that held it. Values are hashed with pkg/wyhash, seeded with
// their length, under keys drawn at New, so no one outside the process can
// choose values that share a line or a tag.
//
// What a caller may assume:
//   - An estimate never counts fewer than the Adds of the value that
//     completed in the window (until a count saturates at 2³²−1): a held
//     value's estimate is its count, which started from at least what it
//     had counted before; a value that left its line had the least count
//     when it left, and reads its line's least count, which never falls.
//   - It over-counts only by what its slot held before it took it (or
//     what another value with its tag, one in 2²⁷ in its line, added).
//     Serially, a line's counts sum to its Adds, so a value is over-counted
//     by at most its line's Adds / Ways, whatever the stream: a value that
//     finds a free slot in its line is counted exactly. With the default
//     2¹⁶ slots a window, a value's first Add over-counts for none of
//     10,000 distinct values a window, 0.54 % of 30,000 and 14 % of
//     65,536 (the count-min sketch it replaced, three rows of 2¹⁵
//     counters: 0.49 % of 10,000 and 7.0 % of 30,000).
//   - Concurrent Adds of one value held in its line sum exactly. A slot
//     that changes hands between an Add's scan and its atomic add counts
//     that add for its new holder (an over-count of it); the Add sees so
//     and counts again. Two Adds racing to take a slot for one value never
//     both succeed, so a value holds one slot at most (the argument is at
//     the window type). An Estimate racing Adds scans its line until two
//     scans agree, and under endless churn returns the line's largest
//     count. The heavy set only names values: entering or leaving it
//     changes no count.
//   - An Add counts toward at most one window: the one current when it
//     began. Rotate clears a window one full window after it stopped being
//     current, so only an Add stalled for longer than a window (a
//     goroutine descheduled for a whole report interval) can lose its
//     count: the cleared window's epoch has moved on, so it lowers no other
//     value's count (it may raise one by its own) and enters nothing in
//     the new window's heavy set (until the epoch, three bits advanced
//     twice a clearing, comes round after four).
//
// # Cost
//
// Add is a hash of the value (wyhash, 2.4 ns for a value of 8 to 16
// bytes here, half of hash/maphash's), a scan of one cache line and one
// locked instruction: an atomic add to the value's slot, or a
// compare-and-swap that takes a free or the least slot. The count-min
// sketch it replaced (three rows, conservative update) needed a
// compare-and-swap for each row at the minimum: three for a value alone in
// its counters, the common case, which this table counts in one add
// (`BenchmarkAdd/distinct-10`: 34 → 16 ns), and so the heavy set's
// members, which the sketch counted in counters of their own, are counted
// in the table like any value. A locked instruction costs
// about 7 ns on the development machine: that is the price of counting
// exactly under concurrency; see docs/benchmarks.md. Keep the table (8
// bytes a slot) within the L2 cache: past it every Add waits on memory.
//
// # Bad input
//
// A value longer than Options.MaxValueLen (default 256 bytes) is never
// hashed in full or stored: Add counts it under the reserved key Invalid.
// A value that is not valid UTF-8 is counted but never enters the heavy
// set (reports carry it as a protobuf string). The caller should map both
// to Invalid itself, with a metric, after checking Valid (or
// Sketch.Valid), which allocates nothing: then no reported name is ever
// attacker-shaped garbage. A missing value is the caller's own key.
//
// # How the tiers will use it
//
//   - Sidecar, per request: one Sketch per descriptor limit (a configured,
//     bounded number). v := value, or Invalid when !Valid(value); n :=
//     sk.Add(v). If v is in the policy's pushed list of heavy values, its
//     pushed drop ratio decides; otherwise n (this window's count on this
//     sidecar) is checked against the local per-sidecar allowance. The reporter sets
//     the threshold at or below that allowance, so a value that exceeds
//     the allowance locally is a heavy hitter at once.
//   - Reporter, each report interval (off the request path): SetThreshold
//     for the next window (from the limit, the number of live sidecars and
//     the interval), Rotate, then AppendHeavy into a reused slice: the
//     values of the window that just ended with their counts, which it
//     sends as rates (count / interval) in the load report. Stats feeds
//     the metrics that show how full the set is and what it turned away.
//   - Aggregator: sums the reported rates per (bucket, value) over live
//     sidecars, as it sums per-caller rates today; a report holds at most K
//     values per descriptor, so a zone load is bounded by K × sidecars and
//     can be cut to the top values by rate.
//   - Controller: computes drop ratios for the reported heavy values only,
//     and pushes a bounded list per callee; every other value is decided
//     by the sidecars' local allowance.
package heavy
