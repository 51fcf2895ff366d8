package adaptive

import (
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
)

// The estimator is a pure law, as pkg/dropratio is. Its tests may run
// against the modelled knee.
func TestPurity(t *testing.T) {
	testkit.CheckPure(t, "github.com/sluicehq/sluice/pkg/adaptive",
		"github.com/sluicehq/sluice/internal/testkit", "github.com/sluicehq/sluice/internal/testkit/knee")
}
