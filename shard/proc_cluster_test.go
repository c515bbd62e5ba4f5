package shard_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// procConfig sizes a run of member processes.
type procConfig struct {
	shards, members, rounds int
	ttl, poll, every, hold  time.Duration // hold: see procWriter
	settleWithin            time.Duration // the deadline of one settle
	plant                   string        // a bug planted in the members (the checker's own test)
}

// quiet is how long the server's view must stay unchanged to count as
// settled: every member has read the member list twice meanwhile.
func (cfg procConfig) quiet() time.Duration { return max(2*cfg.poll, 500*time.Millisecond) }

// procCluster is a group of member processes and the parent's view of
// them: their report lines, counted, and the lease table.
type procCluster struct {
	t     *testing.T
	db    *pgtest.DB
	admin *pgxpool.Pool
	cfg   procConfig

	mu      sync.Mutex
	members map[string]*procMember // spawned and not yet ended by the parent
	counts  map[string]int         // report and log lines by kind (see procWriter.write)
	samples map[string]string      // the first log line of each kind
	errs    []string               // WERR and ERROR lines, unexpected exits
	trace   []traceLine            // the members' Debug lines
	next    int
}

// logMsg finds the message of a member's log line (slog's text format).
var logMsg = regexp.MustCompile(`level=\w+ msg=(?:"([^"]*)"|(\S+))`)

// procMember is one member process.
type procMember struct {
	id      string
	cmd     *exec.Cmd
	ready   chan struct{}
	exited  chan struct{}
	ending  atomic.Bool // the parent killed it or asked it to leave
	stopped atomic.Bool // SIGSTOPped and not yet resumed
	paused  atomic.Bool // SIGSTOPped, or resumed and not yet settled: its report lines are counted apart
	tail    []string    // its last log lines, guarded by procCluster.mu
}

func newProcCluster(t *testing.T, cfg procConfig) *procCluster {
	db := pgtest.New(t)
	admin := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	if _, err := admin.Exec(ctxFor(t, time.Minute), procDDL); err != nil {
		t.Fatal(err)
	}
	return &procCluster{t: t, db: db, admin: admin, cfg: cfg, members: map[string]*procMember{}, counts: map[string]int{}, samples: map[string]string{}}
}

// ctxFor is a context for one step of the parent, ended with the test.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newID returns the identity of the next new member.
func (c *procCluster) newID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return fmt.Sprintf("p%d", c.next-1)
}

// live returns the identities of the members the parent runs and has not
// stopped (SIGSTOP), sorted.
func (c *procCluster) live() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, p := range c.members {
		if !p.stopped.Load() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// member returns the running member id.
func (c *procCluster) member(id string) *procMember {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[id]
}

// spawn starts member id and waits for its READY.
func (c *procCluster) spawn(id string) *procMember {
	t := c.t
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envProcDSN+"="+c.db.DSN, envProcID+"="+id,
		fmt.Sprintf("%s=%d", envProcN, c.cfg.shards), envProcTTL+"="+c.cfg.ttl.String(),
		envProcPoll+"="+c.cfg.poll.String(), envProcEvery+"="+c.cfg.every.String(),
		envProcHold+"="+c.cfg.hold.String(), envProcPlant+"="+c.cfg.plant, envProcDebug+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &procMember{id: id, cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{})}
	c.mu.Lock()
	c.members[id] = p
	c.mu.Unlock()
	go c.read(p, out)
	t.Cleanup(func() { c.end(p) })
	select {
	case <-p.ready:
	case <-p.exited:
		t.Fatalf("member %s exited before it was ready: %v", id, c.errs)
	case <-time.After(time.Minute):
		t.Fatalf("member %s not ready within a minute", id)
	}
	return p
}

// read counts p's report lines, keeps its last log lines, and records its
// exit: unexpected unless the parent ended it (SIGTERM: exit status 0).
func (c *procCluster) read(p *procMember, out io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		c.mu.Lock()
		switch f[0] {
		case "READY":
			close(p.ready)
		case "REFUSED", "LATE": // REFUSED kind by …, LATE committed …
			key := strings.Join(f[:min(map[string]int{"REFUSED": 3, "LATE": 2}[f[0]], len(f))], " ")
			if p.paused.Load() {
				key += " (SIGSTOPped member)"
			}
			c.counts[key]++
		case "WERR", "ERROR":
			c.errs = append(c.errs, p.id+": "+line)
		default:
			if tl, ok := parseTrace(p.id, line); ok {
				c.trace = append(c.trace, tl)
				if tl.attrs["level"] == "DEBUG" {
					break
				}
			}
			if m := logMsg.FindStringSubmatch(line); m != nil {
				key := "log " + m[1] + m[2]
				if p.paused.Load() {
					key += " (SIGSTOPped member)"
				}
				c.counts[key]++
				if _, ok := c.samples[key]; !ok {
					c.samples[key] = p.id + ": " + line
				}
			}
			p.tail = append(p.tail, line)
			if len(p.tail) > 20 {
				p.tail = p.tail[1:]
			}
		}
		c.mu.Unlock()
	}
	err := p.cmd.Wait()
	if st := p.cmd.ProcessState; !p.ending.Load() || (!st.Exited() && st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL) ||
		(st.Exited() && st.ExitCode() != 0) {
		c.mu.Lock()
		c.errs = append(c.errs, fmt.Sprintf("%s: exited: %v (ended by the parent: %v)", p.id, err, p.ending.Load()))
		c.mu.Unlock()
	}
}

// signal sends sig to member id; SIGKILL and SIGTERM end it for the
// parent, which then no longer counts it.
func (c *procCluster) signal(id string, sig syscall.Signal) *procMember {
	p := c.member(id)
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.ending.Store(true)
		c.mu.Lock()
		delete(c.members, id)
		c.mu.Unlock()
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %v to %s: %v", sig, id, err)
	}
	return p
}

// signalAll sends sig to every member the parent runs.
func (c *procCluster) signalAll(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.members {
		_ = p.cmd.Process.Signal(sig)
	}
}

// waitExit waits for p's exit, up to a minute.
func (c *procCluster) waitExit(p *procMember) {
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		c.t.Fatalf("member %s did not exit within a minute", p.id)
	}
}

// end ends p at the test's end: it leaves on SIGTERM (resumed first if
// stopped), and is killed if it has not exited within 30 s.
func (c *procCluster) end(p *procMember) {
	p.ending.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		c.t.Errorf("member %s did not leave within 30 s of SIGTERM", p.id)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// unexpected returns the WERR and ERROR lines and unexpected exits so far.
func (c *procCluster) unexpected() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.errs)
}

// dumpTails logs every running member's last log lines.
func (c *procCluster) dumpTails() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(c.members)) {
		for _, l := range c.members[id].tail {
			c.t.Logf("%s: %s", id, l)
		}
	}
}
