-- 0004_tiers_cost: criticality tiers, cost units and concurrency caps
-- (issue #16), what the limits file says of them.
--
-- A callee counts cost units rather than requests when unit is 'cost': its
-- limit_rps, capacities and default limit are then cost units per second,
-- and the cost_* columns price its requests (NULL and '' are the limits
-- file's defaults: cost 1, max 1e6, no headers). A callee declares tiers
-- when tiers is true; '' in criticality_* is the file's default (header
-- x-sluice-criticality, CRITICAL). Existing rows count requests and
-- declare no tiers, as they did.
ALTER TABLE service_limits
    ADD COLUMN unit text NOT NULL DEFAULT 'requests' CHECK (unit IN ('requests', 'cost')),
    ADD COLUMN cost_default double precision CHECK (cost_default >= 0 AND cost_default < 'Infinity'),
    ADD COLUMN cost_max double precision CHECK (cost_max > 0 AND cost_max < 'Infinity'),
    ADD COLUMN cost_request_header text NOT NULL DEFAULT '',
    ADD COLUMN cost_response_header text NOT NULL DEFAULT '',
    ADD COLUMN tiers boolean NOT NULL DEFAULT false,
    ADD COLUMN criticality_header text NOT NULL DEFAULT '',
    ADD COLUMN criticality_default text NOT NULL DEFAULT ''
        CHECK (criticality_default IN ('', 'CRITICAL_PLUS', 'CRITICAL', 'SHEDDABLE_PLUS', 'SHEDDABLE')),
    ADD COLUMN criticality_max text NOT NULL DEFAULT ''
        CHECK (criticality_max IN ('', 'CRITICAL_PLUS', 'CRITICAL', 'SHEDDABLE_PLUS', 'SHEDDABLE')),
    ADD CONSTRAINT service_limits_cost_needs_unit CHECK (unit = 'cost' OR
        (cost_default IS NULL AND cost_max IS NULL AND cost_request_header = '' AND cost_response_header = '')),
    ADD CONSTRAINT service_limits_criticality_needs_tiers CHECK (tiers OR
        (criticality_header = '' AND criticality_default = '' AND criticality_max = ''));

-- A bucket's settings other than its limit, which it may have without one
-- (a leaf capped in flight alone, a caller given a default tier):
--   (callee, caller, '')          the caller's default tier, the highest
--                                 it may claim, its cap on requests in flight
--   (callee, caller, procedure)   the leaf's cap on requests in flight
--   (callee, '*', procedure)      the procedure's default tier and static cost
-- '' is no tier, 0 no cap, NULL no cost. A row says something: a bucket
-- with no settings has none.
CREATE TABLE bucket_settings (
    callee          text COLLATE "C" NOT NULL,
    caller          text COLLATE "C" NOT NULL,
    procedure       text COLLATE "C" NOT NULL DEFAULT '',
    criticality     text NOT NULL DEFAULT ''
        CHECK (criticality IN ('', 'CRITICAL_PLUS', 'CRITICAL', 'SHEDDABLE_PLUS', 'SHEDDABLE')),
    max_criticality text NOT NULL DEFAULT ''
        CHECK (max_criticality IN ('', 'CRITICAL_PLUS', 'CRITICAL', 'SHEDDABLE_PLUS', 'SHEDDABLE')),
    max_concurrency bigint NOT NULL DEFAULT 0 CHECK (max_concurrency BETWEEN 0 AND 4294967295),
    cost            double precision CHECK (cost >= 0 AND cost < 'Infinity'),
    updated_by      text NOT NULL,
    reason          text NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (callee, caller, procedure),
    CHECK (caller <> '*' OR procedure <> ''),
    -- a leaf: a cap alone
    CHECK (caller = '*' OR procedure = '' OR (criticality = '' AND max_criticality = '' AND cost IS NULL)),
    -- a procedure: a default tier and a cost
    CHECK (caller <> '*' OR (max_criticality = '' AND max_concurrency = 0)),
    -- a caller: no cost
    CHECK (cost IS NULL OR caller = '*'),
    CHECK (criticality <> '' OR max_criticality <> '' OR max_concurrency > 0 OR cost IS NOT NULL)
);
