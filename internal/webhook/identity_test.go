package webhook

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// TestSidecarTLSInjected: with --sidecar-trust-domain the sidecar gets the
// csi-driver-spiffe volume and TLS flags that its own flag parsing accepts,
// whether it is the pod's first init container or not; a pod whose service
// account is not its service is denied, saying why.
func TestSidecarTLSInjected(t *testing.T) {
	h, err := NewHandler(testInject, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.sidecarTLS = SidecarTLS{TrustDomain: "cluster.local"}
	admit := func(pod *corev1.Pod) *admissionv1.AdmissionResponse {
		t.Helper()
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := h.admit(&admissionv1.AdmissionRequest{
			UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
			Namespace: "shop", Object: runtime.RawExtension{Raw: raw},
		}, inject.ScopePod)
		return resp
	}

	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
	}{
		{"no init containers or volumes", func(*corev1.Pod) {}},
		{"with an init container and a volume", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "busybox"}}
			p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := checkoutPod()
			pod.Spec.ServiceAccountName = "checkout"
			tc.edit(pod)
			got := patched(t, pod, admit(pod))
			var sc *corev1.Container
			for i := range got.Spec.InitContainers {
				if got.Spec.InitContainers[i].Name == inject.ContainerName {
					sc = &got.Spec.InitContainers[i]
				}
			}
			if sc == nil {
				t.Fatalf("no sidecar in %+v", got.Spec.InitContainers)
			}
			if len(sc.VolumeMounts) != 1 || sc.VolumeMounts[0].Name != identityVolume || !sc.VolumeMounts[0].ReadOnly {
				t.Errorf("sidecar mounts %+v", sc.VolumeMounts)
			}
			var vol *corev1.Volume
			for i := range got.Spec.Volumes {
				if got.Spec.Volumes[i].Name == identityVolume {
					vol = &got.Spec.Volumes[i]
				}
			}
			if vol == nil || vol.CSI == nil || vol.CSI.Driver != DefaultSPIFFEDriver || len(got.Spec.Volumes) != len(pod.Spec.Volumes)+1 {
				t.Fatalf("volumes %+v", got.Spec.Volumes)
			}
			checkSidecarAcceptsEnv(t, sc, "checkout-5c7d9-abcde")

			// The sidecar's TLS flags, as its binary reads them.
			env := map[string]string{}
			for _, e := range sc.Env {
				env[e.Name] = e.Value
			}
			var fl identity.Flags
			cmd := agent.Command()
			if err := cli.Apply(cmd.Flags(), "sidecar", func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
				t.Fatal(err)
			}
			fl.Cert, _ = cmd.Flags().GetString("tls-cert")
			fl.Key, _ = cmd.Flags().GetString("tls-key")
			fl.CA, _ = cmd.Flags().GetString("tls-ca")
			fl.TrustDomain, _ = cmd.Flags().GetString("trust-domain")
			if err := fl.Validate(); err != nil || !fl.Enabled() || fl.TrustDomain != "cluster.local" ||
				fl.Cert != identityDir+"/tls.crt" || fl.CA != identityDir+"/ca.crt" {
				t.Errorf("sidecar TLS flags %+v: %v", fl, err)
			}
		})
	}

	pod := checkoutPod() // service account "default", service "checkout"
	resp := admit(pod)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity ||
		!strings.Contains(resp.Result.Message, `service account "default", service "checkout"`) {
		t.Errorf("pod running as another service account: %+v", resp)
	}
}
