package dropratio

import (
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
)

// The law must stay pure: standard library only, and in the non-test code
// nothing that reaches for a clock, a goroutine, I/O or a logger. Its
// tests may keep their seed corpus with internal/testkit.
func TestPurity(t *testing.T) {
	testkit.CheckPure(t, "github.com/sluicehq/sluice/pkg/dropratio", "github.com/sluicehq/sluice/internal/testkit")
}
