//go:build benchcompare

// These tests need redis-server (scripts/ensure-redis.sh installs it) and
// run under `make bench-compare`, not `make test`: CI does not install
// Redis. They fail, not skip, when it is missing.

package compare

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func startRedis(t *testing.T) *RedisServer {
	t.Helper()
	redis.SetLogger(discardLogger{}) // the tests stop Redis on purpose
	srv, err := StartRedis(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestTokenBucketIsExact: the Lua bucket admits its burst at once, then
// exactly its rate, whoever asks, however many ask at once.
func TestTokenBucketIsExact(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	client := NewRedisClient(srv.Addr, 8)
	defer client.Close()
	const rate, burst = 50.0, 10.0
	tb, err := NewTokenBucket(ctx, client, rate, burst)
	if err != nil {
		t.Fatal(err)
	}

	// A burst of sequential asks: the bucket's size, plus what refilled
	// while they ran.
	start := time.Now()
	var got int
	for range 40 {
		ok, err := tb.Decide(ctx, "burst")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
		}
	}
	if max := int(burst + rate*time.Since(start).Seconds()); got < int(burst) || got > max {
		t.Fatalf("a burst of 40 asks admitted %d, want %v to %d", got, burst, max)
	}
	// Another key has its own bucket.
	if ok, err := tb.Decide(ctx, "other"); err != nil || !ok {
		t.Fatalf("a fresh key: admitted=%v err=%v, want admitted", ok, err)
	}
	ttl, err := client.PTTL(ctx, "burst").Result()
	if err != nil || ttl <= 0 || ttl > time.Duration(burst/rate*1000+1000)*time.Millisecond {
		t.Fatalf("the bucket's key expires in %v (err %v), want within its refill time plus 1s", ttl, err)
	}

	// Eight goroutines asking as fast as they can for a second share one
	// bucket: never more than its size plus rate × elapsed. A bucket of a
	// second's tokens keeps a stall of this busy machine's clients from
	// wasting tokens, so the floor can be tight too: what refilled after
	// the last asks is all that may go unused.
	shared, err := NewTokenBucket(ctx, client, rate, rate)
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(time.Second)
	begin := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				ok, err := shared.Decide(ctx, "shared")
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin).Seconds()
	hi := shared.Burst + rate*elapsed
	lo := shared.Burst + rate*(elapsed-0.25) - 1
	if n := float64(admitted.Load()); n < lo || n > hi {
		t.Fatalf("8 goroutines for %.2fs admitted %v, want %.1f to %.1f", elapsed, n, lo, hi)
	}
}

// TestFixedWindowCountsPerWindow: within one window exactly the limit is
// admitted; the next window starts again; the counter expires.
func TestFixedWindowCountsPerWindow(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	client := NewRedisClient(srv.Addr, 1)
	defer client.Close()
	now := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	fw := &FixedWindow{Client: client, Limit: 5, Window: time.Second, Now: func() time.Time { return now }}
	count := func() (n int) {
		for range 8 {
			ok, err := fw.Decide(ctx, "checkout:web")
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				n++
			}
		}
		return n
	}
	if n := count(); n != 5 {
		t.Fatalf("first window admitted %d of 8, want 5", n)
	}
	now = now.Add(time.Second)
	if n := count(); n != 5 {
		t.Fatalf("second window admitted %d of 8, want 5", n)
	}
	ttl, err := client.TTL(ctx, WindowKey("checkout:web", now, time.Second)).Result()
	if err != nil || ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("the window's counter expires in %v (err %v), want within 2s", ttl, err)
	}
}

// TestGateFailsOpenWhileRedisIsDown: with Redis stopped, the Redis design
// admits everything and counts it; started again, empty, it decides again
// (the script reloaded) with a full bucket.
func TestGateFailsOpenWhileRedisIsDown(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	client := NewRedisClient(srv.Addr, 1)
	defer client.Close()
	tb, err := NewTokenBucket(ctx, client, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	g := &Gate{Decider: tb, Service: "checkout", Next: app}
	ask := func() int {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set(CallerHeader, "web")
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		return rec.Code
	}
	if a, b := ask(), ask(); a != 200 || b != 429 {
		t.Fatalf("a bucket of one: %d then %d, want 200 then 429", a, b)
	}
	srv.Stop()
	for i := range 3 {
		if c := ask(); c != 200 {
			t.Fatalf("Redis down, request %d: %d, want 200 (fail open)", i, c)
		}
	}
	if c := g.Counts(); c.FailedOpen != 3 || c.Decisions != 5 || c.Dropped != 1 {
		t.Fatalf("counts %+v, want 5 decisions, 1 dropped, 3 failed open", c)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// go-redis stops dialling after PoolSize failed dials and retries once
	// a second in the background: decisions keep failing open for up to a
	// second after Redis is back.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := tb.Decide(ctx, "probe")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision 5s after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := g.Counts().FailedOpen
	if a, b := ask(), ask(); a != 200 || b != 429 {
		t.Fatalf("Redis back, empty: %d then %d, want 200 then 429 (a full bucket of one); counts %+v", a, b, g.Counts())
	}
	if c := g.Counts(); c.FailedOpen != before {
		t.Fatalf("%d failed open once Redis answered again, want none", c.FailedOpen-before)
	}
}

// TestRedisServerCleansUp: Close ends the server and removes its directory.
func TestRedisServerCleansUp(t *testing.T) {
	srv, err := StartRedis(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if _, err := os.Stat(srv.dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close (stat: %v)", srv.dir, err)
	}
	if c, err := net.DialTimeout("tcp", srv.Addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", srv.Addr)
	}
	srv.Close() // idempotent
}
