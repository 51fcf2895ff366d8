package dropratio

// Fast attack reaches into the pipeline: a ratio rises at once (Step), but
// the rise only starts when the rate that calls for it has travelled from
// the sidecars through an aggregator to the controller. Each tier passes a
// jump on as soon as it sees one, instead of waiting for its next interval;
// Jumped is the one rule they share. Falls travel as fast as rises: traffic
// that moves between sidecars or zones rises in one place as it falls in
// another, and a sum that heard of the rise but not yet of the fall would
// count the moved traffic twice. The law's slow release still decides how
// fast a falling rate opens the gates.

const (
	// JumpFactor is by how many times a rate must change, up or down, to
	// be a jump.
	JumpFactor = 1.5
	// JumpMinChange is the least change, in requests per second, that can
	// be a jump: below it, a change at a low rate is noise.
	JumpMinChange = 10.0
)

// Jumped reports whether a rate that was before and is now after changed
// enough to pass on at once: by a factor of at least JumpFactor, up or down,
// and by at least JumpMinChange.
func Jumped(before, after float64) bool {
	lo, hi := min(before, after), max(before, after)
	return hi >= JumpFactor*lo && hi-lo >= JumpMinChange
}
