package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// waitTimeout bounds every wait of these tests.
const waitTimeout = 20 * time.Second

var testInject = inject.Config{
	Image:         "ghcr.io/sluicehq/sluice-sidecar:v0.1.0",
	Aggregators:   []string{"sluice-aggregator.sluice-system.svc:18100"},
	Controllers:   []string{"sluice-controller.sluice-system.svc:18000"},
	CPURequest:    "50m",
	MemoryRequest: "64Mi",
	MemoryLimit:   "256Mi",
	ProxyPort:     inject.DefaultProxyPort,
	AdminPort:     inject.DefaultAdminPort,
}

// running is a webhook server on 127.0.0.1 with a test CA's certificate.
type running struct {
	addr   string
	ca     *testCA
	vol    *secretVolume
	reg    *prometheus.Registry
	client *http.Client
}

func start(t *testing.T) *running { t.Helper(); return startWith(t, nil) }

// startWith starts a server whose Config edit changed, if not nil.
func startWith(t *testing.T, edit func(*Config)) *running {
	t.Helper()
	ca := newCA(t)
	certPEM, keyPEM := ca.issue(t, 1)
	vol := newSecretVolume(t, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
	reg := prometheus.NewRegistry()
	cfg := Config{Inject: testInject, CertFile: vol.path("tls.crt"), KeyFile: vol.path("tls.key"), ShutdownTimeout: 5 * time.Second}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Error("Serve did not return after its context ended")
		}
	})
	return &running{
		addr: ln.Addr().String(), ca: ca, vol: vol, reg: reg,
		client: &http.Client{Timeout: waitTimeout, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12},
		}},
	}
}

// review sends pod, as the API server does, to path and returns the
// response, decoded strictly.
func (r *running) review(t *testing.T, path string, pod *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	uid := types.UID(fmt.Sprintf("uid-%d", time.Now().UnixNano()))
	return r.send(t, path, &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       uid,
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "shop",
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
}

func (r *running) send(t *testing.T, path string, review *admissionv1.AdmissionReview) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.client.Post("https://"+r.addr+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s %s %v", path, resp.Status, data, err)
	}
	out := new(admissionv1.AdmissionReview)
	if strict, err := sigsjson.UnmarshalStrict(data, out); err != nil || len(strict) > 0 {
		t.Fatalf("response does not decode strictly: %v %v\n%s", err, strict, data)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil ||
		out.Response.UID != review.Request.UID {
		t.Fatalf("response %s: want an admission.k8s.io/v1 AdmissionReview answering uid %s", data, review.Request.UID)
	}
	return out.Response
}

// patched applies the response's JSON patch to pod and decodes the result
// strictly, as the API server would.
func patched(t *testing.T, pod *corev1.Pod, resp *admissionv1.AdmissionResponse) *corev1.Pod {
	t.Helper()
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch || len(resp.Patch) == 0 {
		t.Fatalf("response %+v: want allowed with a JSONPatch", resp)
	}
	doc, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("decode patch: %v\n%s", err, resp.Patch)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("apply patch: %v\n%s", err, resp.Patch)
	}
	got := new(corev1.Pod)
	if strict, err := sigsjson.UnmarshalStrict(out, got); err != nil || len(strict) > 0 {
		t.Fatalf("patched pod does not decode strictly: %v %v\n%s", err, strict, out)
	}
	return got
}

func checkoutPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "checkout-5c7d9-",
			Namespace:    "shop",
			Labels:       map[string]string{inject.Inject: "true", inject.NameLabel: "checkout"},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "app",
			Image: "shop/checkout:1.2",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
				HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
		}}},
	}
}

func TestAdmissionOverHTTPS(t *testing.T) {
	r := start(t)
	pod := checkoutPod()
	resp := r.review(t, PathPod, pod)
	got := patched(t, pod, resp)

	var sc *corev1.Container
	for i := range got.Spec.InitContainers {
		if got.Spec.InitContainers[i].Name == inject.ContainerName {
			sc = &got.Spec.InitContainers[i]
		}
	}
	if sc == nil {
		t.Fatalf("no sidecar in the patched pod: %+v", got.Spec)
	}
	// The Service's targetPort "http" now reaches the sidecar, which proxies
	// to the app on 127.0.0.1:8080.
	if sc.Ports[0].Name != "http" || sc.Ports[0].ContainerPort != inject.DefaultProxyPort || got.Spec.Containers[0].Ports[0].Name != "" {
		t.Errorf("port takeover: sidecar %+v, app %+v", sc.Ports, got.Spec.Containers[0].Ports)
	}
	if p := got.Spec.Containers[0].ReadinessProbe.HTTPGet.Port; p != intstr.FromInt32(8080) {
		t.Errorf("app readiness port %v, want 8080", p)
	}
	if sc.ReadinessProbe.HTTPGet.Path != "/readyz" || sc.LivenessProbe.HTTPGet.Path != "/healthz" ||
		sc.ReadinessProbe.HTTPGet.Port != intstr.FromInt32(inject.DefaultAdminPort) {
		t.Errorf("sidecar probes %+v %+v", sc.ReadinessProbe, sc.LivenessProbe)
	}
	if s := sc.SecurityContext; s == nil || !*s.RunAsNonRoot || !*s.ReadOnlyRootFilesystem || s.Capabilities.Drop[0] != "ALL" {
		t.Errorf("security context %+v", s)
	}
	checkSidecarAcceptsEnv(t, sc, "checkout-5c7d9-abcde")

	// A second pass over the patched pod changes nothing.
	again := r.review(t, PathPod, got)
	if !again.Allowed || again.Patch != nil || again.PatchType != nil {
		t.Errorf("second pass: %+v, want allowed and no patch", again)
	}

	if n := counter(t, r.reg, "sluice_injector_admissions_total", "injected"); n != 1 {
		t.Errorf("injected = %v, want 1", n)
	}
	if n := counter(t, r.reg, "sluice_injector_admissions_total", "skipped"); n != 1 {
		t.Errorf("skipped = %v, want 1", n)
	}
}

// checkSidecarAcceptsEnv runs the sidecar binary's own configuration
// layering (internal/cli) and validation (agent.Config) over the injected
// environment, with the downward API resolved: what the sidecar would do at
// start-up in the pod. The binary must listen on the ports the container
// declares and the probes use, whatever its own defaults are.
func checkSidecarAcceptsEnv(t *testing.T, sc *corev1.Container, podName string) agent.Config {
	t.Helper()
	env := map[string]string{}
	for _, e := range sc.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		default:
			t.Errorf("env %s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	cmd := agent.Command()
	fs := cmd.Flags()
	for name := range env {
		flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "SLUICE_SIDECAR_"), "_", "-"))
		if !strings.HasPrefix(name, "SLUICE_SIDECAR_") || fs.Lookup(flag) == nil {
			t.Errorf("env %s sets no flag of the sidecar binary", name)
		}
	}
	if err := cli.Apply(fs, "sidecar", func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatalf("the sidecar would refuse its environment: %v", err)
	}
	str := func(name string) string { v, _ := fs.GetString(name); return v }
	list := func(name string) []string { v, _ := fs.GetStringSlice(name); return v }
	cfg := agent.DefaultConfig()
	cfg.Service, cfg.ID, cfg.Zone, cfg.Upstream = str("service"), str("id"), str("zone"), str("upstream")
	cfg.Aggregators, cfg.Controllers = list("aggregators"), list("controllers")
	cfg.XDSProtocol, cfg.CallerHeader, cfg.Strategy = str("xds-protocol"), str("caller-header"), str("strategy")
	cfg.ReportInterval, _ = fs.GetDuration("report-interval")
	cfg.MaxPeers, _ = fs.GetInt("max-peers")
	cfg.CallerIdentity, cfg.TrustedProxies, cfg.CallerMismatch = str("caller-identity"), list("trusted-proxies"), str("caller-mismatch")
	cfg.TrustDecided, _ = fs.GetBool("trust-decided")
	if err := cfg.Validate(); err != nil {
		t.Errorf("the sidecar would refuse its configuration: %v", err)
	}
	if cfg.ID != podName || cfg.Service != "checkout" || cfg.Upstream != "http://127.0.0.1:8080" {
		t.Errorf("sidecar config %+v", cfg)
	}
	if len(sc.Ports) != 2 {
		t.Fatalf("sidecar ports %+v, want the proxy's and the admin's", sc.Ports)
	}
	for _, l := range []struct {
		flag string
		want int32
	}{{"listen", sc.Ports[0].ContainerPort}, {"admin-addr", sc.Ports[1].ContainerPort}} {
		_, port, err := net.SplitHostPort(str(l.flag))
		if err != nil || port != strconv.Itoa(int(l.want)) {
			t.Errorf("--%s = %q; the container declares %d", l.flag, str(l.flag), l.want)
		}
	}
	if p := sc.ReadinessProbe.HTTPGet.Port; p.IntVal != sc.Ports[1].ContainerPort {
		t.Errorf("readiness probe on %v, the admin port is %d", p, sc.Ports[1].ContainerPort)
	}
	if lf := str("log-format"); lf != "json" {
		t.Errorf("--log-format = %q", lf)
	}
	return cfg
}

func counter(t *testing.T, g prometheus.Gatherer, name, result string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{result=%q}", name, result)
	return 0
}

func TestNamespaceOptInAndPodOptOut(t *testing.T) {
	r := start(t)
	pod := checkoutPod()
	delete(pod.Labels, inject.Inject)

	// Outside an enabled namespace a pod that did not opt in is left alone,
	// even if the API server was misconfigured into sending it.
	if resp := r.review(t, PathPod, pod); !resp.Allowed || resp.Patch != nil {
		t.Errorf("pod path, no opt-in: %+v", resp)
	}
	// In an enabled namespace it is injected...
	patched(t, pod, r.review(t, PathNamespace, pod))
	// ...unless it opts out.
	pod.Annotations = map[string]string{inject.Inject: "false"}
	if resp := r.review(t, PathNamespace, pod); !resp.Allowed || resp.Patch != nil {
		t.Errorf("namespace path, opted out: %+v", resp)
	}
}

func TestBadAnnotationsDenied(t *testing.T) {
	r := start(t)
	for _, tc := range []struct{ annotation, value, says string }{
		{inject.AppPort, "http-alt", `"http-alt" is neither a port number`},
		{inject.AppPort, "65536", "not a port number"},
		{inject.Mode, "enforce", `"enforce" is not "takeover" or "explicit"`},
		{inject.MemoryRequest, "64MB!", "not a quantity"},
		{inject.Service, "check/out", "character '/'"},
		{inject.ProxyPortAnnotation, "8080", "the sidecar listens on"},
		{inject.CallerIdentityAnnotation, "spiffe", `"spiffe" is not header, xfcc or mtls`},
		{inject.CallerIdentityAnnotation, "mtls", "only with --sidecar-trust-domain"},
		{inject.TrustDecidedAnnotation, "1", `"1" is not "true" or "false"`},
	} {
		t.Run(tc.annotation+"="+tc.value, func(t *testing.T) {
			pod := checkoutPod()
			pod.Annotations = map[string]string{tc.annotation: tc.value}
			resp := r.review(t, PathPod, pod)
			if resp.Allowed || resp.Patch != nil || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity {
				t.Fatalf("response %+v: want a denial", resp)
			}
			if msg := resp.Result.Message; !strings.Contains(msg, tc.annotation) || !strings.Contains(msg, tc.says) {
				t.Errorf("message %q: want it to name %s and say %q", msg, tc.annotation, tc.says)
			}
		})
	}
	if n := counter(t, r.reg, "sluice_injector_admissions_total", "denied"); n != 9 {
		t.Errorf("denied = %v, want 9", n)
	}
}

// TestCallerIdentityFlags: the injector's --sidecar-caller-identity and
// --sidecar-trust-decided, and a pod's annotations, reach the sidecar as
// settings its own validation accepts; with --sidecar-trust-domain a pod
// may choose mtls, and its sidecar gets the certificates mtls serves with.
func TestCallerIdentityFlags(t *testing.T) {
	sidecar := func(t *testing.T, r *running, pod *corev1.Pod) agent.Config {
		t.Helper()
		got := patched(t, pod, r.review(t, PathPod, pod))
		for i := range got.Spec.InitContainers {
			if sc := &got.Spec.InitContainers[i]; sc.Name == inject.ContainerName {
				return checkSidecarAcceptsEnv(t, sc, "checkout-5c7d9-abcde")
			}
		}
		t.Fatalf("no sidecar in %+v", got.Spec.InitContainers)
		return agent.Config{}
	}

	r := startWith(t, func(c *Config) { c.Inject.CallerIdentity, c.Inject.TrustDecided = inject.IdentityXFCC, true })
	cfg := sidecar(t, r, checkoutPod())
	if cfg.CallerIdentity != agent.XFCCIdentity || !cfg.TrustDecided || !slices.Contains(cfg.TrustedProxies, "127.0.0.6/32") {
		t.Errorf("injector xfcc, trust decided: sidecar --caller-identity=%s --trust-decided=%v --trusted-proxies=%v; want xfcc, true and Istio's 127.0.0.6",
			cfg.CallerIdentity, cfg.TrustDecided, cfg.TrustedProxies)
	}
	// The injector says it explicitly; a sidecar started by hand
	// believes the same proxies.
	if def := agent.DefaultConfig().TrustedProxies; !slices.Equal(def, inject.XFCCTrustedProxies) {
		t.Errorf("the sidecar's default --trusted-proxies %v, the injector's %v", def, inject.XFCCTrustedProxies)
	}
	pod := checkoutPod()
	pod.Annotations = map[string]string{inject.CallerIdentityAnnotation: "header", inject.TrustDecidedAnnotation: "false"}
	if cfg := sidecar(t, r, pod); cfg.CallerIdentity != agent.HeaderIdentity || cfg.TrustDecided {
		t.Errorf("pod annotations header, false: sidecar --caller-identity=%s --trust-decided=%v", cfg.CallerIdentity, cfg.TrustDecided)
	}

	r = startWith(t, func(c *Config) { c.SidecarTLS.TrustDomain = "cluster.local" })
	pod = checkoutPod()
	pod.Spec.ServiceAccountName = "checkout"
	pod.Annotations = map[string]string{inject.CallerIdentityAnnotation: "mtls"}
	if cfg := sidecar(t, r, pod); cfg.CallerIdentity != agent.MTLSIdentity {
		t.Errorf("pod annotation mtls: sidecar --caller-identity=%s", cfg.CallerIdentity)
	}
}

func TestNotAPodCreationIsAllowed(t *testing.T) {
	r := start(t)
	raw, _ := json.Marshal(checkoutPod())
	for name, req := range map[string]admissionv1.AdmissionRequest{
		"update":      {Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Update},
		"deployment":  {Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Operation: admissionv1.Create},
		"subresource": {Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, SubResource: "ephemeralcontainers"},
	} {
		req.UID, req.Object = types.UID("u-"+name), runtime.RawExtension{Raw: raw}
		resp := r.send(t, PathPod, &admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &req})
		if !resp.Allowed || resp.Patch != nil {
			t.Errorf("%s: %+v, want allowed unchanged", name, resp)
		}
	}
}

func TestMalformedRequests(t *testing.T) {
	r := start(t)
	for name, tc := range map[string]struct {
		method, path, contentType, body string
		status                          int
	}{
		"not json":        {"POST", PathPod, "application/json", "{", http.StatusBadRequest},
		"wrong version":   {"POST", PathPod, "application/json", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, http.StatusBadRequest},
		"no request":      {"POST", PathPod, "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
		"wrong type":      {"POST", PathPod, "text/plain", `{}`, http.StatusBadRequest},
		"GET":             {"GET", PathPod, "", "", http.StatusMethodNotAllowed},
		"unknown path":    {"POST", "/mutate", "application/json", "{}", http.StatusNotFound},
		"pod not decoded": {"POST", PathPod, "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"spec":"nope"}}}`, http.StatusOK},
	} {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "https://"+r.addr+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s: %s %s, want %d", name, resp.Status, data, tc.status)
			}
			if tc.status == http.StatusOK && !bytes.Contains(data, []byte(`"allowed":false`)) {
				t.Errorf("%s: %s, want a denial", name, data)
			}
		})
	}
}

// TestCertificateReload rotates the mounted files as the kubelet does and
// checks that the next handshake presents the new certificate, that a
// half-written pair keeps the old one, and that the metrics say so.
func TestCertificateReload(t *testing.T) {
	r := start(t)
	serial := func() int64 {
		t.Helper()
		d := &net.Dialer{Timeout: waitTimeout}
		conn, err := tls.DialWithDialer(d, "tcp", r.addr, &tls.Config{RootCAs: r.ca.pool, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 1 {
		t.Fatalf("serial %d, want 1", s)
	}

	cert2, key2 := r.ca.issue(t, 2)
	r.vol.update(map[string][]byte{"tls.crt": cert2, "tls.key": key2})
	if s := serial(); s != 2 {
		t.Errorf("after rotation: serial %d, want 2", s)
	}
	if n := counter(t, r.reg, "sluice_injector_cert_reloads_total", "ok"); n != 1 {
		t.Errorf("reloads ok = %v, want 1", n)
	}
	if n := gauge(t, r.reg, "sluice_injector_cert_expiry_timestamp_seconds"); n < float64(time.Now().Add(90*time.Minute).Unix()) {
		t.Errorf("expiry gauge %v: not the new certificate's (2h)", n)
	}

	// A certificate whose key has not arrived: the old pair stays, the error
	// is counted once, not on every handshake.
	cert3, key3 := r.ca.issue(t, 3)
	r.vol.update(map[string][]byte{"tls.crt": cert3, "tls.key": key2})
	for range 3 {
		if s := serial(); s != 2 {
			t.Errorf("mismatched pair: serial %d, want 2 (the last good one)", s)
		}
	}
	if n := counter(t, r.reg, "sluice_injector_cert_reloads_total", "error"); n != 1 {
		t.Errorf("reload errors = %v, want 1", n)
	}
	r.vol.update(map[string][]byte{"tls.crt": cert3, "tls.key": key3})
	if s := serial(); s != 3 {
		t.Errorf("after the key arrived: serial %d, want 3", s)
	}

	// Admission still works over the new certificate.
	patched(t, checkoutPod(), r.review(t, PathPod, checkoutPod()))
}

func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

func TestNewRefusesBadConfig(t *testing.T) {
	_, err := New(Config{Inject: inject.Config{}, ShutdownTimeout: 0}, nil, nil)
	for _, want := range []string{"sidecar-image:", "aggregators:", "tls-cert-file:", "tls-key-file:", "shutdown-timeout:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New() = %v; want it to name %s", err, want)
		}
	}
	mtls := testInject
	mtls.CallerIdentity = inject.IdentityMTLS
	_, err = New(Config{Inject: mtls, CertFile: "c", KeyFile: "k", ShutdownTimeout: time.Second}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "sidecar-caller-identity: mtls needs sidecar certificates, which the injector gives only with --sidecar-trust-domain") {
		t.Errorf("New() with caller identity mtls and no trust domain = %v; want it refused, naming both flags", err)
	}
	ca := newCA(t)
	c, _ := ca.issue(t, 1)
	_, k := ca.issue(t, 2)
	vol := newSecretVolume(t, map[string][]byte{"tls.crt": c, "tls.key": k})
	_, err = New(Config{Inject: testInject, CertFile: vol.path("tls.crt"), KeyFile: vol.path("tls.key"), ShutdownTimeout: time.Second}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Errorf("mismatched key pair: %v; want a start-up error naming the files", err)
	}
}
