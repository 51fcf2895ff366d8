package proxy

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// BenchmarkAddedLatency measures what the proxy adds to a round trip on loopback (the project's
// goal: at most 50 µs at p99). Each iteration makes one sequential request straight to the app
// and one through the proxy, alternating so that both see the same machine; connections are
// warm and reused. Reported in µs: p50 and p99 of each path, and the differences of those
// percentiles as p50-added and p99-added (a difference of percentiles, not a percentile of
// per-request differences, which would mix the noise of two independent samples).
//
//	go test -run x -bench AddedLatency -benchtime 20000x ./internal/agent/proxy
func BenchmarkAddedLatency(b *testing.B) {
	b.Run("http1", func(b *testing.B) {
		app := serve(b, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok")
		})})
		proxy := startProxy(b, app, Options{})
		client := newHTTPClient(b)
		roundTrip := func(url string) func() error {
			req, err := http.NewRequest(http.MethodGet, url, nil)
			if err != nil {
				b.Fatal(err)
			}
			return func() error {
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				// Drain so the connection goes back to the pool.
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return err
			}
		}
		measureAdded(b, roundTrip("http://"+app+"/"), roundTrip("http://"+proxy+"/"))
	})

	// A small body, as most POSTs carry: read whole at once under the body deadline (see
	// limitBody), whose cost this shows.
	b.Run("http1-body", func(b *testing.B) {
		app := serve(b, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(w, r.Body)
		})})
		proxy := startProxy(b, app, Options{})
		client := newHTTPClient(b)
		body := strings.Repeat("x", 1024)
		post := func(url string) func() error {
			return func() error {
				resp, err := client.Post(url, "text/plain", strings.NewReader(body))
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return err
			}
		}
		measureAdded(b, post("http://"+app+"/"), post("http://"+proxy+"/"))
	})

	b.Run("grpc", func(b *testing.B) {
		app := startGRPCApp(b)
		app.health.SetServingStatus("orders", healthpb.HealthCheckResponse_SERVING)
		check := func(addr string) func() error {
			client := healthpb.NewHealthClient(dialGRPC(b, addr))
			req := &healthpb.HealthCheckRequest{Service: "orders"}
			return func() error {
				_, err := client.Check(context.Background(), req)
				return err
			}
		}
		measureAdded(b, check(app.addr), check(startProxy(b, app.addr, Options{})))
	})
}

// measureAdded runs b.N round trips on each path and reports their latency percentiles.
func measureAdded(b *testing.B, direct, proxied func() error) {
	// Warm up: connections dialled, HTTP/2 windows open, pools and caches filled.
	for range 1000 {
		if err := direct(); err != nil {
			b.Fatal(err)
		}
		if err := proxied(); err != nil {
			b.Fatal(err)
		}
	}
	directLat := make([]time.Duration, b.N)
	proxiedLat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := direct(); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := proxied(); err != nil {
			b.Fatal(err)
		}
		directLat[i] = mid.Sub(start)
		proxiedLat[i] = time.Since(mid)
	}
	b.StopTimer()

	d50, d99 := percentiles(directLat)
	p50, p99 := percentiles(proxiedLat)
	b.ReportMetric(micros(d50), "p50-direct-µs")
	b.ReportMetric(micros(d99), "p99-direct-µs")
	b.ReportMetric(micros(p50), "p50-proxied-µs")
	b.ReportMetric(micros(p99), "p99-proxied-µs")
	b.ReportMetric(micros(p50-d50), "p50-added-µs")
	b.ReportMetric(micros(p99-d99), "p99-added-µs")
}

// percentiles returns the nearest-rank 50th and 99th percentiles of lat, which it sorts.
func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(lat)
	rank := func(p int) time.Duration { return lat[(len(lat)*p+99)/100-1] }
	return rank(50), rank(99)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
