package allowance_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/allowance"
)

// The issue's numbers: 50 rps per tenant over 300 sidecars in 1 s windows.
func ExampleAllowance() {
	limit, sidecars, window := 50.0, 300, time.Second
	fmt.Println(allowance.Mean(limit, sidecars, window))
	fmt.Println(allowance.Allowance(limit, sidecars, window, allowance.DefaultQuantile))
	fmt.Println(allowance.ReportThreshold(limit, sidecars, 30*window, allowance.DefaultQuantile))
	fmt.Println(allowance.LocalDropRatio(4, 5))
	// Output:
	// 0.16666666666666666
	// 1
	// 5
	// 0.19999999999999996
}

// The over-enforcement table of the package doc: the expected share of a
// compliant value's requests that the local rule drops, at its limit and at
// half of it, for mean counts λ per sidecar and window.
func ExampleExpectedDropShare() {
	for _, f := range []float64{1, 0.5} {
		for _, lambda := range []float64{0.1, 1, 10, 100, 1000} {
			line := fmt.Sprintf("%v×limit λ=%-6v", f, lambda)
			for _, q := range []float64{0.9, 0.95, 0.99} {
				a := max(1, allowance.PoissonQuantile(lambda, q))
				line += fmt.Sprintf("  A=%-4d %-10s", a, fmt.Sprintf("%.2g%%", 100*allowance.ExpectedDropShare(f*lambda, a)))
			}
			fmt.Println(strings.TrimRight(line, " "))
		}
	}
	// Output:
	// 1×limit λ=0.1     A=1    2.4%        A=1    2.4%        A=1    2.4%
	// 1×limit λ=1       A=2    3.9%        A=3    0.66%       A=4    0.097%
	// 1×limit λ=10      A=14   0.24%       A=15   0.12%       A=18   0.012%
	// 1×limit λ=100     A=113  0.02%       A=117  0.0076%     A=124  0.0011%
	// 1×limit λ=1000    A=1041 0.0019%     A=1052 0.00081%    A=1074 0.00011%
	// 0.5×limit λ=0.1     A=1    1.2%        A=1    1.2%        A=1    1.2%
	// 0.5×limit λ=1       A=2    1.2%        A=3    0.1%        A=4    0.0079%
	// 0.5×limit λ=10      A=14   0.00058%    A=15   0.00016%    A=18   2.5e-06%
	// 0.5×limit λ=100     A=113  3.4e-16%    A=117  1e-17%      A=124  1.7e-20%
	// 0.5×limit λ=1000    A=1041 2.1e-102%   A=1052 5.8e-106%   A=1074 3.3e-113%
}
