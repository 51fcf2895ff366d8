package dropratio

// Fast attack reaches into the pipeline: a ratio rises at once (Step), but
// the rise only starts when the rate that calls for it has travelled from
// the sidecars through an aggregator to the controller. Each tier passes a
// surge on as soon as it sees one, instead of waiting for its next interval;
// Surged is the one rule they share.

const (
	// SurgeFactor is how many times its previous value a rate must reach
	// to be a surge.
	SurgeFactor = 1.5
	// SurgeMinRise is the least rise, in requests per second, that can be
	// a surge: below it, a jump at a low rate is noise.
	SurgeMinRise = 10.0
)

// Surged reports whether a rate that was before and is now after rose enough
// to pass on at once: to at least SurgeFactor times before, and by at least
// SurgeMinRise. Falls never surge: releasing is not urgent.
func Surged(before, after float64) bool {
	return after >= SurgeFactor*before && after-before >= SurgeMinRise
}
