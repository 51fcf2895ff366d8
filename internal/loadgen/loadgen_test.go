package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCountsAdmittedAndDropped(t *testing.T) {
	var n atomic.Int64
	var ended []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-sluice-caller") != "web" {
			http.Error(w, "no caller", http.StatusBadRequest)
			return
		}
		// Every other request is "dropped".
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	g, err := New(Options{
		Targets:  []string{srv.URL},
		Callers:  []Caller{{Name: "web", Rate: func(time.Duration) float64 { return 200 }}},
		Duration: 2 * time.Second,
		SecondEnded: func(s int) {
			ended = append(ended, s)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var seconds []int
	if err := g.Run(context.Background(), func(s int) { seconds = append(seconds, s) }); err != nil {
		t.Fatal(err)
	}
	s := g.Sum("web", 0, 3)
	// Pacing is by schedule: 200 rps for 2 s is 400 requests, give or take
	// the last tick.
	if s.Sent < 390 || s.Sent > 401 {
		t.Errorf("sent %d, want about 400", s.Sent)
	}
	if s.Admitted+s.Dropped+s.Errors+s.Skipped != s.Sent+s.Skipped || s.Errors != 0 {
		t.Errorf("outcomes do not add up: %+v", s)
	}
	if d := s.Admitted - s.Dropped; d < -1 || d > 1 {
		t.Errorf("admitted %d vs dropped %d, want half each", s.Admitted, s.Dropped)
	}
	if len(seconds) != 2 || seconds[0] != 0 || seconds[1] != 1 {
		t.Errorf("onSecond saw %v, want [0 1]", seconds)
	}
	if len(ended) != 2 || ended[0] != 0 || ended[1] != 1 {
		t.Errorf("SecondEnded saw %v, want [0 1]", ended)
	}
}

func TestSkipsWhenSaturated(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	g, err := New(Options{
		Targets:     []string{srv.URL},
		Callers:     []Caller{{Name: "web", Rate: func(time.Duration) float64 { return 1000 }}},
		Duration:    time.Second,
		MaxInFlight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- g.Run(context.Background(), nil) }()
	deadline := time.Now().Add(5 * time.Second)
	for g.Sum("web", 0, 2).Skipped == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := g.Sum("web", 0, 3)
	if s.Skipped == 0 {
		t.Errorf("saturated generator skipped nothing: %+v", s)
	}
	if total := s.Sent + s.Skipped; total < 990 || total > 1001 {
		t.Errorf("sent+skipped = %d, want the schedule's 1000", total)
	}
}

func TestValidate(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("empty options accepted")
	}
}

func TestOffSchedule(t *testing.T) {
	g, err := New(Options{
		Targets: []string{"http://127.0.0.1:1"},
		Callers: []Caller{
			{Name: "web", Rate: func(t time.Duration) float64 {
				if t >= 2*time.Second {
					return 500
				}
				return 50
			}},
			{Name: "batch", Rate: func(time.Duration) float64 { return 20 }},
		},
		Duration: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	set := func(caller, sec int, sent int64) { g.counts[caller][sec].sent.Store(sent) }
	for sec, web := range []int64{50, 44, 465, 535, 500} {
		set(0, sec, web)
		set(1, sec, 20)
	}
	set(1, 4, 14) // 6 off 20: more than 5 and 10 %
	// 44 of 50 is 6 off but 12 %: late; 465 and 535 of 500 are 7 %: on time.
	if got := g.OffSchedule(0, 5); !slices.Equal(got, []int{1, 4}) {
		t.Errorf("OffSchedule(0, 5) = %v, want [1 4]", got)
	}
	if got := g.OffSchedule(2, 4); len(got) != 0 {
		t.Errorf("OffSchedule(2, 4) = %v, want none", got)
	}
}

// TestCallerMethodAndPath: a caller's own method and path replace the
// generator's, so one caller can use several procedures.
func TestCallerMethodAndPath(t *testing.T) {
	var charges, items atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
			charges.Add(1)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/items/7":
			items.Add(1)
		default:
			http.Error(w, r.Method+" "+r.URL.Path, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	web := func(time.Duration) float64 { return 50 }
	g, err := New(Options{
		Targets: []string{srv.URL},
		Callers: []Caller{
			{Name: "web-charges", Rate: web, Method: http.MethodPost, Path: "/v1/charges",
				Header: http.Header{"X-Sluice-Caller": {"web"}}},
			{Name: "web-items", Rate: web, Path: "/v1/items/7"},
		},
		Path:     "/elsewhere",
		Duration: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	c, i := g.Sum("web-charges", 0, 2), g.Sum("web-items", 0, 2)
	if c.Errors != 0 || i.Errors != 0 || c.Admitted != charges.Load() || i.Admitted != items.Load() || c.Admitted == 0 || i.Admitted == 0 {
		t.Errorf("charges %+v (app saw %d), items %+v (app saw %d): want every request on its own method and path", c, charges.Load(), i, items.Load())
	}
}

// Vary numbers a caller's requests from 0 without a gap or a repeat, so
// that a test can give each one a value of its own.
func TestCallerVary(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Tenant")]++
		mu.Unlock()
	}))
	defer srv.Close()
	g, err := New(Options{
		Targets: []string{srv.URL},
		Callers: []Caller{{Name: "crowd", Rate: func(time.Duration) float64 { return 200 },
			Vary: func(n uint64, h http.Header) { h.Set("X-Tenant", fmt.Sprint("t", n)) }}},
		Duration: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	s := g.Sum("crowd", 0, 2)
	if s.Errors != 0 || s.Admitted == 0 || int(s.Admitted) != len(seen) {
		t.Fatalf("%+v, %d distinct tenants: want one per request", s, len(seen))
	}
	for i := range len(seen) {
		if seen[fmt.Sprint("t", i)] != 1 {
			t.Fatalf("tenant t%d seen %d times; numbers must run 0..%d", i, seen[fmt.Sprint("t", i)], len(seen)-1)
		}
	}
}

// TestCallerSend: a caller with Send sends its requests itself, numbered,
// to the targets in turn, and its outcomes are counted.
func TestCallerSend(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	g, err := New(Options{
		Targets: []string{"a", "b"},
		Callers: []Caller{{Name: "rls", Rate: func(time.Duration) float64 { return 100 },
			Send: func(_ context.Context, target string, n uint64) Outcome {
				mu.Lock()
				seen[target]++
				mu.Unlock()
				return Outcome(n % 3)
			}}},
		Duration: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	s := g.Sum("rls", 0, 2)
	if s.Sent < 95 || s.Admitted+s.Dropped+s.Errors != s.Sent {
		t.Errorf("%+v: want about 100 sent, every one counted", s)
	}
	if d := s.Admitted - s.Errors; d < 0 || d > 1 {
		t.Errorf("%+v: want a third each of admitted, dropped and errors", s)
	}
	if d := seen["a"] - seen["b"]; d < -1 || d > 1 {
		t.Errorf("targets %v, want round-robin", seen)
	}
}

// TestEachCallerRoundRobin: each caller spreads its own requests over the
// targets, whatever the other callers send. Two callers at equal rates,
// sent in turn, took alternate targets from one shared turn: each reached
// only half of them.
func TestEachCallerRoundRobin(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]map[string]int{"x": {}, "y": {}}
	send := func(caller string) func(context.Context, string, uint64) Outcome {
		return func(_ context.Context, target string, _ uint64) Outcome {
			mu.Lock()
			seen[caller][target]++
			mu.Unlock()
			return Admitted
		}
	}
	rate := func(time.Duration) float64 { return 100 }
	g, err := New(Options{
		Targets:  []string{"a", "b"},
		Callers:  []Caller{{Name: "x", Rate: rate, Send: send("x")}, {Name: "y", Rate: rate, Send: send("y")}},
		Duration: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for caller, targets := range seen {
		if d := targets["a"] - targets["b"]; targets["a"] < 40 || d < -1 || d > 1 {
			t.Errorf("caller %s reached the targets %v; want about 50 each", caller, targets)
		}
	}
}
