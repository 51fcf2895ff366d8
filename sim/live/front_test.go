package live

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// TestFrontRetries: the retrying client sends a dropped request again after
// each backoff, up to max_retries times, answers with the last answer, and
// counts every attempt.
func TestFrontRetries(t *testing.T) {
	var calls atomic.Int64
	var drop atomic.Bool
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("x-sluice-caller") != "web" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if drop.Load() {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer sidecar.Close()
	web := sim.Bucket{Callee: "api", Caller: "web"}
	f, err := startFront([]frontTarget{{url: sidecar.URL, callee: "api"}},
		map[sim.Bucket]*sim.Retry{web: {MaxRetries: 2, Backoff: 20 * time.Millisecond, Multiplier: 2}}, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	f.begin(time.Now())
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(caller string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, f.target(0)+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-sluice-caller", caller)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	total := func() (offered, retries, admitted, dropped int64) {
		for i := range f.counts[web] {
			c := &f.counts[web][i]
			offered += c.offered.Load()
			retries += c.retries.Load()
			admitted += c.admitted.Load()
			dropped += c.dropped.Load()
		}
		return
	}

	if code := send("web"); code != http.StatusOK || calls.Load() != 1 {
		t.Fatalf("admitted: %d after %d calls, want 200 after 1", code, calls.Load())
	}
	drop.Store(true)
	began := time.Now()
	if code := send("web"); code != http.StatusTooManyRequests || calls.Load() != 4 {
		t.Fatalf("dropped: %d after %d calls, want 429 after 1 + 2 retries", code, calls.Load())
	}
	if took := time.Since(began); took < 60*time.Millisecond {
		t.Errorf("two retries took %v, less than the backoffs' 20 + 40 ms", took)
	}
	if o, r, a, d := total(); o != 4 || r != 2 || a != 1 || d != 3 {
		t.Errorf("counted offered %d, retries %d, admitted %d, dropped %d; want 4, 2, 1, 3", o, r, a, d)
	}
	if code := send("mobile"); code != http.StatusBadRequest {
		t.Errorf("a caller without a retrying flow: %d, want 400", code)
	}
	// After the run no retry is made.
	f.end()
	f.end() // idempotent
	if code := send("web"); code != http.StatusTooManyRequests || calls.Load() != 5 {
		t.Errorf("after the end: %d after %d calls, want 429 after one more", code, calls.Load())
	}
}
