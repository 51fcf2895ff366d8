package live

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// front is the retrying client of the flows that retry. internal/loadgen
// sends every request once and counts its answer; a scenario's retrying
// clients send a dropped request again, to the same sidecar, after
// backoff·multiplier^(k-1) for the k-th retry, up to max_retries times. So
// the load generator sends such a flow's requests to the front, which
// passes each to its sidecar and retries it on 429 as the scenario says,
// and answers the load generator only with the last answer. The front
// counts every attempt, the first and the retries, by the second it was
// made: those counts, not the load generator's, are the flow's series.
type front struct {
	srv     *http.Server
	url     string
	client  *http.Client
	header  string
	targets []frontTarget
	start   time.Time
	stop    chan struct{} // closed at the end of the run: retries are not made after it
	stopped sync.Once
	served  chan struct{} // closed when Serve has returned
	// counts of each retrying bucket, per second.
	counts map[sim.Bucket][]attempts
	policy map[sim.Bucket]*sim.Retry
}

type frontTarget struct {
	url    string // the sidecar's base URL
	callee string
}

// attempts counts one second of a bucket's attempts.
type attempts struct {
	offered, retries, admitted, dropped, errors atomic.Int64
}

// startFront serves the front on loopback. targets are the sidecars;
// loadgen reaches sidecar i through front.target(i).
func startFront(targets []frontTarget, policy map[sim.Bucket]*sim.Retry, seconds int) (*front, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &front{
		url:     "http://" + ln.Addr().String(),
		header:  "x-sluice-caller",
		targets: targets,
		stop:    make(chan struct{}),
		counts:  map[sim.Bucket][]attempts{},
		policy:  policy,
		client: &http.Client{
			Timeout: 5 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        1024,
				MaxIdleConnsPerHost: 1024,
				IdleConnTimeout:     30 * time.Second,
				DisableCompression:  true,
			},
		},
	}
	for b := range policy {
		f.counts[b] = make([]attempts, seconds)
	}
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	f.served = make(chan struct{})
	go func() {
		defer close(f.served)
		f.srv.Serve(ln) // ends with close
	}()
	return f, nil
}

// target is the URL the load generator uses for sidecar i.
func (f *front) target(i int) string { return f.url + "/" + strconv.Itoa(i) }

// begin sets the instant second 0 starts.
func (f *front) begin(start time.Time) { f.start = start }

// end stops retrying: a retry due after the run is not made, and its
// request is answered with its last answer, 429.
func (f *front) end() { f.stopped.Do(func() { close(f.stop) }) }

func (f *front) close() {
	f.srv.Close()
	<-f.served
	f.client.CloseIdleConnections()
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	seg, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	i, err := strconv.Atoi(seg)
	if err != nil || i < 0 || i >= len(f.targets) {
		http.Error(w, "no such target", http.StatusNotFound)
		return
	}
	t := f.targets[i]
	b := sim.Bucket{Callee: t.callee, Caller: r.Header.Get(f.header)}
	policy, counts := f.policy[b], f.counts[b]
	if policy == nil {
		http.Error(w, "no retrying flow "+b.String(), http.StatusBadRequest)
		return
	}
	backoff := float64(policy.Backoff)
	for attempt := 0; ; attempt++ {
		code := f.send(r.Context(), t.url, b.Caller)
		if sec := int(time.Since(f.start) / time.Second); sec >= 0 && sec < len(counts) {
			c := &counts[sec]
			c.offered.Add(1)
			if attempt > 0 {
				c.retries.Add(1)
			}
			switch {
			case code >= 200 && code < 300:
				c.admitted.Add(1)
			case code == http.StatusTooManyRequests:
				c.dropped.Add(1)
			default:
				c.errors.Add(1)
			}
		}
		if code != http.StatusTooManyRequests || attempt == policy.MaxRetries {
			w.WriteHeader(code)
			return
		}
		if !f.wait(r.Context(), time.Duration(backoff)) {
			w.WriteHeader(code)
			return
		}
		backoff *= policy.Multiplier
	}
}

// wait sleeps for d; false if the run ended or the request was abandoned
// first.
func (f *front) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-f.stop:
	case <-ctx.Done():
	}
	return false
}

// send makes one attempt; a transport error is 502.
func (f *front) send(ctx context.Context, url, caller string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/", nil)
	if err != nil {
		return http.StatusBadGateway
	}
	req.Header.Set(f.header, caller)
	resp, err := f.client.Do(req)
	if err != nil {
		return http.StatusBadGateway
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
