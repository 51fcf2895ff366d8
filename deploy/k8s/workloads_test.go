package k8s_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// workload is a pod template of the build, whatever object holds it.
type workload struct {
	kind, name string
	replicas   int32 // 0 for Jobs and CronJobs
	labels     map[string]string
	spec       corev1.PodSpec
	longLived  bool // serves: Deployments and StatefulSets
}

func workloads(r *rendered) []workload {
	var ws []workload
	for _, d := range all[*appsv1.Deployment](r) {
		ws = append(ws, workload{"Deployment", d.Name, *d.Spec.Replicas, d.Spec.Template.Labels, d.Spec.Template.Spec, true})
	}
	for _, s := range all[*appsv1.StatefulSet](r) {
		ws = append(ws, workload{"StatefulSet", s.Name, *s.Spec.Replicas, s.Spec.Template.Labels, s.Spec.Template.Spec, true})
	}
	for _, j := range all[*batchv1.Job](r) {
		ws = append(ws, workload{"Job", j.Name, 0, j.Spec.Template.Labels, j.Spec.Template.Spec, false})
	}
	for _, c := range all[*batchv1.CronJob](r) {
		ws = append(ws, workload{"CronJob", c.Name, 0, c.Spec.JobTemplate.Spec.Template.Labels, c.Spec.JobTemplate.Spec.Template.Spec, false})
	}
	return ws
}

func isSluiceImage(image string) bool { return strings.HasPrefix(image, "ghcr.io/sluicehq/") }

// TestPodSecurity checks every pod against the restricted Pod Security
// Standard (the namespace enforces it) and for requests and memory limits.
func TestPodSecurity(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		ns := one[*corev1.Namespace](t, r, "sluice-system")
		if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("namespace labels %v: want restricted pod security enforced", ns.Labels)
		}
		for _, w := range workloads(r) {
			s := w.spec
			if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
				t.Errorf("%s %s mounts a service account token; no sluice pod talks to the API server", w.kind, w.name)
			}
			if s.ServiceAccountName == "" || s.ServiceAccountName == "default" {
				t.Errorf("%s %s runs as the default service account", w.kind, w.name)
			}
			if s.HostNetwork || s.HostPID || s.HostIPC {
				t.Errorf("%s %s uses host namespaces", w.kind, w.name)
			}
			psc := s.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
				psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s %s: pod security context %+v: want non-root with a RuntimeDefault seccomp profile", w.kind, w.name, psc)
			}
			for _, c := range append(s.InitContainers, s.Containers...) {
				sc := c.SecurityContext
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0 ||
					(sc.Privileged != nil && *sc.Privileged) {
					t.Errorf("%s %s container %s: security context %+v", w.kind, w.name, c.Name, sc)
				}
				req, lim := c.Resources.Requests, c.Resources.Limits
				if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
					t.Errorf("%s %s container %s: resources %+v: want CPU and memory requests and a memory limit", w.kind, w.name, c.Name, c.Resources)
				}
				if lim.Memory().Cmp(*req.Memory()) < 0 {
					t.Errorf("%s %s container %s: memory limit below the request", w.kind, w.name, c.Name)
				}
			}
		}
	})
}

// TestProbes checks that every sluice server is ready on /readyz (its
// real readiness: limits loaded and warm for the controller, a controller
// connection for an aggregator) and alive on /healthz, on a port it
// declares.
func TestProbes(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		for _, w := range workloads(r) {
			for _, c := range w.spec.Containers {
				if !w.longLived {
					if c.ReadinessProbe != nil || c.LivenessProbe != nil {
						t.Errorf("%s %s: a run-to-completion container with probes", w.kind, w.name)
					}
					continue
				}
				if c.ReadinessProbe == nil || c.LivenessProbe == nil {
					t.Errorf("%s %s container %s: readiness and liveness probes required", w.kind, w.name, c.Name)
					continue
				}
				if !isSluiceImage(c.Image) {
					continue // Postgres in dev: pg_isready
				}
				for path, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
					if p.HTTPGet == nil || p.HTTPGet.Path != path {
						t.Errorf("%s %s: probe %+v, want GET %s", w.kind, w.name, p, path)
						continue
					}
					if port := resolvePort(c, p.HTTPGet.Port); port == 0 || port != adminPort(t, c) {
						t.Errorf("%s %s: probe %s on %v, which is not the --admin-addr port", w.kind, w.name, path, p.HTTPGet.Port)
					}
				}
			}
		}
	})
}

func resolvePort(c corev1.Container, p intstr.IntOrString) int32 {
	for _, cp := range c.Ports {
		if (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) || (p.Type == intstr.String && cp.Name == p.StrVal) {
			return cp.ContainerPort
		}
	}
	return 0
}

// flag returns the value of --name=value in c's args.
func flag(c corev1.Container, name string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func adminPort(t *testing.T, c corev1.Container) int32 {
	v, ok := flag(c, "admin-addr")
	if !ok {
		t.Errorf("container %s: no --admin-addr", c.Name)
		return -1
	}
	for _, cp := range c.Ports {
		if ":"+itoa(cp.ContainerPort) == v {
			return cp.ContainerPort
		}
	}
	t.Errorf("container %s: --admin-addr=%s is not a declared port", c.Name, v)
	return -1
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestTerminationGrace checks that the kubelet waits long enough for the
// shutdown internal/process runs: the drain delay, then stopping the
// listeners (bounded by --shutdown-timeout), then the flush hooks (bounded
// again), then a second for the admin server.
func TestTerminationGrace(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		for _, w := range workloads(r) {
			if !w.longLived {
				continue
			}
			for _, c := range w.spec.Containers {
				if !isSluiceImage(c.Image) {
					continue
				}
				dur := func(name string) time.Duration {
					v, ok := flag(c, name)
					if !ok {
						t.Errorf("%s %s: --%s not set explicitly", w.kind, w.name, name)
						return 0
					}
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Errorf("%s %s: --%s=%s: %v", w.kind, w.name, name, v, err)
					}
					return d
				}
				need := dur("drain-delay") + 2*dur("shutdown-timeout") + time.Second
				grace := 30 * time.Second // the Kubernetes default
				if g := w.spec.TerminationGracePeriodSeconds; g != nil {
					grace = time.Duration(*g) * time.Second
				}
				if grace < need {
					t.Errorf("%s %s: terminationGracePeriodSeconds %v < drain + 2 × shutdown-timeout + 1s = %v", w.kind, w.name, grace, need)
				}
			}
		}
	})
}

// TestImagesShareATag checks that an overlay installs one release: every
// sluice image, and the sidecar image the injector injects, carry the same
// tag.
func TestImagesShareATag(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		tags := map[string][]string{}
		add := func(image, where string) {
			i := strings.LastIndex(image, ":")
			if i < 0 || strings.Contains(image[i:], "/") {
				t.Errorf("%s: image %s has no tag", where, image)
				return
			}
			tags[image[i+1:]] = append(tags[image[i+1:]], where)
		}
		var sidecar bool
		for _, w := range workloads(r) {
			for _, c := range w.spec.Containers {
				if isSluiceImage(c.Image) {
					add(c.Image, w.name)
				}
				if img, ok := flag(c, "sidecar-image"); ok {
					add(img, w.name+" --sidecar-image")
					sidecar = true
				}
			}
		}
		if !sidecar || len(tags) != 1 {
			t.Errorf("image tags %v: want one tag, and the injector's --sidecar-image among them", tags)
		}
	})
}

// TestAggregatorsSpreadAcrossZones checks the aggregators' spread and their
// zone-local Service.
func TestAggregatorsSpreadAcrossZones(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		d := one[*appsv1.Deployment](t, r, "sluice-aggregator")
		var zone *corev1.TopologySpreadConstraint
		for i, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
			if c.TopologyKey == corev1.LabelTopologyZone {
				zone = &d.Spec.Template.Spec.TopologySpreadConstraints[i]
			}
		}
		if zone == nil || zone.MaxSkew != 1 || !selects(t, zone.LabelSelector, d.Spec.Template.Labels) {
			t.Fatalf("aggregator spread %+v: want maxSkew 1 over %s selecting the aggregators", zone, corev1.LabelTopologyZone)
		}
		env := map[string]corev1.EnvVar{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			env[e.Name] = e
		}
		zoneEnv := env["SLUICE_AGGREGATOR_ZONE"]
		switch r.overlay {
		case "overlays/prod":
			if zone.WhenUnsatisfiable != corev1.DoNotSchedule || *d.Spec.Replicas < 3 || *d.Spec.Replicas%3 != 0 {
				t.Errorf("prod: %d aggregators, %s: want a multiple of three zones, strictly spread", *d.Spec.Replicas, zone.WhenUnsatisfiable)
			}
			if zoneEnv.ValueFrom == nil || zoneEnv.ValueFrom.FieldRef == nil ||
				zoneEnv.ValueFrom.FieldRef.FieldPath != "metadata.labels['"+corev1.LabelTopologyZone+"']" {
				t.Errorf("prod: aggregator zone %+v: want the pod's topology label", zoneEnv)
			}
		case "overlays/dev":
			if zoneEnv.Value != "dev" {
				t.Errorf("dev: aggregator zone %+v: want the fixed zone dev", zoneEnv)
			}
		}
		svc := one[*corev1.Service](t, r, "sluice-aggregator")
		if svc.Spec.TrafficDistribution == nil || *svc.Spec.TrafficDistribution != corev1.ServiceTrafficDistributionPreferClose {
			t.Errorf("aggregator Service trafficDistribution %v: want PreferClose (zone-local)", svc.Spec.TrafficDistribution)
		}
	})
}

// TestController checks the controller's shape: a StatefulSet whose pods
// are its shards, each told its ordinal and the count, started and rolled
// one at a time, reachable at a name of its own while warming up; and the
// aggregators and sidecars told to reach the shards by those names.
func TestController(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		d := one[*appsv1.StatefulSet](t, r, "sluice-controller")
		if d.Spec.ServiceName != "sluice-controller" || d.Spec.PodManagementPolicy != appsv1.OrderedReadyPodManagement ||
			d.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
			t.Errorf("controller: serviceName %q, pod management %s, update %s: want sluice-controller, OrderedReady, RollingUpdate",
				d.Spec.ServiceName, d.Spec.PodManagementPolicy, d.Spec.UpdateStrategy.Type)
		}
		svc := one[*corev1.Service](t, r, "sluice-controller")
		if !svc.Spec.PublishNotReadyAddresses {
			t.Error("controller Service must publish not-ready addresses: its warm-up needs the aggregators connected")
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("controller Service clusterIP %q: want None, so that each shard has a DNS name", svc.Spec.ClusterIP)
		}
		c := d.Spec.Template.Spec.Containers[0]
		shards := fmt.Sprintf("--shards=%d", *d.Spec.Replicas)
		if !slices.Contains(c.Args, shards) {
			t.Errorf("controller args %q: want %s, the StatefulSet's replicas", c.Args, shards)
		}
		var ordinal bool
		for _, e := range c.Env {
			if e.Name == "SLUICE_CONTROLLER_SHARD" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
				e.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']" {
				ordinal = true
			}
		}
		if !ordinal {
			t.Error("controller: SLUICE_CONTROLLER_SHARD must come from the pod-index label")
		}
		for _, name := range []string{"sluice-aggregator", "sluice-injector"} {
			args := one[*appsv1.Deployment](t, r, name).Spec.Template.Spec.Containers[0].Args
			want := "--controllers=sluice-controller-{shard}.sluice-controller.sluice-system.svc:18000"
			if !slices.Contains(args, want) || !slices.Contains(args, fmt.Sprintf("--controller-shards=%d", *d.Spec.Replicas)) {
				t.Errorf("%s args %q: want %s and --controller-shards=%d", name, args, want, *d.Spec.Replicas)
			}
		}
		var db bool
		for _, e := range c.Env {
			if e.Name == "SLUICE_CONTROLLER_DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				db = true
			}
		}
		if !db {
			t.Error("controller: the database URL must come from a Secret")
		}
		for _, w := range workloads(r) {
			if w.kind == "Job" && w.name == "sluice-migrate" {
				if args := w.spec.Containers[0].Args; len(args) == 0 || args[0] != "migrate" {
					t.Errorf("migrate Job args %q", args)
				}
				return
			}
		}
		t.Error("no sluice-migrate Job")
	})
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("selector %+v: %v", sel, err)
		return false
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

// TestServicesAndBudgets checks that every Service and PodDisruptionBudget
// selects exactly one workload, that Service target ports exist, and that
// no budget forbids every eviction.
func TestServicesAndBudgets(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		match := func(what string, sel *metav1.LabelSelector) *workload {
			var found []workload
			for _, w := range workloads(r) {
				if w.longLived && selects(t, sel, w.labels) {
					found = append(found, w)
				}
			}
			if len(found) != 1 {
				t.Errorf("%s selects %d workloads, want 1", what, len(found))
				return nil
			}
			return &found[0]
		}
		for _, svc := range all[*corev1.Service](r) {
			w := match("Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
			if w == nil {
				continue
			}
			for _, p := range svc.Spec.Ports {
				var ok bool
				for _, c := range w.spec.Containers {
					ok = ok || resolvePort(c, p.TargetPort) != 0
				}
				if !ok {
					t.Errorf("Service %s port %s: targetPort %v is no container port of %s", svc.Name, p.Name, p.TargetPort, w.name)
				}
			}
		}
		budgets := map[string]bool{}
		for _, pdb := range all[*policyv1.PodDisruptionBudget](r) {
			w := match("PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector)
			if w == nil {
				continue
			}
			budgets[w.name] = true
			var allowed int32
			switch {
			case pdb.Spec.MaxUnavailable != nil:
				allowed = pdb.Spec.MaxUnavailable.IntVal
			case pdb.Spec.MinAvailable != nil:
				allowed = w.replicas - pdb.Spec.MinAvailable.IntVal
			}
			if allowed < 1 {
				t.Errorf("PodDisruptionBudget %s allows no eviction of %s (%d replicas): node drains would hang", pdb.Name, w.name, w.replicas)
			}
		}
		for _, want := range []string{"sluice-controller", "sluice-aggregator", "sluice-injector"} {
			if !budgets[want] {
				t.Errorf("no PodDisruptionBudget for %s", want)
			}
		}
	})
}

// TestSecretsAreProvided checks that every Secret a pod uses is in the
// build, made by cert-manager, or, for the database URL in prod, documented
// as created by the operator.
func TestSecretsAreProvided(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		have := map[string]string{}
		for _, s := range all[*corev1.Secret](r) {
			have[s.Name] = "in the build"
		}
		for _, c := range all[*certManagerCertificate](r) {
			have[c.Spec.SecretName] = "cert-manager Certificate " + c.Name
		}
		if r.overlay == "overlays/prod" {
			have["sluice-database"] = "created by the operator (docs/kubernetes.md)"
		}
		for _, w := range workloads(r) {
			var used []string
			for _, v := range w.spec.Volumes {
				if v.Secret != nil {
					used = append(used, v.Secret.SecretName)
				}
			}
			for _, c := range w.spec.Containers {
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						used = append(used, e.ValueFrom.SecretKeyRef.Name)
					}
				}
			}
			for _, name := range used {
				if have[name] == "" {
					t.Errorf("%s %s uses Secret %s, which nothing provides", w.kind, w.name, name)
				}
			}
		}
	})
}

// TestLeastPrivilege checks that no sluice workload can do anything with
// the Kubernetes API, and that the operators' Role is narrow.
func TestLeastPrivilege(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		if n := len(all[*rbacv1.ClusterRole](r)) + len(all[*rbacv1.ClusterRoleBinding](r)); n > 0 {
			t.Errorf("%d cluster-wide RBAC objects; sluice needs none", n)
		}
		for _, sa := range all[*corev1.ServiceAccount](r) {
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("ServiceAccount %s automounts its token", sa.Name)
			}
		}
		for _, rb := range all[*rbacv1.RoleBinding](r) {
			for _, s := range rb.Subjects {
				if s.Kind == rbacv1.ServiceAccountKind {
					t.Errorf("RoleBinding %s binds ServiceAccount %s: no sluice workload needs API access", rb.Name, s.Name)
				}
			}
		}
		for _, role := range all[*rbacv1.Role](r) {
			for _, rule := range role.Rules {
				for _, list := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs} {
					for _, v := range list {
						if v == "*" {
							t.Errorf("Role %s: wildcard in %+v", role.Name, rule)
						}
					}
				}
				for _, res := range rule.Resources {
					if res == "secrets" || res == "pods/exec" || res == "roles" || res == "rolebindings" {
						t.Errorf("Role %s grants %s", role.Name, res)
					}
				}
			}
		}
	})
}
