package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// The shape of BenchmarkFanout: fanoutLockers Lockers in one process, each
// with its own pool, session and listener; the first holds fanoutKeys keys
// and the others wait for them, one waiter per key, for fanoutHold.
const (
	fanoutLockers = 50
	fanoutKeys    = 1000
	fanoutHold    = 2 * time.Second
	fanoutCalib   = 20_000 // NOTIFYs sent to idle listeners to price one
)

// BenchmarkFanout measures the NOTIFY fan-out of waiting Locks (a known
// cost of the design): every Locker's listener receives every event
// on the channel, whoever it is for. Each iteration:
//
//  1. calibrate: fanoutCalib unlock events for keys nobody waits on are
//     sent by plain SQL to the idle listeners; the CPU they cost, client
//     (this process) and server (the listeners' backends, read from
//     /proc: local-mode pgtest only), per delivery, is the price of one
//     notification processed by one Locker;
//  2. hold: Locker 0 holds fanoutKeys keys, and each key has one waiting
//     Lock on one of the other Lockers, for fanoutHold: every failed try
//     of a waiter sends a "w" event, delivered to every listener;
//  3. hand over: Locker 0 unlocks every key ("u" events, since the keys
//     are contended), each waiter takes its key and unlocks it.
//
// A raw LISTEN connection counts the events. It reports, per phase, the
// events, their deliveries (events × listeners), and the CPU spent by the
// client, the listeners' backends and the Lockers' sessions' backends
// (the locks themselves). Run it with -bench Fanout -benchtime 1x.
func BenchmarkFanout(b *testing.B) {
	f := newFanout(b)
	for b.Loop() {
		c := f.calibrate()
		hold, over := f.round()
		f.report(c, hold, over)
	}
}

// fanout is the benchmark's world.
type fanout struct {
	b        *testing.B
	ctx      context.Context
	lockers  []*advisory.Locker
	sessions []int // the Lockers' session backends' pids
	raw      *pgx.Conn
	events   *eventCounter
	listenPI []int // the Lockers' listener backends' pids
	app      string
}

func newFanout(b *testing.B) *fanout {
	db := pgtest.New(b)
	f := &fanout{b: b, ctx: ctxT(b), raw: db.Conn(b), app: "pglocks-fanout-" + db.Name}
	for i := range fanoutLockers {
		l := newLocker(b, lazyPool(b, db.DSN), advisory.Config{MaxSessions: 1, ApplicationName: f.app})
		lk, err := l.TryLock(f.ctx, pglocks.Int64Key(int64(-1-i)))
		if err != nil {
			b.Fatal(err)
		}
		f.sessions = append(f.sessions, int(lk.PID()))
		if err := lk.Unlock(f.ctx); err != nil {
			b.Fatal(err)
		}
		f.lockers = append(f.lockers, l)
	}
	f.events = countEvents(b, db.Conn(b))
	waitFor(b, "every listener to LISTEN", 30*time.Second, func() bool {
		f.listenPI = f.backends("not (pid = any($2))", f.sessions)
		return len(f.listenPI) == fanoutLockers
	})
	return f
}

// backends returns the pids of the Lockers' backends that match cond.
func (f *fanout) backends(cond string, pids []int) []int {
	rows, err := f.raw.Query(f.ctx, "select pid from pg_stat_activity where application_name = $1 and "+cond, f.app, pids)
	if err != nil {
		f.b.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		f.b.Fatal(err)
	}
	out := make([]int, len(got))
	for i, p := range got {
		out[i] = int(p)
	}
	return out
}

// sample is what a phase cost.
type sample struct {
	wall                        time.Duration
	client, listeners, sessions time.Duration // CPU
	w, u                        int64         // events counted
}

func (f *fanout) begin() func() sample {
	start, cpu := time.Now(), clientCPU()
	lis, ses := backendCPU(f.listenPI), backendCPU(f.sessions)
	w, u := f.events.w.Load(), f.events.u.Load()
	return func() sample {
		return sample{wall: time.Since(start), client: clientCPU() - cpu,
			listeners: backendCPU(f.listenPI) - lis, sessions: backendCPU(f.sessions) - ses,
			w: f.events.w.Load() - w, u: f.events.u.Load() - u}
	}
}

// calibrate sends fanoutCalib unlock events for keys nobody waits on and
// waits until every listener has read them and the process is idle again.
func (f *fanout) calibrate() sample {
	idle := f.begin()
	f.drain()
	base := idle()
	end := f.begin()
	for i := 0; i < fanoutCalib; i += 1000 {
		if _, err := f.raw.Exec(f.ctx, "select count(pg_notify($1, 'u:1:' || k)) from generate_series($2::int8, $2 + 999) k",
			advisory.DefaultChannel, int64(1<<50+i)); err != nil {
			f.b.Fatal(err)
		}
	}
	waitFor(f.b, "the counter to see every event", time.Minute, func() bool {
		return f.events.u.Load()-base.u >= fanoutCalib
	})
	f.drain()
	s := end()
	// What the process spends idle (pings, timers) in as long is not the
	// notifications' cost.
	s.client -= time.Duration(float64(base.client) * float64(s.wall) / float64(base.wall))
	return s
}

// drain waits until every listener's backend has read the whole queue,
// and this process is idle again: its listeners have handled what they
// were sent (the queue's usage counts whole pages, so it is not enough).
func (f *fanout) drain() {
	waitFor(f.b, "the notification queue to drain", time.Minute, func() bool {
		var usage float64
		err := f.raw.QueryRow(f.ctx, "select pg_notification_queue_usage()").Scan(&usage)
		return err == nil && usage == 0
	})
	waitFor(f.b, "the process to idle", time.Minute, func() bool {
		cpu := clientCPU()
		t := time.NewTimer(100 * time.Millisecond)
		<-t.C
		return clientCPU()-cpu < 5*time.Millisecond
	})
}

// round runs the hold and hand-over phases.
func (f *fanout) round() (hold, over sample) {
	holder := f.lockers[0]
	held := make([]*advisory.Lock, fanoutKeys)
	for k := range held {
		lk, err := holder.TryLock(f.ctx, fanoutKey(k))
		if err != nil {
			f.b.Fatal(err)
		}
		held[k] = lk
	}
	var wg sync.WaitGroup
	errs := make(chan error, fanoutKeys)
	endHold := f.begin()
	for k := range fanoutKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := f.lockers[1+k%(fanoutLockers-1)]
			lk, err := l.Lock(f.ctx, fanoutKey(k))
			if err == nil {
				err = lk.Unlock(f.ctx)
			}
			errs <- err
		}()
	}
	t := time.NewTimer(fanoutHold)
	<-t.C
	hold = endHold()
	endOver := f.begin()
	for _, lk := range held {
		if err := lk.Unlock(f.ctx); err != nil {
			f.b.Fatal(err)
		}
	}
	wg.Wait()
	f.drain()
	over = endOver()
	close(errs)
	for err := range errs {
		if err != nil {
			f.b.Fatal(err)
		}
	}
	return hold, over
}

func fanoutKey(k int) pglocks.Key { return pglocks.Int64Key(int64(1<<40 + k)) }

// report logs the phases and reports the main figures as metrics.
func (f *fanout) report(c, hold, over sample) {
	// The client's listeners are the Lockers' and the counter's; the
	// backends measured are the Lockers' listeners'.
	listeners := int64(fanoutLockers + 1)
	cn := float64(c.client.Nanoseconds()) / float64(c.u*listeners)
	sn := float64(c.listeners.Nanoseconds()) / float64(c.u*fanoutLockers)
	f.b.Logf("calibration: %d events to %d listeners in %v: client %.0f ns, listener backends %.0f ns per delivery",
		c.u, listeners, c.wall.Round(time.Millisecond), cn, sn)
	for _, p := range []struct {
		name string
		s    sample
	}{{"hold", hold}, {"hand-over", over}} {
		s := p.s
		ev := s.w + s.u
		f.b.Logf("%s: %v, %d w + %d u events (%.0f/s), %d deliveries; CPU: client %v (fan-out ≈ %v), listener backends %v, session backends %v",
			p.name, s.wall.Round(time.Millisecond), s.w, s.u, float64(ev)/s.wall.Seconds(), ev*listeners,
			s.client.Round(time.Millisecond), time.Duration(cn*float64(ev*listeners)).Round(time.Millisecond),
			s.listeners.Round(time.Millisecond), s.sessions.Round(time.Millisecond))
	}
	f.b.ReportMetric(cn, "client-ns/delivery")
	f.b.ReportMetric(sn, "server-ns/delivery")
	f.b.ReportMetric(float64(hold.w+hold.u)/hold.wall.Seconds()/fanoutKeys, "events/s/waited-key")
	f.b.ReportMetric(float64(over.w+over.u)/fanoutKeys, "events/unlock")
	f.b.ReportMetric(float64(hold.listeners)/float64(max(hold.sessions, 1)), "listener/session-cpu")
}

// eventCounter counts the events on the channel, by kind.
type eventCounter struct{ w, u atomic.Int64 }

func countEvents(b *testing.B, conn *pgx.Conn) *eventCounter {
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := conn.Exec(ctx, "listen "+advisory.DefaultChannel); err != nil {
		b.Fatal(err)
	}
	c := &eventCounter{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			if strings.HasPrefix(n.Payload, "w") {
				c.w.Add(1)
			} else {
				c.u.Add(1)
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
	return c
}

// clientCPU is this process's CPU time, user and system.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU sums the CPU time of server backends, from /proc (a local
// server: 0 for backends in a container), in clock ticks of 10 ms.
func backendCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		t, err := procCPU(pid)
		if err != nil {
			continue
		}
		sum += t
	}
	return sum
}

func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 13 {
		return 0, errors.New("bad stat")
	}
	// fields[0] is stat's field 3 (state); utime and stime are 14 and 15.
	u, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}
