package pgtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txDB is the database a server's NewTx transactions share, one per
// template.
type txDB struct {
	once sync.Once
	pool *pgxpool.Pool
	name string
	err  error
}

// NewTx gives the test a transaction, rolled back when the test ends, on a
// database that every NewTx test of this binary shares (a clone of the
// server's template, or of the [WithMigrator] template among opts). It is
// the cheapest isolation, well under a millisecond a test: no database
// is made or dropped. Tests see nothing of one another, as long as nothing
// commits.
//
// Do not use it for code that needs a session of its own or commits:
// session advisory locks (held by the session, not the transaction: pgtest
// unlocks them at cleanup, but another NewTx test on another connection
// sees them meanwhile), LISTEN/NOTIFY (delivered only on commit), code that
// opens its own connections or pools (they see none of the transaction's
// work), COMMIT, CREATE DATABASE, VACUUM and the like. Give those tests
// [New]. A test that ends its transaction other than by a rollback (the
// Tx's Commit, a COMMIT statement, or a COMMIT or ROLLBACK followed by
// BEGIN: cleanup compares the transaction's now() and id with those at
// Begin) fails at cleanup, and the shared database is replaced for the
// tests after it. A ROLLBACK (the Tx's, or a statement) is no failure;
// what a test runs after its own ROLLBACK, outside any transaction,
// commits unseen.
// Cleanup runs DISCARD ALL: settings, prepared statements (and pgx's
// statement cache), cursors, temporary tables, LISTEN and advisory locks
// go.
//
// What a rollback does not isolate: sequences are not rolled back, so a
// test sees the ids that others drew (a serial column's first id need not
// be 1); and parallel NewTx tests that insert the same unique key wait on
// one another's uncommitted row until the first test ends.
func NewTx(t testing.TB, opts ...Option) pgx.Tx {
	t.Helper()
	return SharedServer(t).NewTx(t, opts...)
}

// NewTx is [NewTx] on server s instead of the shared one.
func (s *Server) NewTx(t testing.TB, opts ...Option) pgx.Tx {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := s.txPool(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(fmt.Errorf("pgtest: NewTx: %w", err))
	}
	begun, err := c.Begin(ctx)
	if err != nil {
		c.Release()
		t.Fatal(fmt.Errorf("pgtest: NewTx: %w", err))
	}
	tx := &sharedTx{Tx: begun}
	if err := c.QueryRow(ctx, "select now(), txid_current()").Scan(&tx.start, &tx.xid); err != nil {
		_ = c.Conn().Close(ctx)
		c.Release()
		t.Fatal(fmt.Errorf("pgtest: NewTx: %w", err))
	}
	t.Cleanup(func() { s.endTx(t, c, tx, d) })
	return tx
}

// endTx rolls back a NewTx test's transaction and resets its session,
// failing the test if it ended the transaction itself other than by a
// rollback: its transaction committed (Commit, COMMIT, or COMMIT then
// BEGIN), or another one runs (a transaction's start time, now(), is not
// the one recorded at Begin).
func (s *Server) endTx(t testing.TB, c *pgxpool.Conn, tx *sharedTx, d *txDB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ended := tx.ended.Load() == "commit"
	if c.Conn().PgConn().TxStatus() == 'T' {
		var now time.Time
		err := c.QueryRow(ctx, "select now()").Scan(&now)
		ended = ended || err != nil || !now.Equal(tx.start)
	}
	err := tx.Tx.Rollback(ctx)
	if err == nil || errors.Is(err, pgx.ErrTxClosed) {
		var status string
		if err = c.QueryRow(ctx, "select coalesce(txid_status($1), 'unknown')", tx.xid).Scan(&status); err != nil || status != "aborted" {
			ended = true
		}
	}
	if ended {
		t.Errorf("pgtest: NewTx: the test ended its transaction (COMMIT, or ROLLBACK or COMMIT then BEGIN): "+
			"what it committed would show to later NewTx tests; the shared database %s is replaced", d.name)
		s.retireTxDB(d)
	}
	if err == nil {
		// What a transaction's rollback leaves of a session: prepared
		// statements (pgx's cache forgets its own), cursors, advisory
		// locks, LISTEN, settings, temporary tables.
		if err = c.Conn().DeallocateAll(ctx); err == nil {
			_, err = c.Conn().PgConn().Exec(ctx, "discard all").ReadAll()
		}
	}
	if err != nil {
		_ = c.Conn().Close(ctx) // the pool replaces it
	}
	c.Release()
}

// sharedTx is NewTx's transaction: it records how the test ended it.
type sharedTx struct {
	pgx.Tx
	start time.Time    // now() in the transaction begun
	xid   int64        // its transaction id, assigned at Begin
	ended atomic.Value // "commit" or "rollback"
}

// Commit commits the test's transaction; the test fails at its cleanup.
func (tx *sharedTx) Commit(ctx context.Context) error {
	tx.ended.Store("commit")
	return tx.Tx.Commit(ctx)
}

// Rollback rolls back the test's transaction.
func (tx *sharedTx) Rollback(ctx context.Context) error {
	tx.ended.CompareAndSwap(nil, "rollback")
	return tx.Tx.Rollback(ctx)
}

// retireTxDB stops handing out d: the next NewTx of its template makes a
// new database; d's pool closes with the server.
func (s *Server) retireTxDB(d *txDB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for template, cur := range s.txDBs {
		if cur == d {
			delete(s.txDBs, template)
			s.retiredTx = append(s.retiredTx, d)
		}
	}
}

// txPool returns the pool on the shared NewTx database of opts' template,
// made on first use.
func (s *Server) txPool(ctx context.Context, opts []Option) (*txDB, error) {
	template, err := s.templateFor(ctx, opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	select {
	case <-s.stopping:
		s.mu.Unlock()
		return nil, errors.New("pgtest: NewTx: the server is closed")
	default:
	}
	if s.txDBs == nil {
		s.txDBs = map[string]*txDB{}
	}
	d := s.txDBs[template]
	if d == nil {
		d = &txDB{}
		s.txDBs[template] = d
	}
	s.mu.Unlock()
	d.once.Do(func() {
		db, err := s.clone(ctx, template)
		if err != nil {
			d.err = err
			return
		}
		d.name = db.Name
		d.pool, d.err = pgxpool.New(ctx, db.DSN)
	})
	return d, d.err
}

// closeTxPools closes the NewTx pools (their databases go with the
// server, or with this run's databases).
func (s *Server) closeTxPools() {
	s.mu.Lock()
	dbs := s.retiredTx
	for _, d := range s.txDBs {
		dbs = append(dbs, d)
	}
	s.mu.Unlock()
	for _, d := range dbs {
		d.once.Do(func() {}) // wait for a making one
		if d.pool != nil {
			d.pool.Close()
		}
	}
}
