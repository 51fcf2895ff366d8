// Package zoneload states what the controller accepts in a zone load, so
// that the aggregator that builds one and the controller that checks it
// agree: a zone load outside these bounds is refused, and a refused zone
// load hides its zone from the controller. Standard library only.
package zoneload

const (
	// MaxRate bounds any single rate in a zone load, in requests per
	// second: 10^10 rps is more than any real fleet sends, so a larger
	// number is a bug or a lie. The controller refuses a larger rate; the
	// aggregator caps its sums at it.
	MaxRate = 1e10

	// MaxCostRate bounds a cost rate in a zone load (PeerRate's
	// offered_cost_rps and admitted_cost_rps), in cost units per second:
	// MaxRate requests at a sidecar's default max cost, 10^6 units each.
	// The controller refuses a larger rate; the aggregator caps its sums
	// at it.
	MaxCostRate = MaxRate * 1e6

	// MaxMessageSize is the controller's gRPC receive limit for one zone
	// load message, in bytes, and the default of the aggregator's bound on
	// what it sends.
	MaxMessageSize = 64 << 20

	// MaxLiveSidecars bounds a service's live_sidecars in a zone load: an
	// aggregator keeps at most this many sidecars.
	MaxLiveSidecars = 1 << 20
)
