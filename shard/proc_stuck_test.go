package shard_test

import (
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestProcStopMidTransaction stops (SIGSTOP) a member process while it
// holds shards' lease rows locked in guarded transactions (each write's
// transaction stays open 100 ms after its Guard). Past its trust window
// the others take every other shard of its, but not those: a takeover
// waits for an open guarded transaction (lease's Fencing), so for a
// member paused inside one, the takeover bound TTL + PollInterval does
// not hold — those shards wait for the pause to end. Resumed, its
// transactions end and the group settles; the checker finds no two
// trusted owners.
func TestProcStopMidTransaction(t *testing.T) {
	t.Parallel()
	c := newProcCluster(t, procConfig{shards: 20, members: 2, ttl: 2 * time.Second, poll: 100 * time.Millisecond,
		every: 400 * time.Millisecond, hold: 100 * time.Millisecond, settleWithin: time.Minute})
	r := &procRun{c: c, rng: rand.New(rand.NewPCG(1, 1))}
	c.spawn(c.newID())
	c.spawn(c.newID())
	before := r.settled("start")
	victim := r.pick()
	t0, locked := c.stopLocked(victim)
	took, stuck := c.waitAway(victim, before, t0)
	t.Logf("SIGSTOP %s holding the rows of shards %v locked: its other shards taken over after %v; stuck: %v",
		victim, locked, took.Round(time.Millisecond), stuck)
	if !slices.Equal(stuck, locked) {
		t.Errorf("shards %v stuck, want %v, those whose rows the stopped member holds locked", stuck, locked)
	}
	p := c.member(victim)
	p.stopped.Store(false)
	c.signal(victim, syscall.SIGCONT)
	r.settled("SIGCONT " + victim)
	p.paused.Store(false)
	rep := c.check()
	t.Logf("checker: %s", rep)
	if n := len(rep.violations) + rep.more; n > 0 {
		t.Errorf("%d violations of 'never two trusted owners'", n)
	}
	for _, e := range c.unexpected() {
		t.Errorf("unexpected: %s", e)
	}
}

// stopLocked SIGSTOPs member id at a moment when it holds at least one
// shard's row locked in a guarded transaction: if it holds none once
// stopped, it is resumed and stopped again a little later. It returns
// when it was stopped and the shards whose rows it holds locked.
func (c *procCluster) stopLocked(id string) (time.Time, []string) {
	c.t.Helper()
	p := c.member(id)
	p.paused.Store(true)
	p.stopped.Store(true)
	deadline := time.Now().Add(c.cfg.settleWithin)
	for {
		t0 := time.Now()
		c.signal(id, syscall.SIGSTOP)
		for c.activeTx(id) > 0 {
			if time.Now().After(deadline) {
				c.t.Fatalf("%s's statements still active", id)
			}
			<-time.After(10 * time.Millisecond) // polling a condition
		}
		if locked := c.lockedRows(id); len(locked) > 0 {
			return t0, locked
		}
		c.signal(id, syscall.SIGCONT)
		if time.Now().After(deadline) {
			c.t.Fatalf("%s never stopped holding a row lock", id)
		}
		<-time.After(c.cfg.every / 3) // a new moment to stop it at, not a synchronization
	}
}
