package pgtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// [New]. Settings made with SET (not SET LOCAL) are reset at cleanup.
func NewTx(t testing.TB, opts ...Option) pgx.Tx {
	t.Helper()
	return SharedServer(t).NewTx(t, opts...)
}

// NewTx is [NewTx] on server s instead of the shared one.
func (s *Server) NewTx(t testing.TB, opts ...Option) pgx.Tx {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := s.txPool(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(fmt.Errorf("pgtest: NewTx: %w", err))
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		c.Release()
		t.Fatal(fmt.Errorf("pgtest: NewTx: %w", err))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := tx.Rollback(ctx)
		if err == nil || errors.Is(err, pgx.ErrTxClosed) {
			// What a transaction's rollback leaves of a session.
			_, err = c.Conn().PgConn().Exec(ctx, "select pg_catalog.pg_advisory_unlock_all(); unlisten *; reset all").ReadAll()
		}
		if err != nil {
			_ = c.Conn().Close(ctx) // the pool replaces it
		}
		c.Release()
	})
	return tx
}

// txPool returns the pool on the shared NewTx database of opts' template,
// made on first use.
func (s *Server) txPool(ctx context.Context, opts []Option) (*pgxpool.Pool, error) {
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
		d.pool, d.err = pgxpool.New(ctx, db.DSN)
	})
	return d.pool, d.err
}

// closeTxPools closes the NewTx pools (their databases go with the
// server, or with this run's databases).
func (s *Server) closeTxPools() {
	s.mu.Lock()
	dbs := s.txDBs
	s.mu.Unlock()
	for _, d := range dbs {
		d.once.Do(func() {}) // wait for a making one
		if d.pool != nil {
			d.pool.Close()
		}
	}
}
