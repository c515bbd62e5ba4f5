package reach_test

import (
	"context"
	"testing"

	"github.com/pglocks/pglocks/internal/reach"
)

// TestAnswered: Answered calls the function given to With, through derived
// contexts, and nothing without one.
func TestAnswered(t *testing.T) {
	t.Parallel()
	reach.Answered(context.Background()) // no function: nothing happens
	var n int
	ctx, cancel := context.WithCancel(reach.With(context.Background(), func() { n++ }))
	defer cancel()
	reach.Answered(ctx)
	reach.Answered(ctx)
	if n != 2 {
		t.Errorf("answered %d times, want 2", n)
	}
}
