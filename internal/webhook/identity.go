package webhook

import (
	"errors"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// SidecarTLS gives every injected sidecar mutual TLS. Its certificate comes
// from cert-manager's csi-driver-spiffe, which mounts a key, a certificate
// for spiffe://<trust-domain>/ns/<namespace>/sa/<service-account> and the
// trust domain's CA bundle into the pod, and renews them in place: the
// sidecar re-reads them. Istio's form, so the service account is the sluice
// service (internal/identity), and a pod whose service account is not its
// service is denied with the reason.
type SidecarTLS struct {
	// TrustDomain is the sidecar's --trust-domain; empty injects
	// sidecars in plaintext.
	TrustDomain string
	// Driver is the CSI driver; default DefaultSPIFFEDriver.
	Driver string
}

// DefaultSPIFFEDriver is cert-manager's csi-driver-spiffe.
const DefaultSPIFFEDriver = "spiffe.csi.cert-manager.io"

const (
	identityVolume = "sluice-identity"
	identityDir    = "/var/run/sluice/identity"
)

// Validate names the flag of a bad field.
func (c SidecarTLS) Validate() error {
	if c.TrustDomain == "" {
		return nil
	}
	if err := identity.CheckTrustDomain(c.TrustDomain); err != nil {
		return fmt.Errorf("sidecar-trust-domain: %w", err)
	}
	return nil
}

// errServiceAccount denies a pod whose identity would not be its service.
type errServiceAccount struct{ sa, service string }

func (e errServiceAccount) Error() string {
	return fmt.Sprintf("sluice: the sidecar's mTLS identity is the pod's service account, which must be the sluice service: "+
		"service account %q, service %q; run the pod as service account %q", e.sa, e.service, e.service)
}

// addTLS extends an injection patch: the sidecar container gets the TLS
// flags (as environment, like its other settings) and the identity volume.
func (c SidecarTLS) addTLS(pod *corev1.Pod, res *inject.Result) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	if sa != res.Service {
		return errServiceAccount{sa, res.Service}
	}
	var sc *corev1.Container
	for i := range res.Patch {
		op := &res.Patch[i]
		switch v := op.Value.(type) {
		case []corev1.Container:
			if op.Path == "/spec/initContainers" {
				for j := range v {
					if v[j].Name == inject.ContainerName {
						sc = &v[j]
					}
				}
			}
		case corev1.Container:
			if op.Path == "/spec/initContainers/-" && v.Name == inject.ContainerName {
				op.Value = &v // addressable, so that the edits below land in the patch
				sc = &v
			}
		}
	}
	if sc == nil {
		return errors.New("no sidecar container in the injection patch")
	}
	for _, f := range []struct{ flag, file string }{{"tls-cert", "tls.crt"}, {"tls-key", "tls.key"}, {"tls-ca", "ca.crt"}} {
		sc.Env = append(sc.Env, corev1.EnvVar{Name: inject.Env(f.flag), Value: path.Join(identityDir, f.file)})
	}
	sc.Env = append(sc.Env, corev1.EnvVar{Name: inject.Env("trust-domain"), Value: c.TrustDomain})
	sc.VolumeMounts = append(sc.VolumeMounts, corev1.VolumeMount{Name: identityVolume, MountPath: identityDir, ReadOnly: true})

	driver := c.Driver
	if driver == "" {
		driver = DefaultSPIFFEDriver
	}
	readOnly := true
	vol := corev1.Volume{Name: identityVolume, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: driver, ReadOnly: &readOnly,
		// The sidecar runs as inject.UID, not as the pod's user: the files
		// must be readable by its group.
		VolumeAttributes: map[string]string{"spiffe.csi.cert-manager.io/fs-group": fmt.Sprint(inject.UID)},
	}}}
	for _, v := range pod.Spec.Volumes {
		if v.Name == identityVolume {
			return fmt.Errorf("the pod already has a volume named %q", identityVolume)
		}
	}
	if len(pod.Spec.Volumes) == 0 {
		res.Patch = append(res.Patch, inject.Operation{Op: "add", Path: "/spec/volumes", Value: []corev1.Volume{vol}})
	} else {
		res.Patch = append(res.Patch, inject.Operation{Op: "add", Path: "/spec/volumes/-", Value: vol})
	}
	return nil
}
