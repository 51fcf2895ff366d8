package compare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisServer is a throwaway redis-server on a loopback port, with its own
// temporary directory and no persistence. It is the harness's child: Stop
// ends it, and the kernel kills it if the harness dies without stopping it.
type RedisServer struct {
	Addr string
	bin  string
	dir  string

	mu   sync.Mutex // protects cmd and done
	cmd  *exec.Cmd
	done chan error
}

// StartRedis starts redis-server (from PATH) on a free 127.0.0.1 port and
// waits until it answers PING.
func StartRedis(ctx context.Context) (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("find redis-server (scripts/ensure-redis.sh installs it): %w", err)
	}
	dir, err := os.MkdirTemp("", "sluice-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("make redis dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &RedisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir}
	if err := s.Start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// freePort asks the kernel for a port nobody holds. Another process could
// take it before redis-server binds it; Start then fails loudly.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Start (re)starts the server on its address, empty: a restarted Redis
// without persistence has lost every bucket, as it would in production
// without AOF.
func (s *RedisServer) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("redis-server already running")
	}
	_, port, _ := net.SplitHostPort(s.Addr)
	cmd := exec.Command(s.bin,
		"--bind", "127.0.0.1", "--port", port, "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--protected-mode", "yes", "--loglevel", "warning", "--logfile", "")
	// Its own process group: a Ctrl-C at the terminal reaches the harness,
	// which stops Redis in its order; and Pdeathsig ends it should the
	// harness be killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		out.Close()
	}()
	s.cmd, s.done = cmd, done

	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-done:
			s.cmd, s.done = nil, nil
			log, _ := os.ReadFile(s.dir + "/redis.log")
			return fmt.Errorf("redis-server exited at start (%v): %s", werr, log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stopLocked()
			return fmt.Errorf("redis-server on %s not answering: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the server and waits for it; stopping a stopped server is a
// no-op.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *RedisServer) stopLocked() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd, s.done = nil, nil
}

// Close stops the server and removes its directory.
func (s *RedisServer) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// NewRedisClient is the pooled client every Redis design gets: one
// connection per concurrent caller, dialled up front, RESP2, no retries (a
// decision on the request path is not worth a second round trip; it fails
// open instead), and timeouts that bound a decision when Redis is away.
func NewRedisClient(addr string, concurrency int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        2,
		DisableIdentity: true,
		PoolSize:        concurrency,
		MinIdleConns:    concurrency,
		MaxRetries:      -1,
		DialTimeout:     100 * time.Millisecond,
		ReadTimeout:     100 * time.Millisecond,
		WriteTimeout:    100 * time.Millisecond,
		PoolTimeout:     time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
}

// TokenBucketLua is the token bucket as most teams write it: one script,
// run atomically by Redis, that refills the bucket from the time elapsed
// since its last use (on the server's clock, so clients' clocks never
// matter) and takes a token when there is one. One EVALSHA per decision.
//
// KEYS[1] the bucket; ARGV[1] rate in tokens per second; ARGV[2] burst, the
// bucket's size. Returns 1 to admit, 0 to drop.
//
// The state goes to HSET as Lua numbers, which Redis writes exactly. With
// tostring() the timestamp would be cut to 14 digits (100 µs), and since
// a negative elapsed time is clamped to 0 the rounding only ever adds
// tokens: TestTokenBucketIsExact saw 116 admitted where 100 was the most.
const TokenBucketLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1])
local ts = tonumber(s[2])
if tokens == nil then
  tokens = burst
  ts = now
end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return allowed
`

// TokenBucket decides with TokenBucketLua.
type TokenBucket struct {
	Client *redis.Client
	Rate   float64 // tokens per second
	Burst  float64 // the bucket's size
	script *redis.Script
	args   []any
}

// NewTokenBucket builds the decider and loads the script, so that every
// decision is one EVALSHA.
func NewTokenBucket(ctx context.Context, c *redis.Client, rate, burst float64) (*TokenBucket, error) {
	tb := &TokenBucket{Client: c, Rate: rate, Burst: burst, script: redis.NewScript(TokenBucketLua),
		args: []any{strconv.FormatFloat(rate, 'g', -1, 64), strconv.FormatFloat(burst, 'g', -1, 64)}}
	if err := tb.script.Load(ctx, c).Err(); err != nil {
		return nil, fmt.Errorf("load token bucket script: %w", err)
	}
	return tb, nil
}

// Decide takes a token from key's bucket. A Redis that restarted has lost
// the script; Run falls back to EVAL once and the server caches it again.
func (tb *TokenBucket) Decide(ctx context.Context, key string) (bool, error) {
	n, err := tb.script.Run(ctx, tb.Client, []string{key}, tb.args...).Int()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// FixedWindow is the other common design: count the requests of the
// current one-second window with INCR, set the counter's EXPIRE, both in
// one MULTI/EXEC, and admit while the count is within the limit. One round
// trip per decision (the transaction is pipelined); the window boundary
// lets up to twice the limit through in any one second that straddles it.
type FixedWindow struct {
	Client *redis.Client
	Limit  int64 // requests per window
	Window time.Duration
	Now    func() time.Time // nil: time.Now
}

// WindowKey names key's counter for the window that holds now.
func WindowKey(key string, now time.Time, window time.Duration) string {
	return key + ":" + strconv.FormatInt(now.UnixNano()/int64(window), 10)
}

// Decide counts one request in key's current window.
func (fw *FixedWindow) Decide(ctx context.Context, key string) (bool, error) {
	now := time.Now
	if fw.Now != nil {
		now = fw.Now
	}
	k := WindowKey(key, now(), fw.Window)
	var incr *redis.IntCmd
	_, err := fw.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		incr = p.Incr(ctx, k)
		// The counter outlives its window by one more, for stragglers
		// whose clocks lag; then Redis forgets it.
		p.Expire(ctx, k, 2*fw.Window)
		return nil
	})
	if err != nil {
		return false, err
	}
	return incr.Val() <= fw.Limit, nil
}
