package live

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/child"
)

// Bounds on the waits of a live run. They are generous: a slow machine
// makes a run slower, not wrong.
const (
	buildTimeout  = 5 * time.Minute  // go build of the three binaries
	startTimeout  = 30 * time.Second // until a process listens, is ready, holds a policy
	stopTimeout   = 10 * time.Second // from SIGTERM to exit, then SIGKILL
	scrapeTimeout = 2 * time.Second  // one GET of a process's /metrics
)

// Build compiles the controller, aggregator and sidecar into dir with the
// go command on PATH. It must run inside the sluice module (go run ./cmd/sim,
// go test). The binaries are built without the race detector even under
// go test -race: they are the system under measurement, and instrumenting
// them would cost the CPU that the measurement needs.
func Build(ctx context.Context, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	if err := child.Build(ctx, dir, false, child.Binaries...); err != nil {
		return fmt.Errorf("%w(live mode builds the binaries from the sluice module: run it from there, or pass --bin with a directory holding controller, aggregator and sidecar, e.g. from make build)", err)
	}
	return nil
}

// scrape reads a process's metrics, bounded by scrapeTimeout.
func scrape(ctx context.Context, admin string) (child.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	return child.Scrape(ctx, admin)
}
