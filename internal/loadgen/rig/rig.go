// Package rig runs a load generator and the app behind the sidecars in a
// process of their own (internal/tools/loadrig), driven over HTTP by a
// test.
//
// The end-to-end tests run under go test -race, and a test's own process
// is race-instrumented whatever it starts: sending 1,000 requests a second
// and serving them cost it most of a core there, and with race-built
// sidecars the descriptor tests' crowd (100,000 distinct tenants) kept
// both cores of the machine busy and the load off its schedule in 79 of
// 101 seconds. A rig built without the race detector does the same work
// for a fraction of that.
//
// The rig serves the app on every path but /rig/: it answers 200 and
// counts what it served. POST /rig/run takes a Plan as JSON, runs it with
// internal/loadgen and answers its Result when the run is over.
package rig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/pkg/health"
)

// Plan is one load run.
type Plan struct {
	Targets []string // the sidecars' base URLs
	Seconds int      // the run's length
	Callers []Caller
}

// Caller is one source of load at a constant rate.
type Caller struct {
	Name   string
	Rate   float64             // requests per second
	Header map[string][]string // added to each request
	Vary   *Vary               // nil: every request alike
}

// Vary gives each of a caller's requests a value of its own: request n
// (0, 1, … in the order they are sent) carries value n mod Modulo in
// Header, rendered by Format: a fmt format with one %d verb, or "ipv4",
// 10.x.y.z with x.y.z the value's three low bytes.
type Vary struct {
	Header string
	Format string
	Modulo uint64
}

// Result is what a run saw.
type Result struct {
	// Seconds are each caller's seconds, by name.
	Seconds map[string][]loadgen.Second
	// OffSchedule lists the seconds some caller sent off its rate
	// (loadgen.Generator.OffSchedule).
	OffSchedule []int
	// Latency counts each caller's admitted requests by the time to their
	// answer, per second, on pkg/health's scale (loadgen.Generator.Latency).
	Latency map[string][][health.Buckets]int64
	// Served is what reached the app since the rig started.
	Served int64
	// AppLatency counts the app's answers 200 by the time the app itself
	// took (its queue and its service), per second of the run in which it
	// answered, on pkg/health's scale: the callee's latency, which an
	// objective (slo: latency_p99) bounds, without the proxies' and the
	// load generator's time on the way. Empty when the rig has no App.
	AppLatency [][health.Buckets]int64
}

// P99 is the p99 latency of the admitted requests of callers (all of
// them when none is named) over seconds [from, to); ok is false without
// any.
func (r *Result) P99(from, to int, callers ...string) (d time.Duration, ok bool) {
	w := make([]float64, health.Buckets)
	for name, secs := range r.Latency {
		if len(callers) > 0 && !slices.Contains(callers, name) {
			continue
		}
		addSeconds(w, secs, from, to)
	}
	return health.Quantile(w, 0.99)
}

// AppP99 is the p99 of the app's own latency over seconds [from, to) (see
// AppLatency); ok is false without any answer.
func (r *Result) AppP99(from, to int) (d time.Duration, ok bool) {
	w := make([]float64, health.Buckets)
	addSeconds(w, r.AppLatency, from, to)
	return health.Quantile(w, 0.99)
}

// addSeconds adds seconds [from, to) of secs into w.
func addSeconds(w []float64, secs [][health.Buckets]int64, from, to int) {
	for i := max(from, 0); i < to && i < len(secs); i++ {
		for b, n := range secs[i] {
			w[b] += float64(n)
		}
	}
}

// Sum adds up seconds [from, to) of caller.
func (r *Result) Sum(caller string, from, to int) loadgen.Second {
	var s loadgen.Second
	secs := r.Seconds[caller]
	for i := max(from, 0); i < to && i < len(secs); i++ {
		s.Add(secs[i])
	}
	return s
}

// maxSeconds bounds a run: a rig is for tests, which are bounded in time.
const maxSeconds = 600

// check says what is wrong with p, naming the field.
func (p *Plan) check() error {
	var errs []error
	if len(p.Targets) == 0 {
		errs = append(errs, errors.New("Targets: at least one is required"))
	}
	if p.Seconds <= 0 || p.Seconds > maxSeconds {
		errs = append(errs, fmt.Errorf("Seconds: %d, want 1 to %d", p.Seconds, maxSeconds))
	}
	if len(p.Callers) == 0 {
		errs = append(errs, errors.New("Callers: at least one is required"))
	}
	for i, c := range p.Callers {
		if c.Name == "" || !(c.Rate > 0) {
			errs = append(errs, fmt.Errorf("Callers[%d]: needs a Name and a positive Rate", i))
		}
		if v := c.Vary; v != nil {
			if v.Header == "" || v.Modulo == 0 {
				errs = append(errs, fmt.Errorf("Callers[%d].Vary: needs a Header and a positive Modulo", i))
			}
			if v.Format != "ipv4" && strings.Count(v.Format, "%") != 1 {
				errs = append(errs, fmt.Errorf("Callers[%d].Vary.Format: %q, want \"ipv4\" or a format with one %%d", i, v.Format))
			}
		}
	}
	return errors.Join(errs...)
}

func (v *Vary) fn() func(n uint64, h http.Header) {
	key := http.CanonicalHeaderKey(v.Header)
	if v.Format == "ipv4" {
		return func(n uint64, h http.Header) {
			n %= v.Modulo
			h[key] = []string{fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255)}
		}
	}
	return func(n uint64, h http.Header) { h[key] = []string{fmt.Sprintf(v.Format, n%v.Modulo)} }
}

// Server is a rig: the app and the run endpoint. One run at a time.
type Server struct {
	// App, when set, is the app (a knee, internal/testkit/knee); nil
	// answers every request 200 at once.
	App http.Handler

	served  atomic.Int64
	running atomic.Bool
	// appLat is the run under way's AppLatency; nil between runs.
	appLat atomic.Pointer[appLatency]
}

// appLatency is one run's app latency: its start and its seconds.
type appLatency struct {
	start   time.Time
	seconds [][health.Buckets]atomic.Int64
}

// statusWriter keeps the status the app answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/rig/run" {
		s.served.Add(1)
		if s.App != nil {
			s.serveApp(w, r)
			return
		}
		io.WriteString(w, "from the app\n")
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "POST a Plan", http.StatusMethodNotAllowed)
		return
	}
	var p Plan
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&p); err != nil {
		http.Error(w, "a Plan: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := p.check(); err != nil {
		http.Error(w, "a Plan: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !s.running.CompareAndSwap(false, true) {
		http.Error(w, "a run is under way", http.StatusConflict)
		return
	}
	defer s.running.Store(false)
	res, err := s.run(r.Context(), &p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

// serveApp has the App answer r, timing its answers 200 into the run
// under way's second.
func (s *Server) serveApp(w http.ResponseWriter, r *http.Request) {
	begin := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	s.App.ServeHTTP(sw, r)
	lat := s.appLat.Load()
	if lat == nil || sw.status != http.StatusOK {
		return
	}
	end := time.Now()
	if sec := int(end.Sub(lat.start) / time.Second); sec >= 0 && sec < len(lat.seconds) {
		lat.seconds[sec][health.Bucket(end.Sub(begin))].Add(1)
	}
}

// run runs p; the caller ending the request ends the run.
func (s *Server) run(ctx context.Context, p *Plan) (*Result, error) {
	opts := loadgen.Options{Targets: p.Targets, Duration: time.Duration(p.Seconds) * time.Second}
	for _, c := range p.Callers {
		lc := loadgen.Caller{Name: c.Name, Header: c.Header, Rate: constant(c.Rate)}
		if c.Vary != nil {
			lc.Vary = c.Vary.fn()
		}
		opts.Callers = append(opts.Callers, lc)
	}
	g, err := loadgen.New(opts)
	if err != nil {
		return nil, err
	}
	// The app's seconds count from here, as the generator's do from
	// within Run: the same seconds within a few µs.
	lat := &appLatency{start: time.Now(), seconds: make([][health.Buckets]atomic.Int64, p.Seconds)}
	if s.App != nil {
		s.appLat.Store(lat)
		defer s.appLat.Store(nil)
	}
	if err := g.Run(ctx, nil); err != nil {
		return nil, err
	}
	res := &Result{Seconds: map[string][]loadgen.Second{}, Latency: map[string][][health.Buckets]int64{},
		OffSchedule: g.OffSchedule(0, p.Seconds), Served: s.served.Load()}
	if s.App != nil {
		res.AppLatency = make([][health.Buckets]int64, p.Seconds)
		for i := range lat.seconds {
			for b := range lat.seconds[i] {
				res.AppLatency[i][b] = lat.seconds[i][b].Load()
			}
		}
	}
	for _, c := range p.Callers {
		secs := make([]loadgen.Second, p.Seconds)
		lat := make([][health.Buckets]int64, p.Seconds)
		for i := range secs {
			secs[i] = g.Second(c.Name, i)
			lat[i] = g.Latency(c.Name, i, i+1)
		}
		res.Seconds[c.Name], res.Latency[c.Name] = secs, lat
	}
	return res, nil
}

func constant(r float64) func(time.Duration) float64 { return func(time.Duration) float64 { return r } }

// Run has the rig at base (its http://host:port) run p and returns what
// it saw; ctx bounds the wait.
func Run(ctx context.Context, base string, p Plan) (*Result, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/rig/run", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("rig: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	var res Result
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return nil, fmt.Errorf("rig: its result: %w", err)
	}
	return &res, nil
}
