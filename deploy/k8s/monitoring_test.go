package k8s_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/webhook"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/sidecar/inject"
)

// describer is a prometheus.Registerer that only records the names of the
// metrics registered with it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		// Desc has no accessor for its name; its String has had this form
		// for as long as client_golang has had Desc.
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// codeMetrics is the list of metrics the binaries export, built by the
// binaries' own constructors, so that alerts and dashboards can only name
// metrics that exist.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	d := &describer{names: map[string]bool{}}
	if _, err := controller.New(controller.DefaultConfig(), limits.Static{}, nil, d); err != nil {
		t.Fatal(err)
	}
	controller.NewRecorder(controller.DefaultRecorderConfig(), history.NewMemory(), nil, d)
	acfg := aggregator.DefaultConfig()
	acfg.Zone, acfg.Controllers = "zone-a", []string{"127.0.0.1:18000"}
	if _, err := aggregator.New(acfg, nil, d); err != nil {
		t.Fatal(err)
	}
	scfg := agent.DefaultConfig()
	scfg.Service = "checkout"
	a, err := agent.New(scfg, nil, d)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	certFile, keyFile := selfSigned(t)
	if _, err := webhook.New(webhook.Config{
		Inject: inject.Config{Image: "sidecar:test", Aggregators: []string{"a:1"}, Controllers: []string{"c:1"},
			ProxyPort: inject.DefaultProxyPort, AdminPort: inject.DefaultAdminPort},
		CertFile: certFile, KeyFile: keyFile, ShutdownTimeout: time.Second,
	}, nil, d); err != nil {
		t.Fatal(err)
	}
	// The one metric the controller's command registers itself (it counts
	// failed reads of whichever limits source the flags chose).
	src, err := os.ReadFile("../../internal/controller/command.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`Name: +"(sluice_[a-z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
		d.names[m[1]] = true
	}
	if len(d.names) < 40 {
		t.Fatalf("found only %d metrics: %v", len(d.names), d.names)
	}
	return d.names
}

func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// metricNames parses a PromQL expression and returns the metrics it selects.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == "__name__" {
					name = m.Value
				}
			}
			names = append(names, name)
		}
		return nil
	})
	return names, nil
}

// known reports whether name is an exported metric, or a series the
// Prometheus server makes (up) or a histogram's part of one.
func known(metrics map[string]bool, name string) bool {
	if name == "up" || metrics[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && metrics[base] {
			return true
		}
	}
	return false
}

// TestAlertRules parses every alert expression, checks that it names only
// metrics the code exports, and that the docs say what to do about it.
func TestAlertRules(t *testing.T) {
	metrics := codeMetrics(t)
	docs, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	eachOverlay(t, func(t *testing.T, r *rendered) {
		rules := all[*monitoringv1.PrometheusRule](r)
		if len(rules) != 1 {
			t.Fatalf("%d PrometheusRules, want 1", len(rules))
		}
		var alerts []string
		for _, g := range rules[0].Spec.Groups {
			for _, rule := range g.Rules {
				if rule.Alert == "" {
					t.Errorf("group %s: a rule without an alert name", g.Name)
					continue
				}
				alerts = append(alerts, rule.Alert)
				names, err := metricNames(rule.Expr.String())
				if err != nil {
					t.Errorf("%s: %v", rule.Alert, err)
				}
				for _, n := range names {
					if !known(metrics, n) {
						t.Errorf("%s: metric %s is exported by no sluice binary", rule.Alert, n)
					}
				}
				if len(names) == 0 {
					t.Errorf("%s: selects no metric", rule.Alert)
				}
				if s := rule.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("%s: severity %q", rule.Alert, s)
				}
				if rule.For != nil {
					if _, err := time.ParseDuration(string(*rule.For)); err != nil {
						t.Errorf("%s: for %q: %v", rule.Alert, *rule.For, err)
					}
				}
				anchor := strings.ToLower(rule.Alert)
				if rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" ||
					!strings.HasSuffix(rule.Annotations["runbook_url"], "docs/kubernetes.md#"+anchor) {
					t.Errorf("%s: annotations %v: want summary, description and the runbook in docs/kubernetes.md", rule.Alert, rule.Annotations)
				}
				if !strings.Contains(string(docs), "\n### "+rule.Alert+"\n") {
					t.Errorf("%s: docs/kubernetes.md has no section \"### %s\"", rule.Alert, rule.Alert)
				}
			}
		}
		for _, want := range []string{
			"SluiceSidecarPolicyStale", "SluiceControllerTickSlow", "SluiceReportsRejected", "SluiceZoneLoadsRejected",
			"SluicePostgresUnreachable", "SluiceControllerNotWarm", "SluiceNoAggregators", "SluicePolicyNacked",
		} {
			if !slices.Contains(alerts, want) {
				t.Errorf("no alert %s", want)
			}
		}
	})
}

// TestMetricNamesParse keeps metricNames honest: a test that could not
// find a name could not fail.
func TestMetricNamesParse(t *testing.T) {
	got, err := metricNames(`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0 and on() b{x="y"} or {__name__="c"}`)
	if err != nil || !slices.Equal(got, []string{"a_bucket", "b", "c"}) {
		t.Errorf("metricNames = %q, %v", got, err)
	}
	if _, err := metricNames(`sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced expression parsed")
	}
}

// grafanaPanel is the part of a Grafana panel the test reads.
type grafanaPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // rows
}

// TestDashboard parses the Grafana dashboard the build ships and checks
// that every panel's queries parse and name exported metrics.
func TestDashboard(t *testing.T) {
	metrics := codeMetrics(t)
	eachOverlay(t, func(t *testing.T, r *rendered) {
		cm := one[*corev1.ConfigMap](t, r, "sluice-grafana-dashboard")
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard ConfigMap labels %v: want grafana_dashboard=1 for Grafana's sidecar", cm.Labels)
		}
		var dash struct {
			Title      string         `json:"title"`
			UID        string         `json:"uid"`
			Panels     []grafanaPanel `json:"panels"`
			Templating struct {
				List []struct {
					Name string `json:"name"`
					Type string `json:"type"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal([]byte(cm.Data["sluice.json"]), &dash); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		if dash.Title == "" || dash.UID == "" || len(dash.Templating.List) == 0 || dash.Templating.List[0].Name != "datasource" {
			t.Errorf("dashboard %q (uid %q): want a title, a uid and a datasource variable", dash.Title, dash.UID)
		}
		var queries int
		ids := map[int]bool{}
		var walk func([]grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				if ids[p.ID] {
					t.Errorf("panel id %d twice", p.ID)
				}
				ids[p.ID] = true
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				if p.Datasource["uid"] != "${datasource}" || len(p.Targets) == 0 {
					t.Errorf("panel %q: datasource %v, %d queries", p.Title, p.Datasource, len(p.Targets))
				}
				for _, q := range p.Targets {
					queries++
					expr := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m").Replace(q.Expr)
					names, err := metricNames(expr)
					if err != nil {
						t.Errorf("panel %q: %q: %v", p.Title, q.Expr, err)
					}
					for _, n := range names {
						if !known(metrics, n) {
							t.Errorf("panel %q: metric %s is exported by no sluice binary", p.Title, n)
						}
					}
				}
			}
		}
		walk(dash.Panels)
		if queries < 10 {
			t.Errorf("%d queries: the dashboard lost its panels", queries)
		}
	})
}

// TestScrapeTargets checks that Prometheus is told to scrape every sluice
// admin port, the sidecars' included.
func TestScrapeTargets(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		sms := all[*monitoringv1.ServiceMonitor](r)
		if len(sms) != 1 || len(sms[0].Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitors %d: want one, one endpoint", len(sms))
		}
		sm := sms[0]
		for _, name := range []string{"sluice-controller", "sluice-aggregator", "sluice-injector"} {
			svc := one[*corev1.Service](t, r, name)
			if !selects(t, &sm.Spec.Selector, svc.Labels) {
				t.Errorf("ServiceMonitor does not select Service %s", name)
			}
			var ok bool
			for _, p := range svc.Spec.Ports {
				ok = ok || p.Name == sm.Spec.Endpoints[0].Port
			}
			if !ok {
				t.Errorf("Service %s has no port %q", name, sm.Spec.Endpoints[0].Port)
			}
		}
		pms := all[*monitoringv1.PodMonitor](r)
		if len(pms) != 1 {
			t.Fatalf("PodMonitors %d, want 1", len(pms))
		}
		pm := pms[0]
		if !pm.Spec.NamespaceSelector.Any || len(pm.Spec.PodMetricsEndpoints) != 1 ||
			pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != inject.AdminPortName ||
			!selects(t, &pm.Spec.Selector, map[string]string{inject.SidecarLabel: inject.Injected}) ||
			selects(t, &pm.Spec.Selector, map[string]string{"app": "web"}) {
			t.Errorf("sidecar PodMonitor %+v: want port %s of pods labelled %s=%s in every namespace",
				pm.Spec, inject.AdminPortName, inject.SidecarLabel, inject.Injected)
		}
	})
}
