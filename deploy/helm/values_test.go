package helm_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	sigsjson "sigs.k8s.io/json"

	"helm.sh/helm/v3/pkg/chartutil"
)

// decode converts a rendered object into its typed struct strictly: a
// misspelt or misplaced field fails, as kubectl apply would.
func decode[T any](t *testing.T, objects map[key]object, k key) *T {
	t.Helper()
	o, ok := objects[k]
	if !ok {
		t.Fatalf("no %s", k)
	}
	data, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	v := new(T)
	strict, err := sigsjson.UnmarshalStrict(data, v)
	if err != nil || len(strict) > 0 {
		t.Fatalf("%s does not decode strictly: %v %v", k, err, strict)
	}
	return v
}

// deployment decodes the Deployment name; for the controller, a
// StatefulSet, a Deployment holding its pod template and replicas.
func deployment(t *testing.T, objects map[key]object, ns, name string) *appsv1.Deployment {
	t.Helper()
	if name == "sluice-controller" {
		s := controller(t, objects, ns)
		return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: s.Spec.Replicas, Template: s.Spec.Template}}
	}
	return decode[appsv1.Deployment](t, objects, key{"apps/v1", "Deployment", ns, name})
}

// controller decodes the controller's StatefulSet.
func controller(t *testing.T, objects map[key]object, ns string) *appsv1.StatefulSet {
	t.Helper()
	return decode[appsv1.StatefulSet](t, objects, key{"apps/v1", "StatefulSet", ns, "sluice-controller"})
}

// args returns the first container's arguments as flag → value.
func args(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		m[k] = v
	}
	return m
}

func kinds(objects map[key]object, kind string) []string {
	var names []string
	for k := range objects {
		if k.kind == kind {
			names = append(names, k.name)
		}
	}
	slices.Sort(names)
	return names
}

// images returns every container image and the injector's sidecar image.
func images(t *testing.T, objects map[key]object) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range []string{"sluice-controller", "sluice-aggregator", "sluice-injector"} {
		c := deployment(t, objects, releaseNamespace, name).Spec.Template.Spec.Containers[0]
		out[name] = c.Image
		if name == "sluice-injector" {
			out["sidecar"] = args(c)["sidecar-image"]
		}
	}
	job := decode[batchv1.Job](t, objects, key{"batch/v1", "Job", releaseNamespace, "sluice-migrate"})
	out["sluice-migrate"] = job.Spec.Template.Spec.Containers[0].Image
	return out
}

// TestValuesDoWhatTheySay renders the chart with values other than the
// defaults and checks each one's effect, and that it has none elsewhere.
func TestValuesDoWhatTheySay(t *testing.T) {
	defaults := renderChart(t, releaseNamespace, nil)

	t.Run("mtls off", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"tls": map[string]any{"mtls": false}})
		if certs := kinds(got, "Certificate"); !slices.Equal(certs, []string{"sluice-ca", "sluice-injector"}) {
			t.Errorf("Certificates %v: want only the injector's serving certificate and its CA", certs)
		}
		for _, name := range []string{"sluice-controller", "sluice-aggregator", "sluice-injector"} {
			d := deployment(t, got, releaseNamespace, name)
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--tls-cert=") || strings.HasPrefix(a, "--tls-key=") || strings.HasPrefix(a, "--tls-ca=") ||
					strings.Contains(a, "trust-domain") {
					t.Errorf("%s: %s with mtls off", name, a)
				}
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == "identity" {
					t.Errorf("%s mounts its identity with mtls off", name)
				}
			}
		}
		// The defaults do have them: the check above can fail.
		if a := args(controller(t, defaults, releaseNamespace).Spec.Template.Spec.Containers[0]); a["tls-cert"] == "" || a["trust-domain"] != "cluster.local" {
			t.Errorf("default controller args %v: want mTLS", a)
		}
	})

	t.Run("trust domain and issuer", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"tls": map[string]any{
			"trustDomain": "prod.example.org", "issuer": map[string]any{"name": "mesh-root", "kind": "Issuer"}}})
		for _, kind := range []string{"controller", "aggregator"} {
			var cert struct {
				Spec struct {
					URIs      []string          `json:"uris"`
					IssuerRef map[string]string `json:"issuerRef"`
				} `json:"spec"`
			}
			data, _ := json.Marshal(got[key{"cert-manager.io/v1", "Certificate", releaseNamespace, "sluice-" + kind + "-identity"}])
			if err := json.Unmarshal(data, &cert); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cert.Spec.URIs, []string{"spiffe://prod.example.org/sluice/" + kind}) ||
				cert.Spec.IssuerRef["name"] != "mesh-root" || cert.Spec.IssuerRef["kind"] != "Issuer" {
				t.Errorf("%s certificate %+v", kind, cert.Spec)
			}
			if a := args(deployment(t, got, releaseNamespace, "sluice-"+kind).Spec.Template.Spec.Containers[0]); a["trust-domain"] != "prod.example.org" {
				t.Errorf("%s --trust-domain=%s", kind, a["trust-domain"])
			}
		}
		if a := args(deployment(t, got, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0]); a["sidecar-trust-domain"] != "prod.example.org" {
			t.Errorf("injector --sidecar-trust-domain=%s", a["sidecar-trust-domain"])
		}
	})

	t.Run("replicas", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{
			"aggregator": map[string]any{"replicas": 9}, "injector": map[string]any{"replicas": 5}, "controller": map[string]any{"shards": 3}})
		for name, want := range map[string]int32{"sluice-aggregator": 9, "sluice-injector": 5} {
			if r := *deployment(t, got, releaseNamespace, name).Spec.Replicas; r != want {
				t.Errorf("%s: %d replicas, want %d", name, r, want)
			}
			// Every aggregator and sidecar starts from the shard count.
			if a := args(deployment(t, got, releaseNamespace, name).Spec.Template.Spec.Containers[0]); a["controller-shards"] != "3" {
				t.Errorf("%s --controller-shards=%s, want 3", name, a["controller-shards"])
			}
		}
		ctl := controller(t, got, releaseNamespace)
		if a := args(ctl.Spec.Template.Spec.Containers[0]); *ctl.Spec.Replicas != 3 || a["shards"] != "3" {
			t.Errorf("controller: %d replicas, --shards=%s: want a shard per pod, 3", *ctl.Spec.Replicas, a["shards"])
		}
	})

	t.Run("one tag", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"image": map[string]any{"tag": "v0.2.0"}})
		for name, image := range images(t, got) {
			if !strings.HasSuffix(image, ":v0.2.0") {
				t.Errorf("%s: image %s, want tag v0.2.0", name, image)
			}
		}
		for k, o := range got {
			if v := o["metadata"].(map[string]any)["labels"].(map[string]any)["app.kubernetes.io/version"]; v != "v0.2.0" {
				t.Errorf("%s: version label %v, want v0.2.0", k, v)
			}
		}
		for name, image := range images(t, defaults) {
			if !strings.HasSuffix(image, ":v0.1.0") {
				t.Errorf("default %s: image %s, want the appVersion v0.1.0", name, image)
			}
		}
	})

	t.Run("per-component image", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{
			"image":      map[string]any{"registry": "registry.example.com", "pullPolicy": "Always"},
			"controller": map[string]any{"image": map[string]any{"tag": "v0.1.1", "registry": "mirror.example.com", "pullPolicy": "IfNotPresent"}},
			"sidecar":    map[string]any{"image": map[string]any{"repository": "team/sidecar"}},
		})
		want := map[string]string{
			"sluice-controller": "mirror.example.com/sluicehq/sluice-controller:v0.1.1",
			"sluice-aggregator": "registry.example.com/sluicehq/sluice-aggregator:v0.1.0",
			"sluice-injector":   "registry.example.com/sluicehq/sluice-injector:v0.1.0",
			"sluice-migrate":    "registry.example.com/sluicehq/sluice-configurator:v0.1.0",
			"sidecar":           "registry.example.com/team/sidecar:v0.1.0",
		}
		if g := images(t, got); !equalMaps(g, want) {
			t.Errorf("images %v, want %v", g, want)
		}
		if p := controller(t, got, releaseNamespace).Spec.Template.Spec.Containers[0].ImagePullPolicy; p != corev1.PullIfNotPresent {
			t.Errorf("controller pull policy %q, want its own IfNotPresent", p)
		}
		inj := deployment(t, got, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0]
		if inj.ImagePullPolicy != corev1.PullAlways || args(inj)["sidecar-image-pull-policy"] != "Always" {
			t.Errorf("injector pull policy %q, --sidecar-image-pull-policy=%q: want Always from image.pullPolicy", inj.ImagePullPolicy, args(inj)["sidecar-image-pull-policy"])
		}
		if p := deployment(t, defaults, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0].ImagePullPolicy; p != "" {
			t.Errorf("default pull policy %q, want none (Kubernetes' default)", p)
		}
	})

	t.Run("sidecar ports and defaults", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"injector": map[string]any{"sidecarPorts": map[string]any{"proxy": 7001, "admin": 7002}},
			"sidecar": map[string]any{"resources": map[string]any{"cpuLimit": "1", "memoryLimit": "512Mi"}}})
		a := args(deployment(t, got, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0])
		if a["sidecar-proxy-port"] != "7001" || a["sidecar-admin-port"] != "7002" || a["sidecar-cpu-limit"] != "1" || a["sidecar-memory-limit"] != "512Mi" {
			t.Errorf("injector args %v", a)
		}
		if _, ok := a["sidecar-cpu-request"]; ok {
			t.Errorf("injector args %v: an empty sidecar resource must leave the injector's default", a)
		}
		d := args(deployment(t, defaults, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0])
		if d["sidecar-proxy-port"] != "18300" || d["sidecar-admin-port"] != "19300" {
			t.Errorf("default injector args %v: want ports 18300 and 19300", d)
		}
	})

	t.Run("caller identity", func(t *testing.T) {
		d := args(deployment(t, defaults, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0])
		if _, decided := d["sidecar-trust-decided"]; d["sidecar-caller-identity"] != "header" || decided {
			t.Errorf("default injector args %v: want --sidecar-caller-identity=header, said explicitly, and no --sidecar-trust-decided", d)
		}
		got := renderChart(t, releaseNamespace, map[string]any{"sidecar": map[string]any{"callerIdentity": "xfcc", "trustDecided": true}})
		a := args(deployment(t, got, releaseNamespace, "sluice-injector").Spec.Template.Spec.Containers[0])
		if _, decided := a["sidecar-trust-decided"]; a["sidecar-caller-identity"] != "xfcc" || !decided {
			t.Errorf("injector args %v: want --sidecar-caller-identity=xfcc and --sidecar-trust-decided", a)
		}
	})

	t.Run("resources", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"aggregator": map[string]any{"resources": map[string]any{
			"requests": map[string]any{"cpu": "2", "memory": "1Gi"}, "limits": map[string]any{"memory": "4Gi"}}}})
		r := deployment(t, got, releaseNamespace, "sluice-aggregator").Spec.Template.Spec.Containers[0].Resources
		if !r.Requests.Cpu().Equal(resource.MustParse("2")) || !r.Limits.Memory().Equal(resource.MustParse("4Gi")) {
			t.Errorf("aggregator resources %+v", r)
		}
	})

	t.Run("limits from a file", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"limits": map[string]any{"source": "file",
			"file": map[string]any{"configMapName": "sluice-limits", "key": "limits.yaml"}}})
		spec := controller(t, got, releaseNamespace).Spec.Template.Spec
		c := spec.Containers[0]
		if args(c)["limits"] != "/etc/sluice/limits/limits.yaml" {
			t.Errorf("controller args %q: want --limits from the mounted file", c.Args)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("controller env %s from a Secret: there is no database", e.Name)
			}
		}
		var mounted bool
		for _, v := range spec.Volumes {
			mounted = mounted || (v.ConfigMap != nil && v.ConfigMap.Name == "sluice-limits")
		}
		var path bool
		for _, m := range c.VolumeMounts {
			path = path || m.MountPath == "/etc/sluice/limits"
		}
		if !mounted || !path {
			t.Errorf("controller volumes %+v, mounts %+v: want the ConfigMap at /etc/sluice/limits", spec.Volumes, c.VolumeMounts)
		}
		for k := range got {
			if strings.Contains(k.name, "configurator") || k.name == "sluice-migrate" || k.name == "sluice-derive" {
				t.Errorf("%s with no database", k)
			}
		}
		np := decode[networkingv1.NetworkPolicy](t, got, key{"networking.k8s.io/v1", "NetworkPolicy", releaseNamespace, "sluice-controller"})
		if len(np.Spec.Egress) != 0 {
			t.Errorf("controller egress %+v: want none (no Postgres)", np.Spec.Egress)
		}
	})

	t.Run("database Secret", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"limits": map[string]any{"postgres": map[string]any{"secretName": "pg", "secretKey": "dsn"}}})
		job := decode[batchv1.Job](t, got, key{"batch/v1", "Job", releaseNamespace, "sluice-migrate"})
		for _, c := range []corev1.Container{controller(t, got, releaseNamespace).Spec.Template.Spec.Containers[0], job.Spec.Template.Spec.Containers[0]} {
			var ok bool
			for _, e := range c.Env {
				ok = ok || (e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "pg" && e.ValueFrom.SecretKeyRef.Key == "dsn")
			}
			if !ok {
				t.Errorf("%s env %+v: want the URL from Secret pg, key dsn", c.Name, c.Env)
			}
		}
	})

	t.Run("another namespace, no namespace object", func(t *testing.T) {
		got := renderChart(t, "mesh", map[string]any{"namespace": map[string]any{"create": false}})
		if ns := kinds(got, "Namespace"); len(ns) != 0 {
			t.Errorf("Namespace objects %v with namespace.create=false", ns)
		}
		for k, o := range got {
			if k.kind != "MutatingWebhookConfiguration" && k.namespace != "mesh" {
				t.Errorf("%s outside the release namespace", k)
			}
			// Nothing may still name the manifests' namespace.
			if data, _ := json.Marshal(o); strings.Contains(string(data), releaseNamespace) {
				t.Errorf("%s names %s", k, releaseNamespace)
			}
		}
		a := args(deployment(t, got, "mesh", "sluice-injector").Spec.Template.Spec.Containers[0])
		if a["aggregators"] != "sluice-aggregator.mesh.svc:18100" || a["controllers"] != "sluice-controller-{shard}.sluice-controller.mesh.svc:18000" {
			t.Errorf("injector args %v", a)
		}
		if ns := kinds(defaults, "Namespace"); !slices.Equal(ns, []string{releaseNamespace}) {
			t.Errorf("default Namespace objects %v", ns)
		}
	})

	t.Run("optional parts off", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"monitoring": map[string]any{"enabled": false},
			"dashboard": map[string]any{"enabled": false}, "networkPolicies": map[string]any{"enabled": false}})
		for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy"} {
			if n := kinds(got, kind); len(n) > 0 {
				t.Errorf("%s %v while off", kind, n)
			}
			if n := kinds(defaults, kind); len(n) == 0 {
				t.Errorf("no %s by default", kind)
			}
		}
	})

	t.Run("Postgres egress peers", func(t *testing.T) {
		got := renderChart(t, releaseNamespace, map[string]any{"networkPolicies": map[string]any{
			"postgresTo": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.5.0/24"}}}}})
		for _, name := range []string{"sluice-controller", "sluice-configurator"} {
			np := decode[networkingv1.NetworkPolicy](t, got, key{"networking.k8s.io/v1", "NetworkPolicy", releaseNamespace, name})
			if e := np.Spec.Egress; len(e) != 1 || len(e[0].To) != 1 || e[0].To[0].IPBlock == nil || e[0].To[0].IPBlock.CIDR != "10.0.5.0/24" {
				t.Errorf("%s egress %+v: want Postgres on 10.0.5.0/24 only", name, e)
			}
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestChartLint is what helm lint checks that can fail here: the chart
// loads, its metadata is valid, its defaults meet its schema, and bad
// values are refused, by the schema or by the templates' own checks, with
// the reason.
func TestChartLint(t *testing.T) {
	c := loadChart(t)
	if c.Metadata.APIVersion != "v2" || c.Metadata.AppVersion != "v0.1.0" || c.Schema == nil {
		t.Errorf("Chart.yaml: apiVersion %s, appVersion %s, schema %v: want v2, the prod overlay's tag v0.1.0, and a schema",
			c.Metadata.APIVersion, c.Metadata.AppVersion, c.Schema != nil)
	}
	if err := chartutil.ValidateAgainstSchema(c, c.Values); err != nil {
		t.Errorf("values.yaml does not meet values.schema.json: %v", err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		says   string
	}{
		{"port zero", map[string]any{"injector": map[string]any{"sidecarPorts": map[string]any{"proxy": 0}}}, "sidecarPorts/proxy"},
		{"port too big", map[string]any{"injector": map[string]any{"sidecarPorts": map[string]any{"admin": 70000}}}, "sidecarPorts/admin"},
		{"ports equal", map[string]any{"injector": map[string]any{"sidecarPorts": map[string]any{"proxy": 19300}}}, "proxy and admin are both 19300"},
		{"caller identity", map[string]any{"sidecar": map[string]any{"callerIdentity": "jwt"}}, "sidecar/callerIdentity"},
		{"mtls callers without mtls", map[string]any{"sidecar": map[string]any{"callerIdentity": "mtls"}, "tls": map[string]any{"mtls": false}},
			"sidecar.callerIdentity: mtls needs tls.mtls"},
		{"no controller shard", map[string]any{"controller": map[string]any{"shards": 0}}, "controller/shards"},
		{"controller replicas", map[string]any{"controller": map[string]any{"replicas": 2}}, "replicas"},
		{"pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "image/pullPolicy"},
		{"limits source", map[string]any{"limits": map[string]any{"source": "redis"}}, "limits/source"},
		{"limits file without a ConfigMap", map[string]any{"limits": map[string]any{"source": "file"}}, "limits.file.configMapName: required"},
		{"a misspelt value", map[string]any{"aggregator": map[string]any{"replica": 3}}, "replica"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, releaseNamespace, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("render: %v; want an error saying %q", err, tc.says)
			}
		})
	}
}

// TestNotes renders NOTES.txt, which helm prints after an install: it must
// render for both limit sources and name what the user has to do.
func TestNotes(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct {
		values map[string]any
		says   []string
	}{
		{nil, []string{"create secret generic sluice-database", "job/sluice-migrate", "18300", "mTLS is on"}},
		{map[string]any{"limits": map[string]any{"source": "file", "file": map[string]any{"configMapName": "my-limits"}}, "tls": map[string]any{"mtls": false}},
			[]string{"ConfigMap my-limits"}},
	} {
		vals, err := chartutil.ToRenderValues(c, tc.values, chartutil.ReleaseOptions{Name: releaseName, Namespace: releaseNamespace, IsInstall: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		files, err := (engineStrict()).Render(c, vals)
		if err != nil {
			t.Fatal(err)
		}
		notes := files["sluice/templates/NOTES.txt"]
		for _, s := range tc.says {
			if !strings.Contains(notes, s) {
				t.Errorf("NOTES.txt with %v does not say %q:\n%s", tc.values, s, notes)
			}
		}
		if tc.values != nil && (strings.Contains(notes, "mTLS is on") || strings.Contains(notes, "sluice-migrate")) {
			t.Errorf("NOTES.txt with %v speaks of mTLS or the migration:\n%s", tc.values, notes)
		}
	}
}
