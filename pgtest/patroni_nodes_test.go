package pgtest

import (
	"context"
	"strings"
	"testing"
)

// TestPatroniTooManyNodes: a cluster's network is a /28, so a fourteenth
// node would take the broadcast address or the next cluster's; StartPatroni
// refuses it by name, before it starts anything.
func TestPatroniTooManyNodes(t *testing.T) {
	p, err := StartPatroni(context.Background(), PatroniOptions{Nodes: 14})
	if err == nil {
		_ = p.Close()
		t.Fatal("StartPatroni with 14 nodes: no error")
	}
	if !strings.Contains(err.Error(), "14 nodes; at most 13") {
		t.Fatalf("StartPatroni with 14 nodes: %v, want an error naming the bound", err)
	}
}
