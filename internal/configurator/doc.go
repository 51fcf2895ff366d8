// Package configurator is sluice's operator CLI for limits (the
// configurator binary): it derives limits from weeks of stored peaks,
// shows them for review as a diff against the limits in force, applies or
// rejects them, sets limits and modes by hand, lists the audit log, draws a
// bucket's history, and backtests limits by replaying stored minutes
// through the real control law.
//
// The computations are pure functions with tests of their own: Derive
// (daily peaks, limits, config and a time in; proposals and refusals out)
// and Replay (minute rows and limits in; what the law would have dropped
// out). The cobra commands around them read and write pkg/history.
package configurator
