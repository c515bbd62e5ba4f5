package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// adminExec runs sql on the server's maintenance database through a small
// pool of connections kept for the server's life, instead of a connection
// per CREATE or DROP DATABASE (a connection costs more than the copy of a
// small template). A statement that failed before it was sent — its pooled
// connection closed under it, by a restart say — is sent once more on a
// fresh one; any other failure is the caller's, done or not.
func (s *Server) adminExec(ctx context.Context, sql string) error {
	pool, err := s.adminPool(ctx)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, sql)
	if err != nil && pgconn.SafeToRetry(err) {
		pool.Reset()
		_, err = pool.Exec(ctx, sql)
	}
	return err
}

func (s *Server) adminPool(ctx context.Context) (*pgxpool.Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin != nil {
		return s.admin, nil
	}
	select {
	case <-s.stopping:
		return nil, fmt.Errorf("pgtest: server %s is closed", s)
	default:
	}
	cfg, err := pgxpool.ParseConfig(s.adminDSN)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s.admin = pool
	return pool, nil
}

// closeAdmin closes the pool of adminExec.
func (s *Server) closeAdmin() {
	s.mu.Lock()
	pool := s.admin
	s.admin = nil
	s.mu.Unlock()
	if pool != nil {
		pool.Close()
	}
}

// resetAdmin closes the admin pool's sessions, for after a failover.
func (s *Server) resetAdmin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin != nil {
		s.admin.Reset()
	}
}
