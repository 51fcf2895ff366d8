package configurator

import (
	"context"
	"log/slog"

	"github.com/sluicehq/sluice/pkg/history"
)

// openPostgres opens pkg/history's Postgres store, logging to log.
func openPostgres(log *slog.Logger) func(ctx context.Context, url string) (history.Store, error) {
	return func(ctx context.Context, url string) (history.Store, error) {
		st, err := history.Open(ctx, url, history.WithLogger(log))
		if err != nil {
			return nil, err
		}
		return st, nil
	}
}
