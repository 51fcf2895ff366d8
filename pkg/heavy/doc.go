// Package heavy counts a descriptor's values (tenants, API keys, client
// IPs) per window in fixed memory, and names the few values that count
// most: the heavy hitters. Memory is set by Options, never by the number of
// distinct values, and the request path (Add of a value under the heavy
// threshold) takes no lock and allocates nothing.
//
// # What it is
//
// A Sketch holds two windows, current and previous. Each window is a
// count-min sketch (Rows rows of a power-of-two width, uint32 counters,
// conservative update) and a heavy set of at most K values whose estimate
// reached the threshold. Values are hashed with hash/maphash under a seed
// drawn at New, so no one outside the process can choose values that
// collide.
//
// What a caller may assume:
//   - An estimate never counts fewer than the Adds of the value that
//     completed in the window (until a counter saturates at 2³²−1).
//   - It over-counts only through collisions with other values: serially,
//     by at most ε·N with probability at least 1−δ, where N is the window's
//     number of Adds, ε = e/Width and δ = e⁻³ ≈ 5 % (Rows = 3). With the
//     default Counters (3·2¹⁵, Width 2¹⁵) ε ≈ 8.3·10⁻⁵. Conservative update
//     makes the over-count much smaller than that on skewed streams. (Four
//     rows gave δ = 1.8 % but cost a load and up to a compare-and-swap
//     more per Add, about a sixth of a descriptor's decision. Three rows
//     of 2¹⁵ (384 KiB a window) over-count a value's first Add less often
//     than the former default, four of 2¹⁴ (256 KiB), and more often than
//     four of 2¹⁵: see docs/benchmarks.md.)
//   - Concurrent Adds of one value that collides with no other sum
//     exactly; concurrent Adds in general keep the guarantee above. An Add
//     or Estimate racing with the eviction of its value from the heavy set
//     may over-count by the value's count as a member, never under.
//   - An Add counts toward exactly one window: the one current when it
//     began. Rotate clears a window one full window after it stopped being
//     current, so only an Add stalled for longer than a window (a
//     goroutine descheduled for a whole report interval) can lose its
//     count; none is ever counted twice.
//
// # Cost
//
// Add is a hash of the value (hash/maphash, 4 to 9 ns for a short value
// here), three loads, and one compare-and-swap per row at the minimum: one
// for a value whose counters differ, up to three for a value alone in its
// counters (a fresh window, or a heavy value that dominates them). A
// member of the heavy set is counted instead by one atomic add on a
// counter of its own (its estimate: its rows' minimum plus that count), so
// the values counted most pay least. A locked instruction costs about 7 ns
// on the development machine: that is the price of counting exactly under
// concurrency; see docs/benchmarks.md. Keep Rows × Width × 8 bytes (both
// windows) within the L2 cache: past it every Add waits on memory three
// times.
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
//     sidecar, possibly smoothed with the previous window by Estimates) is
//     checked against the local per-sidecar allowance. The reporter sets
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
