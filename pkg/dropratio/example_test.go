package dropratio_test

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
)

func ExampleLaw_Step() {
	law, err := dropratio.New(dropratio.DefaultConfig())
	if err != nil {
		panic(err)
	}
	mesh := []dropratio.Service{{
		Name:     "payments",
		Capacity: math.Inf(1),
		Callers: []dropratio.Caller{
			{Name: "checkout", Offered: 500, Limit: 100}, // 5x over its limit
			{Name: "reports", Offered: 20, Limit: 100},
		},
	}}
	for _, sv := range law.Step(time.Second, mesh) {
		for _, v := range sv.Verdicts {
			fmt.Printf("%s <- %s: drop %.2f (%v), allowed %v rps\n", sv.Service, v.Caller, v.Ratio, v.Reason, v.Allowed)
		}
	}
	// Output:
	// payments <- checkout: drop 0.80 (over_limit), allowed 100 rps
	// payments <- reports: drop 0.00 (none), allowed 100 rps
}
