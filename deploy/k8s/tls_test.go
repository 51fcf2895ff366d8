package k8s_test

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sluicehq/sluice/internal/identity"
)

// TestMutualTLS checks the TLS wiring of every overlay: either no sluice
// binary gets TLS flags (plaintext, as overlays/dev), or every one does,
// consistently: the controller and the aggregators mount the Secret of a
// Certificate whose one URI is their identity in the trust domain they are
// given, with the three files the flags name, and the injector gives
// sidecars the same trust domain.
func TestMutualTLS(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		want := map[string]identity.Kind{"sluice-controller": identity.Controller, "sluice-aggregator": identity.Aggregator}
		domains := map[string]string{} // deployment → its trust domain, "" for plaintext
		for name, kind := range want {
			tmpl := podTemplate(t, r, name)
			c := tmpl.Spec.Containers[0]
			flags := map[string]string{}
			for _, a := range c.Args {
				if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
					flags[k] = v
				}
			}
			if flags["tls-cert"] == "" && flags["tls-key"] == "" && flags["tls-ca"] == "" {
				domains[name] = ""
				continue
			}
			td := flags["trust-domain"]
			domains[name] = td
			// Each file is in one mounted Secret that a Certificate writes.
			var secret string
			for _, f := range []string{"tls-cert", "tls-key", "tls-ca"} {
				path := flags[f]
				var found string
				for _, m := range c.VolumeMounts {
					if strings.HasPrefix(path, m.MountPath+"/") {
						for _, v := range tmpl.Spec.Volumes {
							if v.Name == m.Name && v.Secret != nil {
								found = v.Secret.SecretName
							}
						}
					}
				}
				if found == "" {
					t.Errorf("%s: --%s=%s is in no mounted Secret", name, f, path)
				}
				secret = found
			}
			var cert *certManagerCertificate
			for _, c := range all[*certManagerCertificate](r) {
				if c.Spec.SecretName == secret {
					cert = c
				}
			}
			if cert == nil {
				t.Errorf("%s: no Certificate writes Secret %q", name, secret)
				continue
			}
			if len(cert.Spec.URIs) != 1 {
				t.Errorf("Certificate %s: %d URIs, want exactly one SPIFFE ID", cert.Name, len(cert.Spec.URIs))
				continue
			}
			id, err := identity.Parse(cert.Spec.URIs[0], td)
			if err != nil || id.Kind != kind {
				t.Errorf("Certificate %s: %q is not a %v of trust domain %q: %v", cert.Name, cert.Spec.URIs[0], kind, td, err)
			}
			if !contains(cert.Spec.Usages, "client auth") || !contains(cert.Spec.Usages, "server auth") {
				t.Errorf("Certificate %s: usages %v, want both server and client auth", cert.Name, cert.Spec.Usages)
			}
		}
		inj := one[*appsv1.Deployment](t, r, "sluice-injector")
		sidecarTD := ""
		for _, a := range inj.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--sidecar-trust-domain="); ok {
				sidecarTD = v
			}
		}
		if domains["sluice-controller"] != domains["sluice-aggregator"] || domains["sluice-controller"] != sidecarTD {
			t.Errorf("trust domains differ: controller %q, aggregator %q, injected sidecars %q (empty: plaintext)",
				domains["sluice-controller"], domains["sluice-aggregator"], sidecarTD)
		}
		if r.overlay == "overlays/prod" && sidecarTD == "" {
			t.Error("prod runs in plaintext")
		}
	})
}
