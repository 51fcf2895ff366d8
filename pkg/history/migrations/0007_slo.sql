-- 0007_slo: a callee's objective (issue #18), what the limits file's slo:
-- says: its p99 latency in milliseconds and its error ratio, 0 for unset.
-- The controller estimates the callee's capacity from its health against
-- them. Not with unit 'cost': health counts requests. Existing rows get 0
-- for both: no objective, as before. Columns with a constant default: no
-- row is rewritten.
ALTER TABLE service_limits
    ADD COLUMN slo_latency_p99_ms double precision NOT NULL DEFAULT 0
        CHECK (slo_latency_p99_ms >= 0 AND slo_latency_p99_ms <= 86400000),
    ADD COLUMN slo_errors double precision NOT NULL DEFAULT 0
        CHECK (slo_errors >= 0 AND slo_errors < 1),
    ADD CONSTRAINT service_limits_slo_counts_requests CHECK (unit = 'requests' OR
        (slo_latency_p99_ms = 0 AND slo_errors = 0));
