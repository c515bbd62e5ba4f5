package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/leader"
)

// TestLeaderHandOverCLI runs two candidates in this process: status lists
// both, "leader handover --to" moves the term to the named one, a bad
// target exits 66 and changes nothing, and "leader resign" ends a term.
func TestLeaderHandOverCLI(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	elected := make(chan string, 10)
	for _, id := range []string{"one", "two"} {
		pool, err := pgxpool.New(ctx, c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		e, err := leader.New(leader.Config{Name: "cli", Pool: pool, Identity: id, Value: "http://" + id,
			TTL: 3 * time.Second, RetryInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, func(ctx context.Context, _ leader.Term) error {
				elected <- id
				<-ctx.Done()
				return nil
			})
		}()
		t.Cleanup(func() {
			_ = e.Close(context.Background())
			<-done
		})
	}
	first := <-elected
	to := map[string]string{"one": "two", "two": "one"}[first]
	var out string
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out, "http://one") || !strings.Contains(out, "http://two") {
		if time.Now().After(deadline) {
			t.Fatalf("status does not list both candidates:\n%s", out)
		}
		out, _, _ = c.run("status", "cli")
	}
	if !strings.Contains(out, "CANDIDATES") {
		t.Fatalf("status:\n%s", out)
	}
	if _, errOut, code := c.run("leader", "handover", "--to", "nobody", "cli"); code != 66 || !strings.Contains(errOut, "no such live candidate") {
		t.Fatalf("handover to nobody: %d %q", code, errOut)
	}
	out, errOut, code := c.run("leader", "handover", "--to", to, "cli")
	if code != 0 || !strings.Contains(out, "led by "+to) {
		t.Fatalf("handover: %d %q %q", code, out, errOut)
	}
	if got := <-elected; got != to {
		t.Fatalf("elected %q, want %q", got, to)
	}
	if out, errOut, code := c.run("leader", "resign", "cli"); code != 0 || !strings.Contains(out, "term") {
		t.Fatalf("resign: %d %q %q", code, out, errOut)
	}
}
