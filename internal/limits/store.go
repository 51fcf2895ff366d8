package limits

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// FromHistory turns the store's limits into a Set. A setting the store left
// empty (nil) is inherited: a bucket's from its callee, a callee's is the
// default. A value its type does not know (a LimitStore is an interface;
// history's own stores refuse such values) is an error naming the service
// or bucket and the field, never a silent default: an unknown fail mode must
// not become open.
func FromHistory(l history.Limits) (*Set, error) {
	services := map[string]*Service{}
	get := func(callee string) *Service {
		s := services[callee]
		if s == nil {
			s = &Service{
				Name: callee, Capacity: math.Inf(1), DefaultLimit: math.Inf(1),
				Mode: dropratio.Enforce, FailMode: dataplane.FailOpen, Callers: map[string]Bucket{},
			}
			services[callee] = s
		}
		return s
	}
	var errs []error
	for _, sl := range l.Services {
		s := get(sl.Callee)
		if sl.Capacity != nil {
			s.Capacity = *sl.Capacity
		}
		if sl.DefaultLimit != nil {
			s.DefaultLimit = *sl.DefaultLimit
		}
		path := "service " + sl.Callee
		s.Mode = stored(path+": mode", sl.Mode, dropratio.Enforce, &errs)
		s.FailMode = stored(path+": fail_mode", sl.FailMode, dataplane.FailOpen, &errs)
		s.Enforcement = stored(path+": enforcement", sl.Enforcement, dataplane.EnforceSidecar, &errs)
	}
	for _, b := range l.Buckets {
		s := get(b.Callee)
		path := "limit " + b.Callee + "/" + b.Caller
		s.Callers[b.Caller] = Bucket{
			Limit:       b.Limit,
			Mode:        stored(path+": mode", b.Mode, s.Mode, &errs),
			Enforcement: stored(path+": enforcement", b.Enforcement, s.callerEnforcement(b.Caller), &errs),
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid limits: %w", errors.Join(errs...))
	}
	return NewSet(services), nil
}

// stored reads a setting from the store: def when it is nil, else its
// value, which must be one its type can spell (MarshalText refuses others).
func stored[T encoding.TextMarshaler](path string, v *T, def T, errs *[]error) T {
	if v == nil {
		return def
	}
	if _, err := (*v).MarshalText(); err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", path, err))
		return def
	}
	return *v
}

// Store is a Source backed by the history store: it reloads every limit
// within moments of a change notification, and every resync interval as a
// safety net for notifications lost with a connection. While the store is
// unreachable it keeps serving the last limits it read.
//
// Until the first successful read, Ready reports why not, and the
// controller publishes nothing: it would otherwise push ratios computed
// without limits, which opens every gate.
type Store struct {
	store   history.LimitStore
	resync  time.Duration
	log     *slog.Logger
	current atomic.Pointer[Set]
	lastErr atomic.Pointer[error]

	// OnReload, when set before Run, is told the outcome of every read
	// (nil for success), for metrics.
	OnReload func(error)
}

// NewStore returns a Source over st; Run keeps it current.
func NewStore(st history.LimitStore, resync time.Duration, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{store: st, resync: resync, log: logger}
}

// Limits returns the last limits read, or no limits before the first read.
func (s *Store) Limits() *Set {
	if set := s.current.Load(); set != nil {
		return set
	}
	return Empty
}

// Ready is nil once limits have been read at least once.
func (s *Store) Ready() error {
	if s.current.Load() != nil {
		return nil
	}
	if err := s.lastErr.Load(); err != nil {
		return fmt.Errorf("limits not loaded yet: %w", *err)
	}
	return errors.New("limits not loaded yet")
}

// Run reads the limits now, on every change notification and every resync
// interval, until ctx ends. It subscribes again after losing the
// notification channel.
func (s *Store) Run(ctx context.Context) error {
	s.reload(ctx)
	resync := time.NewTicker(s.resync)
	defer resync.Stop()
	var changes <-chan struct{}
	retry := time.NewTimer(0)
	defer retry.Stop()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			ch, err := s.store.Changes(ctx)
			if err != nil {
				s.log.Warn("cannot listen for limit changes; retrying", "err", err, "retry_in", backoff)
				retry.Reset(backoff)
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			changes = ch
			// Changes made while nobody listened are read now.
			s.reload(ctx)
		case _, ok := <-changes:
			if !ok {
				changes = nil
				retry.Reset(backoff)
				continue
			}
			s.reload(ctx)
		case <-resync.C:
			s.reload(ctx)
		}
	}
}

func (s *Store) reload(ctx context.Context) {
	l, err := s.store.Limits(ctx)
	if ctx.Err() != nil {
		return
	}
	var set *Set
	if err == nil {
		set, err = FromHistory(l)
	}
	// OnReload is told last, so that whoever hears of a good read reads
	// its limits.
	defer func() {
		if s.OnReload != nil {
			s.OnReload(err)
		}
	}()
	if err != nil {
		s.lastErr.Store(&err)
		s.log.Error("reading limits failed; keeping the last limits read", "err", err)
		return
	}
	s.lastErr.Store(nil)
	first := s.current.Load() == nil
	s.current.Store(set)
	if first {
		s.log.Info("limits loaded", "services", set.Len(), "buckets", len(l.Buckets))
	}
}
