package gooselock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/stdsql"
	"github.com/pressly/goose/v3/lock"
)

// UnlockTimeout bounds [Locker.SessionUnlock]. goose calls it with a
// context that is never cancelled; when the server does not answer in
// time, the connection is closed, which frees the lock.
const UnlockTimeout = 15 * time.Second

// Locker is a goose lock.SessionLocker on a pglocks advisory key. Its
// methods are safe for concurrent use (one lock per *sql.Conn).
type Locker struct {
	key pglocks.Key
}

var _ lock.SessionLocker = (*Locker)(nil)

// New returns a Locker that takes key, for example pglocks.KeyOf("goose")
// or pglocks.KeyOf("goose:" + schema). Every replica that migrates the same
// database must use the same key. To exclude goose's own
// lock.NewPostgresSessionLocker as well (a rolling switch to this
// package), use pglocks.Int64Key(lock.DefaultLockID).
func New(key pglocks.Key) (*Locker, error) {
	if err := key.Validate(); err != nil {
		return nil, fmt.Errorf("gooselock: key: %w", err)
	}
	return &Locker{key: key}, nil
}

// Key returns the advisory-lock key the Locker takes.
func (l *Locker) Key() pglocks.Key {
	if l == nil {
		return pglocks.Key{}
	}
	return l.key
}

// SessionLock takes the lock on conn's session, waiting until it is free
// or ctx ends (see [stdsql.SessionLock]).
func (l *Locker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if err := l.check(); err != nil {
		return err
	}
	if err := stdsql.SessionLock(ctx, conn, l.key); err != nil {
		return fmt.Errorf("gooselock: %w", err)
	}
	return nil
}

// SessionUnlock releases the lock on conn's session within
// [UnlockTimeout] (see [stdsql.SessionUnlock]).
func (l *Locker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if err := l.check(); err != nil {
		return err
	}
	if ctx == nil {
		return errors.New("gooselock: nil context")
	}
	ctx, cancel := context.WithTimeout(ctx, UnlockTimeout)
	defer cancel()
	if err := stdsql.SessionUnlock(ctx, conn, l.key); err != nil {
		return fmt.Errorf("gooselock: %w", err)
	}
	return nil
}

func (l *Locker) check() error {
	if l == nil || l.key == (pglocks.Key{}) {
		return errors.New("gooselock: nil or zero Locker (make one with New)")
	}
	return nil
}
