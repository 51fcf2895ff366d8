package knee

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// On synctest's clock the knee is exact: with 2 workers and a queue of 2,
// six requests at once are answered 200 after one and two service times,
// two each, and 503 at once, two.
func TestHandlerQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := New(Config{Workers: 2, Service: 100 * time.Millisecond, Queue: 2})
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			code int
			took time.Duration
		}
		answers := make([]answer, 6)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				answers[i] = answer{rec.Code, time.Since(start)}
			})
		}
		synctest.Wait()
		if st := h.Stats(); st.InFlight != 4 || st.Refused != 2 {
			t.Errorf("at once: %+v, want 4 in flight, 2 refused", st)
		}
		wg.Wait()
		slices.SortFunc(answers, func(a, b answer) int { return int(a.took - b.took) })
		want := []answer{{503, 0}, {503, 0}, {200, 100 * time.Millisecond}, {200, 100 * time.Millisecond}, {200, 200 * time.Millisecond}, {200, 200 * time.Millisecond}}
		if !slices.Equal(answers, want) {
			t.Errorf("answers %v, want %v", answers, want)
		}
		if st := h.Stats(); st != (Stats{Served: 4, Refused: 2}) {
			t.Errorf("after: %+v, want 4 served, 2 refused, none in flight", st)
		}
	})
}

// A request whose caller gives up, queued or served, leaves at once and
// frees its place.
func TestHandlerCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := New(Config{Workers: 1, Service: time.Second, Queue: 1})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 2 { // one served, one queued, both given up after 100ms
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			wg.Go(func() {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
			})
		}
		start := time.Now()
		wg.Wait()
		if took := time.Since(start); took != 100*time.Millisecond {
			t.Errorf("gave up after %v, want 100ms", took)
		}
		if st := h.Stats(); st != (Stats{}) {
			t.Errorf("after: %+v, want nothing served, refused or in flight", st)
		}
	})
}

// The real app on loopback, at modest rates: half its knee, then twice.
// Twice the knee queues and refuses; half does not. The assertions are
// order relations, and only at a rate the machine delivered.
func TestHandlerLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 3s")
	}
	cfg := Config{Workers: 2, Service: 50 * time.Millisecond, Queue: 10} // knee 40 rps
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	client.Timeout = 10 * time.Second
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64

	low := offer(t, client, srv.URL, 0.5*cfg.Knee(), 1500*time.Millisecond)
	high := offer(t, client, srv.URL, 2*cfg.Knee(), 1500*time.Millisecond)
	t.Logf("half the knee: %s", low)
	t.Logf("twice the knee: %s", high)
	if high.rate < 1.5*cfg.Knee() {
		t.Skipf("the machine delivered %.0f rps, not enough past the knee of %.0f to judge", high.rate, cfg.Knee())
	}
	if high.p99 < 3*low.p99 {
		t.Errorf("p99 at twice the knee %v, want well above %v at half", high.p99, low.p99)
	}
	if high.refused == 0 || high.refused <= low.refused {
		t.Errorf("refused %d at twice the knee, %d at half: want more at twice", high.refused, low.refused)
	}
}

type load struct {
	rate         float64 // requests per second sent
	p99          time.Duration
	ok, refused  int
	otherAnswers int
}

func (l load) String() string {
	return fmt.Sprintf("%.1f rps sent, p99 %v, %d ok, %d refused, %d other", l.rate, l.p99.Round(time.Millisecond), l.ok, l.refused, l.otherAnswers)
}

// offer sends rate requests per second for d, open loop, each on its own
// goroutine, waits for all of them, and returns what they met.
func offer(t *testing.T, c *http.Client, url string, rate float64, d time.Duration) load {
	t.Helper()
	n := int(rate * d.Seconds())
	took := make([]time.Duration, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		wg.Go(func() {
			t0 := time.Now()
			resp, err := c.Get(url)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			resp.Body.Close()
			took[i], codes[i] = time.Since(t0), resp.StatusCode
		})
	}
	sent := time.Since(start)
	wg.Wait()
	var l load
	if n > 1 && sent > 0 {
		l.rate = float64(n-1) / sent.Seconds() // intervals between the first and last sent
	}
	var good []time.Duration
	for i, code := range codes {
		switch code {
		case http.StatusOK:
			l.ok++
			good = append(good, took[i])
		case http.StatusServiceUnavailable:
			l.refused++
		default:
			l.otherAnswers++
		}
	}
	if len(good) > 0 {
		slices.Sort(good)
		l.p99 = good[(len(good)*99-1)/100]
	}
	return l
}
