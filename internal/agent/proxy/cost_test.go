//go:build unix

package proxy_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// costRounds is how many times each path runs its b.N requests, the paths taking turns, so
// that a change in the machine's load falls on all of them alike.
const costRounds = 3

// costRunTimeout bounds one path's b.N requests of one round.
const costRunTimeout = 2 * time.Minute

// BenchmarkProxyCost is what the sidecar costs per request (issue 19): the same app (a
// trivial handler, a trivial unary gRPC method: the health service's Check) reached
//
//   - direct: with nothing in between;
//   - bare: through a bare httputil.ReverseProxy with the proxy's transports (NewBare), the
//     floor any Go proxy pays;
//   - proxy: through the sidecar's proxy alone (New, with its bounds, body deadline,
//     X-Forwarded-* and gRPC guard), without the limiter's middleware;
//   - sidecar: through the sidecar binary's handler (internal/agent: the limiter's middleware
//     in front of the proxy) under a policy that admits the caller, on its server (NewServer),
//     its port served as the binary serves it: gRPC by the forwarder (GRPCForwarder, behind
//     the limiter's stream interceptor);
//   - for gRPC, fwd: through the forwarder alone, with no interceptor; and sidecar-nethttp:
//     the sidecar with --grpc-forwarder=false, gRPC through the middleware and ReverseProxy.
//
// Each path makes b.N requests at a fixed concurrency, costRounds times, the paths taking
// turns. Reported: the process's CPU time (getrusage: user + system, client and app
// included, so only the differences between paths are the proxies') per request, the median
// of the rounds, and the latency p50/p99 each proxy adds over direct (differences of
// percentiles over all rounds' requests).
//
//	go test -run '^$' -bench ProxyCost -benchtime 10000x ./internal/agent/proxy
func BenchmarkProxyCost(b *testing.B) {
	for _, proto := range []string{"http1", "grpc"} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/c%d", proto, conc), func(b *testing.B) {
				benchProxyCost(b, proto, conc)
			})
		}
	}
}

func benchProxyCost(b *testing.B, proto string, conc int) {
	var app string
	if proto == "grpc" {
		app = proxy.StartGRPCApp(b)
	} else {
		app = proxy.Serve(b, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "ok")
		})})
	}
	up := &url.URL{Scheme: "http", Host: app}
	bare := proxy.Serve(b, proxy.NewServer("", proxy.NewBare(up)))
	p, err := proxy.New(up, proxy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	bounded := proxy.Serve(b, proxy.NewServer("", p))

	paths := []path{
		{"direct", newCaller(b, proto, app, conc)},
		{"bare", newCaller(b, proto, bare, conc)},
		{"proxy", newCaller(b, proto, bounded, conc)},
		{"sidecar", newCaller(b, proto, startSidecar(b, app, true), conc)},
	}
	if proto == "grpc" {
		f, err := p.NewGRPCForwarder(nil)
		if err != nil {
			b.Fatal(err)
		}
		fwd := serveGRPC(b, f.Server)
		b.Cleanup(func() { f.Close() })
		paths = append(paths,
			path{"fwd", newCaller(b, proto, fwd, conc)},
			path{"sidecar-nethttp", newCaller(b, proto, startSidecar(b, app, false), conc)})
	}
	if *costOnly != "" { // for a profile or a syscall count of one path: -proxycost.only sidecar
		paths = slices.DeleteFunc(paths, func(p path) bool { return p.name != "direct" && p.name != *costOnly })
	}
	cpu := make([][]float64, len(paths))
	lat := make([][]time.Duration, len(paths))
	for round := range costRounds {
		for k := range paths {
			i := (k + round) % len(paths) // each path goes first once
			// Warm up: connections dialled, HTTP/2 windows open, pools filled.
			if _, err := drive(paths[i].call, 200*conc, conc, nil); err != nil {
				b.Fatalf("%s: warm-up: %v", paths[i].name, err)
			}
			l := make([]time.Duration, b.N)
			c, err := drive(paths[i].call, b.N, conc, l)
			if err != nil {
				b.Fatalf("%s: %v", paths[i].name, err)
			}
			cpu[i] = append(cpu[i], micros(c)/float64(b.N))
			lat[i] = append(lat[i], l...)
		}
	}
	d50, d99 := percentiles(lat[0])
	for i, p := range paths {
		b.ReportMetric(median(cpu[i]), p.name+"-cpu-µs/req")
		if i == 0 {
			continue
		}
		p50, p99 := percentiles(lat[i])
		b.ReportMetric(micros(p50-d50), p.name+"-p50-added-µs")
		b.ReportMetric(micros(p99-d99), p.name+"-p99-added-µs")
	}
	b.ReportMetric(micros(d50), "direct-p50-µs")
	b.ReportMetric(micros(d99), "direct-p99-µs")
	// b.N counts one path's requests in one round; ns/op is not a figure of this benchmark.
	b.ReportMetric(0, "ns/op")
}

type path struct {
	name string
	call func() error
}

var costOnly = flag.String("proxycost.only", "", "measure only direct and this path (bare, proxy, sidecar, fwd or sidecar-nethttp)")

// startSidecar runs the sidecar binary's handler in front of app under a policy that admits
// the caller "web" (limited, far under its limit) and returns its address. The port is
// served as the binary serves it: h2c connections by the gRPC forwarder when fwd (the
// default, --grpc-forwarder), by net/http's server and ReverseProxy otherwise.
func startSidecar(b *testing.B, app string, fwd bool) string {
	cfg := agent.DefaultConfig()
	cfg.Service = "checkout"
	cfg.Upstream = "http://" + app
	cfg.GRPCForwarder = fwd
	a, err := agent.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(a.Close)
	a.Limiter().SetPolicy(&sidecar.Policy{
		Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound,
		Peers: []sidecar.Rule{{Peer: "web", LimitRPS: 1e9, AllowedRPS: 1e9}},
	})
	if d := a.Limiter().Service("checkout").Decide("web"); d.Drop {
		b.Fatal("the policy drops web")
	}
	if a.H2C() == nil {
		return proxy.Serve(b, a.Server(""))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	split := process.SplitH2C(ln, 10*time.Second)
	srv := a.Server("")
	go srv.Serve(split.HTTP1)
	go a.H2C().Serve(split.H2C)
	b.Cleanup(func() {
		a.H2C().Stop()
		srv.Close()
		split.Wait()
	})
	return ln.Addr().String()
}

// serveGRPC serves g on a loopback port until the benchmark ends and returns its address.
func serveGRPC(b *testing.B, g *grpc.Server) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(ln)
	b.Cleanup(g.Stop)
	return ln.Addr().String()
}

// newCaller returns a function that makes one request to addr as the caller "web": a GET of
// "/" over HTTP/1.1, or a health Check over h2c. It is safe for conc goroutines at once.
func newCaller(b *testing.B, proto, addr string, conc int) func() error {
	if proto == "grpc" {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		client := healthpb.NewHealthClient(cc)
		req := &healthpb.HealthCheckRequest{Service: "orders"}
		ctx := metadata.AppendToOutgoingContext(context.Background(), sidecar.DefaultCallerHeader, "web")
		return func() error {
			_, err := client.Check(ctx, req)
			return err
		}
	}
	client := proxy.NewHTTPClient(b)
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = conc
	target := "http://" + addr + "/"
	return func() error {
		req, err := http.NewRequest(http.MethodGet, target, nil)
		if err != nil {
			return err
		}
		req.Header[http.CanonicalHeaderKey(sidecar.DefaultCallerHeader)] = callerWeb
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, res.Body) // drained, so the connection is reused
		res.Body.Close()
		if err == nil && res.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", res.StatusCode)
		}
		return err
	}
}

var callerWeb = []string{"web"}

// drive makes n calls from conc goroutines and returns the process's CPU time over them.
// With lat, it records each call's latency there (len(lat) == n). It gives up after
// costRunTimeout.
func drive(call func() error, n, conc int, lat []time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(costRunTimeout)
	var next atomic.Int64
	var mu sync.Mutex // guards first
	var first error
	var wg sync.WaitGroup
	before := cpuTime()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				start := time.Now()
				err := call()
				if err == nil && lat != nil {
					lat[i] = time.Since(start)
				}
				if err == nil && start.After(deadline) {
					err = fmt.Errorf("%d calls not done within %v", n, costRunTimeout)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					next.Store(math.MaxInt32) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	return cpuTime() - before, first
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	lat = slices.Clone(lat)
	slices.Sort(lat)
	rank := func(p int) time.Duration { return lat[(len(lat)*p+99)/100-1] }
	return rank(50), rank(99)
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
