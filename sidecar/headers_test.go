package sidecar

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		p, limit float64
		want     int
	}{
		{0, 100, 1}, // the next tick at least
		{0.01, 100, 1},
		{0.5, 100, 1},  // 0.5 → 0
		{0.6, 100, 2},  // 0.6 → 0.2 → 0
		{0.8, 100, 3},  // 0.8 → 0.6 → 0.2 → 0
		{0.9, 100, 4},  // ten times over: 0.9 → 0.8 → 0.6 → 0.2 → 0
		{0.95, 100, 5}, // twenty times over
		{0.99, 100, 7}, // the law's p_max
		{0.99, inf, 7}, // no limit: capacity is shared out, the release is the same
		{0.99, 0, 60},  // blocked: no wait helps
		{0, 0, 60},     // blocked, even by a hand-built ratio of 0
		{math.Nextafter(1, 0), 100, 53},
		{1.5, 100, 53},       // clamped below 1, as the Limiter applies it
		{-1, 100, 1},         // clamped to 0
		{math.NaN(), 100, 1}, // as 0
	} {
		if got := retryAfter(tc.p, tc.limit); got != tc.want {
			t.Errorf("retryAfter(%v, %v) = %d, want %d", tc.p, tc.limit, got, tc.want)
		}
	}
	// Bounded, and never shorter for a higher ratio.
	last := 0
	for p := 0.0; p < 1; p += 1.0 / 4096 {
		got := retryAfter(p, 100)
		if got < MinRetryAfter || got > MaxRetryAfter || got < last {
			t.Fatalf("retryAfter(%v, 100) = %d after %d: outside [%d, %d] or shorter than for a lower ratio", p, got, last, MinRetryAfter, MaxRetryAfter)
		}
		last = got
	}
}

// The rule's oracle is the control law itself: a ratio seeded at p, then
// stepped once a second with the caller at its limit, reaches 0 after as
// many ticks as retryAfter says, not one fewer.
func TestRetryAfterIsTheLawsRelease(t *testing.T) {
	cfg := dropratio.DefaultConfig()
	if cfg.ReleaseRate != assumedReleaseRate {
		t.Fatalf("the law's default release rate is %v, retryAfter assumes %v", cfg.ReleaseRate, assumedReleaseRate)
	}
	for p := 0.01; p <= cfg.PMax; p += 0.01 {
		law, err := dropratio.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		law.Seed("checkout", "web", p)
		in := []dropratio.Service{{Name: "checkout", Capacity: inf, Callers: []dropratio.Caller{{Name: "web", Offered: 100, Limit: 100}}}}
		ticks := 0
		for law.Ratio("checkout", "web") > 0 && ticks < 100 {
			law.Step(time.Second, in)
			ticks++
		}
		if got := retryAfter(p, 100); got != ticks {
			t.Errorf("p %.2f: the law released it in %d ticks, retryAfter says %d", p, ticks, got)
		}
	}
}

func TestParseRateLimitHeaders(t *testing.T) {
	for _, h := range []RateLimitHeaders{NoRateLimitHeaders, DraftRateLimitHeaders, XRateLimitHeaders} {
		got, err := ParseRateLimitHeaders(h.String())
		if err != nil || got != h {
			t.Errorf("ParseRateLimitHeaders(%q) = %v, %v; want %v", h.String(), got, err, h)
		}
	}
	for _, s := range []string{"", "None", "x-ratelimit-headers", "ietf"} {
		if _, err := ParseRateLimitHeaders(s); err == nil {
			t.Errorf("ParseRateLimitHeaders(%q) succeeded", s)
		}
	}
}

// rateLimitKeys are every header a rate-limit response may carry, as
// net/http keys them; the tables below say which must be there.
var rateLimitKeys = []string{"Retry-After", "X-Envoy-Ratelimited", "Ratelimit-Policy", "Ratelimit",
	"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}

// headerCase is a caller, the rule it gets, and what its responses carry
// in each form: admitted responses, and, for a caller that is dropped,
// drops. A nil map means no response of that kind is expected.
type headerCase struct {
	name   string
	caller string
	rule   *Rule // nil: the caller is not listed
	admit  map[RateLimitHeaders]map[string]string
	drop   map[RateLimitHeaders]map[string]string
}

// headerCases are the callers of the tests below, all of service checkout.
// The ratios are exact in Diffuse with one stripe: 0.5 drops every other
// request starting with the first, 0.95 admits one request in twenty.
func headerCases() []headerCase {
	none := map[string]string{}
	same := func(m map[string]string) map[RateLimitHeaders]map[string]string {
		return map[RateLimitHeaders]map[string]string{NoRateLimitHeaders: m, DraftRateLimitHeaders: m, XRateLimitHeaders: m}
	}
	// A drop's headers: the draft's always, Envoy's with XRateLimitHeaders.
	drop := func(retry, policy, xLimit string) map[RateLimitHeaders]map[string]string {
		base := map[string]string{"Retry-After": retry, "X-Envoy-Ratelimited": "true", "Ratelimit": `"sluice";r=0;t=` + retry}
		if policy != "" {
			base["Ratelimit-Policy"] = policy
		}
		x := map[string]string{}
		for k, v := range base {
			x[k] = v
		}
		if xLimit != "" {
			x["X-Ratelimit-Limit"], x["X-Ratelimit-Remaining"], x["X-Ratelimit-Reset"] = xLimit, "0", retry
		}
		return map[RateLimitHeaders]map[string]string{NoRateLimitHeaders: base, DraftRateLimitHeaders: base, XRateLimitHeaders: x}
	}
	admit := func(q, r, t string) map[RateLimitHeaders]map[string]string {
		return map[RateLimitHeaders]map[string]string{
			NoRateLimitHeaders:    none,
			DraftRateLimitHeaders: {"Ratelimit-Policy": `"sluice";q=` + q + `;w=1`, "Ratelimit": `"sluice";r=` + r + `;t=` + t},
			XRateLimitHeaders:     {"X-Ratelimit-Limit": q + ", " + q + ";w=1", "X-Ratelimit-Remaining": r, "X-Ratelimit-Reset": t},
		}
	}
	return []headerCase{
		{name: "unlisted caller", caller: "polite", admit: same(none)},
		{name: "ratio 0 with a limit", caller: "steady",
			rule:  &Rule{Peer: "steady", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 39.5},
			admit: admit("100", "60", "1")}, // 100 − 39.5, rounded down
		{name: "ratio 0 at the limit", caller: "full",
			rule:  &Rule{Peer: "full", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 100.4},
			admit: admit("100", "0", "1")},
		{name: "ratio 0.5", caller: "half",
			rule:  &Rule{Peer: "half", DropRatio: 0.5, LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 200, Reason: ReasonLimit},
			admit: admit("100", "0", "1"), drop: drop("1", `"sluice";q=100;w=1`, "100, 100;w=1")},
		{name: "ratio 0.95", caller: "surge",
			rule:  &Rule{Peer: "surge", DropRatio: 0.95, LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 2000, Reason: ReasonLimit},
			admit: admit("100", "0", "5"), drop: drop("5", `"sluice";q=100;w=1`, "100, 100;w=1")},
		{name: "capacity share below the limit", caller: "shared",
			rule:  &Rule{Peer: "shared", DropRatio: 0.5, LimitRPS: 100, AllowedRPS: 30.7, OfferedRPS: 61.4, Reason: ReasonCapacity},
			admit: admit("30", "0", "1"), drop: drop("1", `"sluice";q=30;w=1`, "30, 30;w=1")},
		{name: "shadow mode", caller: "shadowed",
			rule:  &Rule{Peer: "shadowed", DropRatio: 0.95, Mode: dropratio.Shadow, LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 2000},
			admit: same(none)},
		{name: "no limit", caller: "free",
			rule:  &Rule{Peer: "free", LimitRPS: inf, AllowedRPS: inf, OfferedRPS: 5000},
			admit: same(none)},
		{name: "no limit, dropped for a hand-built ratio", caller: "freebutdropped",
			rule:  &Rule{Peer: "freebutdropped", DropRatio: 0.5, LimitRPS: inf, AllowedRPS: inf, OfferedRPS: 5000},
			admit: same(none), drop: drop("1", "", "")},
		{name: "blocked", caller: "blocked",
			rule: &Rule{Peer: "blocked", DropRatio: 0.99, LimitRPS: 0, AllowedRPS: 0, OfferedRPS: 3, Reason: ReasonLimit},
			drop: drop("60", `"sluice";q=0;w=1`, "0, 0;w=1")},
	}
}

func caseNamed(t *testing.T, name string) headerCase {
	t.Helper()
	for _, c := range headerCases() {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no case %q", name)
	return headerCase{}
}

// headerPolicy is the policy of headerCases, in a Limiter whose decisions
// are exact (one stripe).
func headerPolicy() (*Limiter, *ServiceLimiter) {
	var rules []Rule
	for _, c := range headerCases() {
		if c.rule != nil {
			rules = append(rules, *c.rule)
		}
	}
	l := NewLimiter(LimiterOptions{OneStripe: true})
	l.SetPolicy(policy("checkout", rules...))
	return l, l.Service("checkout")
}

// checkHeaders checks that a response has exactly want's rate-limit headers
// (of rateLimitKeys), each once; get reads a header by its net/http key.
func checkHeaders(t *testing.T, what string, get func(key string) []string, want map[string]string) {
	t.Helper()
	for _, k := range rateLimitKeys {
		got := get(k)
		w, ok := want[k]
		if !ok && len(got) != 0 || ok && (len(got) != 1 || got[0] != w) {
			if ok {
				t.Errorf("%s: %s = %q, want %q", what, k, got, w)
			} else {
				t.Errorf("%s: %s = %q, want none", what, k, got)
			}
		}
	}
}

// TestMiddlewareRateLimitHeaders sends each caller's requests through the
// middleware over real HTTP, in every form, until it has seen what the case
// expects (one admitted and one dropped response, as the case has them),
// and checks every rate-limit header of both.
func TestMiddlewareRateLimitHeaders(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusNoContent)
	})
	for _, form := range []RateLimitHeaders{NoRateLimitHeaders, DraftRateLimitHeaders, XRateLimitHeaders} {
		t.Run(form.String(), func(t *testing.T) {
			_, s := headerPolicy()
			srv := httptest.NewServer(s.Middleware(next, HTTPOptions{RateLimitHeaders: form, TrustDecided: true}))
			defer srv.Close()
			bare := NewLimiter(LimiterOptions{}).Service("checkout") // no policy
			bareSrv := httptest.NewServer(bare.Middleware(next, HTTPOptions{RateLimitHeaders: form}))
			defer bareSrv.Close()

			send := func(t *testing.T, url string, hdr map[string]string) *http.Response {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					t.Fatal(err)
				}
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				res, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				return res
			}

			t.Run("no policy", func(t *testing.T) {
				res := send(t, bareSrv.URL, map[string]string{DefaultCallerHeader: "steady"})
				if res.StatusCode != http.StatusNoContent {
					t.Fatalf("status %d, want 204", res.StatusCode)
				}
				checkHeaders(t, "admitted", res.Header.Values, nil)
			})
			for _, c := range headerCases() {
				t.Run(c.name, func(t *testing.T) {
					var admitted, dropped *http.Response
					for range 40 {
						if (admitted != nil || c.admit == nil) && (dropped != nil || c.drop == nil) {
							break
						}
						res := send(t, srv.URL, map[string]string{DefaultCallerHeader: c.caller})
						switch res.StatusCode {
						case http.StatusNoContent:
							admitted = res
						case http.StatusTooManyRequests:
							dropped = res
						default:
							t.Fatalf("status %d", res.StatusCode)
						}
					}
					if (admitted != nil) != (c.admit != nil) || (dropped != nil) != (c.drop != nil) {
						t.Fatalf("admitted %v, dropped %v in 40 requests; want %v, %v", admitted != nil, dropped != nil, c.admit != nil, c.drop != nil)
					}
					if admitted != nil {
						if admitted.Header.Get("X-Upstream") != "yes" {
							t.Error("the app's headers are lost")
						}
						checkHeaders(t, "admitted", admitted.Header.Values, c.admit[form])
					}
					if dropped != nil {
						checkHeaders(t, "dropped", dropped.Header.Values, c.drop[form])
					}
				})
			}
			// A request its caller decided gets the caller's headers too,
			// with no decision: steady's, uncounted.
			t.Run("decided upstream", func(t *testing.T) {
				before := s.DecidedUpstream()
				res := send(t, srv.URL, map[string]string{DefaultCallerHeader: "steady", DecidedHeader: "steady"})
				if res.StatusCode != http.StatusNoContent || s.DecidedUpstream() != before+1 {
					t.Fatalf("status %d, DecidedUpstream +%d; want 204, +1", res.StatusCode, s.DecidedUpstream()-before)
				}
				checkHeaders(t, "admitted", res.Header.Values, caseNamed(t, "ratio 0 with a limit").admit[form])
			})
		})
	}
}

// TestGRPCInterceptorRateLimitHeaders is TestMiddlewareRateLimitHeaders for
// the server interceptors on loopback: admitted calls get the form's
// headers as header metadata, drops get x-envoy-ratelimited and the form's
// quota headers as trailers (Retry-After is the status's RetryInfo), and
// RetryInfo says what Retry-After says.
func TestGRPCInterceptorRateLimitHeaders(t *testing.T) {
	for _, form := range []RateLimitHeaders{NoRateLimitHeaders, DraftRateLimitHeaders, XRateLimitHeaders} {
		t.Run(form.String(), func(t *testing.T) {
			_, s := headerPolicy()
			client := startHealthServer(t, s, GRPCOptions{RateLimitHeaders: form})
			for _, c := range headerCases() {
				t.Run(c.name, func(t *testing.T) {
					var admitted, dropped metadata.MD
					var dropErr error
					gotAdmit, gotDrop := false, false
					for range 40 {
						if (gotAdmit || c.admit == nil) && (gotDrop || c.drop == nil) {
							break
						}
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, c.caller)
						var header, trailer metadata.MD
						_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
						cancel()
						switch status.Code(err) {
						case codes.OK:
							admitted, gotAdmit = header, true
						case codes.ResourceExhausted:
							dropped, dropErr, gotDrop = trailer, err, true
						default:
							t.Fatalf("call: %v", err)
						}
					}
					if gotAdmit != (c.admit != nil) || gotDrop != (c.drop != nil) {
						t.Fatalf("admitted %v, dropped %v in 40 calls; want %v, %v", gotAdmit, gotDrop, c.admit != nil, c.drop != nil)
					}
					if gotAdmit {
						checkHeaders(t, "admitted", mdGet(admitted), c.admit[form])
					}
					if !gotDrop {
						return
					}
					want := map[string]string{}
					for k, v := range c.drop[form] {
						want[k] = v
					}
					delete(want, "Retry-After")
					if form != DraftRateLimitHeaders {
						delete(want, "Ratelimit")
						delete(want, "Ratelimit-Policy")
					}
					checkHeaders(t, "dropped", mdGet(dropped), want)
					var info *errdetails.RetryInfo
					for _, d := range status.Convert(dropErr).Details() {
						if ri, ok := d.(*errdetails.RetryInfo); ok {
							info = ri
						}
					}
					secs, err := strconv.Atoi(c.drop[form]["Retry-After"])
					if err != nil {
						t.Fatal(err)
					}
					if got := info.GetRetryDelay().AsDuration(); got != time.Duration(secs)*time.Second {
						t.Errorf("RetryInfo %v, want Retry-After's %ds", got, secs)
					}
				})
			}
		})
	}
}

// mdGet reads metadata by a net/http key.
func mdGet(md metadata.MD) func(string) []string {
	return func(k string) []string { return md.Get(strings.ToLower(k)) }
}

// The middleware's gRPC form of a drop, through the sidecar's proxy, has
// x-envoy-ratelimited and, asked for, Envoy's X-RateLimit-* among its
// trailers; an admitted call's headers reach the client as header metadata.
func TestMiddlewareGRPCRateLimitHeaders(t *testing.T) {
	_, s := headerPolicy()
	ph := startProxiedHealthOpts(t, s, HTTPOptions{RateLimitHeaders: XRateLimitHeaders})
	for _, c := range headerCases() {
		if c.name != "ratio 0.5" {
			continue
		}
		var admitted, dropped metadata.MD
		gotAdmit, gotDrop := false, false
		for range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, c.caller)
			var header, trailer metadata.MD
			_, err := ph.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
			cancel()
			switch status.Code(err) {
			case codes.OK:
				admitted, gotAdmit = header, true
			case codes.ResourceExhausted:
				dropped, gotDrop = trailer, true
			default:
				t.Fatalf("call: %v", err)
			}
		}
		if !gotAdmit || !gotDrop {
			t.Fatalf("admitted %v, dropped %v; at 0.5, want both in 4 calls", gotAdmit, gotDrop)
		}
		checkHeaders(t, "admitted", mdGet(admitted), c.admit[XRateLimitHeaders])
		checkHeaders(t, "dropped", mdGet(dropped), c.drop[XRateLimitHeaders])
	}
}

// allocPolicy has a caller with a quota at ratio 0, one without a limit,
// and a blocked one whose every request is dropped (Diffuse admits one in
// 2^32 at the largest ratio).
func allocPolicy() *ServiceLimiter {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "steady", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 39.5},
		Rule{Peer: "free", LimitRPS: inf, AllowedRPS: inf},
		Rule{Peer: "blocked", DropRatio: math.Nextafter(1, 0), LimitRPS: 0, AllowedRPS: 0},
	))
	return l.Service("checkout")
}

// The admitted path with headers, in every form, assigns pre-rendered
// values and allocates nothing; neither do drops in Envoy's form, nor a
// request its caller decided.
func TestMiddlewareRateLimitHeadersAllocs(t *testing.T) {
	s := allocPolicy()
	var reached int
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ })
	for _, tc := range []struct {
		name, caller, decided, ct string
		form                      RateLimitHeaders
		wantReached               bool
		wantHeader                string // a header the response must carry
	}{
		{"admitted, draft", "steady", "", "", DraftRateLimitHeaders, true, "Ratelimit"},
		{"admitted, x-ratelimit", "steady", "", "", XRateLimitHeaders, true, "X-Ratelimit-Remaining"},
		{"admitted gRPC, draft", "steady", "", "application/grpc", DraftRateLimitHeaders, true, "Ratelimit-Policy"},
		{"admitted, decided upstream", "steady", "steady", "", DraftRateLimitHeaders, true, "Ratelimit"},
		{"admitted, no limit", "free", "", "", DraftRateLimitHeaders, true, ""},
		{"dropped, x-ratelimit", "blocked", "", "", XRateLimitHeaders, false, "X-Envoy-Ratelimited"},
		{"dropped gRPC, x-ratelimit", "blocked", "", "application/grpc", XRateLimitHeaders, false, "X-Ratelimit-Limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := s.Middleware(next, HTTPOptions{RateLimitHeaders: tc.form, TrustDecided: true})
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header.Set(DefaultCallerHeader, tc.caller)
			if tc.decided != "" {
				req.Header.Set(DecidedHeader, tc.decided)
			}
			if tc.ct != "" {
				req.Header.Set("Content-Type", tc.ct)
			}
			w := &discardWriter{h: http.Header{}}
			reached = 0
			if got := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, req) }); got != 0 {
				t.Errorf("%v allocations per request", got)
			}
			if (reached > 0) != tc.wantReached {
				t.Errorf("reached next %d times, want reached %v", reached, tc.wantReached)
			}
			if tc.wantHeader != "" && len(w.h[tc.wantHeader]) == 0 {
				t.Errorf("no %s in %v", tc.wantHeader, w.h)
			}
			if tc.wantHeader == "" && len(w.h) != 0 {
				t.Errorf("headers %v, want none", w.h)
			}
		})
	}
}

// fakeStream is a grpc.ServerTransportStream that keeps what it is given,
// uncopied, so that an allocation test counts only the interceptors' own.
type fakeStream struct{ header, trailer metadata.MD }

func (*fakeStream) Method() string                       { return "/grpc.health.v1.Health/Check" }
func (f *fakeStream) SetHeader(md metadata.MD) error     { f.header = md; return nil }
func (f *fakeStream) SendHeader(md metadata.MD) error    { f.header = md; return nil }
func (f *fakeStream) SetTrailer(md metadata.MD) error    { f.trailer = md; return nil }
func (f *fakeStream) reset()                             { f.header, f.trailer = nil, nil }
func (f *fakeStream) got() (header, trailer metadata.MD) { return f.header, f.trailer }

// The unary interceptor's headers cost no allocation of sluice's own: a call
// with them allocates what one without them does (reading the incoming
// metadata copies it), given a stream that keeps metadata uncopied. grpc-go's
// own stream copies it; see UnaryServerInterceptor.
func TestGRPCInterceptorRateLimitHeadersAllocs(t *testing.T) {
	s := allocPolicy()
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, tc := range []struct {
		caller      string
		wantHeader  string // a key the header metadata must have; "" for none
		wantTrailer string // a key the trailer metadata must have; "" for none
		wantCode    codes.Code
	}{
		{"steady", "x-ratelimit-remaining", "", codes.OK},
		{"blocked", "", "x-envoy-ratelimited", codes.ResourceExhausted},
	} {
		fs := &fakeStream{}
		ctx := grpc.NewContextWithServerTransportStream(
			metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultCallerHeader, tc.caller)), fs)
		allocs := map[RateLimitHeaders]float64{}
		for _, form := range []RateLimitHeaders{NoRateLimitHeaders, XRateLimitHeaders} {
			ic := s.UnaryServerInterceptor(GRPCOptions{RateLimitHeaders: form})
			var err error
			allocs[form] = testing.AllocsPerRun(1000, func() {
				fs.reset()
				_, err = ic(ctx, nil, nil, handler)
			})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("%s, %v: %v, want %v", tc.caller, form, err, tc.wantCode)
			}
		}
		if allocs[XRateLimitHeaders] != allocs[NoRateLimitHeaders] {
			t.Errorf("%s: %v allocations per call with headers, %v without", tc.caller, allocs[XRateLimitHeaders], allocs[NoRateLimitHeaders])
		}
		header, trailer := fs.got() // from the last call, with headers
		if tc.wantHeader != "" && len(header[tc.wantHeader]) != 1 || tc.wantHeader == "" && header != nil {
			t.Errorf("%s: header metadata %v, want %q", tc.caller, header, tc.wantHeader)
		}
		if tc.wantTrailer != "" && len(trailer[tc.wantTrailer]) != 1 || tc.wantTrailer == "" && trailer != nil {
			t.Errorf("%s: trailer metadata %v, want %q", tc.caller, trailer, tc.wantTrailer)
		}
	}
}

// An expired policy's fail mode keeps what requests are told: under
// dataplane.FailLocal a limited caller's bucket admits with the policy's headers and
// drops with a rejection rendered for its ratio of 0 (Retry-After 1) and
// x-envoy-ratelimited.
func TestRateLimitHeadersUnderFailLocal(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("checkout", Rule{Peer: "steady", LimitRPS: 1, AllowedRPS: 1, OfferedRPS: 0.4})
	p.FailMode, p.TTL, p.LiveInstances = dataplane.FailLocal, time.Second, 1
	now := time.Now()
	l.SetPolicyAt(p, now)
	l.Expire(now.Add(2 * time.Second))
	if st := l.Status("checkout"); st.State != Expired {
		t.Fatalf("policy %v, want expired", st.State)
	}
	h := l.Service("checkout").Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), HTTPOptions{RateLimitHeaders: DraftRateLimitHeaders})
	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set(DefaultCallerHeader, "steady")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	// The bucket holds one token (1 rps, at least one token).
	first, second := send(), send()
	if first.Code != http.StatusNoContent || second.Code != http.StatusTooManyRequests {
		t.Fatalf("statuses %d, %d; want 204 then 429", first.Code, second.Code)
	}
	checkHeaders(t, "admitted", first.Result().Header.Values,
		map[string]string{"Ratelimit-Policy": `"sluice";q=1;w=1`, "Ratelimit": `"sluice";r=0;t=1`})
	checkHeaders(t, "dropped", second.Result().Header.Values,
		map[string]string{"Retry-After": "1", "X-Envoy-Ratelimited": "true", "Ratelimit-Policy": `"sluice";q=1;w=1`, "Ratelimit": `"sluice";r=0;t=1`})
}

// The stream interceptor sends what the unary one does: at 0.5 the first
// Watch is dropped with x-envoy-ratelimited and Envoy's headers in its
// trailers, the second is admitted with them in its header metadata.
func TestGRPCStreamInterceptorRateLimitHeaders(t *testing.T) {
	_, s := headerPolicy()
	client := startHealthServer(t, s, GRPCOptions{RateLimitHeaders: XRateLimitHeaders})
	c := caseNamed(t, "ratio 0.5")
	watch := func() (header, trailer metadata.MD, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, c.caller)
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		_, err = stream.Recv() // the status of a drop, or the first message
		header, _ = stream.Header()
		return header, stream.Trailer(), err
	}
	_, trailer, err := watch()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("first Watch: %v, want RESOURCE_EXHAUSTED", err)
	}
	want := map[string]string{}
	for k, v := range c.drop[XRateLimitHeaders] {
		want[k] = v
	}
	delete(want, "Retry-After") // RetryInfo carries it
	delete(want, "Ratelimit")
	delete(want, "Ratelimit-Policy")
	checkHeaders(t, "dropped", mdGet(trailer), want)

	header, _, err := watch()
	if err != nil {
		t.Fatalf("second Watch: %v, want admitted", err)
	}
	checkHeaders(t, "admitted", mdGet(header), c.admit[XRateLimitHeaders])
}

// TestRateLimitHeadersNameTheBindingLevel: a leaf's rejection and its
// admitted responses name the bucket whose limit binds it (Rule.Bound) in
// RateLimit-Policy, RateLimit, the body of a 429 and the message of a
// RESOURCE_EXHAUSTED; the request path stays free of allocations.
func TestRateLimitHeadersNameTheBindingLevel(t *testing.T) {
	for _, tc := range []struct {
		bound      dropratio.Bound
		name, text string // the bucket, and what the body and message add
	}{
		{dropratio.BoundNone, "checkout/web/create-charge", ""},
		{dropratio.BoundLeaf, "checkout/web/create-charge", ""},
		{dropratio.BoundCaller, "checkout/web", " (bucket checkout/web: the limit of caller web across procedures)"},
		{dropratio.BoundProcedure, "checkout/*/create-charge", " (bucket checkout/*/create-charge: the capacity of procedure create-charge)"},
		{dropratio.BoundCallee, "checkout", " (bucket checkout: the capacity of service checkout)"},
		{dropratio.Bound(99), "checkout/web/create-charge", ""}, // a hand-built rule
	} {
		t.Run(tc.bound.String(), func(t *testing.T) {
			p := checkoutProcedures()
			for i := range p.Peers {
				if r := &p.Peers[i]; r.Peer == "web" && (r.Procedure == "create-charge" || r.Procedure == "get-item") {
					r.Bound = tc.bound
				}
			}
			l := NewLimiter(LimiterOptions{})
			l.SetPolicy(p)
			h := l.Service("checkout").Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
				HTTPOptions{RateLimitHeaders: DraftRateLimitHeaders})

			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
			req.Header.Set(DefaultCallerHeader, "web")
			h.ServeHTTP(rec, req)
			want := "request from caller web to procedure create-charge of service checkout" + tc.text + " was rate limited by sluice\n"
			if rec.Code != http.StatusTooManyRequests || rec.Body.String() != want {
				t.Errorf("got %d %q, want 429 %q", rec.Code, rec.Body, want)
			}
			checkHeaders(t, "drop", rec.Header().Values, map[string]string{
				"Ratelimit-Policy": `"` + tc.name + `";q=50;w=1`, "Ratelimit": `"` + tc.name + `";r=0;t=53`,
				"Retry-After": "53", "X-Envoy-Ratelimited": "true"})

			// An admitted request: get-item, with the same bound.
			admitName := strings.ReplaceAll(tc.name, "create-charge", "get-item")
			rec = httptest.NewRecorder()
			req = httptest.NewRequest(http.MethodGet, "/v1/items/7", nil)
			req.Header.Set(DefaultCallerHeader, "web")
			h.ServeHTTP(rec, req)
			checkHeaders(t, "admit", rec.Header().Values, map[string]string{
				"Ratelimit-Policy": `"` + admitName + `";q=100;w=1`, "Ratelimit": `"` + admitName + `";r=90;t=1`})
			w := &discardWriter{h: http.Header{}}
			if got := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, req) }); got != 0 {
				t.Errorf("%v allocations per admitted request", got)
			}

			r := p.Leaf("web", "create-charge")
			msg := status.Convert(renderGRPC("checkout", r, 53)).Message()
			if want := "call from caller web to procedure create-charge of service checkout" + tc.text + " was rate limited by sluice"; msg != want {
				t.Errorf("gRPC message %q, want %q", msg, want)
			}
		})
	}
}
