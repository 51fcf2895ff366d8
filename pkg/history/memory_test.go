package history_test

import (
	"testing"

	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/history/historytest"
)

func TestMemory(t *testing.T) {
	historytest.Run(t, func(t *testing.T) history.Store {
		s := history.NewMemory()
		t.Cleanup(s.Close)
		return s
	})
}
