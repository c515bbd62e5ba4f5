package schedule_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// historyJob makes r's job with a runner of its own that keeps history
// runs per job (0: the default).
func historyJob(t testing.TB, r *replica, name string, p schedule.Policy, history int) *schedule.Job {
	t.Helper()
	runner, err := schedule.New(schedule.Config{Store: r.store, Pool: r.pool, History: history})
	if err != nil {
		t.Fatal(err)
	}
	j, err := runner.Job(name, p)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// startResult is what a Start in the background returned.
type startResult struct {
	run *schedule.Run
	err error
}

// TestStalledStart: a replica stalls between its read of the slot (free)
// and its acquire of the job, while another replica runs the job's next
// slot. When it wakes, the slot's window has closed: it must not run it —
// neither again, when the slot ran and its row was pruned meanwhile
// (History 1), nor late, after a later slot ran (default History).
func TestStalledStart(t *testing.T) {
	t.Parallel()
	t.Run("History1", func(t *testing.T) { t.Parallel(); stalledStart(t, 1, true) })
	t.Run("Default", func(t *testing.T) { t.Parallel(); stalledStart(t, 0, false) })
}

func stalledStart(t *testing.T, history int, runSlot bool) {
	ctx := ctxT(t)
	db := pgtest.New(t)
	const period = 2 * time.Second
	policy := schedule.Policy{Period: period}
	a, b := newReplica(t, db, "a", 0), newReplica(t, db, "b", 0)
	ja, jb := historyJob(t, a, "stall", policy, history), historyJob(t, b, "stall", policy, history)
	tol := ja.Policy().Tolerance
	slot := awaitRoom(t, a.pool, period, tol, period/2)
	peeked, resume := make(chan struct{}), make(chan struct{})
	schedule.SetAfterPeek(ja, func() { close(peeked); <-resume })
	done := make(chan startResult, 1)
	go func() {
		run, err := ja.Start(ctx)
		done <- startResult{run, err}
	}()
	<-peeked
	if runSlot { // b runs the slot a read as free
		if _, err := jb.Do(ctx, b.work); err != nil {
			t.Fatal(err)
		}
	}
	next := awaitNext(t, b.pool, period, tol)
	if _, err := jb.Do(ctx, b.work); err != nil { // and the next one (with History 1, the slot's row goes)
		t.Fatal(err)
	}
	close(resume)
	res := <-done
	if res.run != nil {
		rec := res.run.Record()
		_, _ = res.run.End(ctx, nil)
		t.Fatalf("the stalled replica ran slot %s (token %d) after slot %s ran: late, and a second time if it ran before",
			rec.Slot, rec.Token, schedule.SlotKey(next))
	}
	if !errors.Is(res.err, schedule.ErrWindowClosed) {
		t.Fatalf("stalled Start of slot %v: %v, want ErrWindowClosed", slot, res.err)
	}
	t.Logf("stalled Start: %v", res.err)
}

// TestBusyThenTaken: two replicas wait for the job, held by a run of
// another slot; when it ends, one of them runs the slot and holds the job
// past the slot's window. The other's wait ends when the window closes:
// it must say the slot was taken, by whom, not that it was not run. The
// window (9 s) leaves room for a loaded machine between the End and the
// winner's start; every wait has a deadline.
func TestBusyThenTaken(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	const period = 12 * time.Second
	policy := schedule.Policy{Period: period}
	h, a, c := newReplica(t, db, "h", 0), newReplica(t, db, "a", 0), newReplica(t, db, "c", 0)
	jh := h.job(t, "busy", policy)
	tol := jh.Policy().Tolerance
	awaitRoom(t, h.pool, period, tol, 8*time.Second)
	other, err := jh.StartSlot(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{}, 2)
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // also when the test fails early
	ran := make(chan schedule.Record, 2)
	done := make(chan error, 2)
	for _, r := range []*replica{a, c} {
		j := r.job(t, "busy", policy)
		schedule.SetWaiting(j, func() { waiting <- struct{}{} })
		go func() {
			_, err := j.Do(ctx, func(_ context.Context, run *schedule.Run) error {
				ran <- run.Record()
				<-release // holds the job until the other's wait has ended
				return nil
			})
			done <- err
		}()
	}
	recv(t, waiting, "a waiter waiting")
	recv(t, waiting, "both waiters waiting")
	if _, err := other.End(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var winner schedule.Record
	select {
	case winner = <-ran:
	case err := <-done:
		t.Fatalf("a waiter returned before either ran the slot: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no waiter ran the slot within a minute of the End")
	}
	err = recv(t, done, "the other waiter's wait ending")
	free()
	if err2 := recv(t, done, "the winner's run ending"); err2 != nil {
		t.Errorf("the winner: %v", err2)
	}
	var te *schedule.TakenError
	if !errors.As(err, &te) || te.By.Token != winner.Token {
		t.Fatalf("the other waiter: %v, want taken by the winner's run (token %d, slot %s)", err, winner.Token, winner.Slot)
	}
	t.Logf("the other waiter: %v", err)
}

// recv receives from c, failing the test after a minute with what it
// waited for.
func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
		panic("unreachable")
	}
}
