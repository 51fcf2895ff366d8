// Package k8s holds sluice's Kubernetes manifests (a kustomize base and the
// overlays dev and prod, alert rules, a Grafana dashboard) and the tests
// that render every overlay and check what it would install. It has no Go
// code of its own; see docs/kubernetes.md.
package k8s
