// Package helm holds sluice's Helm chart (deploy/helm/sluice) and the tests
// that render it with Helm's own library and compare it, object for
// object, with what kustomize builds from deploy/k8s/overlays/prod. It has
// no Go code of its own; see docs/kubernetes.md, "Install with Helm".
package helm
