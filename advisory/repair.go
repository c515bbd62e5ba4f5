package advisory

import (
	"context"
	"fmt"

	"github.com/pglocks/pglocks"
)

// settle repairs the Locker's state after a try or unlock that the server
// answered with an error (see [judge]). The session is alive, but the
// statement may have run part-way: a session lock taken by a statement
// that then failed is still held (session locks ignore rollback), and an
// unlock that failed may have unlocked. settle asks pg_locks whether the
// session holds r's key in r's mode and makes the Locker agree:
//
//   - a try that took the lock keeps it: the caller gets the Lock (or, if
//     it left, the lock is unlocked);
//   - a try that took nothing returns the error, for [decide] to judge;
//   - an unlock that unlocked succeeds; one that did not leaves the Lock
//     held and returns the error, so that Unlock can be called again.
//
// The session is closed (its locks announced lost) only when pg_locks
// cannot tell: when the query fails, or when another holder in this process
// shares the key on this session (pg_locks shows a key once however many
// times a session took it).
func (s *session) settle(r *request, cause error) error {
	if r.kind == opTryAll {
		return s.settleAll(r, cause)
	}
	failed := fmt.Errorf("%s failed: %w", r.kind, cause)
	held, err := s.holdsKey(r.key, r.shared)
	if err != nil {
		return s.failDead(r, fmt.Errorf("%w; pg_locks could not tell what it did, so the session is closed: %w", failed, err))
	}
	mine := s.l.countOn(s, r.key, r.shared)
	switch {
	case r.kind == opTry && mine == 0 && held:
		return s.took(r) // it took the lock before it failed
	case r.kind == opTry && mine == 0:
		r.err = failed
		s.finishOrUndo(r)
		return nil
	case r.kind == opUnlock && mine == 1 && !held:
		r.err = s.released(r.lock, true)
		r.finish()
		return nil
	case r.kind == opUnlock && mine == 1:
		s.l.stillHeld(r.lock)
		r.err = fmt.Errorf("%w; the lock is still held", failed)
		r.finish()
		return nil
	}
	return s.failDead(r, fmt.Errorf("%w; the key is held more than once on the session, which pg_locks cannot count, so the session is closed", failed))
}

// holdsKey asks the server whether this session holds key in the given
// mode. s.mu must be held.
func (s *session) holdsKey(key pglocks.Key, shared bool) (bool, error) {
	classid, objid, objsubid := key.LockTag()
	mode := "ExclusiveLock"
	if shared {
		mode = "ShareLock"
	}
	s.arm()
	// A session's advisory locks are all in its own database, so pid
	// alone selects them. No pg_database in the query: a lock on a shared
	// catalog needs an entry in the server's lock table, which is full
	// when a try failed with ErrLockTableFull; the pg_locks view's own
	// lock takes a fast-path slot of the backend.
	res, err := s.conn.Exec(context.Background(), fmt.Sprintf(`select count(*) from pg_locks
		where locktype = 'advisory' and pid = pg_backend_pid() and granted and mode = '%s'
		and classid = %d and objid = %d and objsubid = %d`, mode, classid, objid, objsubid)).ReadAll()
	if err != nil {
		return false, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return false, fmt.Errorf("pg_locks: unexpected answer")
	}
	return string(res[0].Rows[0][0]) != "0", nil
}

// countOn counts the Locks of l on session s for key in the given mode.
func (l *Locker) countOn(s *session, key pglocks.Key, shared bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for lk := range s.locks {
		if idOf(lk.key) == idOf(key) && lk.shared == shared {
			n++
		}
	}
	return n
}

// stillHeld undoes Unlock's mark on lk: its unlock did not happen.
func (l *Locker) stillHeld(lk *Lock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lk.state == lockUnlocking {
		lk.state = lockHeld
	}
}

// took makes the Lock for a try that took its key and hands it to the
// caller, or unlocks it if the caller left.
func (s *session) took(r *request) error {
	lk := s.l.newLock(s, r.key, r.shared)
	r.got = lk
	if r.finish() {
		return nil
	}
	return s.undo(lk) // the caller left while the lock was being taken
}

// failDead closes the session for cause and fails r accordingly.
func (s *session) failDead(r *request, cause error) error {
	s.die(cause)
	if r.kind == opUnlock {
		r.err = fmt.Errorf("%w: %w", ErrNotHeld, r.lock.Err())
	} else {
		r.err = fmt.Errorf("%w (pid %d): %w", errSessionDied, s.pid, cause)
	}
	s.finishOrUndo(r)
	return errAlreadyDead
}
