package k8s_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// overlays are the installs the docs describe; each is rendered and checked.
var overlays = []string{"overlays/dev", "overlays/prod"}

// The cert-manager objects are decoded into these: the fields the base
// uses, strictly, rather than cert-manager's own Go types, whose module
// would bring half of Kubernetes' client libraries with it.
type (
	certManagerIssuer struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			SelfSigned *struct{} `json:"selfSigned,omitempty"`
			CA         *struct {
				SecretName string `json:"secretName"`
			} `json:"ca,omitempty"`
		} `json:"spec"`
	}
	certManagerCertificate struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			IsCA        bool     `json:"isCA,omitempty"`
			CommonName  string   `json:"commonName,omitempty"`
			SecretName  string   `json:"secretName"`
			DNSNames    []string `json:"dnsNames,omitempty"`
			URIs        []string `json:"uris,omitempty"`
			Duration    string   `json:"duration,omitempty"`
			RenewBefore string   `json:"renewBefore,omitempty"`
			Usages      []string `json:"usages,omitempty"`
			PrivateKey  *struct {
				Algorithm      string `json:"algorithm,omitempty"`
				Size           int    `json:"size,omitempty"`
				RotationPolicy string `json:"rotationPolicy,omitempty"`
			} `json:"privateKey,omitempty"`
			IssuerRef struct {
				Name  string `json:"name"`
				Kind  string `json:"kind,omitempty"`
				Group string `json:"group,omitempty"`
			} `json:"issuerRef"`
		} `json:"spec"`
	}
)

// newObject returns the typed struct for apiVersion and kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return new(corev1.Namespace)
	case "v1 ServiceAccount":
		return new(corev1.ServiceAccount)
	case "v1 Service":
		return new(corev1.Service)
	case "v1 ConfigMap":
		return new(corev1.ConfigMap)
	case "v1 Secret":
		return new(corev1.Secret)
	case "apps/v1 Deployment":
		return new(appsv1.Deployment)
	case "apps/v1 StatefulSet":
		return new(appsv1.StatefulSet)
	case "policy/v1 PodDisruptionBudget":
		return new(policyv1.PodDisruptionBudget)
	case "batch/v1 Job":
		return new(batchv1.Job)
	case "batch/v1 CronJob":
		return new(batchv1.CronJob)
	case "rbac.authorization.k8s.io/v1 Role":
		return new(rbacv1.Role)
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return new(rbacv1.RoleBinding)
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return new(rbacv1.ClusterRole)
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return new(rbacv1.ClusterRoleBinding)
	case "networking.k8s.io/v1 NetworkPolicy":
		return new(networkingv1.NetworkPolicy)
	case "admissionregistration.k8s.io/v1 MutatingWebhookConfiguration":
		return new(admissionregistrationv1.MutatingWebhookConfiguration)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return new(monitoringv1.ServiceMonitor)
	case "monitoring.coreos.com/v1 PodMonitor":
		return new(monitoringv1.PodMonitor)
	case "monitoring.coreos.com/v1 PrometheusRule":
		return new(monitoringv1.PrometheusRule)
	case "cert-manager.io/v1 Issuer":
		return new(certManagerIssuer)
	case "cert-manager.io/v1 Certificate":
		return new(certManagerCertificate)
	}
	return nil
}

// rendered is one overlay, built and decoded.
type rendered struct {
	overlay string
	objects []any // typed, in kustomize's output order
}

// render builds overlay with kustomize (the library kubectl and kustomize
// use) and decodes every object strictly into its typed struct: a field
// name that is misspelt, misplaced or unknown to the API fails the test.
func render(t *testing.T, overlay string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	r := &rendered{overlay: overlay}
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", overlay, res.CurId(), err)
		}
		data, err := yaml.YAMLToJSON(y)
		if err != nil {
			t.Fatalf("%s: %s: %v", overlay, res.CurId(), err)
		}
		obj := newObject(res.GetApiVersion(), res.GetKind())
		if obj == nil {
			t.Errorf("%s: %s: no typed decoder for %s %s; add one", overlay, res.CurId(), res.GetApiVersion(), res.GetKind())
			continue
		}
		strict, err := sigsjson.UnmarshalStrict(data, obj)
		if err != nil {
			t.Errorf("%s: %s: decode: %v", overlay, res.CurId(), err)
			continue
		}
		for _, e := range strict {
			t.Errorf("%s: %s %s: %v", overlay, res.GetKind(), res.GetName(), e)
		}
		r.objects = append(r.objects, obj)
	}
	return r
}

// all returns the objects of type T.
func all[T any](r *rendered) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the object of type T named name, or fails.
func one[T interface{ GetName() string }](t *testing.T, r *rendered, name string) T {
	t.Helper()
	for _, v := range all[T](r) {
		if v.GetName() == name {
			return v
		}
	}
	var zero T
	t.Fatalf("%s: no %T named %s", r.overlay, zero, name)
	return zero
}

// podTemplate is the pod template of the Deployment or StatefulSet name:
// the controller is a StatefulSet, the other servers Deployments.
func podTemplate(t *testing.T, r *rendered, name string) corev1.PodTemplateSpec {
	t.Helper()
	for _, d := range all[*appsv1.Deployment](r) {
		if d.Name == name {
			return d.Spec.Template
		}
	}
	for _, s := range all[*appsv1.StatefulSet](r) {
		if s.Name == name {
			return s.Spec.Template
		}
	}
	t.Fatalf("%s: no Deployment or StatefulSet named %s", r.overlay, name)
	return corev1.PodTemplateSpec{}
}

// eachOverlay runs f on every overlay, rendered once per test binary.
func eachOverlay(t *testing.T, f func(t *testing.T, r *rendered)) {
	for _, o := range overlays {
		t.Run(filepath.Base(o), func(t *testing.T) { f(t, cached(t, o)) })
	}
}

var cache = map[string]*rendered{}

func cached(t *testing.T, overlay string) *rendered {
	if r, ok := cache[overlay]; ok {
		return r
	}
	r := render(t, overlay)
	if !t.Failed() {
		cache[overlay] = r
	}
	return r
}

func TestEveryOverlayRendersAndDecodesStrictly(t *testing.T) {
	entries, err := os.ReadDir("overlays")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, "overlays/"+e.Name())
		}
	}
	if !slices.Equal(dirs, overlays) {
		t.Errorf("overlays on disk %q, tested %q: test every overlay", dirs, overlays)
	}
	eachOverlay(t, func(t *testing.T, r *rendered) {
		kinds := map[string]int{}
		for _, o := range r.objects {
			kinds[fmt.Sprintf("%T", o)]++
		}
		for _, want := range []string{
			"*v1.Namespace", "*v1.Deployment", "*v1.Service", "*v1.PodDisruptionBudget", "*v1.Job", "*v1.CronJob",
			"*v1.NetworkPolicy", "*v1.MutatingWebhookConfiguration", "*v1.ServiceMonitor", "*v1.PodMonitor",
			"*v1.PrometheusRule", "*v1.Role", "*v1.RoleBinding", "*v1.ConfigMap",
			"*k8s_test.certManagerCertificate", "*k8s_test.certManagerIssuer",
		} {
			if kinds[want] == 0 {
				t.Errorf("no %s in the build", want)
			}
		}
		var names []string
		for k, n := range kinds {
			names = append(names, fmt.Sprintf("%s×%d", k, n))
		}
		sort.Strings(names)
		t.Logf("%s: %d objects: %v", r.overlay, len(r.objects), names)

		for _, o := range r.objects {
			m, ok := o.(metav1.Object)
			if !ok {
				t.Errorf("%T has no metadata", o)
				continue
			}
			switch o.(type) {
			case *corev1.Namespace, *admissionregistrationv1.MutatingWebhookConfiguration:
				if m.GetNamespace() != "" {
					t.Errorf("cluster-scoped %T %s has namespace %q", o, m.GetName(), m.GetNamespace())
				}
			default:
				if m.GetNamespace() != "sluice-system" {
					t.Errorf("%T %s in namespace %q, want sluice-system", o, m.GetName(), m.GetNamespace())
				}
			}
		}
	})
}
