package leader_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// TestSafetyChurn runs five candidate processes, each behind a
// partitionable proxy, through rounds of random faults on the leader —
// SIGKILL, a pause (SIGSTOP … SIGCONT), a real network partition — while
// every leader makes guarded writes. Then it checks the record:
//
//   - no instant when two processes lead on unexpired terms: two processes'
//     leading intervals (ELECTED … DEMOTED, by the machine's one wall clock)
//     overlap only while the older term's process was paused, plus its first
//     moments after SIGCONT, when its own timers have not run yet;
//   - terms are strictly increasing in the order of election;
//   - the fenced resource accepted no write of a stale term: in the order
//     they were made, written terms never decrease;
//   - liveness: after every round's fault heals, a leader exists within the
//     bound.
//
// LEADER_CHURN_ROUNDS sets the rounds (default 12; 200 for the full run).
func TestSafetyChurn(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	rounds := 12
	if n, err := strconv.Atoi(os.Getenv("LEADER_CHURN_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	const ttl = 2 * time.Second
	db := setup(t)
	if _, err := db.Conn(t).Exec(ctxT(t, time.Minute),
		"create table fenced (seq bigserial primary key, term bigint not null, writer text not null)"); err != nil {
		t.Fatal(err)
	}
	h := newHub()
	type member struct {
		proxy *pgtest.Proxy
		dsn   string
		id    string
		slot  int // which settings
	}
	members := map[*proc]member{}
	// Candidates with different settings, as in a rolling deploy: the
	// advisory PingInterval and the Grace each trusts its session for.
	settings := [][]string{
		{"LEADER_CHILD_PING=100ms"},
		{"LEADER_CHILD_PING=200ms"},
		{"LEADER_CHILD_PING=400ms"}, // Grace 1.2s
		{"LEADER_CHILD_PING=200ms", "LEADER_CHILD_GRACE=1s"},
		{"LEADER_CHILD_PING=50ms", "LEADER_CHILD_GRACE=100ms"},
	}
	spawn := func(id string, m member) {
		m.id = id
		env := append([]string{"LEADER_CHILD_FENCED=1"}, settings[m.slot]...)
		members[h.spawn(t, m.dsn, id, ttl, env...)] = m
	}
	start := h.mark()
	for i := range 5 {
		p, dsn := db.Proxy(t, pgtest.Partitionable())
		spawn(fmt.Sprintf("c%d", i), member{proxy: p, dsn: dsn, slot: i})
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	type pause struct {
		p          *proc
		stop, cont time.Time
	}
	var pauses []pause
	obs := db.Conn(t)
	lead := h.elected(t, start).from
	for round := range rounds {
		from := h.mark()
		var fault string
		switch r.IntN(3) {
		case 0:
			fault = "kill"
			_ = lead.cmd.Process.Kill()
			h.find(t, from, "the killed leader's exit", func(m msg) bool { return m.from == lead && m.kind == "EXIT" })
			m := members[lead]
			delete(members, lead)
			spawn(fmt.Sprintf("%s.%d", m.id, round), m)
		case 1:
			fault = "pause"
			d := time.Duration(200+r.IntN(4000)) * time.Millisecond
			stop := time.Now()
			_ = lead.cmd.Process.Signal(syscall.SIGSTOP)
			<-time.After(d) // the fault's duration, not synchronisation
			_ = lead.cmd.Process.Signal(syscall.SIGCONT)
			pauses = append(pauses, pause{lead, stop, time.Now()})
		case 2:
			fault = "partition"
			d := time.Duration(200+r.IntN(4000)) * time.Millisecond
			if err := members[lead].proxy.Partition(); err != nil {
				t.Fatal(err)
			}
			<-time.After(d) // the fault's duration
			members[lead].proxy.Pass()
		}
		// Liveness: a leader within TTL + RetryInterval (+ slack) of healing.
		healed := time.Now()
		term, p := leaderNow(t, h, obs, from, healed.Add(ttl+200*time.Millisecond+3*time.Second))
		lead = p
		t.Logf("round %d: %s; leader %s term %d after %v", round, fault, lead.id, term, time.Since(healed).Round(time.Millisecond))
	}
	// A resumed process needs a moment to be scheduled and to run its own
	// timers; on 2 shared cores under -race that can take a while.
	const resumeGrace = 2 * time.Second
	// The check judges what each process reported up to now; a process
	// resumed from the last round's pause is judged only once its grace
	// has passed, or a term it has not yet had time to end would count as
	// running on past the check (it failed that way: the check ran 1 ms
	// after the SIGCONT and flagged an overlap 2 s later, a time it had
	// not seen).
	if n := len(pauses); n > 0 {
		<-time.After(time.Until(pauses[n-1].cont.Add(resumeGrace + 500*time.Millisecond))) // a grace to let pass, not a synchronization
	}
	check(t, h, db, func(p *proc, at time.Time) bool {
		for _, ps := range pauses {
			if ps.p == p && !at.Before(ps.stop) && at.Before(ps.cont.Add(resumeGrace)) {
				return true
			}
		}
		return false
	}, func(p *proc) string {
		var s []string
		for _, ps := range pauses {
			if ps.p == p {
				s = append(s, ps.stop.Format("15:04:05.000")+"–"+ps.cont.Format("15:04:05.000"))
			}
		}
		return strings.Join(s, ", ")
	})
}

// leaderNow waits until the database shows a held term whose process has
// reported its election, and returns them; it fails the test at deadline.
func leaderNow(t *testing.T, h *hub, obs *pgx.Conn, from int, deadline time.Time) (int64, *proc) {
	t.Helper()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		var term int64
		err := obs.QueryRow(ctxT(t, 30*time.Second), `select token from pglocks_leases
			where name = 'pglocks.leader:failover' and owner is not null and expires_at > now()`).Scan(&term)
		if err == nil {
			h.mu.Lock()
			var who *proc
			for _, m := range h.msgs {
				switch {
				case m.kind == "ELECTED" && m.term == term:
					who = m.from
				case (m.kind == "DEMOTED" || m.kind == "EXIT") && m.from == who:
					who = nil // gone, or stepping down: not a leader
				}
			}
			h.mu.Unlock()
			if who != nil {
				return term, who
			}
		} else if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			h.logSince(t, from)
			logServer(t, obs)
			t.Fatalf("no leader by the liveness deadline")
		}
		<-time.After(delay) // polling the database for a condition, with a deadline
	}
}

// check verifies the record of a churn run; paused says whether p was
// paused (or just resumed) at an instant.
func check(t *testing.T, h *hub, db *pgtest.DB, paused func(p *proc, at time.Time) bool, pausesOf func(*proc) string) {
	t.Helper()
	h.mu.Lock()
	msgs := slices.Clone(h.msgs)
	h.mu.Unlock()
	type interval struct {
		p        *proc
		term     int64
		from, to time.Time
	}
	var terms []interval
	open := map[*proc]int{}
	now := time.Now() // an open term is known to run up to now, no further
	for _, m := range msgs {
		switch m.kind {
		case "ELECTED":
			open[m.from] = len(terms)
			terms = append(terms, interval{p: m.from, term: m.term, from: m.wall, to: now})
		case "DEMOTED":
			if i, ok := open[m.from]; ok {
				terms[i].to = m.wall
				delete(open, m.from)
			}
		case "EXIT": // killed: it led until it died
			if i, ok := open[m.from]; ok {
				terms[i].to = m.at
				delete(open, m.from)
			}
		}
	}
	for i := 1; i < len(terms); i++ {
		if terms[i].term <= terms[i-1].term {
			t.Errorf("term %d elected after term %d", terms[i].term, terms[i-1].term)
		}
	}
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if a.p == b.p || !a.from.Before(b.to) || !b.from.Before(a.to) {
				continue
			}
			// Overlap [b.from, a.to): allowed only while a's process was paused.
			for at := b.from; at.Before(a.to) && at.Before(b.to); at = at.Add(10 * time.Millisecond) {
				if !paused(a.p, at) {
					t.Errorf("two leaders at %v: %s (term %d, %v–%v, paused %s) and %s (term %d, from %v)",
						at.Format("15:04:05.000"), a.p.id, a.term, a.from.Format("15:04:05.000"), a.to.Format("15:04:05.000"),
						pausesOf(a.p), b.p.id, b.term, b.from.Format("15:04:05.000"))
					break
				}
			}
		}
	}
	rows, err := db.Conn(t).Query(ctxT(t, time.Minute), "select term from fenced order by seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last, n int64
	for rows.Next() {
		var term int64
		if err := rows.Scan(&term); err != nil {
			t.Fatal(err)
		}
		if term < last {
			t.Errorf("write %d: a write of term %d was accepted after one of term %d", n, term, last)
		}
		last = max(last, term)
		n++
	}
	t.Logf("checked %d terms and %d fenced writes", len(terms), n)
	if n == 0 {
		t.Error("no fenced write was accepted at all")
	}
}

// logServer logs what the server shows of the election: its lease row,
// who holds or waits for advisory locks, and every client backend.
func logServer(t *testing.T, obs *pgx.Conn) {
	t.Helper()
	queries := []string{
		`select name, owner, token, expires_at, clock_timestamp() as now, pid, metadata from pglocks_leases`,
		`select l.pid, l.granted, l.objid, a.state, a.client_port, a.backend_start, a.state_change, left(a.query, 80)
			from pg_locks l left join pg_stat_activity a using (pid) where l.locktype = 'advisory'`,
		`select pid, client_port, state, wait_event, state_change, left(query, 80)
			from pg_stat_activity where backend_type = 'client backend'`,
	}
	for _, q := range queries {
		rows, err := obs.Query(ctxT(t, 30*time.Second), q)
		if err != nil {
			t.Logf("%s: %v", q, err)
			continue
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Logf("%v", err)
				break
			}
			t.Logf("server: %v", vals)
		}
		rows.Close()
	}
}
