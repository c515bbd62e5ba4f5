package leader_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// runChild runs a candidate process when the test binary is started as one
// (LEADER_CHILD_DSN set): it campaigns, prints ELECTED and DEMOTED lines
// with its wall clock, resigns on SIGUSR1 and exits on SIGTERM.
func runChild() bool {
	dsn := os.Getenv("LEADER_CHILD_DSN")
	if dsn == "" {
		return false
	}
	if err := child(dsn); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func child(dsn string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Candidates may differ in their settings (LEADER_CHILD_PING, _GRACE).
	ping, _ := time.ParseDuration(os.Getenv("LEADER_CHILD_PING"))
	grace, _ := time.ParseDuration(os.Getenv("LEADER_CHILD_GRACE"))
	locker, err := advisory.New(pool, advisory.Config{PingInterval: ping})
	if err != nil {
		return err
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		return err
	}
	ttl, _ := time.ParseDuration(os.Getenv("LEADER_CHILD_TTL"))
	e, err := leader.New(leader.Config{
		Name: "failover", Pool: pool, Locker: locker, Store: store, Grace: grace,
		Identity: os.Getenv("LEADER_CHILD_ID"), TTL: ttl, RetryInterval: 200 * time.Millisecond,
		HandOverOnClose: os.Getenv("LEADER_CHILD_HANDOVER") != "",
		Logger:          slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		return err
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			_ = e.Resign(ctx)
		}
	}()
	fmt.Println("READY")
	fenced := os.Getenv("LEADER_CHILD_FENCED") != ""
	err = e.Run(ctx, func(ctx context.Context, term leader.Term) error {
		// This process believes it leads while its ctx is live and its term
		// is trusted: the contract a leader's work is held to.
		// An ended term's TrustedUntil is the zero time: its belief ended by
		// the last deadline it read, or now.
		var last time.Time
		trusted := func() (bool, time.Time) {
			now := time.Now()
			tu := term.TrustedUntil()
			if tu.IsZero() {
				if last.IsZero() || now.Before(last) {
					return false, now
				}
				return false, last
			}
			until := now.Add(time.Until(tu)) // as a wall time
			last = until
			return ctx.Err() == nil && now.Before(until), until
		}
		if ok, _ := trusted(); !ok {
			fmt.Printf("LATE %d %d\n", term.Number, time.Now().UnixNano())
			<-ctx.Done()
			return nil
		}
		fmt.Printf("ELECTED %d %d\n", term.Number, time.Now().UnixNano())
		var end time.Time
		for {
			ok, until := trusted()
			if !ok {
				if end = time.Now(); until.Before(end) {
					end = until // belief ended at the trust deadline at the latest
				}
				break
			}
			if fenced {
				// A guarded write; a deposed term's is refused.
				_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := term.Guard(ctx, tx); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "insert into fenced (term, writer) values ($1, $2)", term.Number, os.Getenv("LEADER_CHILD_ID"))
					return err
				})
			}
			wait := time.NewTimer(10 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-wait.C:
			}
			wait.Stop()
		}
		fmt.Printf("DEMOTED %d %d %v\n", term.Number, end.UnixNano(), context.Cause(ctx))
		<-ctx.Done()
		return nil
	})
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = store.Close(cctx)
	_ = locker.Close(cctx)
	return err
}

// proc is a candidate child process as the parent sees it.
type proc struct {
	id  string
	cmd *exec.Cmd
}

type msg struct {
	from *proc
	kind string // READY, ELECTED, DEMOTED, ERROR, EXIT
	term int64
	wall time.Time // the child's clock
	at   time.Time // when the parent read it
	text string
}

// hub collects every child's lines in order; waiters search it from a
// position and block on its change channel, with a deadline.
type hub struct {
	mu      sync.Mutex
	msgs    []msg
	procs   []*proc
	changed chan struct{}
}

func newHub() *hub { return &hub{changed: make(chan struct{})} }

func (h *hub) add(m msg) {
	h.mu.Lock()
	h.msgs = append(h.msgs, m)
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

// mark returns the position of the next message.
func (h *hub) mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// find returns the first message at or after from that matches, waiting
// for one up to a minute.
func (h *hub) find(t *testing.T, from int, what string, match func(msg) bool) msg {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		h.mu.Lock()
		for _, m := range h.msgs[from:] {
			if m.kind == "ERROR" {
				h.mu.Unlock()
				t.Fatalf("%s: %s", m.from.id, m.text)
			}
			if match(m) {
				h.mu.Unlock()
				return m
			}
		}
		changed := h.changed
		from = len(h.msgs)
		h.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			h.dump()
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (h *hub) spawn(t *testing.T, dsn, id string, ttl time.Duration, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LEADER_CHILD_DSN="+dsn, "LEADER_CHILD_ID="+id, "LEADER_CHILD_TTL="+ttl.String())
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	from := h.mark()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{id: id, cmd: cmd}
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			m := msg{from: p, kind: f[0], at: time.Now(), text: sc.Text()}
			if strings.Contains(sc.Text(), `msg="leader: campaigning"`) {
				m.kind = "CAMPAIGN"
			}
			if len(f) >= 3 {
				m.term, _ = strconv.ParseInt(f[1], 10, 64)
				ns, _ := strconv.ParseInt(f[2], 10, 64)
				m.wall = time.Unix(0, ns)
			}
			h.add(m)
		}
		_ = cmd.Wait()
		h.add(msg{from: p, kind: "EXIT", at: time.Now()})
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	h.find(t, from, id+" READY", func(m msg) bool { return m.from == p && m.kind == "READY" })
	return p
}

// dump makes every child print its goroutines (Go's SIGQUIT handler), for
// diagnosing a hang, and waits for them to exit.
func (h *hub) dump() {
	h.mu.Lock()
	procs := slices.Clone(h.procs)
	h.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	}
}

// logSince logs every child line from position from on, with the time the
// parent read it: a failing test's record of what each candidate saw.
func (h *hub) logSince(t *testing.T, from int) {
	t.Helper()
	h.mu.Lock()
	msgs := slices.Clone(h.msgs[from:])
	h.mu.Unlock()
	for _, m := range msgs {
		t.Logf("%s %s: %s", m.at.Format("15:04:05.000"), m.from.id, m.text)
	}
}

// elected waits for an ELECTED line at or after from.
func (h *hub) elected(t *testing.T, from int) msg {
	t.Helper()
	return h.find(t, from, "an election", func(m msg) bool { return m.kind == "ELECTED" })
}

func trials(t *testing.T, def int) int {
	if n, err := strconv.Atoi(os.Getenv("LEADER_TRIALS")); err == nil && n > 0 {
		return n
	}
	if testing.Short() {
		return 2
	}
	return def
}

func summary(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	p99 := s[min(len(s)-1, (len(s)*99+99)/100-1)] // nearest rank
	return fmt.Sprintf("n=%d min=%v median=%v p99=%v max=%v", len(s), s[0].Round(time.Millisecond),
		s[len(s)/2].Round(time.Millisecond), p99.Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// TestFailoverProcesses measures failover between candidate processes:
// the leader is SIGKILLed, its session terminated, or it resigns; a new
// leader must follow, in a higher term.
func TestFailoverProcesses(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"SIGKILL", "TerminateSession", "Resign"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ttl := 10 * time.Second
			h := newHub()
			from := h.mark()
			h.spawn(t, db.DSN, fault+"-0", ttl)
			h.spawn(t, db.DSN, fault+"-1", ttl)
			var took []time.Duration
			again := 0 // trials whose leader was elected again
			m := h.elected(t, from)
			lead, term := m.from, m.term
			campaignFrom := from
			for i := range trials(t, 20) {
				from := h.mark()
				start := time.Now()
				switch fault {
				case "SIGKILL":
					_ = lead.cmd.Process.Kill()
				case "TerminateSession":
					pid := sessionPIDByName(t, db, "failover")
					if err := db.Server.TerminateBackend(ctxT(t, 30*time.Second), pid); err != nil {
						t.Fatal(err)
					}
				case "Resign":
					// Hand over to a candidate that campaigns, not to one
					// still sitting out after its own resignation.
					h.find(t, campaignFrom, "the other candidate's campaign", func(m msg) bool {
						return m.from != lead && m.kind == "CAMPAIGN"
					})
					from, start = h.mark(), time.Now()
					_ = lead.cmd.Process.Signal(syscall.SIGUSR1)
				}
				next := h.elected(t, from)
				took = append(took, next.at.Sub(start))
				if next.term <= term {
					t.Fatalf("trial %d: term %d after %d", i, next.term, term)
				}
				if fault == "SIGKILL" {
					h.find(t, from, "the killed leader's exit", func(m msg) bool { return m.from == lead && m.kind == "EXIT" })
					h.spawn(t, db.DSN, fmt.Sprintf("%s-%d", fault, i+2), ttl)
				}
				if next.from == lead {
					again++
				} else {
					// The old leader campaigns anew after from. A leader
					// elected again (the other candidate's wake-up took
					// longer than its sit-out, on a loaded machine) leaves
					// the other's campaign under way: its line stands.
					campaignFrom = from
				}
				lead, term = next.from, next.term
			}
			t.Logf("%s → new leader: %s; the same leader again in %d", fault, summary(took), again)
		})
	}
}

func sessionPIDByName(t *testing.T, db *pgtest.DB, name string) uint32 {
	t.Helper()
	e, err := leader.New(leader.Config{Name: name, Pool: db.NewPool(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	return sessionPID(t, db, e)
}

// TestFailoverPartition cuts the leader off from the database for real (a
// partitionable proxy): the old leader must step down before a new one is
// elected, and the new one must lead within TTL + RetryInterval.
func TestFailoverPartition(t *testing.T) {
	t.Parallel()
	db := setup(t)
	const ttl = 3 * time.Second
	h := newHub()
	proxies := map[*proc]*pgtest.Proxy{}
	from := h.mark()
	for i := range 2 {
		p, dsn := db.Proxy(t, pgtest.Partitionable())
		proxies[h.spawn(t, dsn, fmt.Sprintf("part-%d", i), ttl)] = p
	}
	m := h.elected(t, from)
	lead := m.from
	var took []time.Duration
	for i := range trials(t, 5) {
		from := h.mark()
		start := time.Now()
		if err := proxies[lead].Partition(); err != nil {
			t.Fatal(err)
		}
		demoted := h.find(t, from, "the cut-off leader's demotion", func(m msg) bool { return m.from == lead && m.kind == "DEMOTED" })
		next := h.elected(t, from)
		if next.from == lead {
			t.Fatalf("trial %d: the partitioned candidate was elected", i)
		}
		if !demoted.wall.Before(next.wall) {
			t.Fatalf("trial %d: new leader at %v, old one demoted only at %v", i, next.wall, demoted.wall)
		}
		if next.term <= m.term {
			t.Fatalf("trial %d: term %d after %d", i, next.term, m.term)
		}
		took = append(took, next.at.Sub(start))
		t.Logf("trial %d: old leader demoted %v after the cut, new leader %v after it",
			i, demoted.at.Sub(start).Round(time.Millisecond), next.at.Sub(start).Round(time.Millisecond))
		if limit := ttl + 200*time.Millisecond + 2*time.Second; next.at.Sub(start) > limit {
			t.Errorf("trial %d: new leader after %v, beyond TTL + RetryInterval (+2s slack)", i, next.at.Sub(start))
		}
		proxies[lead].Pass()
		lead, m = next.from, next
	}
	t.Logf("partition → new leader: %s", summary(took))
}
