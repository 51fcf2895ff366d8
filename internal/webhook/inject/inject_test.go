package inject_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"

	"github.com/sluicehq/sluice/internal/webhook/inject"
)

var cfg = inject.Config{
	Image:         "ghcr.io/sluicehq/sidecar:test",
	Aggregators:   []string{"sluice-aggregator.sluice-system.svc:18100"},
	Controllers:   []string{"sluice-controller.sluice-system.svc:18000"},
	CPURequest:    "50m",
	MemoryRequest: "64Mi",
	MemoryLimit:   "256Mi",
	ProxyPort:     inject.DefaultProxyPort,
	AdminPort:     inject.DefaultAdminPort,
}

// appPod is a typical Deployment pod: the app's port is named, its probes
// use the name.
func appPod(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "checkout-7d9f-",
			Namespace:    "shop",
			Labels:       map[string]string{inject.NameLabel: "checkout", "pod-template-hash": "7d9f"},
			Annotations:  annotations,
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "shop/checkout:1.2",
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: 9090},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}},
				StartupProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/metrics", Port: intstr.FromString("metrics")}}},
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/quit", Port: intstr.FromString("http")}}},
			}},
		},
	}
}

// apply applies ops to pod as the API server would: JSON in, RFC 6902
// patch, and the result decoded strictly (unknown or duplicate fields fail).
func apply(t *testing.T, pod *corev1.Pod, ops []inject.Operation) *corev1.Pod {
	t.Helper()
	doc, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatalf("decode patch %s: %v", raw, err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("apply patch %s: %v", raw, err)
	}
	got := new(corev1.Pod)
	strict, err := sigsjson.UnmarshalStrict(out, got)
	if err != nil || len(strict) > 0 {
		t.Fatalf("patched pod does not decode strictly: %v %v\n%s", err, strict, out)
	}
	return got
}

// checkValid checks what the API server's validation would reject and
// what would break at run time: duplicate names and ports in the pod's
// network namespace, bad port and env names, probes on ports their
// container does not declare, requests above limits.
func checkValid(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	containerNames := map[string]bool{}
	portNames := map[string]string{}
	ports := map[int32]string{}
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for _, c := range all {
		if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 || containerNames[c.Name] {
			t.Errorf("container name %q: invalid or duplicate %v", c.Name, errs)
		}
		containerNames[c.Name] = true
		for _, p := range c.Ports {
			if p.Name != "" {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					t.Errorf("container %s: port name %q: %v", c.Name, p.Name, errs)
				}
				if other, dup := portNames[p.Name]; dup {
					t.Errorf("port name %q in containers %s and %s", p.Name, other, c.Name)
				}
				portNames[p.Name] = c.Name
			}
			if other, dup := ports[p.ContainerPort]; dup {
				t.Errorf("port %d in containers %s and %s", p.ContainerPort, other, c.Name)
			}
			ports[p.ContainerPort] = c.Name
		}
		for _, e := range c.Env {
			if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
				t.Errorf("container %s: env %q: %v", c.Name, e.Name, errs)
			}
		}
		resolves := func(what string, port intstr.IntOrString) {
			if port.Type == intstr.Int {
				return
			}
			for _, p := range c.Ports {
				if p.Name == port.StrVal {
					return
				}
			}
			t.Errorf("container %s: %s uses port %q, which the container does not declare", c.Name, what, port.StrVal)
		}
		for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
			if p != nil && p.HTTPGet != nil {
				resolves(what, p.HTTPGet.Port)
			}
			if p != nil && p.TCPSocket != nil {
				resolves(what, p.TCPSocket.Port)
			}
		}
		if l := c.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.HTTPGet != nil {
			resolves("preStop", l.PreStop.HTTPGet.Port)
		}
		for name, req := range c.Resources.Requests {
			if lim, ok := c.Resources.Limits[name]; ok && req.Cmp(lim) > 0 {
				t.Errorf("container %s: %s request %s above limit %s", c.Name, name, req.String(), lim.String())
			}
		}
	}
}

func sidecarOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.ContainerName {
			return c
		}
	}
	t.Fatalf("no %s init container in %+v", inject.ContainerName, pod.Spec.InitContainers)
	return corev1.Container{}
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func mustInject(t *testing.T, pod *corev1.Pod, scope inject.Scope) (*corev1.Pod, inject.Result) {
	t.Helper()
	before, _ := json.Marshal(pod)
	res, err := inject.Pod(pod, scope, cfg)
	if err != nil {
		t.Fatalf("Pod: %v", err)
	}
	if after, _ := json.Marshal(pod); string(before) != string(after) {
		t.Fatal("Pod changed its argument")
	}
	if res.Patch == nil {
		t.Fatalf("Pod left the pod alone: %s", res.Skipped)
	}
	got := apply(t, pod, res.Patch)
	checkValid(t, got)

	// A second pass changes nothing.
	again, err := inject.Pod(got, scope, cfg)
	if err != nil || again.Patch != nil || again.Skipped == "" {
		t.Fatalf("second pass: %+v, %v; want no patch", again, err)
	}
	return got, res
}

func TestTakeover(t *testing.T) {
	pod := appPod(map[string]string{inject.Inject: "true"})
	got, res := mustInject(t, pod, inject.ScopePod)
	if len(res.Warnings) > 0 {
		t.Errorf("warnings: %q", res.Warnings)
	}

	sc := sidecarOf(t, got)
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("restartPolicy = %v, want Always (a native sidecar)", sc.RestartPolicy)
	}
	if sc.Image != cfg.Image || sc.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s %s", sc.Image, sc.ImagePullPolicy)
	}
	wantPorts := []corev1.ContainerPort{
		{Name: "http", ContainerPort: 18300, Protocol: corev1.ProtocolTCP},
		{Name: inject.AdminPortName, ContainerPort: 19300, Protocol: corev1.ProtocolTCP},
	}
	if !slices.Equal(sc.Ports, wantPorts) {
		t.Errorf("sidecar ports %+v, want %+v", sc.Ports, wantPorts)
	}

	// The app gave up the name; its probes and hooks that used it now use
	// the number; the one on another port is untouched.
	app := got.Spec.Containers[0]
	if app.Ports[0].Name != "" || app.Ports[0].ContainerPort != 8080 || app.Ports[1].Name != "metrics" {
		t.Errorf("app ports %+v", app.Ports)
	}
	for what, port := range map[string]intstr.IntOrString{
		"readiness": app.ReadinessProbe.HTTPGet.Port, "liveness": app.LivenessProbe.TCPSocket.Port,
		"preStop": app.Lifecycle.PreStop.HTTPGet.Port,
	} {
		if port != intstr.FromInt32(8080) {
			t.Errorf("app %s port %v, want 8080", what, port)
		}
	}
	if app.StartupProbe.HTTPGet.Port != intstr.FromString("metrics") {
		t.Errorf("startup probe port %v, want metrics", app.StartupProbe.HTTPGet.Port)
	}

	for name, probe := range map[string]*corev1.Probe{"/readyz": sc.ReadinessProbe, "/healthz": sc.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != name || probe.HTTPGet.Port != intstr.FromInt32(19300) {
			t.Errorf("probe %s: %+v", name, probe)
		}
	}

	e := env(sc)
	for name, want := range map[string]string{
		"SLUICE_SIDECAR_SERVICE":     "checkout",
		"SLUICE_SIDECAR_UPSTREAM":    "http://127.0.0.1:8080",
		"SLUICE_SIDECAR_LISTEN":      ":18300",
		"SLUICE_SIDECAR_ADMIN_ADDR":  ":19300",
		"SLUICE_SIDECAR_AGGREGATORS": "sluice-aggregator.sluice-system.svc:18100",
		"SLUICE_SIDECAR_CONTROLLERS": "sluice-controller.sluice-system.svc:18000",
	} {
		if e[name].Value != want {
			t.Errorf("env %s = %q, want %q", name, e[name].Value, want)
		}
	}
	if id := e["SLUICE_SIDECAR_ID"]; id.ValueFrom == nil || id.ValueFrom.FieldRef == nil || id.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("SLUICE_SIDECAR_ID = %+v, want the pod name from the downward API", id)
	}
	if _, ok := e["SLUICE_SIDECAR_ZONE"]; ok {
		t.Error("SLUICE_SIDECAR_ZONE set: the aggregator stamps the zone")
	}

	sec := sc.SecurityContext
	if sec == nil || !*sec.RunAsNonRoot || *sec.RunAsUser != inject.UID || !*sec.ReadOnlyRootFilesystem ||
		*sec.AllowPrivilegeEscalation || !slices.Equal(sec.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		sec.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v", sec)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	if !equalResources(sc.Resources, wantRes) {
		t.Errorf("resources %+v, want %+v", sc.Resources, wantRes)
	}

	var status map[string]any
	if err := json.Unmarshal([]byte(got.Annotations[inject.Status]), &status); err != nil ||
		status["service"] != "checkout" || status["takeover"] != "http" || status["appPort"] != 8080.0 ||
		status["proxyPort"] != 18300.0 || status["adminPort"] != 19300.0 {
		t.Errorf("status annotation %q (%v)", got.Annotations[inject.Status], err)
	}
	if got.Annotations[inject.Inject] != "true" {
		t.Error("the pod's own annotation was lost")
	}
	if got.Labels[inject.SidecarLabel] != inject.Injected || got.Labels[inject.NameLabel] != "checkout" {
		t.Errorf("labels %v: want %s=%s beside the pod's own", got.Labels, inject.SidecarLabel, inject.Injected)
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	eq := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || v.Cmp(w) != 0 {
				return false
			}
		}
		return true
	}
	return eq(a.Requests, b.Requests) && eq(a.Limits, b.Limits)
}

func TestAnnotationsOverride(t *testing.T) {
	pod := appPod(map[string]string{
		inject.Service:       "payments",
		inject.AppPort:       "metrics", // by name
		inject.Strategy:      "random",
		inject.CPURequest:    "100m",
		inject.CPULimit:      "1",
		inject.MemoryRequest: "32Mi",
		inject.MemoryLimit:   "128Mi",
	})
	pod.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "shop/migrate"}}
	got, _ := mustInject(t, pod, inject.ScopeNamespace)
	if n := len(got.Spec.InitContainers); n != 2 || got.Spec.InitContainers[0].Name != "migrate" {
		t.Fatalf("init containers %+v: want migrate, then the sidecar", got.Spec.InitContainers)
	}
	sc := sidecarOf(t, got)
	e := env(sc)
	if e["SLUICE_SIDECAR_SERVICE"].Value != "payments" || e["SLUICE_SIDECAR_UPSTREAM"].Value != "http://127.0.0.1:9090" ||
		e["SLUICE_SIDECAR_STRATEGY"].Value != "random" {
		t.Errorf("env %+v", sc.Env)
	}
	if sc.Ports[0].Name != "metrics" || got.Spec.Containers[0].Ports[0].Name != "http" {
		t.Errorf("sidecar took %q; app ports %+v", sc.Ports[0].Name, got.Spec.Containers[0].Ports)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	if !equalResources(sc.Resources, wantRes) {
		t.Errorf("resources %+v, want %+v", sc.Resources, wantRes)
	}
}

func TestExplicitModeLeavesTheAppAlone(t *testing.T) {
	pod := appPod(map[string]string{inject.Mode: inject.ModeExplicit})
	got, res := mustInject(t, pod, inject.ScopeNamespace)
	if len(res.Warnings) > 0 {
		t.Errorf("warnings %q", res.Warnings)
	}
	if !slices.Equal(got.Spec.Containers[0].Ports, pod.Spec.Containers[0].Ports) ||
		got.Spec.Containers[0].ReadinessProbe.HTTPGet.Port != intstr.FromString("http") {
		t.Errorf("app container changed: %+v", got.Spec.Containers[0])
	}
	if sc := sidecarOf(t, got); sc.Ports[0].Name != inject.ProxyPortName {
		t.Errorf("proxy port named %q, want %q", sc.Ports[0].Name, inject.ProxyPortName)
	}
}

func TestUnnamedPortWarns(t *testing.T) {
	for name, tweak := range map[string]func(*corev1.Pod){
		"unnamed":    func(p *corev1.Pod) { p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}} },
		"undeclared": func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil; p.Annotations[inject.AppPort] = "8080" },
	} {
		t.Run(name, func(t *testing.T) {
			pod := appPod(map[string]string{})
			pod.Spec.Containers[0].ReadinessProbe, pod.Spec.Containers[0].LivenessProbe, pod.Spec.Containers[0].Lifecycle = nil, nil, nil
			pod.Spec.Containers[0].StartupProbe = nil
			tweak(pod)
			got, res := mustInject(t, pod, inject.ScopeNamespace)
			if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], inject.ProxyPortName) {
				t.Errorf("warnings %q: want one naming %s", res.Warnings, inject.ProxyPortName)
			}
			if sc := sidecarOf(t, got); sc.Ports[0].Name != inject.ProxyPortName || env(sc)["SLUICE_SIDECAR_UPSTREAM"].Value != "http://127.0.0.1:8080" {
				t.Errorf("sidecar %+v", sc)
			}
		})
	}
}

func TestOptInAndOut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		scope       inject.Scope
		inject      bool
	}{
		{"namespace enabled, pod silent", nil, nil, inject.ScopeNamespace, true},
		{"namespace enabled, pod opts out", nil, map[string]string{inject.Inject: "false"}, inject.ScopeNamespace, false},
		{"namespace enabled, label opts out", map[string]string{inject.Inject: "false"}, nil, inject.ScopeNamespace, false},
		{"pod label opts in", map[string]string{inject.Inject: "true"}, nil, inject.ScopePod, true},
		{"pod annotation opts in", nil, map[string]string{inject.Inject: "true"}, inject.ScopePod, true},
		{"pod silent outside enabled namespace", nil, nil, inject.ScopePod, false},
		{"label in, annotation out: the annotation wins", map[string]string{inject.Inject: "true"}, map[string]string{inject.Inject: "false"}, inject.ScopePod, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := appPod(tc.annotations)
			for k, v := range tc.labels {
				pod.Labels[k] = v
			}
			res, err := inject.Pod(pod, tc.scope, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Patch != nil; got != tc.inject {
				t.Errorf("injected = %v (%s), want %v", got, res.Skipped, tc.inject)
			}
			if !tc.inject && res.Skipped == "" {
				t.Error("skipped without saying why")
			}
		})
	}
}

func TestHostNetworkIsSkipped(t *testing.T) {
	pod := appPod(nil)
	pod.Spec.HostNetwork = true
	res, err := inject.Pod(pod, inject.ScopeNamespace, cfg)
	if err != nil || res.Patch != nil || len(res.Warnings) != 1 {
		t.Errorf("host network pod: %+v, %v; want skipped with a warning", res, err)
	}
}

func TestBadAnnotationsAreDenied(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(*corev1.Pod)
		where []string // the problems' Where, in order
		text  string   // in the message
	}{
		{"inject value", ann(inject.Inject, "yes"), []string{inject.Inject}, `"yes" is not "true" or "false"`},
		{"port zero", ann(inject.AppPort, "0"), []string{inject.AppPort}, "not a port number"},
		{"port too big", ann(inject.AppPort, "70000"), []string{inject.AppPort}, "not a port number"},
		{"port negative", ann(inject.AppPort, "-8080"), []string{inject.AppPort}, "not a port number"},
		{"port name unknown", ann(inject.AppPort, "grpc"), []string{inject.AppPort}, `"grpc" is neither`},
		{"port is the sidecar's", ann(inject.AppPort, "18300"), []string{inject.AppPort}, "the sidecar listens on"},
		{"proxy port moved onto the app's", ann(inject.ProxyPortAnnotation, "8080"), []string{inject.AppPort}, "8080 proxy"},
		{"proxy port zero", ann(inject.ProxyPortAnnotation, "0"), []string{inject.ProxyPortAnnotation}, `"0" is not a port number`},
		{"admin port too big", ann(inject.AdminPortAnnotation, "65536"), []string{inject.AdminPortAnnotation}, `"65536" is not a port number`},
		{"admin port a name", ann(inject.AdminPortAnnotation, "admin"), []string{inject.AdminPortAnnotation}, `"admin" is not a port number`},
		{"proxy port empty", ann(inject.ProxyPortAnnotation, ""), []string{inject.ProxyPortAnnotation}, `"" is not a port number`},
		{"admin port onto the proxy's", ann(inject.AdminPortAnnotation, "18300"), []string{inject.AdminPortAnnotation}, "both 18300"},
		{"proxy port onto the admin's", ann(inject.ProxyPortAnnotation, "19300"), []string{inject.ProxyPortAnnotation}, "both 19300"},
		{"proxy port onto another container's", func(p *corev1.Pod) {
			ann(inject.ProxyPortAnnotation, "9090")(p)
		}, []string{"spec.containers[0].ports[1]"}, "declares port 9090"},
		{"Istio's port in a pod with Istio", func(p *corev1.Pod) {
			ann(inject.ProxyPortAnnotation, "15001")(p)
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "istio-proxy", Image: "istio/proxyv2"})
		}, []string{inject.ProxyPortAnnotation}, "Istio's sidecar"},
		{"mode", ann(inject.Mode, "shadow"), []string{inject.Mode}, `"shadow" is not "takeover" or "explicit"`},
		{"strategy", ann(inject.Strategy, "fast"), []string{inject.Strategy}, `"fast"`},
		{"cpu quantity", ann(inject.CPURequest, "lots"), []string{inject.CPURequest}, `"lots" is not a quantity`},
		{"memory quantity", ann(inject.MemoryLimit, "1Gx"), []string{inject.MemoryLimit}, `"1Gx" is not a quantity`},
		{"negative quantity", ann(inject.CPULimit, "-1"), []string{inject.CPULimit}, "not positive"},
		{"empty quantity", ann(inject.MemoryRequest, ""), []string{inject.MemoryRequest}, "empty"},
		{"request above limit", func(p *corev1.Pod) { ann(inject.CPURequest, "2")(p); ann(inject.CPULimit, "1")(p) },
			[]string{inject.CPURequest}, "more than " + inject.CPULimit},
		{"service name", ann(inject.Service, "check out!"), []string{inject.Service}, "character"},
		{"service reserved", ann(inject.Service, "_overflow"), []string{inject.Service}, "reserved"},
		{"service empty", ann(inject.Service, ""), []string{inject.Service}, "empty"},
		{"service from a bad label", func(p *corev1.Pod) { p.Labels[inject.NameLabel] = "-checkout" },
			[]string{inject.Service + " (defaulted from the label " + inject.NameLabel + ")"}, "does not start with"},
		{"service missing", func(p *corev1.Pod) { delete(p.Labels, inject.NameLabel) }, []string{inject.Service}, "required"},
		{"no port at all", func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }, []string{inject.AppPort}, "required"},
		{"pod uses the admin port", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "debug", Ports: []corev1.ContainerPort{{ContainerPort: 19300}}})
		}, []string{"spec.containers[1].ports[0]"}, "19300"},
		{"caller identity unknown", ann(inject.CallerIdentityAnnotation, "jwt"), []string{inject.CallerIdentityAnnotation}, `"jwt" is not header, xfcc or mtls`},
		{"caller identity empty", ann(inject.CallerIdentityAnnotation, ""), []string{inject.CallerIdentityAnnotation}, "empty"},
		{"caller identity mtls without certificates", ann(inject.CallerIdentityAnnotation, "mtls"), []string{inject.CallerIdentityAnnotation},
			"only with --sidecar-trust-domain"},
		{"trust decided", ann(inject.TrustDecidedAnnotation, "yes"), []string{inject.TrustDecidedAnnotation}, `"yes" is not "true" or "false"`},
		{"every problem at once", func(p *corev1.Pod) {
			ann(inject.AppPort, "x")(p)
			ann(inject.Mode, "y")(p)
			ann(inject.CPURequest, "z")(p)
			ann(inject.Service, "")(p)
		}, []string{inject.Service, inject.Mode, inject.CPURequest, inject.AppPort}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := appPod(map[string]string{})
			tc.tweak(pod)
			res, err := inject.Pod(pod, inject.ScopeNamespace, cfg)
			var deny *inject.DenyError
			if !errors.As(err, &deny) {
				t.Fatalf("got %+v, %v; want a denial", res, err)
			}
			var where []string
			for _, p := range deny.Problems {
				where = append(where, p.Where)
			}
			if !slices.Equal(where, tc.where) {
				t.Errorf("problems at %q, want %q: %v", where, tc.where, err)
			}
			if !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), tc.where[0]) {
				t.Errorf("message %q does not name %q and say %q", err, tc.where[0], tc.text)
			}
		})
	}
}

func ann(k, v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func TestConfigValidate(t *testing.T) {
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	bad := inject.Config{PullPolicy: "Sometimes", Aggregators: []string{"nohost"}, CPURequest: "x", MemoryRequest: "2Gi", MemoryLimit: "1Gi",
		ProxyPort: 0, AdminPort: 70000}
	err := bad.Validate()
	for _, want := range []string{"sidecar-image", "sidecar-image-pull-policy", "aggregators[0]", "controllers", "sidecar-cpu-request", "sidecar-memory-request",
		"sidecar-proxy-port: 0 is not a port number", "sidecar-admin-port: 70000 is not a port number"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to name %s", err, want)
		}
	}
	for _, tc := range []struct {
		identity string
		tls      bool
		want     string // "" for valid
	}{
		{"", false, ""}, {"header", false, ""}, {"xfcc", false, ""}, {"mtls", true, ""},
		{"mtls", false, "sidecar-caller-identity: mtls needs sidecar certificates, which the injector gives only with --sidecar-trust-domain"},
		{"jwt", true, `sidecar-caller-identity: "jwt" is not header, xfcc or mtls`},
	} {
		c := cfg
		c.CallerIdentity, c.TLS = tc.identity, tc.tls
		if err := c.Validate(); tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate() with --sidecar-caller-identity=%q, TLS %v = %v; want %q", tc.identity, tc.tls, err, tc.want)
		}
	}
	same := cfg
	same.AdminPort = same.ProxyPort
	if err := same.Validate(); err == nil || !strings.Contains(err.Error(), "sidecar-admin-port: 18300 is also sidecar-proxy-port") {
		t.Errorf("Validate() with one port for both = %v; want it refused", err)
	}
}

func TestEnvNames(t *testing.T) {
	for flag, want := range map[string]string{"admin-addr": "SLUICE_SIDECAR_ADMIN_ADDR", "id": "SLUICE_SIDECAR_ID"} {
		if got := inject.Env(flag); got != want {
			t.Errorf("Env(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestPodWithoutLabelsOrAnnotationsOfItsOwn(t *testing.T) {
	pod := appPod(nil)
	pod.Labels = nil
	pod.Annotations = map[string]string{inject.Service: "checkout"}
	got, _ := mustInject(t, pod, inject.ScopeNamespace)
	if len(got.Labels) != 1 || got.Labels[inject.SidecarLabel] != inject.Injected {
		t.Errorf("labels %v", got.Labels)
	}
	pod.Annotations = nil
	pod.Labels = map[string]string{inject.NameLabel: "checkout"}
	got, _ = mustInject(t, pod, inject.ScopeNamespace)
	if len(got.Annotations) != 1 || got.Annotations[inject.Status] == "" {
		t.Errorf("annotations %v", got.Annotations)
	}
}

// TestDefaultPortsAvoidIstio holds the reason the defaults were chosen: a
// pod may carry Istio's sidecar and sluice's side by side.
func TestDefaultPortsAvoidIstio(t *testing.T) {
	for _, p := range []int32{inject.DefaultProxyPort, inject.DefaultAdminPort} {
		if slices.Contains(inject.IstioPorts, p) {
			t.Errorf("default port %d is one of Istio's %v", p, inject.IstioPorts)
		}
	}
	if inject.DefaultProxyPort == inject.DefaultAdminPort {
		t.Error("the default proxy and admin ports are the same")
	}
}

// TestSidecarPorts checks that the ports from the injector's config and
// from a pod's annotations reach everything that depends on them: the
// container's ports, its probes, the sidecar binary's --listen and
// --admin-addr, the status annotation and the warnings.
func TestSidecarPorts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		proxy, admin int32 // the injector's
		annotations  map[string]string
		appPorts     []corev1.ContainerPort // nil: appPod's
		wantProxy    int32
		wantAdmin    int32
	}{
		{"the injector's defaults", inject.DefaultProxyPort, inject.DefaultAdminPort, nil, nil, 18300, 19300},
		{"the injector's flags", 4000, 4001, nil, nil, 4000, 4001},
		{"the pod's annotations win", 4000, 4001, map[string]string{inject.ProxyPortAnnotation: "7001", inject.AdminPortAnnotation: "7002"}, nil, 7001, 7002},
		{"one annotation, one default", inject.DefaultProxyPort, inject.DefaultAdminPort, map[string]string{inject.AdminPortAnnotation: "7002"}, nil, 18300, 7002},
		{"an app on the default port moves the sidecar", inject.DefaultProxyPort, inject.DefaultAdminPort,
			map[string]string{inject.ProxyPortAnnotation: "18301", inject.AppPort: "18300"},
			[]corev1.ContainerPort{{Name: "http", ContainerPort: 18300}}, 18301, 19300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.ProxyPort, c.AdminPort = tc.proxy, tc.admin
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			pod := appPod(tc.annotations)
			if tc.appPorts != nil {
				pod.Spec.Containers[0].Ports = tc.appPorts
				pod.Spec.Containers[0].StartupProbe = nil // it used the port named metrics
			}
			res, err := inject.Pod(pod, inject.ScopeNamespace, c)
			if err != nil || res.Patch == nil {
				t.Fatalf("Pod: %+v, %v", res, err)
			}
			got := apply(t, pod, res.Patch)
			checkValid(t, got)
			sc := sidecarOf(t, got)
			if len(sc.Ports) != 2 || sc.Ports[0].ContainerPort != tc.wantProxy || sc.Ports[1].ContainerPort != tc.wantAdmin ||
				sc.Ports[0].Name != "http" || sc.Ports[1].Name != inject.AdminPortName {
				t.Errorf("sidecar ports %+v, want http %d and %s %d", sc.Ports, tc.wantProxy, inject.AdminPortName, tc.wantAdmin)
			}
			for _, probe := range []*corev1.Probe{sc.ReadinessProbe, sc.LivenessProbe} {
				if probe.HTTPGet.Port != intstr.FromInt32(tc.wantAdmin) {
					t.Errorf("probe on %v, want %d", probe.HTTPGet.Port, tc.wantAdmin)
				}
			}
			e := env(sc)
			if e[inject.Env("listen")].Value != ":"+itoa(tc.wantProxy) || e[inject.Env("admin-addr")].Value != ":"+itoa(tc.wantAdmin) {
				t.Errorf("--listen %q, --admin-addr %q; want :%d, :%d", e[inject.Env("listen")].Value, e[inject.Env("admin-addr")].Value, tc.wantProxy, tc.wantAdmin)
			}
			var status struct{ ProxyPort, AdminPort int32 }
			if err := json.Unmarshal([]byte(got.Annotations[inject.Status]), &status); err != nil ||
				status.ProxyPort != tc.wantProxy || status.AdminPort != tc.wantAdmin {
				t.Errorf("status %s: want ports %d, %d", got.Annotations[inject.Status], tc.wantProxy, tc.wantAdmin)
			}
			if again, err := inject.Pod(got, inject.ScopeNamespace, c); err != nil || again.Patch != nil {
				t.Errorf("second pass: %+v, %v", again, err)
			}
		})
	}
}

// TestIstioSidecarInThePod checks both orders of the two injectors: with
// Istio's sidecar already in the pod, sluice's default ports fit beside it
// and Istio's own ports are refused, naming where they came from.
func TestIstioSidecarInThePod(t *testing.T) {
	withIstio := map[string]func(*corev1.Pod){
		"istio-proxy native sidecar": func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "istio-init", Image: "istio/proxyv2"}, {Name: "istio-proxy", Image: "istio/proxyv2"}}
		},
		"istio-proxy container": func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy", Image: "istio/proxyv2",
				Ports: []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090}}})
		},
		"Istio's status annotation": func(p *corev1.Pod) { p.Annotations["sidecar.istio.io/status"] = `{"containers":["istio-proxy"]}` },
	}
	for name, addIstio := range withIstio {
		t.Run(name, func(t *testing.T) {
			pod := appPod(map[string]string{})
			addIstio(pod)
			got, _ := mustInject(t, pod, inject.ScopeNamespace)
			if sc := sidecarOf(t, got); sc.Ports[0].ContainerPort != inject.DefaultProxyPort {
				t.Errorf("sidecar ports %+v", sc.Ports)
			}

			old := cfg
			old.ProxyPort, old.AdminPort = 15001, 15020 // sluice's ports before they moved
			pod = appPod(map[string]string{inject.AdminPortAnnotation: "15021"})
			addIstio(pod)
			_, err := inject.Pod(pod, inject.ScopeNamespace, old)
			var deny *inject.DenyError
			if !errors.As(err, &deny) || len(deny.Problems) != 2 ||
				deny.Problems[0].Where != inject.ProxyPortAnnotation || !strings.Contains(deny.Problems[0].Message, "the injector's --sidecar-proxy-port") ||
				deny.Problems[1].Where != inject.AdminPortAnnotation || !strings.Contains(deny.Problems[1].Message, "this annotation") {
				t.Errorf("Istio's ports: %v; want both refused, the proxy's from the injector's flag and the admin's from the annotation", err)
			}
		})
	}
	// Without Istio in the pod its ports are the operator's choice.
	old := cfg
	old.ProxyPort, old.AdminPort = 15001, 15020
	if res, err := inject.Pod(appPod(nil), inject.ScopeNamespace, old); err != nil || res.Patch == nil {
		t.Errorf("no Istio, ports 15001 and 15020: %+v, %v; want injected", res, err)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestCallerIdentity checks that the injector's caller identity and
// decided-mark trust, or a pod's annotations, reach the sidecar's flags and
// the status annotation, and that xfcc believes Istio's Envoy, which
// connects from 127.0.0.6 (::6), not 127.0.0.1.
func TestCallerIdentity(t *testing.T) {
	for _, tc := range []struct {
		name         string
		identity     string // the injector's
		trustDecided bool   // the injector's
		tls          bool
		annotations  map[string]string
		wantIdentity string
		wantDecided  bool
	}{
		{"the injector's defaults", "", false, false, nil, "header", false},
		{"the injector's flags", "xfcc", true, false, nil, "xfcc", true},
		{"the pod's annotations win", "xfcc", true, false,
			map[string]string{inject.CallerIdentityAnnotation: "header", inject.TrustDecidedAnnotation: "false"}, "header", false},
		{"one pod opts into xfcc", "header", false, false, map[string]string{inject.CallerIdentityAnnotation: "xfcc"}, "xfcc", false},
		{"mtls with sidecar certificates", "header", false, true,
			map[string]string{inject.CallerIdentityAnnotation: "mtls", inject.TrustDecidedAnnotation: "true"}, "mtls", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.CallerIdentity, c.TrustDecided, c.TLS = tc.identity, tc.trustDecided, tc.tls
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			pod := appPod(tc.annotations)
			res, err := inject.Pod(pod, inject.ScopeNamespace, c)
			if err != nil || res.Patch == nil {
				t.Fatalf("Pod: %+v, %v", res, err)
			}
			if len(res.Warnings) > 0 {
				t.Errorf("warnings %q", res.Warnings)
			}
			got := apply(t, pod, res.Patch)
			checkValid(t, got)
			e := env(sidecarOf(t, got))
			if v := e[inject.Env("caller-identity")].Value; v != tc.wantIdentity {
				t.Errorf("--caller-identity %q, want %q", v, tc.wantIdentity)
			}
			if v := e[inject.Env("trust-decided")].Value; v != strconv.FormatBool(tc.wantDecided) {
				t.Errorf("--trust-decided %q, want %v", v, tc.wantDecided)
			}
			proxies, set := e[inject.Env("trusted-proxies")]
			if set != (tc.wantIdentity == inject.IdentityXFCC) {
				t.Errorf("--trusted-proxies %q set: %v; want it only with xfcc", proxies.Value, set)
			}
			if set {
				checkTrustsIstio(t, proxies.Value)
			}
			var status struct {
				CallerIdentity string
				TrustDecided   bool
			}
			if err := json.Unmarshal([]byte(got.Annotations[inject.Status]), &status); err != nil ||
				status.CallerIdentity != tc.wantIdentity || status.TrustDecided != tc.wantDecided {
				t.Errorf("status %s: want callerIdentity %s, trustDecided %v", got.Annotations[inject.Status], tc.wantIdentity, tc.wantDecided)
			}
		})
	}
}

// checkTrustsIstio checks that --trusted-proxies, as the sidecar parses it
// (CIDRs, comma-separated), holds the addresses Istio's Envoy connects
// from, and nothing outside the pod.
func checkTrustsIstio(t *testing.T, value string) {
	t.Helper()
	var prefixes []netip.Prefix
	for _, s := range strings.Split(value, ",") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			t.Fatalf("--trusted-proxies %q: %v", value, err)
		}
		prefixes = append(prefixes, p)
	}
	trusted := func(a netip.Addr) bool {
		return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	for _, a := range []string{"127.0.0.6", "::6", "127.0.0.1", "::1"} {
		if !trusted(netip.MustParseAddr(a)) {
			t.Errorf("--trusted-proxies %q does not hold %s", value, a)
		}
	}
	for _, a := range []string{"10.0.0.6", "192.168.1.1", "fd00::6", "0.0.0.0"} {
		if trusted(netip.MustParseAddr(a)) {
			t.Errorf("--trusted-proxies %q holds %s, an address outside the pod", value, a)
		}
	}
}

// TestMTLSUnderIstioWarns: the sidecar's port would demand TLS of callers
// whose Envoy forwards plaintext.
func TestMTLSUnderIstioWarns(t *testing.T) {
	c := cfg
	c.TLS = true
	pod := appPod(map[string]string{inject.CallerIdentityAnnotation: "mtls", "sidecar.istio.io/status": "{}"})
	res, err := inject.Pod(pod, inject.ScopeNamespace, c)
	if err != nil || res.Patch == nil {
		t.Fatalf("Pod: %+v, %v", res, err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], inject.CallerIdentityAnnotation) || !strings.Contains(res.Warnings[0], "choose xfcc") {
		t.Errorf("warnings %q: want one naming %s and advising xfcc", res.Warnings, inject.CallerIdentityAnnotation)
	}
}
