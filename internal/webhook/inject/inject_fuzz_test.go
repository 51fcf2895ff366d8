package inject_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/webhook/inject"
	"github.com/sluicehq/sluice/pkg/names"

	"github.com/sluicehq/sluice/internal/testkit"
)

// keyValues parses lines of key=value; a line without '=' is a key with
// an empty value.
func keyValues(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

// podSeeds are FuzzPod's committed seeds: annotations and labels.
func podSeeds() map[string][2]string {
	in := inject.Inject + "=true\n"
	return map[string][2]string{
		"inject":              {in, ""},
		"inject-by-label":     {"", inject.Inject + "=true"},
		"opt-out":             {inject.Inject + "=false", inject.Inject + "=true"},
		"bad-opt-in":          {inject.Inject + "=yes", ""},
		"service":             {in + inject.Service + "=payments.v2", ""},
		"service-reserved":    {in + inject.Service + "=" + names.Overflow, ""},
		"service-empty":       {in + inject.Service + "=", ""},
		"service-254-bytes":   {in + inject.Service + "=" + strings.Repeat("s", names.MaxLen+1), ""},
		"service-non-utf8":    {in + inject.Service + "=check\xffout", ""},
		"service-from-label":  {in, inject.NameLabel + "=web"},
		"no-service":          {in, inject.NameLabel + "="},
		"explicit":            {in + inject.Mode + "=explicit\n" + inject.Strategy + "=random", ""},
		"bad-mode":            {in + inject.Mode + "=iptables\n" + inject.Strategy + "=coin", ""},
		"port-number":         {in + inject.AppPort + "=8080", ""},
		"port-undeclared":     {in + inject.AppPort + "=7000", ""},
		"port-sidecar":        {in + inject.AppPort + "=18300", ""},
		"sidecar-ports":       {in + inject.ProxyPortAnnotation + "=8081\n" + inject.AdminPortAnnotation + "=8082", ""},
		"sidecar-ports-same":  {in + inject.ProxyPortAnnotation + "=8081\n" + inject.AdminPortAnnotation + "=8081", ""},
		"sidecar-ports-bad":   {in + inject.ProxyPortAnnotation + "=0\n" + inject.AdminPortAnnotation + "=http", ""},
		"sidecar-port-app":    {in + inject.ProxyPortAnnotation + "=8080", ""},
		"sidecar-port-istio":  {in + inject.ProxyPortAnnotation + "=15001\nsidecar.istio.io/status={}", ""},
		"caller-identity":     {in + inject.CallerIdentityAnnotation + "=xfcc\n" + inject.TrustDecidedAnnotation + "=true", ""},
		"caller-identity-bad": {in + inject.CallerIdentityAnnotation + "=mtls\n" + inject.TrustDecidedAnnotation + "=yes", ""},
		"port-out-of-range":   {in + inject.AppPort + "=65536", ""},
		"port-negative":       {in + inject.AppPort + "=-1", ""},
		"port-name":           {in + inject.AppPort + "=metrics", ""},
		"port-name-unknown":   {in + inject.AppPort + "=grpc", ""},
		"port-huge":           {in + inject.AppPort + "=99999999999999999999999", ""},
		"resources":           {in + inject.CPURequest + "=100m\n" + inject.CPULimit + "=1\n" + inject.MemoryRequest + "=1Gi\n" + inject.MemoryLimit + "=2Gi", ""},
		"resources-inverted":  {in + inject.CPURequest + "=2\n" + inject.CPULimit + "=1", ""},
		"resources-bad":       {in + inject.CPURequest + "=lots\n" + inject.MemoryLimit + "=-1Gi\n" + inject.CPULimit + "=", ""},
		"resources-extreme":   {in + inject.MemoryRequest + "=1e308\n" + inject.MemoryLimit + "=9223372036854775807Ei\n" + inject.CPURequest + "=0.000000001n", ""},
		"status-already-set":  {in + inject.Status + "={\"service\":\"x\"}", ""},
		"every-annotation":    {in + inject.Service + "=\n" + inject.Mode + "=x\n" + inject.Strategy + "=y\n" + inject.AppPort + "=z\n" + inject.CPURequest + "=w", ""},
		"slash-and-tilde-key": {in + "a/b~c=d", "e~f/g=h"},
	}
}

func TestFuzzPodCorpus(t *testing.T) {
	testkit.CheckCorpus(t, "FuzzPod", testkit.FromMap(podSeeds(), func(a [2]string) []any { return []any{a[0], a[1]} }))
}

// FuzzPod runs the injector on the test's app pod with any annotations and
// labels, in both scopes. It must never panic or change its argument; a
// denial names where each problem is; and a patch must apply as the API
// server would apply it, to a pod that its validation accepts, with the
// sidecar serving a valid service name, and a second pass must leave the
// result alone.
func FuzzPod(f *testing.F) {
	f.Fuzz(func(t *testing.T, annotations, labels string) {
		for _, scope := range []inject.Scope{inject.ScopePod, inject.ScopeNamespace} {
			pod := appPod(keyValues(annotations))
			if l := keyValues(labels); l != nil {
				pod.Labels = l
			}
			before, err := json.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			res, err := inject.Pod(pod, scope, cfg)
			if after, _ := json.Marshal(pod); string(after) != string(before) {
				t.Fatal("Pod changed its argument")
			}
			if err != nil {
				var deny *inject.DenyError
				if !errors.As(err, &deny) || len(deny.Problems) == 0 {
					t.Fatalf("error %v is not a denial with problems", err)
				}
				for _, p := range deny.Problems {
					if p.Where == "" || p.Message == "" {
						t.Errorf("problem %+v does not say where or what", p)
					}
				}
				continue
			}
			if res.Patch == nil {
				if res.Skipped == "" {
					t.Fatal("no patch and no reason")
				}
				continue
			}
			if err := names.Check(res.Service); err != nil || res.Service == names.Overflow {
				t.Fatalf("injected service %q: %v", res.Service, err)
			}
			got := apply(t, pod, res.Patch)
			checkValid(t, got)
			if e := env(sidecarOf(t, got))[inject.Env("service")]; e.Value != res.Service {
				t.Errorf("sidecar serves %q, result says %q", e.Value, res.Service)
			}
			again, err := inject.Pod(got, scope, cfg)
			if err != nil || again.Patch != nil {
				t.Fatalf("second pass: %+v, %v; want no patch", again, err)
			}
		}
	})
}
