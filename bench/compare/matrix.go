package compare

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/sidecar"
)

// windowLength is the fixed window's: limits are per second.
const windowLength = time.Second

// inProcessSample is how many in-process decisions there are per timed one:
// enough that the clock reads stay out of the throughput, few enough for
// millions of samples a run.
const inProcessSample = 16

// Design names, as the tables print them.
const (
	DesignLua         = "Redis + Lua token bucket (EVALSHA)"
	DesignWindow      = "Redis fixed window (MULTI/EXEC)"
	DesignSluice      = "sluice in-process Decide"
	DesignDirect      = "direct to the app (no proxy)"
	DesignGateProxy   = "reverse proxy calling Redis (Lua)"
	DesignSidecarProx = "sluice sidecar proxy"
)

// MatrixOptions shape the latency runs.
type MatrixOptions struct {
	Concurrency []int
	KeyCounts   []int
	Warm        time.Duration // per run, not recorded
	Measure     time.Duration // per run
}

// RunDecisions measures one decision of each design at every concurrency
// and key count: the three designs of a cell back to back, so that they
// share the machine's state of the moment.
func RunDecisions(ctx context.Context, redisAddr string, o MatrixOptions, progress func(*LatencyResult)) ([]*LatencyResult, error) {
	var out []*LatencyResult
	for _, nkeys := range o.KeyCounts {
		keys := Keys("caller", nkeys)
		lim := sidecar.NewLimiter(sidecar.LimiterOptions{MaxPeers: max(nkeys+16, sidecar.DefaultMaxPeers)})
		lim.SetPolicy(OpenPolicy(service, keys))
		svc := lim.Service(service)
		for _, k := range keys {
			// Every caller is known before the clock starts, as in a
			// sidecar that has seen its callers once.
			svc.Decide(k)
		}
		sluiceOp := func(_ context.Context, key string) (bool, error) { return !svc.Decide(key).Drop, nil }
		for _, conc := range o.Concurrency {
			client := NewRedisClient(redisAddr, conc)
			if err := client.FlushAll(ctx).Err(); err != nil {
				client.Close()
				return nil, fmt.Errorf("flush redis: %w", err)
			}
			// Limits no run reaches: every design measures its admit path.
			tb, err := NewTokenBucket(ctx, client, 1e12, 1e12)
			if err != nil {
				client.Close()
				return nil, err
			}
			fw := &FixedWindow{Client: client, Limit: math.MaxInt64, Window: windowLength}
			for _, d := range []struct {
				name  string
				every int
				op    Op
			}{
				{DesignLua, 1, tb.Decide},
				{DesignWindow, 1, fw.Decide},
				{DesignSluice, inProcessSample, sluiceOp},
			} {
				r := ClosedLoop(ctx, d.name, conc, keys, o.Warm, o.Measure, d.every, d.op)
				out = append(out, r)
				progress(r)
				if err := ctx.Err(); err != nil {
					client.Close()
					return out, err
				}
			}
			client.Close()
		}
	}
	return out, nil
}

// RunProxies measures a request through each proxy: straight to the app,
// through the sluice sidecar, through the same reverse proxy asking Redis's
// Lua token bucket instead. Client, proxies, app and Redis share the
// machine, as they would share a node.
func RunProxies(ctx context.Context, redisAddr string, o MatrixOptions, progress func(*LatencyResult)) ([]*LatencyResult, error) {
	app, err := Serve(App())
	if err != nil {
		return nil, err
	}
	defer app.Close()
	var out []*LatencyResult
	for _, nkeys := range o.KeyCounts {
		keys := Keys("caller", nkeys)
		sc, err := NewSidecar(app.URL, service, keys)
		if err != nil {
			return out, err
		}
		scSrv, err := Serve(sc.Handler())
		if err != nil {
			sc.Close()
			return out, err
		}
		for _, conc := range o.Concurrency {
			rs, err := runProxyCell(ctx, redisAddr, app.URL, scSrv.URL, keys, conc, o, progress)
			out = append(out, rs...)
			if err != nil {
				scSrv.Close()
				sc.Close()
				return out, err
			}
		}
		scSrv.Close()
		sc.Close()
	}
	return out, nil
}

func runProxyCell(ctx context.Context, redisAddr, appURL, sidecarURL string, keys []string, conc int, o MatrixOptions, progress func(*LatencyResult)) ([]*LatencyResult, error) {
	client := NewRedisClient(redisAddr, conc)
	defer client.Close()
	if err := client.FlushAll(ctx).Err(); err != nil {
		return nil, fmt.Errorf("flush redis: %w", err)
	}
	tb, err := NewTokenBucket(ctx, client, 1e12, 1e12)
	if err != nil {
		return nil, err
	}
	gate, p, err := NewGateProxy(appURL, tb, service)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	gateSrv, err := Serve(gate)
	if err != nil {
		return nil, err
	}
	defer gateSrv.Close()
	var out []*LatencyResult
	for _, d := range []struct{ name, url string }{
		{DesignDirect, appURL},
		{DesignSidecarProx, sidecarURL},
		{DesignGateProxy, gateSrv.URL},
	} {
		hc := NewHTTPClient(conc)
		r := ClosedLoop(ctx, d.name, conc, keys, o.Warm, o.Measure, 1, HTTPOp(hc, d.url))
		hc.CloseIdleConnections()
		out = append(out, r)
		progress(r)
		if err := ctx.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}
