package k8s_test

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The recommended labels
// (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
const (
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelVersion   = "app.kubernetes.io/version"
	labelComponent = "app.kubernetes.io/component"
	labelPartOf    = "app.kubernetes.io/part-of"
	labelManagedBy = "app.kubernetes.io/managed-by"
)

// overlayTag is the tag of the overlay's controller image: the release it
// installs (TestImagesShareATag checks that every image has it).
func overlayTag(t *testing.T, r *rendered) string {
	t.Helper()
	image := one[*appsv1.StatefulSet](t, r, "sluice-controller").Spec.Template.Spec.Containers[0].Image
	_, tag, ok := strings.Cut(image, ":")
	if !ok {
		t.Fatalf("controller image %s has no tag", image)
	}
	return tag
}

// checkRecommended checks that l carries every recommended label, with
// the values every object of the install shares.
func checkRecommended(t *testing.T, where string, l map[string]string, version string) {
	t.Helper()
	for k, want := range map[string]string{
		labelPartOf: "sluice", labelInstance: "sluice", labelManagedBy: "kustomize", labelVersion: version,
	} {
		if l[k] != want {
			t.Errorf("%s: label %s=%q, want %q", where, k, l[k], want)
		}
	}
	for _, k := range []string{labelName, labelComponent} {
		if l[k] == "" {
			t.Errorf("%s: no label %s (labels %v)", where, k, l)
		}
	}
}

// TestRecommendedLabels checks the recommended labels on every object of
// every overlay and on every pod template, and that a template's name and
// component are its workload's.
func TestRecommendedLabels(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		version := overlayTag(t, r)
		for _, o := range r.objects {
			m := o.(metav1.Object)
			where := fmt.Sprintf("%T %s", o, m.GetName())
			checkRecommended(t, where, m.GetLabels(), version)

			templates := map[string]map[string]string{}
			switch o := o.(type) {
			case *appsv1.Deployment:
				templates["template"] = o.Spec.Template.Labels
			case *appsv1.StatefulSet:
				templates["template"] = o.Spec.Template.Labels
				for _, v := range o.Spec.VolumeClaimTemplates {
					// Immutable once the StatefulSet exists: a label that
					// changes with the release would fail every upgrade.
					if len(v.Labels) > 0 {
						t.Errorf("%s: volumeClaimTemplate %s has labels %v", where, v.Name, v.Labels)
					}
				}
			case *batchv1.Job:
				templates["template"] = o.Spec.Template.Labels
			case *batchv1.CronJob:
				templates["jobTemplate"] = o.Spec.JobTemplate.Labels
				templates["jobTemplate's template"] = o.Spec.JobTemplate.Spec.Template.Labels
			}
			for what, l := range templates {
				checkRecommended(t, where+" "+what, l, version)
				for _, k := range []string{labelName, labelComponent} {
					if l[k] != m.GetLabels()[k] {
						t.Errorf("%s %s: %s=%q, the object's is %q", where, what, k, l[k], m.GetLabels()[k])
					}
				}
			}
		}
	})
}

// TestSelectorsUseStableLabels checks that no selector names a label that
// changes between releases or installers. A Deployment's selector can not
// be changed after it is created, so the workloads' selectors stay exactly
// what the first release had: app.kubernetes.io/name alone.
func TestSelectorsUseStableLabels(t *testing.T) {
	stable := func(where string, sel map[string]string, exprs []metav1.LabelSelectorRequirement) {
		keys := []string{}
		for k := range sel {
			keys = append(keys, k)
		}
		for _, e := range exprs {
			keys = append(keys, e.Key)
		}
		for _, k := range keys {
			if k == labelVersion || k == labelManagedBy || k == labelPartOf || k == "helm.sh/chart" {
				t.Errorf("%s selects on %s, which is not stable", where, k)
			}
		}
	}
	eachOverlay(t, func(t *testing.T, r *rendered) {
		for _, d := range all[*appsv1.Deployment](r) {
			if want := map[string]string{labelName: d.Name}; len(d.Spec.Selector.MatchExpressions) > 0 ||
				fmt.Sprint(d.Spec.Selector.MatchLabels) != fmt.Sprint(want) {
				t.Errorf("Deployment %s selector %+v, want %v: it can not change on an existing Deployment", d.Name, d.Spec.Selector, want)
			}
			for _, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
				stable("Deployment "+d.Name+" topology spread", c.LabelSelector.MatchLabels, c.LabelSelector.MatchExpressions)
			}
		}
		for _, s := range all[*appsv1.StatefulSet](r) {
			stable("StatefulSet "+s.Name, s.Spec.Selector.MatchLabels, s.Spec.Selector.MatchExpressions)
		}
		for _, s := range all[*corev1.Service](r) {
			stable("Service "+s.Name, s.Spec.Selector, nil)
		}
		for _, p := range all[*policyv1.PodDisruptionBudget](r) {
			stable("PodDisruptionBudget "+p.Name, p.Spec.Selector.MatchLabels, p.Spec.Selector.MatchExpressions)
		}
	})
}
