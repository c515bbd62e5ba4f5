package singleflight_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/singleflight"
)

// plain is a Results that cannot fence (as a Redis cache would be): Get
// and Put of a Table, Puts recorded.
type plain struct {
	t    *singleflight.Table
	mu   sync.Mutex
	puts []string
}

func (p *plain) Get(ctx context.Context, key string) ([]byte, bool, error) { return p.t.Get(ctx, key) }

func (p *plain) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	p.mu.Lock()
	p.puts = append(p.puts, string(value))
	p.mu.Unlock()
	return p.t.Put(ctx, key, value, ttl)
}

func (p *plain) putCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.puts)
}

// TestUnfencedResults: with a Results that has no PutHeld, Do puts only
// after a round trip on the lock's session answered after fn returned: a
// session terminated while fn ran, which the Locker (one ping a minute)
// has not noticed, gets no Put.
func TestUnfencedResults(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, table := groupWith(t, db.DSN, time.Minute, slowPing)
	p := &plain{t: table}
	g.Results = p
	if v, from, err := g.Do(ctx, "held", func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil || from != singleflight.Computed || string(v) != "v" {
		t.Fatalf("Do with the lock held = %q, %v, %v", v, from, err)
	}
	if n := p.putCount(); n != 1 {
		t.Fatalf("%d Puts with the lock held, want 1", n)
	}

	started, terminated := make(chan struct{}), make(chan struct{})
	done := make(chan doResult, 1)
	go func() {
		v, from, err := g.Do(ctx, "lost", func(context.Context) ([]byte, error) {
			close(started)
			<-terminated
			return []byte("computed after the loss"), nil
		})
		done <- doResult{v, from, err}
	}()
	closed(t, "fn to start", started)
	terminateHolder(t, ctx, db, "singleflight:lost")
	close(terminated)
	r := recv(t, "Do", done)
	if !errors.Is(r.err, singleflight.ErrNotStored) || !errors.Is(r.err, advisory.ErrLost) || r.value != nil {
		t.Errorf("Do whose lock was lost = %q, %v, %v; want ErrNotStored and advisory.ErrLost", r.value, r.from, r.err)
	}
	if n := p.putCount(); n != 1 {
		t.Errorf("%d Puts, want 1: the lost call must not Put", n)
	}
}

// terminateHolder terminates the backend that holds key (one session).
func terminateHolder(t *testing.T, ctx context.Context, db *pgtest.DB, key string) {
	t.Helper()
	holders, err := advisory.Holders(ctx, db.NewPool(t), pglocks.KeyOf(key))
	if err != nil || len(holders) != 1 || !holders[0].Granted {
		t.Fatalf("holders of %q = %+v, %v; want one session", key, holders, err)
	}
	if err := db.Server.TerminateBackend(ctx, holders[0].PID); err != nil {
		t.Fatal(err)
	}
}

// TestPutHeldKeySpaces: PutHeld finds a held lock in pg_locks in both key
// spaces (objsubid 1 for bigint keys, named or not, 2 for int4 pairs),
// negative halves included; it refuses a lock that has ended or is shared.
func TestPutHeldKeySpaces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, table := group(t, db.DSN, time.Minute)
	for _, key := range []pglocks.Key{pglocks.KeyOf("named"), pglocks.Int64Key(-5), pglocks.Int64Key(1<<32 | 7), pglocks.PairKey(-1, 7), pglocks.PairKey(3, -9)} {
		lk, err := g.Locker.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		name := "k" + key.String()
		if err := table.PutHeld(ctx, lk, name, []byte("v"), time.Minute); err != nil {
			t.Errorf("PutHeld under %v = %v", key, err)
		}
		if v, ok, err := table.Get(ctx, name); err != nil || !ok || string(v) != "v" {
			t.Errorf("stored under %v = %q, %v, %v", key, v, ok, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		err = table.PutHeld(ctx, lk, name, []byte("after"), time.Minute)
		if !errors.Is(err, singleflight.ErrNotStored) || errors.Is(err, advisory.ErrLost) {
			t.Errorf("PutHeld after Unlock of %v = %v; want ErrNotStored, not ErrLost", key, err)
		}
	}
	rl, err := g.Locker.RLock(ctx, pglocks.KeyOf("shared"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rl.Unlock(ctx) }()
	if err := table.PutHeld(ctx, rl, "shared", []byte("v"), time.Minute); !errors.Is(err, singleflight.ErrNotStored) || !strings.Contains(err.Error(), "exclusive") {
		t.Errorf("PutHeld under a shared lock = %v; want ErrNotStored saying it needs an exclusive lock", err)
	}
}

// TestPutHeldRechecksAfterRowWait pins the PostgreSQL behaviour the fence
// relies on: a store that waits for another transaction's row checks the
// lock again once it holds the row. Here the holder's session is
// terminated during the wait (the Locker, one ping a minute, does not
// know); the other transaction then commits, and the store writes nothing.
func TestPutHeldRechecksAfterRowWait(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, table := groupWith(t, db.DSN, time.Minute, slowPing)
	if err := table.Put(ctx, "k", []byte("old"), time.Minute); err != nil {
		t.Fatal(err)
	}
	lk, err := g.Locker.Lock(ctx, pglocks.KeyOf("k"))
	if err != nil {
		t.Fatal(err)
	}
	other := db.Conn(t)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "update "+singleflight.DefaultTable+" set value = 'other' where key = 'k'"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- table.PutHeld(ctx, lk, "k", []byte("held"), time.Minute) }()
	waitLockWait(t, ctx, db.NewPool(t), "insert into%")
	if err := db.Server.TerminateBackend(ctx, lk.PID()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = recv(t, "PutHeld", done)
	if !errors.Is(err, singleflight.ErrNotStored) || !errors.Is(err, advisory.ErrLost) {
		t.Errorf("PutHeld whose lock was lost during its row wait = %v; want ErrNotStored and advisory.ErrLost", err)
	}
	if v, _, err := table.Get(ctx, "k"); err != nil || string(v) != "other" {
		t.Errorf("stored = %q, %v; want the other transaction's value", v, err)
	}
}

// waitLockWait waits until a backend of this database runs a statement
// like query and waits for a lock.
func waitLockWait(t *testing.T, ctx context.Context, pool *pgxpool.Pool, query string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `select exists (select from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock' and query like $1)`, query).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement like %q waited for a lock within a minute", query)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// TestStoreUnknown: the store's statement runs and commits but its reply
// is lost; Do must not say the result is stored, nor that it is not.
func TestStoreUnknown(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	g, _ := group(t, db.DSN, time.Minute)
	proxy, dsn := db.Proxy(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// No ping before a statement, and each statement in one flight (no
	// separate prepare): the store's statement reaches the server whole.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table, err := singleflight.NewTable(pool, "", "")
	if err != nil {
		t.Fatal(err)
	}
	g.Results = table
	direct, _ := group(t, db.DSN, time.Minute)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan doResult, 1)
	go func() {
		v, from, err := g.Do(ctx, "k", func(context.Context) ([]byte, error) {
			proxy.DropReplies()
			return []byte("v"), nil
		})
		done <- doResult{v, from, err}
	}()
	deadline := time.Now().Add(time.Minute)
	for { // until the store has committed, unanswered
		if _, ok, err := direct.Results.Get(ctxT(t), "singleflight:k"); err != nil || ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the store did not commit within a minute")
		}
		<-time.After(10 * time.Millisecond)
	}
	cancel()
	r := recv(t, "Do", done)
	proxy.Pass()
	t.Logf("Do: %q, %v, %v", r.value, r.from, r.err)
	if !errors.Is(r.err, singleflight.ErrStoreUnknown) || errors.Is(r.err, singleflight.ErrNotStored) || r.value != nil {
		t.Errorf("Do whose store's reply was lost = %q, %v, %v; want ErrStoreUnknown only", r.value, r.from, r.err)
	}
}

// TestPutHeldOtherRole: a Table whose role may not read the lock session's
// backend_start (another role, no pg_read_all_stats) checks the pid alone:
// it stores while the lock is held and not after the session ended.
func TestPutHeldOtherRole(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, _ := groupWith(t, db.DSN, time.Minute, slowPing)
	role := pgx.Identifier{fmt.Sprintf("sf_other_%d", time.Now().UnixNano())}.Sanitize()
	admin := db.Conn(t)
	if _, err := admin.Exec(ctx, "create role "+role+" login password 'pw'; grant all on "+singleflight.DefaultTable+" to "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), db.DSN)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "select pg_terminate_backend(pid) from pg_stat_activity where usename = $1", strings.Trim(role, `"`))
		if _, err := c.Exec(context.Background(), "drop owned by "+role+"; drop role "+role); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = strings.Trim(role, `"`), "pw"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table, err := singleflight.NewTable(pool, "", "")
	if err != nil {
		t.Fatal(err)
	}
	lk, err := g.Locker.Lock(ctx, pglocks.KeyOf("k"))
	if err != nil {
		t.Fatal(err)
	}
	var start *time.Time
	if err := pool.QueryRow(ctx, "select backend_start from pg_stat_activity where pid = $1", int32(lk.PID())).Scan(&start); err != nil || start != nil {
		t.Fatalf("the other role reads the lock session's backend_start = %v, %v; want NULL (the test proves nothing otherwise)", start, err)
	}
	if err := table.PutHeld(ctx, lk, "k", []byte("v"), time.Minute); err != nil {
		t.Fatalf("PutHeld by another role under a held lock = %v", err)
	}
	if err := db.Server.TerminateBackend(ctx, lk.PID()); err != nil {
		t.Fatal(err)
	}
	if err := table.PutHeld(ctx, lk, "k", []byte("after"), time.Minute); !errors.Is(err, singleflight.ErrNotStored) || !errors.Is(err, advisory.ErrLost) {
		t.Errorf("PutHeld by another role after the session ended = %v; want ErrNotStored and advisory.ErrLost", err)
	}
}

// tenantTable is a wrapper users write: it embeds a Table and keys its
// rows by tenant in its own Get and Put.
type tenantTable struct {
	*singleflight.Table
	tenant string
}

func (w tenantTable) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return w.Table.Get(ctx, w.tenant+"/"+key)
}

func (w tenantTable) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return w.Table.Put(ctx, w.tenant+"/"+key, value, ttl)
}

// TestEmbeddedTableWrapper: a Results that embeds a *Table has its own Put
// called; the Table's promoted PutHeld must not bypass it (it stored the
// value under the bare key, so the wrapper's Get never found it and fn ran
// on every call).
func TestEmbeddedTableWrapper(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	g, table := group(t, db.DSN, time.Hour)
	g.Results = tenantTable{Table: table, tenant: "acme"}
	ctx := ctxT(t)
	var runs atomic.Int32
	for range 3 {
		if _, _, err := g.Do(ctx, "k", func(context.Context) ([]byte, error) { runs.Add(1); return []byte("v"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times through a wrapper of Table, want once", n)
	}
	if _, ok, err := table.Get(ctx, "acme/singleflight:k"); err != nil || !ok {
		t.Errorf("the wrapper's key holds nothing (%v, %v): its Put was bypassed", ok, err)
	}
}
