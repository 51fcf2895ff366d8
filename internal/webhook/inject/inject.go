// Package inject adds the sluice sidecar to a Kubernetes Pod. It is the pure
// half of the injection webhook: a Pod and the injector's settings in, an
// RFC 6902 JSON patch (or a denial naming the bad annotation) out. No I/O,
// no clocks, no logging; internal/webhook serves it over HTTPS.
//
// The sidecar is a native sidecar (an init container with restartPolicy
// Always, Kubernetes 1.29 and later): it starts before the app's containers
// and stops after them.
//
// How requests reach it, without iptables: the sidecar listens on its proxy
// port (DefaultProxyPort unless the injector or the pod says otherwise)
// and, in the default mode "takeover", takes over the name of the app's
// container port. A Service whose targetPort names that port ("http") then
// sends its traffic to the sidecar, which proxies to the app on 127.0.0.1;
// a pod without the sidecar (opted out, or created while the injector was
// down) still serves the same name from the app itself. A Service whose
// targetPort is a number bypasses the sidecar: name it. In mode "explicit"
// nothing of the app is touched and the sidecar's port is named
// ProxyPortName: point the Service's targetPort at it.
//
// This package must stay out of the sidecar's request path: the sidecar
// binary never imports it, so the Kubernetes libraries it needs never reach
// the data plane (internal/deptest holds that rule).
package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Annotations and labels the injector reads and writes.
const (
	// Inject, as a pod annotation or label, is "true" (opt in) or "false"
	// (opt out). As a namespace label its value Enabled opts every pod of
	// the namespace in. Only the label can make the API server call the
	// webhook for a single pod outside an enabled namespace: admission
	// webhooks select objects by label, never by annotation.
	Inject = "sluice.io/inject"
	// Enabled is the namespace label value that opts a namespace in.
	Enabled = "enabled"

	// Service names the service the pod serves; default: the pod's
	// NameLabel label.
	Service = "sluice.io/service"
	// NameLabel is the recommended Kubernetes label the service name
	// defaults to.
	NameLabel = "app.kubernetes.io/name"
	// AppPort is the app's port: a number or the name of a container port.
	// Default: the first TCP port of the first container that has one.
	AppPort = "sluice.io/app-port"
	// Mode is how requests reach the sidecar: ModeTakeover (default) or
	// ModeExplicit. Whether drops are enforced or only counted (shadow) is
	// not a pod's choice: it belongs to the limit, so that every replica of
	// a service agrees on it (`configurator shadow`).
	Mode = "sluice.io/mode"
	// Strategy is the sidecar's --strategy: diffuse or random.
	Strategy = "sluice.io/strategy"
	// Resource requests and limits of the sidecar container.
	CPURequest    = "sluice.io/cpu-request"
	MemoryRequest = "sluice.io/memory-request"
	CPULimit      = "sluice.io/cpu-limit"
	MemoryLimit   = "sluice.io/memory-limit"
	// ProxyPortAnnotation and AdminPortAnnotation move the sidecar's two
	// ports for one pod, as the resource annotations override the
	// injector's defaults: for an app that already uses a default port.
	ProxyPortAnnotation = "sluice.io/proxy-port"
	AdminPortAnnotation = "sluice.io/admin-port"
	// CallerIdentityAnnotation and TrustDecidedAnnotation override the
	// injector's --sidecar-caller-identity (IdentityHeader, IdentityXFCC or
	// IdentityMTLS) and --sidecar-trust-decided ("true" or "false") for
	// one pod: the sidecar's --caller-identity and --trust-decided.
	CallerIdentityAnnotation = "sluice.io/caller-identity"
	TrustDecidedAnnotation   = "sluice.io/trust-decided"

	// Status is written by the injector on the pods it changed: what it did,
	// as JSON.
	Status = "sluice.io/status"
	// SidecarLabel, with the value Injected, marks the pods the injector
	// changed: the label the sidecars' PodMonitor and the NetworkPolicies
	// that let sidecars reach the aggregators and controllers select on.
	SidecarLabel = "sluice.io/sidecar"
	Injected     = "injected"
)

// Modes of Mode.
const (
	ModeTakeover = "takeover"
	ModeExplicit = "explicit"
)

// Caller identity modes: the sidecar's --caller-identity values.
const (
	// IdentityHeader believes the caller header: any client that reaches
	// the port can name any caller.
	IdentityHeader = "header"
	// IdentityXFCC reads the SPIFFE ID the pod's own proxy (Istio's Envoy)
	// appended to x-forwarded-client-cert after verifying the caller's
	// certificate; the header is believed only from XFCCTrustedProxies.
	IdentityXFCC = "xfcc"
	// IdentityMTLS serves the sidecar's port with TLS and reads the
	// client certificate: callers must dial it with TLS and a certificate
	// of the trust domain, so it needs sidecar certificates (Config.TLS).
	IdentityMTLS = "mtls"
)

// XFCCTrustedProxies is the sidecar's default --trusted-proxies, which the
// injector passes in xfcc mode too, so that the pod shows what its sidecar
// believes: loopback, and the addresses Istio's Envoy connects to the
// pod's ports from. Since Istio 1.10 inbound traffic goes to the pod's IP,
// from the source address 127.0.0.6 (::6 over IPv6), which iptables lets
// through instead of sending it back to Envoy; loopback alone would not
// believe it. Only processes of the pod can use these addresses: a TCP peer
// elsewhere can not complete a handshake from them.
var XFCCTrustedProxies = []string{"127.0.0.1/32", "::1/128", "127.0.0.6/32", "::6/128"}

// The injected container and its ports.
const (
	ContainerName = "sluice-sidecar"
	// DefaultProxyPort and DefaultAdminPort are the injector's default
	// ports for the sidecar's proxy and its /metrics, /healthz, /readyz.
	// They follow sluice's own numbering (18000 and 19000 the controller's,
	// 18100 and 19100 the aggregators', 19200 the injector's admin) and are
	// none of IstioPorts, so that a pod can carry both sidecars. The sidecar
	// binary's own defaults (15001, 15020) are for running it outside
	// Kubernetes; the injector always passes the ports it chose.
	DefaultProxyPort = 18300
	DefaultAdminPort = 19300
	ProxyPortName    = "sluice-proxy"
	AdminPortName    = "sluice-admin"
	// UID is the sidecar's user and group: distroless's "nonroot".
	UID = 65532
)

// IstioPorts are the ports Istio's sidecar (Envoy and pilot-agent) listens
// on in every pod it joins, as its application requirements list them
// (https://istio.io/latest/docs/ops/deployment/application-requirements/).
// Istio does not declare them as container ports, so the injector can not
// see them in the pod: it refuses them only in pods that show Istio's
// sidecar, and the defaults avoid them.
var IstioPorts = []int32{15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090}

// istioContainer and istioStatus mark a pod Istio's injector has already
// changed.
const (
	istioContainer = "istio-proxy"
	istioStatus    = "sidecar.istio.io/status"
)

// Env is the environment variable of the sidecar binary's flag, as
// internal/cli names it: SLUICE_SIDECAR_<FLAG>.
func Env(flag string) string {
	return "SLUICE_SIDECAR_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Config is the injector's side of the injection: what every sidecar gets.
type Config struct {
	// Image of the sidecar binary. Required.
	Image string
	// PullPolicy of Image; empty means IfNotPresent.
	PullPolicy corev1.PullPolicy
	// Aggregators and Controllers are the sidecar's --aggregators and
	// --controllers: in Kubernetes, one Service name each. The aggregator
	// Service routes to the pod's own zone (trafficDistribution), and the
	// aggregator stamps its zone on every report, so the sidecar needs no
	// --zone of its own.
	Aggregators []string
	Controllers []string
	// ControllerShards is the sidecar's --controller-shards, passed when
	// above 1: the shard count it assumes at start when Controllers name
	// "{shard}" (it follows the count the shards announce).
	ControllerShards int
	// CallerHeader is the sidecar's --caller-header; empty leaves its
	// default.
	CallerHeader string
	// Default resources of the sidecar container, as quantities; an empty
	// string sets none. Pods override each with an annotation.
	CPURequest, MemoryRequest, CPULimit, MemoryLimit string
	// ProxyPort and AdminPort are the sidecar's default ports (1-65535, two
	// different ones; DefaultProxyPort and DefaultAdminPort unless the
	// injector's flags say otherwise). Pods override each with an
	// annotation.
	ProxyPort, AdminPort int32
	// CallerIdentity is the sidecars' default --caller-identity
	// (IdentityHeader, IdentityXFCC or IdentityMTLS; empty means
	// IdentityHeader), and TrustDecided their --trust-decided. Pods
	// override each with an annotation.
	CallerIdentity string
	TrustDecided   bool
	// TLS says that sidecars get certificates (internal/webhook adds them
	// with a trust domain): IdentityMTLS needs them.
	TLS bool
}

// Validate reports every bad field at once.
func (c Config) Validate() error {
	var errs []error
	if c.Image == "" {
		errs = append(errs, errors.New("sidecar-image: required"))
	}
	switch c.PullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("sidecar-image-pull-policy: %q is not Always, IfNotPresent or Never", c.PullPolicy))
	}
	for _, l := range []struct {
		flag  string
		addrs []string
	}{{"aggregators", c.Aggregators}, {"controllers", c.Controllers}} {
		if len(l.addrs) == 0 {
			errs = append(errs, fmt.Errorf("%s: at least one address is required", l.flag))
		}
		for i, a := range l.addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %q is not host:port", l.flag, i, a))
			}
		}
	}
	if c.ControllerShards < 0 || c.ControllerShards > shard.MaxCount {
		errs = append(errs, fmt.Errorf("controller-shards: %d is not in [0, %d]", c.ControllerShards, shard.MaxCount))
	}
	var r resources
	for _, q := range []struct {
		flag, value string
		into        *resource.Quantity
	}{{"sidecar-cpu-request", c.CPURequest, &r.cpuReq}, {"sidecar-memory-request", c.MemoryRequest, &r.memReq},
		{"sidecar-cpu-limit", c.CPULimit, &r.cpuLim}, {"sidecar-memory-limit", c.MemoryLimit, &r.memLim}} {
		if err := parseQuantity(q.value, q.into); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", q.flag, err))
		}
	}
	for _, p := range r.check("sidecar-cpu-request", "sidecar-cpu-limit", "sidecar-memory-request", "sidecar-memory-limit") {
		errs = append(errs, errors.New(p.String()))
	}
	for _, p := range []struct {
		flag string
		port int32
	}{{"sidecar-proxy-port", c.ProxyPort}, {"sidecar-admin-port", c.AdminPort}} {
		if p.port < 1 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a port number (1-65535)", p.flag, p.port))
		}
	}
	if c.ProxyPort == c.AdminPort {
		errs = append(errs, fmt.Errorf("sidecar-admin-port: %d is also sidecar-proxy-port; the sidecar needs two ports", c.AdminPort))
	}
	if msg := c.checkIdentity(c.CallerIdentity); msg != "" {
		errs = append(errs, errors.New("sidecar-caller-identity: "+msg))
	}
	return errors.Join(errs...)
}

// checkIdentity says what is wrong with mode as a caller identity for this
// injector, or "".
func (c Config) checkIdentity(mode string) string {
	switch mode {
	case "", IdentityHeader, IdentityXFCC:
		return ""
	case IdentityMTLS:
		if !c.TLS {
			return "mtls needs sidecar certificates, which the injector gives only with --sidecar-trust-domain"
		}
		return ""
	}
	return fmt.Sprintf("%q is not %s, %s or %s", mode, IdentityHeader, IdentityXFCC, IdentityMTLS)
}

// Scope says why the webhook is asked about a pod: the API server calls it
// for pods that carry the Inject label (ScopePod) and for every pod of a
// namespace labelled Inject=enabled (ScopeNamespace).
type Scope int

const (
	// ScopePod injects only pods that opt in themselves.
	ScopePod Scope = iota
	// ScopeNamespace injects every pod that does not opt out.
	ScopeNamespace
)

// Operation is one RFC 6902 operation.
type Operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Result is what Pod decided.
type Result struct {
	// Patch is nil when the pod is left alone.
	Patch []Operation
	// Skipped says why the pod is left alone.
	Skipped string
	// Warnings are shown to the user who created the pod (kubectl prints
	// them): injection happened, but something may not work as they think.
	Warnings []string
	// Service is the service name the sidecar was given.
	Service string
}

// Problem is one reason to deny a pod: where (an annotation, or a field
// path) and what.
type Problem struct {
	Where   string
	Message string
}

func (p Problem) String() string { return p.Where + ": " + p.Message }

// DenyError lists every problem of a pod at once.
type DenyError struct{ Problems []Problem }

func (e *DenyError) Error() string {
	s := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		s[i] = p.String()
	}
	return "sluice sidecar injection: " + strings.Join(s, "; ")
}

// Pod decides what to do with pod and returns the patch that injects the
// sidecar, or why it left the pod alone, or a *DenyError. It does not change
// pod. cfg must be valid.
func Pod(pod *corev1.Pod, scope Scope, cfg Config) (Result, error) {
	want, problems := optIn(pod, scope)
	if len(problems) > 0 {
		return Result{}, &DenyError{problems}
	}
	if want != "" {
		return Result{Skipped: want}, nil
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == ContainerName {
			return Result{Skipped: "the sidecar is already there"}, nil
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerName {
			return Result{Skipped: "the sidecar is already there"}, nil
		}
	}
	if pod.Spec.HostNetwork {
		msg := "the pod uses the host's network, where the sidecar's ports would be the node's"
		return Result{Skipped: msg, Warnings: []string{"sluice: not injected: " + msg}}, nil
	}

	p := &plan{pod: pod, cfg: cfg}
	p.read()
	if len(p.problems) > 0 {
		return Result{}, &DenyError{p.problems}
	}
	return p.build()
}

// optIn returns why the pod is skipped ("" to inject) and any bad value.
func optIn(pod *corev1.Pod, scope Scope) (skip string, problems []Problem) {
	value := ""
	for _, src := range []struct {
		kind string
		m    map[string]string
	}{{"label", pod.Labels}, {"annotation", pod.Annotations}} { // the annotation wins
		v, ok := src.m[Inject]
		if !ok {
			continue
		}
		if v != "true" && v != "false" {
			problems = append(problems, Problem{Inject, fmt.Sprintf("%s value %q is not \"true\" or \"false\"", src.kind, v)})
			continue
		}
		value = v
	}
	switch {
	case len(problems) > 0:
		return "", problems
	case value == "false":
		return "the pod opted out (" + Inject + ": \"false\")", nil
	case value == "" && scope == ScopePod:
		return "the pod did not opt in and its namespace is not " + Inject + "=" + Enabled, nil
	}
	return "", nil
}

// plan holds what read found out about the pod.
type plan struct {
	pod      *corev1.Pod
	cfg      Config
	problems []Problem

	service  string
	mode     string
	strategy string
	res      resources
	// proxyPort and adminPort are the sidecar's: the injector's, or the
	// pod's annotations.
	proxyPort, adminPort int32
	// callerIdentity and trustDecided likewise.
	callerIdentity string
	trustDecided   bool

	appPort int32
	// appContainer and appPortIndex locate the declared app port, or -1.
	appContainer, appPortIndex int
	appPortName                string
}

func (p *plan) deny(where, format string, args ...any) {
	p.problems = append(p.problems, Problem{where, fmt.Sprintf(format, args...)})
}

func (p *plan) read() {
	ann := p.pod.Annotations

	// Service name: the annotation, else the recommended name label.
	svc, fromAnn := ann[Service]
	where := Service
	if !fromAnn {
		svc = p.pod.Labels[NameLabel]
		where = Service + " (defaulted from the label " + NameLabel + ")"
	}
	p.service = svc
	switch {
	case svc == "" && fromAnn:
		p.deny(Service, "empty service name")
	case svc == "":
		p.deny(Service, "required: set it, or the pod label %s, to the name of the service this pod serves", NameLabel)
	case svc == names.Overflow:
		p.deny(where, "%q is reserved", svc)
	default:
		if err := names.Check(svc); err != nil {
			p.deny(where, "%v", err)
		}
	}

	// Mode and strategy.
	switch p.mode = ann[Mode]; p.mode {
	case "":
		p.mode = ModeTakeover
	case ModeTakeover, ModeExplicit:
	default:
		p.deny(Mode, "%q is not %q or %q", p.mode, ModeTakeover, ModeExplicit)
	}
	switch p.strategy = ann[Strategy]; p.strategy {
	case "", "diffuse", "random":
	default:
		p.deny(Strategy, "%q is not \"diffuse\" or \"random\"", p.strategy)
	}

	// Resources: the injector's defaults, then the pod's annotations.
	for _, q := range []struct {
		ann, def string
		into     *resource.Quantity
	}{{CPURequest, p.cfg.CPURequest, &p.res.cpuReq}, {MemoryRequest, p.cfg.MemoryRequest, &p.res.memReq},
		{CPULimit, p.cfg.CPULimit, &p.res.cpuLim}, {MemoryLimit, p.cfg.MemoryLimit, &p.res.memLim}} {
		v, ok := ann[q.ann]
		if !ok {
			v = q.def
		} else if v == "" {
			p.deny(q.ann, "empty quantity")
			continue
		}
		if err := parseQuantity(v, q.into); err != nil {
			p.deny(q.ann, "%v", err)
		}
	}
	p.problems = append(p.problems, p.res.check(CPURequest, CPULimit, MemoryRequest, MemoryLimit)...)

	p.readIdentity()
	p.readSidecarPorts()
	p.readPorts()
}

// readIdentity sets who the sidecar believes the caller is, and whether it
// trusts decided marks: the injector's, or the pod's annotations.
func (p *plan) readIdentity() {
	p.callerIdentity = p.cfg.CallerIdentity
	if v, set := p.pod.Annotations[CallerIdentityAnnotation]; set {
		p.callerIdentity = v
		if v == "" {
			p.deny(CallerIdentityAnnotation, "empty; want %s, %s or %s", IdentityHeader, IdentityXFCC, IdentityMTLS)
		} else if msg := p.cfg.checkIdentity(v); msg != "" {
			p.deny(CallerIdentityAnnotation, "%s", msg)
		}
	}
	if p.callerIdentity == "" {
		p.callerIdentity = IdentityHeader
	}
	p.trustDecided = p.cfg.TrustDecided
	switch v, set := p.pod.Annotations[TrustDecidedAnnotation]; {
	case !set:
	case v == "true" || v == "false":
		p.trustDecided = v == "true"
	default:
		p.deny(TrustDecidedAnnotation, "%q is not \"true\" or \"false\"", v)
	}
}

// readSidecarPorts sets the sidecar's two ports: the injector's, or the
// pod's annotations.
func (p *plan) readSidecarPorts() {
	ok := true
	for _, sp := range []struct {
		ann  string
		def  int32
		into *int32
	}{{ProxyPortAnnotation, p.cfg.ProxyPort, &p.proxyPort}, {AdminPortAnnotation, p.cfg.AdminPort, &p.adminPort}} {
		v, set := p.pod.Annotations[sp.ann]
		if !set {
			*sp.into = sp.def
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			p.deny(sp.ann, "%q is not a port number (1-65535)", v)
			ok = false
			continue
		}
		*sp.into = int32(n)
	}
	if ok && p.proxyPort == p.adminPort {
		where := AdminPortAnnotation
		if _, set := p.pod.Annotations[where]; !set {
			where = ProxyPortAnnotation
		}
		p.deny(where, "the proxy and admin ports are both %d; the sidecar needs two ports", p.proxyPort)
	}
	if !ok || !p.hasIstio() {
		return
	}
	// Istio's sidecar is in the pod already and listens on its ports
	// without declaring them: the clash would only show as a sidecar that
	// can not bind and restarts.
	for _, sp := range []struct {
		ann, flag string
		port      int32
	}{{ProxyPortAnnotation, "--sidecar-proxy-port", p.proxyPort}, {AdminPortAnnotation, "--sidecar-admin-port", p.adminPort}} {
		if !slices.Contains(IstioPorts, sp.port) {
			continue
		}
		from := "this annotation"
		if _, set := p.pod.Annotations[sp.ann]; !set {
			from = "the injector's " + sp.flag
		}
		p.deny(sp.ann, "port %d (from %s) is one Istio's sidecar, which this pod has, listens on; set %s to a port outside %v",
			sp.port, from, sp.ann, IstioPorts)
	}
}

// hasIstio says whether Istio's injector has already added its sidecar.
func (p *plan) hasIstio() bool {
	if _, ok := p.pod.Annotations[istioStatus]; ok {
		return true
	}
	for _, c := range slices.Concat(p.pod.Spec.InitContainers, p.pod.Spec.Containers) {
		if c.Name == istioContainer {
			return true
		}
	}
	return false
}

// readPorts finds the app port and checks that the sidecar's ports are free.
func (p *plan) readPorts() {
	p.appContainer, p.appPortIndex = -1, -1
	spec := &p.pod.Spec
	v, set := p.pod.Annotations[AppPort]
	switch n, err := strconv.Atoi(v); {
	case !set:
		for i, c := range spec.Containers {
			for j, port := range c.Ports {
				if isTCP(port) {
					p.appContainer, p.appPortIndex, p.appPort = i, j, port.ContainerPort
					break
				}
			}
			if p.appContainer >= 0 {
				break
			}
		}
		if p.appContainer < 0 {
			p.deny(AppPort, "required: no container declares a TCP port; set it to the port the app listens on")
			return
		}
	case err == nil:
		if n < 1 || n > 65535 {
			p.deny(AppPort, "%q is not a port number (1-65535)", v)
			return
		}
		p.appPort = int32(n)
		p.appContainer, p.appPortIndex = findPort(spec.Containers, func(cp corev1.ContainerPort) bool {
			return cp.ContainerPort == p.appPort && isTCP(cp)
		})
	default:
		p.appContainer, p.appPortIndex = findPort(spec.Containers, func(cp corev1.ContainerPort) bool {
			return cp.Name == v && isTCP(cp)
		})
		if p.appContainer < 0 {
			p.deny(AppPort, "%q is neither a port number (1-65535) nor the name of a container's TCP port", v)
			return
		}
		p.appPort = spec.Containers[p.appContainer].Ports[p.appPortIndex].ContainerPort
	}
	if p.appContainer >= 0 {
		p.appPortName = spec.Containers[p.appContainer].Ports[p.appPortIndex].Name
	}
	if p.appPort == p.proxyPort || p.appPort == p.adminPort {
		p.deny(AppPort, "the app's port %d is one the sidecar listens on (%d proxy, %d admin; %s and %s move them)",
			p.appPort, p.proxyPort, p.adminPort, ProxyPortAnnotation, AdminPortAnnotation)
	}

	// The sidecar shares the pod's network namespace: its ports and port
	// names must be free.
	for _, list := range []struct {
		field string
		cs    []corev1.Container
	}{{"spec.initContainers", spec.InitContainers}, {"spec.containers", spec.Containers}} {
		for i, c := range list.cs {
			for j, port := range c.Ports {
				field := fmt.Sprintf("%s[%d].ports[%d]", list.field, i, j)
				if (port.ContainerPort == p.proxyPort || port.ContainerPort == p.adminPort) && port.ContainerPort != p.appPort {
					p.deny(field, "container %q declares port %d, which the sluice sidecar listens on (%s and %s move it)",
						c.Name, port.ContainerPort, ProxyPortAnnotation, AdminPortAnnotation)
				}
				if port.Name == ProxyPortName || port.Name == AdminPortName {
					p.deny(field, "container %q has a port named %q, a name the sluice sidecar uses", c.Name, port.Name)
				}
			}
		}
	}
}

func isTCP(p corev1.ContainerPort) bool { return p.Protocol == "" || p.Protocol == corev1.ProtocolTCP }

func findPort(cs []corev1.Container, match func(corev1.ContainerPort) bool) (int, int) {
	for i, c := range cs {
		for j, port := range c.Ports {
			if match(port) {
				return i, j
			}
		}
	}
	return -1, -1
}

// build turns a plan without problems into the patch.
func (p *plan) build() (Result, error) {
	res := Result{Service: p.service}
	proxyName := ProxyPortName
	takeover := ""
	switch {
	case p.mode == ModeExplicit:
	case p.appContainer < 0:
		res.Warnings = append(res.Warnings, fmt.Sprintf(
			"sluice: no container declares port %d, so there is no port name for the sidecar to take over: "+
				"point the Service's targetPort at %q (%d), or requests bypass the sidecar", p.appPort, ProxyPortName, p.proxyPort))
	case p.appPortName == "":
		res.Warnings = append(res.Warnings, fmt.Sprintf(
			"sluice: port %d of container %q has no name, so there is none for the sidecar to take over: "+
				"name it and target the name from the Service, or point the targetPort at %q (%d); "+
				"a Service targeting %d bypasses the sidecar", p.appPort, p.pod.Spec.Containers[p.appContainer].Name,
			ProxyPortName, p.proxyPort, p.appPort))
	default:
		takeover = p.appPortName
		proxyName = takeover
		res.Patch = append(res.Patch, p.releasePortName()...)
	}

	if p.callerIdentity == IdentityMTLS && p.hasIstio() {
		res.Warnings = append(res.Warnings, fmt.Sprintf(
			"sluice: %s mtls: the sidecar's port %d serves TLS and requires a client certificate, and Istio's Envoy forwards "+
				"what callers send: a caller that does not dial it with TLS and a sluice certificate fails; under Istio choose %s",
			CallerIdentityAnnotation, p.proxyPort, IdentityXFCC))
	}

	c := p.container(proxyName)
	if len(p.pod.Spec.InitContainers) == 0 {
		res.Patch = append(res.Patch, Operation{"add", "/spec/initContainers", []corev1.Container{c}})
	} else {
		res.Patch = append(res.Patch, Operation{"add", "/spec/initContainers/-", c})
	}

	status, err := json.Marshal(struct {
		Service        string `json:"service"`
		AppPort        int32  `json:"appPort"`
		ProxyPort      int32  `json:"proxyPort"`
		AdminPort      int32  `json:"adminPort"`
		Mode           string `json:"mode"`
		Takeover       string `json:"takeover,omitempty"`
		CallerIdentity string `json:"callerIdentity"`
		TrustDecided   bool   `json:"trustDecided"`
	}{p.service, p.appPort, p.proxyPort, p.adminPort, p.mode, takeover, p.callerIdentity, p.trustDecided})
	if err != nil {
		return Result{}, fmt.Errorf("encode status: %w", err)
	}
	if len(p.pod.Annotations) == 0 { // absent or empty: add the whole map
		res.Patch = append(res.Patch, Operation{"add", "/metadata/annotations", map[string]string{Status: string(status)}})
	} else {
		res.Patch = append(res.Patch, Operation{"add", "/metadata/annotations/" + escape(Status), string(status)})
	}
	if len(p.pod.Labels) == 0 {
		res.Patch = append(res.Patch, Operation{"add", "/metadata/labels", map[string]string{SidecarLabel: Injected}})
	} else {
		res.Patch = append(res.Patch, Operation{"add", "/metadata/labels/" + escape(SidecarLabel), Injected})
	}
	return res, nil
}

// releasePortName removes the app port's name, so that the sidecar can carry
// it, and points the app container's own probes and hooks that used the
// name at the number instead (a probe resolves a port name in its own
// container only).
func (p *plan) releasePortName() []Operation {
	i, name := p.appContainer, p.appPortName
	c := &p.pod.Spec.Containers[i]
	base := fmt.Sprintf("/spec/containers/%d", i)
	ops := []Operation{{Op: "remove", Path: fmt.Sprintf("%s/ports/%d/name", base, p.appPortIndex)}}
	num := intstr.FromInt32(p.appPort)
	named := func(v intstr.IntOrString) bool { return v.Type == intstr.String && v.StrVal == name }
	for _, probe := range []struct {
		field string
		p     *corev1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
		if probe.p == nil {
			continue
		}
		if h := probe.p.HTTPGet; h != nil && named(h.Port) {
			ops = append(ops, Operation{"replace", base + "/" + probe.field + "/httpGet/port", num})
		}
		if s := probe.p.TCPSocket; s != nil && named(s.Port) {
			ops = append(ops, Operation{"replace", base + "/" + probe.field + "/tcpSocket/port", num})
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, hook := range []struct {
			field string
			h     *corev1.LifecycleHandler
		}{{"postStart", l.PostStart}, {"preStop", l.PreStop}} {
			if hook.h == nil {
				continue
			}
			if h := hook.h.HTTPGet; h != nil && named(h.Port) {
				ops = append(ops, Operation{"replace", base + "/lifecycle/" + hook.field + "/httpGet/port", num})
			}
			if s := hook.h.TCPSocket; s != nil && named(s.Port) {
				ops = append(ops, Operation{"replace", base + "/lifecycle/" + hook.field + "/tcpSocket/port", num})
			}
		}
	}
	return ops
}

// container is the sidecar.
func (p *plan) container(proxyName string) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	pull := p.cfg.PullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}
	env := []corev1.EnvVar{
		{Name: Env("service"), Value: p.service},
		// The pod's name is the sidecar's id: unique while it runs, and the
		// name an operator looks for.
		{Name: Env("id"), ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: Env("upstream"), Value: "http://127.0.0.1:" + strconv.Itoa(int(p.appPort))},
		// Always passed: the sidecar binary's own defaults are not the
		// injector's.
		{Name: Env("listen"), Value: ":" + strconv.Itoa(int(p.proxyPort))},
		{Name: Env("admin-addr"), Value: ":" + strconv.Itoa(int(p.adminPort))},
		{Name: Env("aggregators"), Value: strings.Join(p.cfg.Aggregators, ",")},
		{Name: Env("controllers"), Value: strings.Join(p.cfg.Controllers, ",")},
		{Name: Env("log-format"), Value: "json"},
	}
	if p.cfg.ControllerShards > 1 {
		env = append(env, corev1.EnvVar{Name: Env("controller-shards"), Value: strconv.Itoa(p.cfg.ControllerShards)})
	}
	if p.strategy != "" {
		env = append(env, corev1.EnvVar{Name: Env("strategy"), Value: p.strategy})
	}
	if p.cfg.CallerHeader != "" {
		env = append(env, corev1.EnvVar{Name: Env("caller-header"), Value: p.cfg.CallerHeader})
	}
	// Both said explicitly, so that the pod shows what its sidecar trusts.
	env = append(env,
		corev1.EnvVar{Name: Env("caller-identity"), Value: p.callerIdentity},
		corev1.EnvVar{Name: Env("trust-decided"), Value: strconv.FormatBool(p.trustDecided)})
	if p.callerIdentity == IdentityXFCC {
		env = append(env, corev1.EnvVar{Name: Env("trusted-proxies"), Value: strings.Join(XFCCTrustedProxies, ",")})
	}
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromInt32(p.adminPort), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds: period, TimeoutSeconds: 1, FailureThreshold: failures, SuccessThreshold: 1,
		}
	}
	uid := int64(UID)
	return corev1.Container{
		Name:            ContainerName,
		Image:           p.cfg.Image,
		ImagePullPolicy: pull,
		RestartPolicy:   &always,
		Ports: []corev1.ContainerPort{
			{Name: proxyName, ContainerPort: p.proxyPort, Protocol: corev1.ProtocolTCP},
			{Name: AdminPortName, ContainerPort: p.adminPort, Protocol: corev1.ProtocolTCP},
		},
		Env:            env,
		Resources:      p.res.requirements(),
		ReadinessProbe: probe("/readyz", 5, 3),
		LivenessProbe:  probe("/healthz", 10, 3),
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr(true),
			RunAsUser:                &uid,
			RunAsGroup:               &uid,
			ReadOnlyRootFilesystem:   ptr(true),
			AllowPrivilegeEscalation: ptr(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

func ptr[T any](v T) *T { return &v }

// escape makes s one JSON-pointer token (RFC 6901).
func escape(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }

// resources are the sidecar's requests and limits; zero means unset.
type resources struct{ cpuReq, memReq, cpuLim, memLim resource.Quantity }

func parseQuantity(v string, into *resource.Quantity) error {
	if v == "" {
		*into = resource.Quantity{}
		return nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return fmt.Errorf("%q is not a quantity (e.g. 100m, 0.5, 64Mi)", v)
	}
	if q.Sign() <= 0 {
		return fmt.Errorf("%q is not positive", v)
	}
	*into = q
	return nil
}

func (r resources) check(cpuReq, cpuLim, memReq, memLim string) []Problem {
	var ps []Problem
	for _, c := range []struct {
		reqName, limName string
		req, lim         resource.Quantity
	}{{cpuReq, cpuLim, r.cpuReq, r.cpuLim}, {memReq, memLim, r.memReq, r.memLim}} {
		if !c.req.IsZero() && !c.lim.IsZero() && c.req.Cmp(c.lim) > 0 {
			ps = append(ps, Problem{c.reqName, fmt.Sprintf("%s is more than %s %s", c.req.String(), c.limName, c.lim.String())})
		}
	}
	return ps
}

func (r resources) requirements() corev1.ResourceRequirements {
	var rr corev1.ResourceRequirements
	set := func(l *corev1.ResourceList, name corev1.ResourceName, q resource.Quantity) {
		if q.IsZero() {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[name] = q
	}
	set(&rr.Requests, corev1.ResourceCPU, r.cpuReq)
	set(&rr.Requests, corev1.ResourceMemory, r.memReq)
	set(&rr.Limits, corev1.ResourceCPU, r.cpuLim)
	set(&rr.Limits, corev1.ResourceMemory, r.memLim)
	return rr
}
