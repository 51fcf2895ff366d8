package k8s_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sluicehq/sluice/internal/webhook"
	"github.com/sluicehq/sluice/internal/webhook/inject"
)

func TestWebhookConfiguration(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		cfgs := all[*admissionregistrationv1.MutatingWebhookConfiguration](r)
		if len(cfgs) != 1 {
			t.Fatalf("%d MutatingWebhookConfigurations, want 1", len(cfgs))
		}
		mwc := cfgs[0]
		svc := one[*corev1.Service](t, r, "sluice-injector")
		dep := one[*appsv1.Deployment](t, r, "sluice-injector")

		// The CA comes from the injector's Certificate, which names the
		// Service the API server calls.
		ref := mwc.Annotations["cert-manager.io/inject-ca-from"]
		ns, name, _ := strings.Cut(ref, "/")
		cert := one[*certManagerCertificate](t, r, name)
		if ns != cert.Namespace || !contains(cert.Spec.DNSNames, svc.Name+"."+svc.Namespace+".svc") {
			t.Errorf("inject-ca-from %q: want the Certificate for %s.%s.svc (dnsNames %v)", ref, svc.Name, svc.Namespace, cert.Spec.DNSNames)
		}
		var mounted bool
		for _, v := range dep.Spec.Template.Spec.Volumes {
			mounted = mounted || (v.Secret != nil && v.Secret.SecretName == cert.Spec.SecretName)
		}
		if !mounted {
			t.Errorf("the injector does not mount %s, the Certificate's Secret", cert.Spec.SecretName)
		}
		issuer := one[*certManagerIssuer](t, r, cert.Spec.IssuerRef.Name)
		if issuer.Spec.CA == nil || cert.Spec.IsCA {
			t.Errorf("the serving certificate must come from a CA issuer (a stable CA across renewals), got %+v", issuer.Spec)
		}

		paths := map[string]bool{}
		for _, wh := range mwc.Webhooks {
			where := "webhook " + wh.Name
			if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("%s: failurePolicy must be Ignore: the limiter never blocks deploys", where)
			}
			if wh.TimeoutSeconds == nil || *wh.TimeoutSeconds < 1 || *wh.TimeoutSeconds > 5 {
				t.Errorf("%s: timeoutSeconds %v, want at most 5", where, wh.TimeoutSeconds)
			}
			if wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone {
				t.Errorf("%s: sideEffects must be None", where)
			}
			if len(wh.AdmissionReviewVersions) != 1 || wh.AdmissionReviewVersions[0] != "v1" {
				t.Errorf("%s: admissionReviewVersions %v, want [v1], what the webhook speaks", where, wh.AdmissionReviewVersions)
			}
			if len(wh.Rules) != 1 || !equal(wh.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
				!equal(wh.Rules[0].Resources, []string{"pods"}) || !equal(wh.Rules[0].APIGroups, []string{""}) {
				t.Errorf("%s: rules %+v, want pod creation only", where, wh.Rules)
			}
			s := wh.ClientConfig.Service
			if s == nil || s.Name != svc.Name || s.Namespace != svc.Namespace || s.Port == nil || s.Path == nil {
				t.Errorf("%s: clientConfig %+v: want the %s Service", where, wh.ClientConfig, svc.Name)
				continue
			}
			paths[*s.Path] = true
			var port *corev1.ServicePort
			for i := range svc.Spec.Ports {
				if svc.Spec.Ports[i].Port == *s.Port {
					port = &svc.Spec.Ports[i]
				}
			}
			if port == nil || resolvePort(dep.Spec.Template.Spec.Containers[0], port.TargetPort) == 0 {
				t.Errorf("%s: port %d does not lead to the injector's container", where, *s.Port)
				continue
			}
			if listen, _ := flag(dep.Spec.Template.Spec.Containers[0], "listen"); listen != ":"+itoa(resolvePort(dep.Spec.Template.Spec.Containers[0], port.TargetPort)) {
				t.Errorf("%s: the injector listens on %q, the Service targets %v", where, listen, port.TargetPort)
			}
		}
		if !paths[webhook.PathPod] || !paths[webhook.PathNamespace] || len(paths) != 2 {
			t.Errorf("webhook paths %v, want %s and %s", paths, webhook.PathPod, webhook.PathNamespace)
		}

		checkOptInMatrix(t, mwc, sidecarPorts(t, r))
		checkCallerIdentity(t, dep.Spec.Template.Spec.Containers[0])
	})
}

// checkCallerIdentity: the injector's --sidecar-caller-identity is said
// explicitly (what the sidecars trust is a choice the manifests show), and
// the injector's own validation accepts it with the overlay's trust domain.
func checkCallerIdentity(t *testing.T, c corev1.Container) {
	t.Helper()
	mode, ok := flag(c, "sidecar-caller-identity")
	if !ok {
		t.Errorf("injector: no --sidecar-caller-identity; say it explicitly")
		return
	}
	_, tls := flag(c, "sidecar-trust-domain")
	cfg := inject.Config{Image: "sidecar:test", Aggregators: []string{"a:1"}, Controllers: []string{"c:1"},
		ProxyPort: inject.DefaultProxyPort, AdminPort: inject.DefaultAdminPort, CallerIdentity: mode, TLS: tls}
	if err := cfg.Validate(); err != nil {
		t.Errorf("injector: %v", err)
	}
}

// ports are the injected sidecar's, as the injector's flags set them.
type ports struct{ proxy, admin int32 }

// sidecarPorts reads the injector's --sidecar-proxy-port and
// --sidecar-admin-port. They must be said explicitly, so that the chart and
// the manifests can be compared, and be none of Istio's ports.
func sidecarPorts(t *testing.T, r *rendered) ports {
	t.Helper()
	c := one[*appsv1.Deployment](t, r, "sluice-injector").Spec.Template.Spec.Containers[0]
	var p ports
	for _, f := range []struct {
		name string
		into *int32
	}{{"sidecar-proxy-port", &p.proxy}, {"sidecar-admin-port", &p.admin}} {
		v, ok := flag(c, f.name)
		n, err := strconv.ParseInt(v, 10, 32)
		if !ok || err != nil || n < 1 || n > 65535 {
			t.Fatalf("injector: --%s=%q: want a port number, set explicitly", f.name, v)
		}
		if slices.Contains(inject.IstioPorts, int32(n)) {
			t.Errorf("injector: --%s=%d is one of Istio's ports %v: a pod could not carry both sidecars", f.name, n, inject.IstioPorts)
		}
		*f.into = int32(n)
	}
	if p.proxy == p.admin {
		t.Errorf("injector: the sidecar's proxy and admin ports are both %d", p.proxy)
	}
	return p
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkOptInMatrix plays the API server: for namespaces and pods labelled
// every which way, it finds which webhooks the configuration calls, sends
// the pod to the injection logic on that webhook's path, and checks who
// ends up with a sidecar.
func checkOptInMatrix(t *testing.T, mwc *admissionregistrationv1.MutatingWebhookConfiguration, p ports) {
	t.Helper()
	cfg := inject.Config{Image: "sidecar:test", Aggregators: []string{"a:1"}, Controllers: []string{"c:1"}, ProxyPort: p.proxy, AdminPort: p.admin}
	for _, tc := range []struct {
		name        string
		namespace   string
		nsLabels    map[string]string
		podLabels   map[string]string
		annotations map[string]string
		calls       int
		injected    bool
	}{
		{"enabled namespace", "shop", map[string]string{inject.Inject: inject.Enabled}, nil, nil, 1, true},
		{"enabled namespace, pod label false", "shop", map[string]string{inject.Inject: inject.Enabled}, map[string]string{inject.Inject: "false"}, nil, 0, false},
		{"enabled namespace, pod annotation false", "shop", map[string]string{inject.Inject: inject.Enabled}, nil, map[string]string{inject.Inject: "false"}, 1, false},
		{"enabled namespace, pod label true", "shop", map[string]string{inject.Inject: inject.Enabled}, map[string]string{inject.Inject: "true"}, nil, 1, true},
		{"plain namespace, pod label true", "shop", nil, map[string]string{inject.Inject: "true"}, nil, 1, true},
		{"plain namespace, pod annotation true only", "shop", nil, nil, map[string]string{inject.Inject: "true"}, 0, false},
		{"plain namespace, nothing", "shop", nil, nil, nil, 0, false},
		{"kube-system, even if asked", "kube-system", map[string]string{inject.Inject: inject.Enabled}, map[string]string{inject.Inject: "true"}, nil, 0, false},
		{"sluice's own namespace", "sluice-system", map[string]string{inject.Inject: inject.Enabled}, map[string]string{inject.Inject: "true"}, nil, 0, false},
	} {
		nsLabels := labels.Set{"kubernetes.io/metadata.name": tc.namespace}
		for k, v := range tc.nsLabels {
			nsLabels[k] = v
		}
		podLabels := labels.Set{inject.NameLabel: "checkout"}
		for k, v := range tc.podLabels {
			podLabels[k] = v
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "checkout-1", Namespace: tc.namespace, Labels: podLabels, Annotations: tc.annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		}
		var calls int
		var injected bool
		for _, wh := range mwc.Webhooks {
			if !matches(t, wh.NamespaceSelector, nsLabels) || !matches(t, wh.ObjectSelector, podLabels) {
				continue
			}
			calls++
			scope := inject.ScopePod
			if *wh.ClientConfig.Service.Path == webhook.PathNamespace {
				scope = inject.ScopeNamespace
			}
			res, err := inject.Pod(pod, scope, cfg)
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			injected = injected || res.Patch != nil
		}
		if calls != tc.calls || injected != tc.injected {
			t.Errorf("%s: %d webhook calls, injected %v; want %d, %v", tc.name, calls, injected, tc.calls, tc.injected)
		}
	}
}

func matches(t *testing.T, sel *metav1.LabelSelector, l labels.Set) bool {
	t.Helper()
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %+v: %v", sel, err)
	}
	return s.Matches(l)
}
