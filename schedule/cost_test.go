package schedule_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// counter is a pgx tracer that counts the statements its pool sends: one
// round trip each (the extended protocol's parse, bind and execute go in
// one flight).
type counter struct {
	mu   sync.Mutex
	sqls []string
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "listen ") {
		return ctx // the store's listener, started once on a connection of its own: not on a Start's path
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sqls = append(c.sqls, strings.Join(strings.Fields(d.SQL), " "))
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// during returns the statements sent while f ran.
func (c *counter) during(f func()) []string {
	c.mu.Lock()
	n := len(c.sqls)
	c.mu.Unlock()
	f()
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.sqls[n:]...)
}

// TestRoundTrips pins the costs the package doc states: the winner's Start
// six round trips and End two; a Start that finds its slot taken one when
// the slot's run has ended, two while it runs, four while it starts.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	var ca, cb counter
	a := newReplicaOn(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &ca }), "a")
	b := newReplicaOn(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &cb }), "b")
	ja, jb := a.job(t, "cost", schedule.Policy{}), b.job(t, "cost", schedule.Policy{})
	check := func(what string, want int, sqls []string) {
		t.Helper()
		if len(sqls) != want {
			t.Errorf("%s: %d round trips, want %d: %q", what, len(sqls), want, sqls)
		}
	}
	marking, mark := make(chan struct{}), make(chan struct{})
	schedule.SetBeforeMark(ja, func() { close(marking); <-mark })
	var run *schedule.Run
	started := make(chan []string)
	go func() {
		started <- ca.during(func() {
			var err error
			if run, err = ja.StartSlot(ctx, "s"); err != nil {
				t.Error(err)
			}
		})
	}()
	<-marking
	check("a Start of a slot being started", 4, cb.during(func() { taken(t)(jb.StartSlot(ctx, "s")) }))
	close(mark)
	check("the winner's Start", 6, <-started)
	if run == nil {
		t.FailNow()
	}
	check("a Start of a slot whose run runs", 2, cb.during(func() { taken(t)(jb.StartSlot(ctx, "s")) }))
	check("End", 2, ca.during(func() {
		if _, err := run.End(ctx, nil); err != nil {
			t.Error(err)
		}
	}))
	check("a Start of a slot run", 1, cb.during(func() { taken(t)(jb.StartSlot(ctx, "s")) }))
}

// taken returns a func that fails t unless err, a Start's, says the slot
// is taken.
func taken(t *testing.T) func(*schedule.Run, error) {
	return func(run *schedule.Run, err error) {
		t.Helper()
		if !errors.Is(err, schedule.ErrTaken) {
			t.Errorf("Start: %v, want taken", err)
			_, _ = run.End(context.Background(), nil)
		}
	}
}
