package advisory

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/outcome"
)

// Statements run at the protocol level (Bind, Execute, Sync, then messages
// up to ReadyForQuery) rather than through pgconn's result readers, for
// two reasons. A read that times out leaves a pgconn connection usable
// (the partial message is kept), where a result reader would close it; so
// a caller whose ctx ends can leave while the answer is still read. And
// the context given to pgconn is never done, so no per-statement watcher
// goroutine is started; QueryTimeout is a socket deadline instead.

// reply is what a statement answered.
type reply struct {
	ok    bool   // the first column of the row, a boolean
	extra []byte // the second column, raw (anySQL's taken positions)
	pgErr error  // a server error; the session stays usable
}

// monoBase anchors the session's verified times, which are stored as
// offsets from it so that they keep Go's monotonic clock reading.
var monoBase = time.Now()

// arm bounds the next statements by QueryTimeout with a socket deadline,
// renewed when less than half of it is left, and notes the send time.
func (s *session) arm() {
	now := time.Now()
	s.sentAt = now.Sub(monoBase)
	s.extend(now)
}

// extend renews the socket deadline to QueryTimeout from now when less
// than half of it is left.
func (s *session) extend(now time.Time) {
	if s.deadline.Sub(now) < s.l.cfg.QueryTimeout/2 {
		s.deadline = now.Add(s.l.cfg.QueryTimeout)
		_ = s.conn.Conn().SetDeadline(s.deadline)
	}
}

// send writes one execution of a prepared statement and flushes it.
func (s *session) send(name string, params [][]byte, formats []int16) error {
	s.arm()
	s.write(name, params, formats)
	return s.conn.Frontend().Flush()
}

// write buffers one execution of a prepared statement (Bind, Execute,
// Sync), to be sent by the next Flush.
func (s *session) write(name string, params [][]byte, formats []int16) {
	f := s.conn.Frontend()
	f.SendBind(&pgproto3.Bind{PreparedStatement: name, ParameterFormatCodes: formats,
		Parameters: params, ResultFormatCodes: resultFormatsBinary})
	f.SendExecute(&pgproto3.Execute{})
	f.SendSync(&pgproto3.Sync{})
}

// requestArgs returns the statement and arguments of request r: a try, or
// the unlock statement unlockStmt chooses now.
func (s *session) requestArgs(r *request) (string, [][]byte, []int16) {
	kind := stmtTry
	if r.kind == opTryAll {
		return s.anyArgs(r.m, r.want)
	}
	if r.kind == opUnlock {
		kind = s.unlockStmt(r.key, r.shared)
	}
	return s.stmtArgs(kind, r.key, r.shared, r.want)
}

var resultFormatsBinary = []int16{1}

// recv reads the answer of one statement, up to ReadyForQuery. When ctx
// ends first the read times out and recv returns an error for which
// pgconn.Timeout is true; the rest of the answer can be read later.
func (s *session) recv(ctx context.Context, rep *reply) error {
	if ctx.Done() != nil {
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = s.conn.Conn().SetReadDeadline(time.Now())
			close(fired)
		})
		defer func() {
			if !stop() {
				<-fired
				_ = s.conn.Conn().SetReadDeadline(s.deadline)
			}
		}()
	}
	for {
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if len(m.Values) > 0 && len(m.Values[0]) == 1 {
				rep.ok = m.Values[0][0] == 1
			}
			if len(m.Values) > 1 {
				rep.extra = append(rep.extra[:0], m.Values[1]...)
			}
		case *pgproto3.ErrorResponse:
			rep.pgErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			// The server answered: the session was alive when this
			// statement was sent.
			if v := int64(s.sentAt); v > s.verified.Load() {
				s.verified.Store(v)
			}
			return nil
		}
	}
}

// ping checks the session with a bare Sync, the cheapest round trip.
func (s *session) ping() error {
	s.arm()
	f := s.conn.Frontend()
	f.SendSync(&pgproto3.Sync{})
	if err := f.Flush(); err != nil {
		return err
	}
	var rep reply
	return s.recv(context.Background(), &rep)
}

// do runs request r's statement; ctx is the caller's on the direct path,
// context.Background() for the worker. A non-nil error means the session is dead. handedOff
// means ctx ended during the statement: r is now abandoned and a goroutine
// owns s.mu to finish it.
func (s *session) do(ctx context.Context, r *request) (handedOff bool, err error) {
	s.lastUse = time.Now()
	if s.skip(r) {
		return false, nil
	}
	var rep reply
	err = s.send(s.requestArgs(r))
	if err == nil {
		err = s.recv(ctx, &rep)
		if err != nil && ctx.Err() != nil && pgconn.Timeout(err) && r.state.CompareAndSwap(reqPending, reqAbandoned) {
			s.l.wg.Add(1) // the worker is alive (we hold s.mu), so the count is not 0
			go s.resume(r, rep)
			return true, nil
		}
	}
	return false, s.complete(r, &rep, err)
}

// resume finishes a statement whose caller left, then lets the session go
// and delivers the events it produced (see [events]).
func (s *session) resume(r *request, rep reply) {
	defer s.l.wg.Done()
	defer s.l.deliver()
	defer s.mu.Unlock()
	// A fresh deadline for the rest of the answer, set directly: arm would
	// also move sentAt, and VerifiedAt must count from the real send time.
	s.deadline = time.Now().Add(s.l.cfg.QueryTimeout)
	_ = s.conn.Conn().SetDeadline(s.deadline)
	err := s.recv(context.Background(), &rep)
	if err := s.complete(r, &rep, err); err != nil {
		s.die(err)
	}
}

// complete applies the answer to r's statement (or err, a transport error
// that kills the session), as [judge] decides, and hands r's result to its
// caller.
func (s *session) complete(r *request, rep *reply, err error) error {
	defer s.pending.Add(-1)
	switch judge(rep, err) {
	case verdictDead:
		return s.failDead(r, fmt.Errorf("%s: %w", r.kind, err))
	case verdictSettle:
		return s.settle(r, rep.pgErr)
	}
	switch r.kind {
	case opTryAll:
		if !rep.ok {
			s.finishOrUndo(r)
			return nil
		}
		return s.tookAll(r, rep.extra)
	case opTry:
		if !rep.ok {
			s.finishOrUndo(r)
			return nil
		}
		return s.took(r)
	case opUnlock:
		r.err = s.released(r.lock, rep.ok)
		r.finish()
	}
	return nil
}

// undo unlocks lk at once, for a caller that did not wait for it.
func (s *session) undo(lk *Lock) error {
	var rep reply
	err := s.send(s.stmtArgs(s.unlockStmt(lk.key, lk.shared), lk.key, lk.shared, false))
	if err == nil {
		err = s.recv(context.Background(), &rep)
	}
	if err == nil && rep.pgErr != nil {
		if s.unlockedAnyway(lk, rep.pgErr) {
			return nil
		}
		err = rep.pgErr
	}
	if err != nil {
		// The lock may still be held, and nobody waits for the answer:
		// only the session's end settles it.
		cause := fmt.Errorf("undo an abandoned lock: %w", err)
		s.die(cause)
		return errAlreadyDead
	}
	_ = s.released(lk, rep.ok)
	return nil
}

// unlockStmt is the statement that unlocks key on s: with the wake-up
// NOTIFY when a waiter elsewhere asked for it and this is the session's
// last Lock of the key in that mode — an unlock that leaves the key held
// wakes nobody. An unlock needs no entry in the server's lock table, a
// NOTIFY's commit does: on a full table a NOTIFY sent for nothing would
// fail the statement (53200) and leave the session's locks to be counted.
func (s *session) unlockStmt(key pglocks.Key, shared bool) stmtKind {
	if s.l.isContended(key) && s.l.countOn(s, key, shared) == 1 {
		return stmtUnlockNotify
	}
	return stmtUnlock
}

// unlockedAnyway reports, after an unlock of lk failed with cause on a
// full lock table (the NOTIFY's commit found no entry; the unlock itself
// needs none and is not undone by the abort), whether pg_locks shows the
// key free on this session — then lk is recorded as unlocked.
func (s *session) unlockedAnyway(lk *Lock, cause error) bool {
	if !outcome.LockTableFull(cause) || s.l.countOn(s, lk.key, lk.shared) != 1 {
		return false
	}
	held, err := s.holdsKey(lk.key, lk.shared)
	if err != nil || held {
		return false
	}
	_ = s.released(lk, true)
	return true
}

// released records that lk was unlocked; ok is what the server answered.
func (s *session) released(lk *Lock, ok bool) error {
	s.l.mu.Lock()
	delete(s.locks, lk)
	s.nlocks.Store(int32(len(s.locks)))
	lk.endLocked(lockUnlocked, nil)
	s.l.mu.Unlock()
	if !ok {
		return fmt.Errorf("server says the session (pid %d) did not hold it", s.pid)
	}
	return nil
}

func (k opKind) String() string {
	switch k {
	case opUnlock:
		return "unlock"
	case opTryAll:
		return "try all"
	}
	return "try"
}

// putKey encodes key's arguments into buf; it returns params and formats.
func putKey(buf *[8]byte, hi, lo int32, pair bool, v int64) ([][]byte, []int16) {
	if pair {
		binary.BigEndian.PutUint32(buf[0:4], uint32(hi))
		binary.BigEndian.PutUint32(buf[4:8], uint32(lo))
		return [][]byte{buf[0:4], buf[4:8]}, []int16{1, 1}
	}
	binary.BigEndian.PutUint64(buf[:], uint64(v))
	return [][]byte{buf[:]}, []int16{1}
}

// errAlreadyDead tells the caller of do or complete that die has run.
var errAlreadyDead = errors.New("session already dead")

// errSessionDied is wrapped by the error of a request whose session died.
var errSessionDied = errors.New("session died")
