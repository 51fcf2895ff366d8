package agent

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/sidecar/rls"
)

// RLSConfig is the sidecar's Envoy rate limit service (sidecar/rls): off
// unless Listen is set.
type RLSConfig struct {
	// Listen is the address the rate limit service's gRPC port listens
	// on; "" serves none.
	Listen string
	// Domain is the domain Envoy's ratelimit filter sends for this
	// sidecar's service; "" means Service.
	Domain string
	// CallerKey, ProcedureKey, MethodKey and TierKey are the descriptor
	// entry keys of the caller, the request's path (or gRPC full method),
	// its HTTP method and its tier header's value; "" leaves the last
	// three out.
	CallerKey, ProcedureKey, MethodKey, TierKey string
	// DescriptorKeys maps a policy descriptor's name to the entry key of
	// its value, when that is not its name.
	DescriptorKeys map[string]string
	// Headers has responses carry x-ratelimit-limit, -remaining and
	// -reset, as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED.
	Headers bool
}

// defaultRLS is RLSConfig's defaults: the keys Envoy's actions give.
func defaultRLS() RLSConfig {
	m := rls.DefaultMapping("")
	return RLSConfig{CallerKey: m.CallerKey, ProcedureKey: m.ProcedureKey, MethodKey: m.MethodKey}
}

// mapping is the service's Mapping for the sidecar of service.
func (r RLSConfig) mapping(service string) rls.Mapping {
	domain := r.Domain
	if domain == "" {
		domain = service
	}
	return rls.Mapping{Domain: domain, CallerKey: r.CallerKey, ProcedureKey: r.ProcedureKey, MethodKey: r.MethodKey,
		TierKey: r.TierKey, Descriptors: r.DescriptorKeys, Headers: r.Headers}
}

// rlsFlags are the flag names of Mapping's fields, for Validate's errors.
var rlsFlags = strings.NewReplacer("Domain:", "rls-domain:", "CallerKey:", "rls-caller-key:", "ProcedureKey:", "rls-procedure-key:",
	"MethodKey:", "rls-method-key:", "TierKey:", "rls-tier-key:", "Descriptors:", "rls-descriptor-keys:",
	"is CallerKey's", "is rls-caller-key's", "is ProcedureKey's", "is rls-procedure-key's", "is MethodKey's", "is rls-method-key's",
	"is TierKey's", "is rls-tier-key's")

// validate checks the rate limit service's settings, by flag name; none
// when it is off.
func (r RLSConfig) validate(service string) []error {
	if r.Listen == "" {
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(r.Listen); err != nil {
		errs = append(errs, fmt.Errorf("rls-listen: %q is not host:port", r.Listen))
	}
	if err := r.mapping(service).Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			errs = append(errs, errors.New(rlsFlags.Replace(line)))
		}
	}
	return errs
}

// addRLSFlags adds the rate limit service's flags.
func addRLSFlags(f *pflag.FlagSet, r *RLSConfig) {
	f.StringVar(&r.Listen, "rls-listen", r.Listen, "address of Envoy's rate limit service (envoy.service.ratelimit.v3, gRPC), answered from the local limiter, e.g. 127.0.0.1:8081; empty: off")
	f.StringVar(&r.Domain, "rls-domain", r.Domain, "the rate limit request domain that names this sidecar's service; empty: --service. Other domains are answered OK, no limit")
	f.StringVar(&r.CallerKey, "rls-caller-key", r.CallerKey, "descriptor entry key that names the caller (Envoy's source_cluster action)")
	f.StringVar(&r.ProcedureKey, "rls-procedure-key", r.ProcedureKey, "descriptor entry key of the request's path or gRPC full method (a request_headers action on :path); empty: none")
	f.StringVar(&r.MethodKey, "rls-method-key", r.MethodKey, "descriptor entry key of the request's HTTP method (a request_headers action on :method); empty: none")
	f.StringVar(&r.TierKey, "rls-tier-key", r.TierKey, "descriptor entry key of the request's criticality tier; empty: none")
	f.StringToStringVar(&r.DescriptorKeys, "rls-descriptor-keys", r.DescriptorKeys, "descriptor=key pairs: the entry key that carries a policy descriptor's value, when it is not the descriptor's name (tenant=tenant_id)")
	f.BoolVar(&r.Headers, "rls-headers", r.Headers, "have rate limit responses add x-ratelimit-limit, x-ratelimit-remaining and x-ratelimit-reset, as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED")
}

// RLSServer is the rate limit service's gRPC server, nil when it is off.
func (a *Agent) RLSServer() *grpc.Server {
	if a.rls == nil {
		return nil
	}
	g := grpc.NewServer(rls.ServerOptions()...)
	a.rls.Register(g)
	return g
}
