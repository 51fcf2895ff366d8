-- 0002_enforcement: which data plane carries out a bucket's ratio. 'upstream'
-- means the caller's proxyless gRPC client or the callee's Envoy drops before
-- a request reaches the callee's sidecar, which then only counts it
-- (docs/dataplanes.md). A service's value is the default of its callers.
-- Existing rows are sidecar-enforced, as they were.
ALTER TABLE service_limits
    ADD COLUMN enforcement text NOT NULL DEFAULT 'sidecar' CHECK (enforcement IN ('sidecar', 'upstream'));
ALTER TABLE bucket_limits
    ADD COLUMN enforcement text NOT NULL DEFAULT 'sidecar' CHECK (enforcement IN ('sidecar', 'upstream'));
