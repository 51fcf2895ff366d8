package history

import (
	"io"
	"log/slog"
	"time"
)

// Option configures a store (Memory or Postgres).
type Option func(*options)

type options struct {
	now func() time.Time
	log *slog.Logger
}

func newOptions(opts []Option) options {
	o := options{now: time.Now, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// clock returns the time to stamp a change with: UTC, at the microsecond
// precision Postgres keeps, so that both stores return the same instants.
func (o options) clock() time.Time { return o.now().UTC().Truncate(time.Microsecond) }

// WithClock sets the clock that stamps changes; nil means time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// WithLogger sets where the store logs what nobody else can see, such as a
// lost listener connection; nil means nowhere.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}
