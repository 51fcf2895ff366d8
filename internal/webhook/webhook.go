// Package webhook is the sluice injector: a mutating admission webhook that
// adds the sidecar to pods (the injection itself is internal/webhook/inject), served
// over HTTPS with a certificate read from files and reloaded when they
// change.
//
// The API server calls it on two paths, one per webhook of the
// MutatingWebhookConfiguration in deploy/k8s:
//
//	/inject            pods labelled sluice.io/inject=true; only those that opt in are injected
//	/inject/namespace  every pod of a namespace labelled sluice.io/inject=enabled, unless it opts out
//
// so the webhook needs no access to the Kubernetes API: the namespace's
// choice arrives as the path the API server was told to call.
package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// Paths the webhook serves.
const (
	PathPod       = "/inject"
	PathNamespace = "/inject/namespace"
)

// maxBody bounds an AdmissionReview. The API server's own request limit is
// 3 MiB; a pod is far smaller.
const maxBody = 8 << 20

// Handler answers AdmissionReview requests. Safe for concurrent use.
type Handler struct {
	cfg     inject.Config
	log     *slog.Logger
	mux     *http.ServeMux
	results map[string]prometheus.Counter // by result, resolved once
	latency prometheus.Histogram
	// sidecarTLS, set before the handler serves, gives sidecars mTLS.
	sidecarTLS SidecarTLS
}

// Results of an admission, the values of the result label.
const (
	resultInjected = "injected"
	resultSkipped  = "skipped"
	resultDenied   = "denied"
	resultBad      = "bad_request"
)

// NewHandler returns the webhook's HTTP handler. reg may be nil.
func NewHandler(cfg inject.Config, log *slog.Logger, reg prometheus.Registerer) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{
		cfg:     cfg,
		log:     log,
		mux:     http.NewServeMux(),
		results: map[string]prometheus.Counter{},
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_injector_admission_duration_seconds",
			Help:    "Time to read, decide and answer one admission request.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_injector_admissions_total",
		Help: "Admission requests answered, by result: injected, skipped (left alone), denied (bad annotations), bad_request.",
	}, []string{"result"})
	for _, r := range []string{resultInjected, resultSkipped, resultDenied, resultBad} {
		h.results[r] = results.WithLabelValues(r) // zeros exported from the start, so rate() works
	}
	if reg != nil {
		reg.MustRegister(results, h.latency)
	}
	h.mux.HandleFunc("POST "+PathPod, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, inject.ScopePod) })
	h.mux.HandleFunc("POST "+PathNamespace, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, inject.ScopeNamespace) })
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, scope inject.Scope) {
	start := time.Now()
	defer func() { h.latency.Observe(time.Since(start).Seconds()) }()

	review, err := readReview(w, r)
	if err != nil {
		h.results[resultBad].Inc()
		h.log.Warn("bad admission request", "err", err, "remote", r.RemoteAddr)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := review.Request
	resp, result := h.admit(req, scope)
	h.results[result].Inc()

	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	body, err := json.Marshal(out)
	if err != nil {
		http.Error(w, "encode the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// readReview reads and checks an admission.k8s.io/v1 AdmissionReview.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, error) {
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return nil, fmt.Errorf("content type %q is not application/json", r.Header.Get("Content-Type"))
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read the request: %w", err)
	}
	review := new(admissionv1.AdmissionReview)
	if err := json.Unmarshal(data, review); err != nil {
		return nil, fmt.Errorf("decode the AdmissionReview: %w", err)
	}
	if gv := review.APIVersion; gv != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("got %s %s; this webhook speaks admission.k8s.io/v1 AdmissionReview", gv, review.Kind)
	}
	if review.Request == nil || review.Request.UID == "" {
		return nil, errors.New("the AdmissionReview has no request, or a request without a uid")
	}
	return review, nil
}

// admit decides one request. Anything that is not the creation of a Pod is
// allowed unchanged: the configuration should not send it, and refusing it
// would block the cluster for the sake of a rate limiter.
func (h *Handler) admit(req *admissionv1.AdmissionRequest, scope inject.Scope) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Version != "v1" || req.Kind.Kind != "Pod" || req.SubResource != "" ||
		req.Operation != admissionv1.Create {
		return resp, resultSkipped
	}
	pod := new(corev1.Pod)
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest,
			Reason: metav1.StatusReasonBadRequest, Message: "sluice sidecar injection: decode the pod: " + err.Error()}
		return resp, resultBad
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "…"
	}
	res, err := inject.Pod(pod, scope, h.cfg)
	var deny *inject.DenyError
	switch {
	case errors.As(err, &deny):
		h.log.Info("pod denied", "namespace", req.Namespace, "pod", name, "reason", err.Error())
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
			Reason: metav1.StatusReasonInvalid, Message: err.Error()}
		return resp, resultDenied
	case err != nil:
		// Not the pod's fault: let it through without the sidecar, as the
		// API server would if the webhook were down (failurePolicy Ignore).
		h.log.Error("injection failed; the pod goes without the sidecar", "namespace", req.Namespace, "pod", name, "err", err)
		resp.Warnings = []string{"sluice: the sidecar was not injected: " + err.Error()}
		return resp, resultSkipped
	}
	resp.Warnings = res.Warnings
	if res.Patch == nil {
		h.log.Debug("pod left alone", "namespace", req.Namespace, "pod", name, "reason", res.Skipped)
		return resp, resultSkipped
	}
	if h.sidecarTLS.TrustDomain != "" {
		if err := h.sidecarTLS.addTLS(pod, &res); err != nil {
			var sa errServiceAccount
			if errors.As(err, &sa) {
				h.log.Info("pod denied", "namespace", req.Namespace, "pod", name, "reason", err.Error())
				resp.Allowed = false
				resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
					Reason: metav1.StatusReasonInvalid, Message: err.Error()}
				return resp, resultDenied
			}
			h.log.Error("add TLS to the sidecar; the pod goes without the sidecar", "namespace", req.Namespace, "pod", name, "err", err)
			resp.Warnings = append(resp.Warnings, "sluice: the sidecar was not injected: "+err.Error())
			return resp, resultSkipped
		}
	}
	patch, err := json.Marshal(res.Patch)
	if err != nil {
		h.log.Error("encode the patch; the pod goes without the sidecar", "err", err)
		return resp, resultSkipped
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	h.log.Debug("sidecar injected", "namespace", req.Namespace, "pod", name, "service", res.Service)
	return resp, resultInjected
}
